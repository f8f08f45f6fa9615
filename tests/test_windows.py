"""`window_size`: windows in parallel, one final pass, the post-pass over the survivors, every id kept.

The LLM side is the real `openai` SDK against tests/support/fake_llm.py on 127.0.0.1; the
offline side is the real local backend. Nothing of ours is mocked.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import sys
import threading
from pathlib import Path

import pytest

from rag_rerank import BackendError, InputError, arerank, arerank_many, reasons, rerank
from rag_rerank.cli import main
from rag_rerank.guard import load_limits, validate_request
from rag_rerank.models import Chunk, RerankResult
from rag_rerank.reasons import BELOW_MIN_SCORE
from rag_rerank.render import extract_chunk_lines
from rag_rerank.shortening import prompt_tokens
from rag_rerank.tools import call_tool
from rag_rerank.windows import NOT_IN_FINAL, WINDOW_PROGRESS, split
from tests.support.fake_llm import FakeLLM, InFlight, RecordedRequest, Reply
from tests.support.quoting_ranker import quoting_ranker

QUERY = "When should I prefer IVF over HNSW for vector search?"
_FILLER = ("river", "garden", "violin", "harbour", "copper", "lantern", "meadow", "pottery", "glacier",
           "orchard", "saddle", "tapestry", "walnut", "quarry", "biscuit", "compass", "ferry", "granite",
           "kettle", "ladder", "marble", "needle", "oyster", "pepper", "ribbon", "sandal", "thimble",
           "umbrella", "velvet", "whistle", "yarn", "zephyr", "anchor", "bramble", "candle", "dune")
_TOPICAL = ("IVF partitions vectors into cells and scans only nprobe lists, so prefer IVF over HNSW "
            "when memory is tight",
            "HNSW vector search keeps a graph in RAM; IVF suits corpora larger than memory",
            "For vector search at billion scale, IVF with product quantization beats HNSW on memory")


def make_chunks(n: int, topical: dict[int, str] | None = None, seed: int = 7) -> list[dict[str, str]]:
    """`n` filler chunks of distinct random words; positions in `topical` get on-topic text."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = " ".join(rng.sample(_FILLER, 9)) + f" item {i}"
        out.append({"id": f"d{i:04d}", "text": (topical or {}).get(i, text)})
    return out


def ids_of(result: RerankResult) -> list[str]:
    return [r.id for r in result.ranked] + [d.id for d in result.dropped]


_LOSER = re.compile(r"(below_min_score|not_in_final): (window \d+ of \d+) (scored it \d\.\d{3}|dropped it)"
                    r"(; the final pass took the best \d+ \(down to \d\.\d{3}\)|; the final prompt's token "
                    r"budget was full| \(.+\))?", re.DOTALL)


def assert_accounted(result: RerankResult, chunks: list[dict[str, str]]) -> None:
    """Every id once, every reason in the grammar, every window loser's in its documented forms."""
    got = ids_of(result)
    assert len(got) == len(set(got)), "an id appears twice"
    assert sorted(got) == sorted(c["id"] for c in chunks), "an id is missing or invented"
    for d in result.dropped:
        assert reasons.split(d.reason) is not None, d.reason  # `token` / `token: detail`, a listed token
        if " window " in d.reason and not d.reason.startswith("redundant_with:"):
            assert _LOSER.fullmatch(d.reason), d.reason


# --------------------------------------------------------------------------- the local backend


def test_cli_accounts_for_all_200_ids_in_windows_of_50(tmp_path: Path, capsys) -> None:
    topical = {3: _TOPICAL[0], 77: _TOPICAL[1], 151: _TOPICAL[2]}
    chunks = make_chunks(200, topical)
    path = tmp_path / "200.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in chunks), encoding="utf-8")
    assert main(["rerank", "-q", QUERY, "-c", str(path), "--window-size", "50", "--meta"]) == 0
    cap = capsys.readouterr()
    obj, meta = json.loads(cap.out), json.loads(cap.err)
    got = [r["id"] for r in obj["ranked"]] + [d["id"] for d in obj["dropped"]]
    assert sorted(got) == sorted(c["id"] for c in chunks) and len(got) == 200
    assert {r["id"] for r in obj["ranked"]} == {"d0003", "d0077", "d0151"}  # one from each of 3 windows
    assert meta["calls"] == 5 and [w["stage"] for w in meta["windows"]] == ["window"] * 4 + ["final"]
    assert [w["chunks"] for w in meta["windows"][:4]] == [[0, 50], [50, 100], [100, 150], [150, 200]]


