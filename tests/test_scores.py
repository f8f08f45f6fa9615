"""A score for every chunk: `RerankResult.scores` names every input id, with the score its scorer
gave it (ranked or not) or why it has none; the card's JSON is unchanged unless asked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag_rerank import Reranker, rerank
from rag_rerank.cli import main
from rag_rerank.skill import load_skill
from tests.support.fake_llm import FakeLLM, Reply

HAPPY = load_skill().example("happy-path")
MANY = [{"id": f"m{i}", "text": f"IVF partitions vectors into cells; probe {i} of them per query."}
        for i in range(24)]


def test_every_input_id_has_a_score_with_the_local_backend() -> None:
    result = rerank(HAPPY.query, HAPPY.chunks, 2)
    ids = [json.loads(line)["id"] for line in HAPPY.chunks.splitlines() if line.strip()]
    assert list(result.scores) == ids  # input order
    assert all(isinstance(s, float) and 0.0 <= s <= 1.0 for s in result.scores.values())
    for r in result.ranked:
        assert result.scores[r.id] == r.score
    dropped = {d.id: d.reason for d in result.dropped}
    for cid, reason in dropped.items():  # the number a dropped reason carries is the score
        if reason.split(":")[0] in ("below_min_score", "not_selected"):
            assert f"{result.scores[cid]:.3f}" in reason


def test_windows_give_every_candidate_a_score() -> None:
    result = rerank("how many cells does IVF probe", MANY, 3, window_size=10)
    assert set(result.scores) == {c["id"] for c in MANY}
    assert all(isinstance(s, float) for s in result.scores.values())


def test_a_chunk_the_model_did_not_score_says_why() -> None:
    reason = "IVF is preferred when index memory is constrained"
    answer = {"ranked": [{"id": "c3", "score": 0.9, "reason": reason}],
              "dropped": [{"id": "c5", "reason": "about risotto"}]}
    with FakeLLM([Reply.openai_text(json.dumps(answer))]) as srv, \
            Reranker("openai", base_url=srv.openai_url, api_key="sk-x", model="m") as reranker:
        result = reranker.rerank(HAPPY.query, HAPPY.chunks, 3)
    assert result.scores["c3"] == 0.9
    assert result.scores["c5"] == "no score: the model dropped it without one"
    assert result.scores["c1"] == "not scored: the model neither ranked nor dropped it"
    assert result.full_order()[0] == "c3" and sorted(result.full_order()) == sorted(result.scores)


def test_full_order_puts_the_rest_by_score() -> None:
    result = rerank(HAPPY.query, HAPPY.chunks, 1)
    order = result.full_order()
    assert order[: len(result.ranked)] == [r.id for r in result.ranked]
    rest = [result.scores[i] for i in order[len(result.ranked):]]
    assert rest == sorted(rest, reverse=True)


def test_the_cards_json_is_unchanged_unless_the_flag_is_given(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "chunks.jsonl"
    path.write_text(HAPPY.chunks, encoding="utf-8")
    assert main(["rerank", "-q", HAPPY.query, "-c", str(path)]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert set(plain) == {"ranked", "dropped"}
    assert main(["rerank", "-q", HAPPY.query, "-c", str(path), "--scores"]) == 0
    with_scores = json.loads(capsys.readouterr().out)
    assert {k: with_scores[k] for k in ("ranked", "dropped")} == plain
    assert set(with_scores["scores"]) == {"c1", "c2", "c3", "c4", "c5"}
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"query": HAPPY.query, "chunks": HAPPY.chunks}) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["batch", "-i", str(lines), "-o", str(out), "--no-progress", "--scores"]) == 0
    rec = json.loads(out.read_text(encoding="utf-8"))
    assert rec["result"] == plain and set(rec["scores"]) == {"c1", "c2", "c3", "c4", "c5"}


def test_a_later_answer_without_a_number_keeps_an_earlier_number() -> None:
    """`meta.scores_of` reads the answers in order (the windows', then the final pass's): a chunk a
    later answer drops without a number keeps the number an earlier one gave it, and a chunk no
    answer gave a number says so; every id in input order, an unanswered one as unscored."""
    from rag_rerank.meta import NO_NUMBER, UNSCORED, scores_of
    from rag_rerank.models import Chunk, RerankRequest

    request = RerankRequest("q", tuple(Chunk(i, "t") for i in ("a", "b", "c", "d", "e")), 1, 0.7)
    first = {"ranked": [{"id": "a", "score": 0.9, "reason": "r"}],
             "dropped": [{"id": "b", "reason": "not_selected: 0.400"}, {"id": "c", "reason": "off topic"}]}
    final = {"ranked": [], "dropped": [{"id": "a", "reason": "outside top_k"}, {"id": "b", "reason": "x"},
                                       {"id": "c", "reason": "y"}, {"id": "d", "reason": "below_min_score"}]}
    assert scores_of(request, [first, final], []) == {"a": 0.9, "b": 0.4, "c": NO_NUMBER, "d": NO_NUMBER,
                                                      "e": UNSCORED}
