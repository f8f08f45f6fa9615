"""The simulated judge (`bench/simjudge.py`): its answers pass our output guard, its knobs do what
they say, the same seed gives the same answer, and the real openai SDK reaches it over HTTP.
(Its figures measure mechanisms, not model quality: here only that the mechanisms are wired.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag_rerank import Reranker
from rag_rerank.guard import check_output, validate_request
from rag_rerank.guard.output import cites_chunk, misquoted
from rag_rerank.render import render
from tests.support.judged_set import simjudge, write_judged_set

sj = simjudge()


@pytest.fixture()
def data(tmp_path: Path) -> tuple[Path, Path]:
    return write_judged_set(tmp_path, queries=4, chunks=10)


def _first(cands: Path) -> dict:
    return json.loads(cands.read_text(encoding="utf-8").splitlines()[0])


def _prompt(row: dict, top_k: int = 5, order: list[int] | None = None) -> tuple[str, object]:
    chunks = [row["chunks"][i] for i in (order or range(len(row["chunks"])))]
    request = validate_request(row["query"], chunks, top_k, 0.7)
    return render(request), request


def test_answer_passes_the_output_guard_and_its_reasons_quote_the_chunk(data) -> None:
    cands, qrels = data
    judge = sj.SimJudge.from_files(cands, qrels, sj.Knobs(noise=0.1, primacy=0.2, seed=3))
    row = _first(cands)
    prompt, request = _prompt(row)
    text, finish = judge.answer(prompt)
    assert finish == "stop"
    obj = check_output(text, request.chunks, request.top_k, query=request.query)
    texts = {c["id"]: c["text"] for c in row["chunks"]}
    assert len(obj["ranked"]) == 5
    for r in obj["ranked"]:
        assert misquoted(r["reason"], texts[r["id"]]) is None and cites_chunk(r["reason"], texts[r["id"]])
    seen = [r["id"] for r in obj["ranked"]] + [d["id"] for d in obj["dropped"]]
    assert sorted(seen) == sorted(texts)
    # the dropped ones carry their score, as the scored backends write it
    assert all(d["reason"].split(": ")[0] in ("below_min_score", "not_selected") for d in obj["dropped"])


def test_without_knobs_the_scores_are_the_qrels(data) -> None:
    cands, qrels = data
    judge = sj.SimJudge.from_files(cands, qrels)
    row = _first(cands)
    ids = [c["id"] for c in row["chunks"]]
    grades = {line.split()[2]: int(line.split()[3]) for line in qrels.read_text().splitlines()}
    assert judge.scores(row["qid"], ids) == pytest.approx([0.1 + 0.8 * grades[i] / 3 for i in ids])
    assert judge.scores(row["qid"], ids[::-1]) == pytest.approx(judge.scores(row["qid"], ids)[::-1])


def test_the_same_seed_gives_the_same_answer_and_another_seed_another(data) -> None:
    cands, qrels = data
    row = _first(cands)
    prompt, _ = _prompt(row)
    knobs = sj.Knobs(noise=0.2, omit_rate=0.2, seed=11)
    a = sj.SimJudge.from_files(cands, qrels, knobs).answer(prompt)
    b = sj.SimJudge.from_files(cands, qrels, knobs).answer(prompt)
    c = sj.SimJudge.from_files(cands, qrels, sj.Knobs(noise=0.2, omit_rate=0.2, seed=12)).answer(prompt)
    assert a == b and a != c


def test_primacy_and_recency_favour_the_first_and_the_last_shown(data) -> None:
    cands, qrels = data
    row = _first(cands)
    ids = [c["id"] for c in row["chunks"]]
    truth = sj.SimJudge.from_files(cands, qrels).scores(row["qid"], ids)
    first = sj.SimJudge.from_files(cands, qrels, sj.Knobs(primacy=0.3)).scores(row["qid"], ids)
    last = sj.SimJudge.from_files(cands, qrels, sj.Knobs(recency=0.3)).scores(row["qid"], ids)
    gain_first = [f - t for f, t in zip(first, truth, strict=True)]
    gain_last = [f - t for f, t in zip(last, truth, strict=True)]
    assert gain_first[0] == pytest.approx(min(0.3, 1 - truth[0])) and gain_first[-1] == pytest.approx(0.0)
    assert gain_last[-1] == pytest.approx(min(0.3, 1 - truth[-1])) and gain_last[0] == pytest.approx(0.0)


def test_squash_maps_every_score_into_its_range_monotonically(data) -> None:
    cands, qrels = data
    row = _first(cands)
    ids = [c["id"] for c in row["chunks"]]
    truth = sj.SimJudge.from_files(cands, qrels).scores(row["qid"], ids)
    squashed = sj.SimJudge.from_files(cands, qrels, sj.Knobs(squash=(0.6, 0.9))).scores(row["qid"], ids)
    assert all(0.6 <= s <= 0.9 for s in squashed)
    by_truth = sorted(range(len(ids)), key=lambda i: truth[i])
    assert by_truth == sorted(range(len(ids)), key=lambda i: squashed[i])


def test_omitted_ids_and_format_errors(data) -> None:
    cands, qrels = data
    row = _first(cands)
    prompt, _request = _prompt(row)
    omitting = sj.SimJudge.from_files(cands, qrels, sj.Knobs(omit_rate=0.5, seed=1))
    obj = json.loads(omitting.answer(prompt)[0])
    listed = {r["id"] for r in obj["ranked"]} | {d["id"] for d in obj["dropped"]}
    assert 0 < len(listed) < len(row["chunks"])
    spoiling = sj.SimJudge.from_files(cands, qrels, sj.Knobs(format_error_rate=1.0, seed=2))
    flavours = set()
    for attempt in range(40):
        text, finish = spoiling.answer(prompt, attempt)
        if finish == "length":
            flavours.add("truncated")
            with pytest.raises(ValueError):
                json.loads(text)
        elif text.startswith("```json"):
            flavours.add("fenced")
        else:
            assert text.startswith("Here is the ranking")
            flavours.add("prose")
    assert flavours == {"fenced", "prose", "truncated"}


def test_through_the_openai_sdk_with_format_errors_the_guard_repairs_or_reasks(data) -> None:
    cands, qrels = data
    rows = [json.loads(line) for line in cands.read_text().splitlines()]
    with sj.SimJudge.from_files(cands, qrels, sj.Knobs(format_error_rate=0.5, noise=0.05, seed=4)) as judge:
        with Reranker(backend="openai", base_url=judge.openai_url, model="sim") as reranker:
            results = [reranker.rerank(r["query"], r["chunks"], top_k=3) for r in rows]
        calls = judge.calls
    assert calls >= len(rows)
    for row, result in zip(rows, results, strict=True):
        ids = [r.id for r in result.ranked] + [d.id for d in result.dropped]
        assert sorted(ids) == sorted(c["id"] for c in row["chunks"])


def test_unknown_query_is_a_400_that_names_it(data) -> None:
    cands, qrels = data
    judge = sj.SimJudge.from_files(cands, qrels)
    status, body = judge.reply({"messages": [{"role": "user", "content": "<query>nobody asked</query>"}]})
    assert status == 400 and "unknown query 'nobody asked'" in body["error"]["message"]


def test_knobs_are_checked() -> None:
    with pytest.raises(ValueError, match="noise"):
        sj.Knobs(noise=-1)
    with pytest.raises(ValueError, match="squash"):
        sj.Knobs(squash=(0.9, 0.6))
    with pytest.raises(ValueError, match="omit_rate"):
        sj.Knobs(omit_rate=2)