def test_window_calls_report_progress_and_the_cli_shows_a_bar_on_a_terminal(
        tmp_path: Path, capsys, monkeypatch) -> None:
    """1,000 candidates are 21 calls: `rerank` reports each finished call through WINDOW_PROGRESS,
    and `rag-rerank rerank --window-size` draws a tqdm bar on stderr when it is a terminal; none when
    it is not (a log file), and stdout stays the result object alone."""
    pytest.importorskip("tqdm")
    seen: list[tuple[int, int]] = []
    token = WINDOW_PROGRESS.set(lambda done, total: seen.append((done, total)))
    try:
        rerank(QUERY, make_chunks(200, {3: _TOPICAL[0]}), 5, window_size=50)
    finally:
        WINDOW_PROGRESS.reset(token)
    assert seen == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]
    path = tmp_path / "200.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in make_chunks(200)), encoding="utf-8")
    argv = ["rerank", "-q", QUERY, "-c", str(path), "--window-size", "50"]
    assert main(argv) == 0
    plain = capsys.readouterr()
    assert plain.err == "" and json.loads(plain.out)["ranked"] is not None
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # the environment: stderr is a terminal
    assert main(argv) == 0
    shown = capsys.readouterr()
    assert "windows:" in shown.err and "5/5" in shown.err
    assert json.loads(shown.out) == json.loads(plain.out)


def test_without_window_size_over_max_chunks_says_how_to_pass_it(tmp_path: Path, capsys) -> None:
    path = tmp_path / "60.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in make_chunks(60)), encoding="utf-8")
    assert main(["rerank", "-q", QUERY, "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--window-size" in err and "window_size" in err and "(max_chunks)" in err
    with pytest.raises(InputError, match="window_size"):
        rerank(QUERY, make_chunks(60))


def test_a_duplicate_pair_split_across_windows_ends_redundant_with_the_other() -> None:
    long = _TOPICAL[0] + ", as the benchmark tables in the appendix of the report show in detail"
    chunks = make_chunks(120, {10: long, 95: _TOPICAL[0], 50: _TOPICAL[1]})
    result = rerank(QUERY, chunks, top_k=5, window_size=40, lambda_=1.0)
    assert_accounted(result, chunks)
    reasons = {d.id: d.reason for d in result.dropped}
    # both survive their windows (0-39 and 80-119); d0010 says all d0095 says and more: the
    # post-pass keeps the container (issue 32: containment keeps the chunk that says more)
    assert "d0010" in result.ids and reasons["d0095"] == "redundant_with:d0010"
    assert result.meta.windows[0]["survivors"] >= 1 and result.meta.windows[2]["survivors"] >= 1


@pytest.mark.parametrize(("n", "size", "top_k"), [(51, 50, 5), (100, 20, 10), (233, 17, 3), (1000, 50, 5)])
def test_every_id_exactly_once_and_losers_have_documented_reasons(n: int, size: int, top_k: int) -> None:
    topical = {i: _TOPICAL[i % 3] + f" (copy {i})" for i in range(5, n, 37)}
    chunks = make_chunks(n, topical, seed=n)
    result = rerank(QUERY, chunks, top_k=top_k, window_size=size)
    assert_accounted(result, chunks)
    assert 1 <= len(result.ranked) <= top_k
    windows = -(-n // size)
    assert result.meta.calls == windows + 1 == len(result.meta.windows)
    tokens = {re.match(r"[a-z_]+", d.reason).group(0) for d in result.dropped}  # type: ignore[union-attr]
    assert tokens <= {"below_min_score", NOT_IN_FINAL, "not_selected", "redundant_with"}
    final = result.meta.windows[-1]
    assert final["stage"] == "final" and final["size"] <= size
    assert sum(w["survivors"] for w in result.meta.windows[:-1]) == final["size"]


def test_window_size_at_least_the_candidates_is_one_ordinary_call() -> None:
    chunks = make_chunks(30, {4: _TOPICAL[0]})
    result = rerank(QUERY, chunks, window_size=30)
    assert result.meta.calls == 1 and result.meta.windows == ()
    assert result.to_dict() == rerank(QUERY, chunks).to_dict()


def test_no_survivor_anywhere_skips_the_final_pass() -> None:
    chunks = make_chunks(90)  # nothing about vector search
    result = rerank(QUERY, chunks, window_size=30)
    assert result.ranked == () and result.meta.calls == 3
    assert_accounted(result, chunks)
    assert "final pass skipped" in " ".join(result.meta.notes)


def test_sync_and_async_agree() -> None:
    chunks = make_chunks(150, {i: _TOPICAL[i % 3] + f" {i}" for i in (2, 48, 99, 140)})
    a = rerank(QUERY, chunks, top_k=3, window_size=25)
    b = asyncio.run(arerank(QUERY, chunks, top_k=3, window_size=25))
    assert a.to_dict() == b.to_dict() and a.meta.calls == b.meta.calls == 7


def test_losers_of_the_survivor_cut_are_not_in_final_with_their_score() -> None:
    topical = {i: _TOPICAL[i % 3] + f" variant {i} " + " ".join(_FILLER[i % 30 : i % 30 + 4])
               for i in range(0, 100, 2)}
    chunks = make_chunks(100, topical)
    result = rerank(QUERY, chunks, top_k=5, window_size=20)
    assert_accounted(result, chunks)
    cut = [d.reason for d in result.dropped if d.reason.startswith(NOT_IN_FINAL + ": ")]
    assert cut and all(re.match(r"not_in_final: window \d of 5 (scored it \d\.\d{3}|dropped it)", r)
                       for r in cut)
    assert any("the final pass took the best 20" in r for r in cut)


def test_the_final_prompt_keeps_to_the_token_budget() -> None:
    big = {i: (_TOPICAL[i % 3] + ". ") * 12 + str(i) for i in range(0, 60, 3)}  # ~300 tokens each
    chunks = make_chunks(60, big)
    lim = load_limits().with_overrides(max_context_tokens=2500)  # a window of 10 holds 4 big chunks
    result = rerank(QUERY, chunks, top_k=3, window_size=10, limits=lim)
    assert_accounted(result, chunks)
    assert any(d.reason.endswith("the final prompt's token budget was full") for d in result.dropped)
    final = result.meta.windows[-1]
    assert final["size"] < 10 and result.ranked
    # counted as the input guard counts a prompt (the estimator, each chunk's id too)
    assert prompt_tokens(QUERY, _final_chunks(result, chunks)) <= 2500


def _final_chunks(result: RerankResult, chunks: list[dict[str, str]]) -> list[Chunk]:
    """The chunks the final pass was shown: the ranked ones and those the post-pass dropped after it."""
    shown = {r.id for r in result.ranked} | {d.id for d in result.dropped if not d.reason.startswith(
        (NOT_IN_FINAL, BELOW_MIN_SCORE))}
    return [Chunk(c["id"], c["text"]) for c in chunks if c["id"] in shown]


def test_the_final_prompt_is_packed_with_the_callers_tokenizer() -> None:
    """A caller's tokenizer decides the final pass's budget as it decides the input guard's: counting
    every character as a token, 10 big survivors (about 13,000 characters) are over 8,000 tokens,
    which the package's estimate (about 2,900) would let through whole."""
    big = {i: (_TOPICAL[i % 3] + ". ") * 12 + str(i) for i in range(0, 60, 3)}
    chunks = make_chunks(60, big)
    lim = load_limits().with_overrides(max_context_tokens=8000)
    estimated = rerank(QUERY, chunks, top_k=3, window_size=10, limits=lim)
    assert not any(d.reason.endswith("budget was full") for d in estimated.dropped)
    assert estimated.meta.windows[-1]["size"] == 10
    result = rerank(QUERY, chunks, top_k=3, window_size=10, limits=lim, tokenizer=len)
    assert_accounted(result, chunks)
    assert any(d.reason.endswith("the final prompt's token budget was full") for d in result.dropped)
    assert 0 < result.meta.windows[-1]["size"] < 10
    assert prompt_tokens(QUERY, _final_chunks(result, chunks), len) <= 8000


# --------------------------------------------------------------------------- input checks


@pytest.mark.parametrize(
    ("window_size", "top_k", "fragment"),
    [(51, 5, "between 1 and 50"), (0, 5, "between 1 and 50"), (True, 5, "positive integer"),
     ("20", 5, "positive integer"), (4, 5, "below top_k 5")],
)
def test_bad_window_sizes_are_named(window_size: object, top_k: int, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        rerank(QUERY, make_chunks(80), top_k=top_k, window_size=window_size)  # type: ignore[arg-type]
    assert any(v.path == "window_size" and fragment in v.message for v in info.value.violations)


def test_total_limit_and_per_window_budget() -> None:
    lim = load_limits()
    with pytest.raises(InputError, match=r"over the limit of 1000 \(max_total_chunks\)"):
        validate_request(QUERY, make_chunks(lim.max_total_chunks + 1), window_size=50)
    small = lim.with_overrides(max_context_tokens=400)
    long = {i: "word " * 200 for i in (3, 47)}
    with pytest.raises(InputError) as info:
        validate_request(QUERY, make_chunks(80, long), window_size=20, limits=small)
    msg = " ".join(v.message for v in info.value.violations)
    assert "2 windows of 20" in msg and "chunks[0:20]" in msg and "chunks[40:60]" in msg
    # the same text in one prompt would be judged as a whole
    assert validate_request(QUERY, make_chunks(80), window_size=20).chunks


def test_windows_are_consecutive_in_input_order() -> None:
    request = validate_request(QUERY, make_chunks(95), top_k=5, window_size=20)
    windows = split(request, 20)
    assert [(w.first, w.end) for w in windows] == [(0, 20), (20, 40), (40, 60), (60, 80), (80, 95)]
    assert [c.id for w in windows for c in w.ask.chunks] == list(request.ids)
    assert all(w.ask.top_k == 10 for w in windows)  # each window asks for its own candidate_k


# --------------------------------------------------------------------------- an LLM over HTTP


def test_openai_120_candidates_in_windows_of_40_make_4_requests_3_at_once() -> None:
    probe = InFlight(quoting_ranker(), delay=0.3)
    chunks = make_chunks(120)
    with FakeLLM(handler=probe) as srv:
        result = rerank(QUERY, chunks, top_k=5, window_size=40, backend="openai", base_url=srv.openai_url,
                        api_key="x", model="m")
        requests = list(srv.requests)
    assert len(requests) == 4
    assert probe.max == 3, "the three windows were in flight together"
    final = requests[-1]
    assert final.received_at >= max(r.received_at for r in requests[:3]) + 0.25, "final after the windows"
    final_ids = [json.loads(line)["id"] for line in extract_chunk_lines(final.prompt)]
    assert len(final_ids) == 30 and final_ids == sorted(final_ids)  # 3 x candidate_k 10, in input order
    assert_accounted(result, chunks)
    assert result.meta.calls == 4 and result.meta.attempts == 4
    assert result.meta.usage["prompt_tokens"] == 400  # the fake's 100 per call, summed


def test_async_openai_windows_share_the_batch_bound_on_calls() -> None:
    probe = InFlight(quoting_ranker(), delay=0.2)
    requests = [{"query": QUERY, "chunks": make_chunks(90, seed=s), "top_k": 3, "window_size": 30}
                for s in range(3)]
    with FakeLLM(handler=probe) as srv:
        out = asyncio.run(arerank_many(requests, concurrency=2, backend="openai", base_url=srv.openai_url,
                                       api_key="x", model="m"))
        n = len(srv.requests)
    assert all(isinstance(r, RerankResult) and r.meta.calls == 4 for r in out)
    assert n == 12 and probe.max == 2, "three windowed requests, never more than 2 calls on the wire"


def test_arerank_windows_are_concurrent_up_to_concurrency() -> None:
    probe = InFlight(quoting_ranker(), delay=0.2)
    with FakeLLM(handler=probe) as srv:
        result = asyncio.run(arerank(QUERY, make_chunks(200), window_size=25, concurrency=3, backend="openai",
                                     base_url=srv.openai_url, api_key="x", model="m"))
    assert result.meta.calls == 9 and probe.max == 3


def _failing_window(marker: str) -> tuple[FakeLLM, threading.Event]:
    """A server that answers every window but the one whose prompt holds `marker` (HTTP 401, fatal)."""
    answer = quoting_ranker()
    failed = threading.Event()

    def handle(req: RecordedRequest) -> Reply:
        if f'"id": "{marker}"' in req.prompt and len(re.findall(r'"id": "', req.prompt)) == 40:
            failed.set()
            return Reply.openai_error(401, "Incorrect API key provided: sk-window-SECRET-123456",
                                      type_="authentication_error")
        return answer(req)

    return FakeLLM(handler=handle), failed


def test_a_failing_window_without_fallback_is_a_backend_error_naming_it() -> None:
    srv, failed = _failing_window("d0050")
    with srv, pytest.raises(BackendError) as info:
        rerank(QUERY, make_chunks(120), window_size=40, backend="openai", base_url=srv.openai_url,
               api_key="sk-window-SECRET-123456", model="m")
    assert failed.is_set()
    text = str(info.value)
    assert text.startswith("window 2 of 3 (chunks[40:80]): ") and "SECRET" not in text
    assert info.value.attempts and info.value.attempts[0].kind == "fatal"


def test_a_window_answered_by_the_fallback_counts_the_failed_attempts_and_tokens() -> None:
    """Every window's model invented an id three times, then the local backend answered: 9 calls
    sent, but meta.attempts said 3 (one per window), each window's entry 1, and usage {}."""
    invented = Reply.openai_text(json.dumps({"ranked": [{"id": "zz", "score": 0.9, "reason": "IVF"}]}),
                                 usage={"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55})
    chunks = [{"id": f"c{i}", "text": f"IVF index memory partition {i} cells word{i}"} for i in range(12)]
    with FakeLLM(handler=lambda req: invented) as srv:  # two windows and the final pass
        result = rerank("IVF memory", chunks, 3, window_size=6, backend="openai", base_url=srv.openai_url,
                        api_key="x", model="m", fallback="local")
        sent = len(srv.requests)
    assert sent == 9 and [w["fallback"] for w in result.meta.windows] == ["local"] * 3
    assert [w["attempts"] for w in result.meta.windows] == [4, 4, 4] and result.meta.attempts == 12
    assert [w["usage"]["total_tokens"] for w in result.meta.windows] == [165, 165, 165]
    assert dict(result.meta.usage) == {"prompt_tokens": 450, "completion_tokens": 45, "total_tokens": 495}


def test_a_failing_window_with_fallback_is_ranked_locally_and_flagged() -> None:
    chunks = make_chunks(120, {55: _TOPICAL[0]})
    srv, failed = _failing_window("d0050")
    with srv:
        result = rerank(QUERY, chunks, top_k=3, window_size=40, backend="openai", base_url=srv.openai_url,
                        api_key="sk-window-SECRET-123456", model="m", fallback="local")
    assert failed.is_set()
    assert_accounted(result, chunks)
    assert result.meta.fallback == "local"
    assert [w["fallback"] for w in result.meta.windows] == [None, "local", None, None]
    assert result.meta.calls == 4
    notes = " ".join(result.meta.notes)
    assert "window 2 of 3: openai failed" in notes and "SECRET" not in notes
    assert result.meta.windows[1]["survivors"] >= 1  # the local backend found the topical chunk there


def test_a_failing_final_pass_names_it_or_falls_back() -> None:
    answer = quoting_ranker()

    def handle(req: RecordedRequest) -> Reply:
        if len(re.findall(r'"id": "', req.prompt)) != 40:  # every window holds 40; the final pass fewer
            return Reply.openai_error(400, "context length exceeded")
        return answer(req)

    chunks = make_chunks(120, {7: _TOPICAL[1]})
    with FakeLLM(handler=handle) as srv:
        kw = {"window_size": 40, "backend": "openai", "base_url": srv.openai_url, "api_key": "x",
              "model": "m"}
        with pytest.raises(BackendError, match=r"^final pass over 30 survivors: "):
            rerank(QUERY, chunks, **kw)
        result = rerank(QUERY, chunks, fallback="local", **kw)
    assert_accounted(result, chunks)
    assert result.meta.windows[-1]["fallback"] == "local" and result.meta.fallback == "local"
    assert "the final pass: openai failed" in " ".join(result.meta.notes)


# --------------------------------------------------------------------------- batch, tools, eval


def test_batch_line_carries_window_size(tmp_path: Path, capsys) -> None:
    lines = [{"query": QUERY, "chunks": make_chunks(70, {33: _TOPICAL[0]}), "window_size": 35},
             {"query": QUERY, "chunks": make_chunks(70)}]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    assert main(["batch", "-i", str(inp), "-o", str(tmp_path / "out.jsonl"), "--no-progress"]) == 2
    out = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert out[0]["meta"]["calls"] == 3 and out[0]["result"]["ranked"][0]["id"] == "d0033"
    assert out[1]["error"]["kind"] == "input" and "window_size" in out[1]["error"]["message"]
    capsys.readouterr()
    assert main(["batch", "-i", str(inp), "-o", str(tmp_path / "all.jsonl"), "--no-progress",
                 "--window-size", "20"]) == 0
    out = [json.loads(x) for x in (tmp_path / "all.jsonl").read_text().splitlines()]
    # the line's own 35 wins over the flag's 20; the second line has 4 windows and, with nothing on
    # topic, no survivor for a final pass
    assert [r["meta"]["calls"] for r in out] == [3, 4]
    assert [len(r["meta"]["windows"]) for r in out] == [3, 4]


def test_call_tool_with_window_size() -> None:
    chunks = make_chunks(120, {90: _TOPICAL[2]})
    result = call_tool({"query": QUERY, "chunks": chunks, "window_size": 40, "top_k": 3})
    assert "error" not in result and result["ranked"][0]["id"] == "d0090"
    assert len(result["ranked"]) + len(result["dropped"]) == 120
    refused = call_tool({"query": QUERY, "chunks": chunks})
    assert refused["error"]["type"] == "invalid_input"
    assert "window_size" in refused["error"]["violations"][0]["message"]


def test_eval_depth_over_max_chunks_needs_window_size(tmp_path: Path) -> None:
    pytest.importorskip("ir_measures")
    from rag_rerank.evaluate import evaluate

    rows = [{"qid": f"q{n}", "query": QUERY, "chunks": make_chunks(100, {60 + n: _TOPICAL[n]}, seed=n)}
            for n in range(2)]
    cands = tmp_path / "c.jsonl"
    cands.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q0 0 d0060 1\nq1 0 d0061 1\n", encoding="utf-8")
    with pytest.raises(InputError, match="window_size"):
        evaluate(cands, qrels, depth=100)
    report = evaluate(cands, qrels, window_size=25, concurrency=1)
    # with window_size, depth defaults to every candidate (up to max_total_chunks)
    assert report.config["depth"] == 1000 and report.config["window_size"] == 25 and not report.failed
    assert report.reranked["MRR@10"] == 1.0 and report.input["MRR@10"] < 0.1


def test_a_framework_component_passes_window_size_through() -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document

    from rag_rerank.integrations.langchain import RagRerankCompressor

    docs = [Document(page_content=c["text"], id=c["id"]) for c in make_chunks(120, {70: _TOPICAL[0]})]
    compressor = RagRerankCompressor(top_n=3, window_size=30)
    assert [d.id for d in compressor.compress_documents(docs, QUERY)] == ["d0070"]
    assert compressor.last_result is not None and compressor.last_result.meta.calls == 5


def test_metadata_options_apply_in_windows() -> None:
    """embed_meta_fields reaches every window's scorer; meta fusion runs in the final post-pass."""
    chunks = make_chunks(90, {10: "the right choice when RAM is short", 70: _TOPICAL[1]})
    for i, c in enumerate(chunks):
        c["meta"] = {"title": "IVF over HNSW for vector search" if i == 10 else "misc", "year": 2000 + i % 20}
    plain = rerank(QUERY, chunks, top_k=3, window_size=30)
    titled = rerank(QUERY, chunks, top_k=3, window_size=30, embed_meta_fields=["title"])
    assert "d0010" not in plain.ids and "d0010" in titled.ids
    fused = rerank(QUERY, chunks, top_k=3, window_size=30, meta_field="year")
    assert_accounted(fused, chunks)
    assert any(n.startswith("meta_fusion:") for n in fused.meta.notes)


def test_window_threads_run_in_the_callers_context() -> None:
    """A service keeps a request id (or a tracing span) in a ContextVar and logs through a filter
    that reads it. The synchronous `rerank` scores windows on a thread pool, whose threads started
    with an empty context: the retry logger's records of a window came out without the request id."""
    import contextvars
    import logging

    from rag_rerank import RetryPolicy

    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
    seen: list[tuple[str, str]] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append((threading.current_thread().name, request_id.get()))

    logger = logging.getLogger("rag_rerank")
    handler, level = Handler(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    def flaky(req: RecordedRequest) -> Reply:  # each window's first answer is a 503, then a valid one
        with lock:
            again = req.prompt in first_prompts
            first_prompts.add(req.prompt)
        return quoting_ranker()(req) if again else Reply.openai_error(503, "busy", type_="server_error")

    lock, first_prompts = threading.Lock(), set[str]()
    token = request_id.set("req-42")
    try:
        with FakeLLM(handler=flaky) as srv:
            rerank(QUERY, make_chunks(60), top_k=3, window_size=20, backend="openai", base_url=srv.openai_url,
                   api_key="x", model="m", policy=RetryPolicy(initial_wait_s=0.0, jitter_s=0.0))
    finally:
        request_id.reset(token)
        logger.removeHandler(handler)
        logger.setLevel(level)
    window_records = [rid for thread, rid in seen if thread.startswith("rag-rerank-window")]
    assert len(window_records) >= 3 and set(window_records) == {"req-42"}
    assert {rid for _, rid in seen} == {"req-42"}


def test_each_window_reports_the_time_its_call_took() -> None:
    """`meta.windows[].latency_ms` was 0.001-0.005 ms for calls that took hundreds: the timer started
    after the answer had arrived. Every answer here takes at least 0.2 s on the server."""
    chunks = make_chunks(25)
    with FakeLLM(handler=quoting_ranker(), latency=0.2) as srv:
        options = {"backend": "openai", "model": "fake-gpt", "base_url": srv.openai_url,
                   "api_key": "sk-x-0123", "window_size": 10}
        for result in (rerank(QUERY, chunks, 3, **options),
                       asyncio.run(arerank(QUERY, chunks, 3, **options))):
            entries = result.meta.windows
            assert [e["stage"] for e in entries] == ["window"] * 3 + ["final"]
            assert all(200.0 <= e["latency_ms"] <= result.meta.latency_ms for e in entries), entries
