"""RerankAPIBackend with the real httpx client over HTTP against a /v1/rerank server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rag_rerank import arerank, arerank_many, rerank
from rag_rerank.backends.rerank_api import RerankAPIBackend, endpoint, map_scores
from rag_rerank.backends.scored import SCORE_DECIMALS
from rag_rerank.cli import main
from rag_rerank.errors import BackendError, FatalFailure, InputError, TransientFailure
from rag_rerank.guard import validate_request
from rag_rerank.guard.output import cites_chunk
from rag_rerank.retry import RetryPolicy
from rag_rerank.skill import load_skill
from rag_rerank.tools import call_tool
from tests.support.fake_llm import FakeLLM, RecordedRequest, Reply

KEY = "sk-rerank-SECRET-0123456789"
_WORD = re.compile(r"\w+")


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RERANK_API_KEY", "RERANK_BASE_URL"):
        monkeypatch.delenv(var, raising=False)


def _overlap_scores(req: RecordedRequest) -> list[float]:
    """What the fake server scores: how many query words a document shares, a third each, at most 1."""
    q = {w.lower() for w in _WORD.findall(req.body["query"])}
    return [min(1.0, len(q & {w.lower() for w in _WORD.findall(d)}) / 3) for d in req.body["documents"]]


def reranker(scale: float = 1.0, shift: float = 0.0) -> Any:
    """A Cohere-shaped answer: results sorted by score, top_n of them, usage and billed units."""

    def handle(req: RecordedRequest) -> Reply:
        scores = [s * scale + shift for s in _overlap_scores(req)]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[: req.body["top_n"]]
        body = {"id": "r1", "results": [{"index": i, "relevance_score": scores[i]} for i in order],
                "usage": {"total_tokens": 42}, "meta": {"billed_units": {"search_units": 1}}}
        return Reply(200, body)

    return handle


def _policy(waits: list[float], **kw: Any) -> RetryPolicy:
    return RetryPolicy(sleep=waits.append, jitter_s=0.0, initial_wait_s=0.01, **kw)


def _example() -> tuple[str, str]:
    ex = load_skill().example("happy-path")
    return ex.query, ex.chunks


@pytest.mark.parametrize("missing", ["httpx", "httpx2"])
def test_works_with_whichever_http_client_the_openai_sdk_brought(missing: str) -> None:
    """Regression: a fresh `pip install rag-rerank` gets today's openai, which depends on httpx2 and
    not httpx; `import httpx` failed and --backend rerank-api was an internal error (exit 4)."""
    other = {"httpx": "httpx2", "httpx2": "httpx"}[missing]
    if importlib.util.find_spec(other) is None:
        pytest.skip(f"{other} is not installed here")
    query, chunks = _example()
    root = Path(__file__).resolve().parent.parent
    with FakeLLM(handler=reranker()) as srv:
        code = (
            "import sys, json\n"
            f"sys.modules[{missing!r}] = None\n"  # import fails as for a package that is not installed
            "from rag_rerank import rerank\n"
            f"r = rerank({query!r}, {chunks!r}, 3, backend='rerank-api', base_url={srv.url + '/v1'!r},\n"
            f"           api_key={KEY!r}, model='m')\n"
            f"print(json.dumps([r.ids, {other!r} in sys.modules]))\n"
        )
        done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr
    ids, used = json.loads(done.stdout)
    assert len(srv.requests) == 1 and ids and used


def test_request_shape_scores_order_reasons_and_usage() -> None:
    query, chunks = _example()
    with FakeLLM(handler=reranker()) as srv:
        result = rerank(query, chunks, 3, 1.0, backend="rerank-api", base_url=f"{srv.url}/v1",
                        api_key=KEY, model="rerank-small")
    (req,) = srv.requests
    assert req.path == "/v1/rerank"
    assert req.headers["authorization"] == f"Bearer {KEY}"
    request = validate_request(query, chunks)
    assert req.body == {"model": "rerank-small", "query": query,
                        "documents": [c.text for c in request.chunks], "top_n": 5}
    expected = _overlap_scores(req)
    by_id = {c.id: round(s, SCORE_DECIMALS) for c, s in zip(request.chunks, expected, strict=True)}
    # lambda 1: plain relevance order, and the score is the server's (already in [0, 1])
    assert [r.id for r in result.ranked] == sorted(
        (cid for cid, s in by_id.items() if s > 0.2), key=lambda cid: -by_id[cid])[:3]
    text = {c.id: c.text for c in request.chunks}
    for r in result.ranked:
        assert r.score == by_id[r.id]
        assert cites_chunk(r.reason, text[r.id]) and "rerank-api" in r.reason
    assert sorted([*result.ids, *(d.id for d in result.dropped)]) == sorted(by_id)
    assert result.meta.backend == "rerank-api" and result.meta.model == "rerank-small"
    assert len(result.ranked) == 3
    assert dict(result.meta.usage) == {"total_tokens": 42, "search_units": 1}


def test_logits_are_mapped_through_the_sigmoid() -> None:
    assert map_scores([0.2, 0.9], "auto") == [0.2, 0.9]
    assert map_scores([-2.0, 0.0, 3.0], "auto") == pytest.approx([0.1192, 0.5, 0.9526], abs=1e-4)
    assert map_scores([0.5, 0.9], "sigmoid") == pytest.approx([0.6225, 0.7109], abs=1e-4)
    assert map_scores([1.5, -0.5], "identity") == [1.0, 0.0]
    query, chunks = _example()
    with FakeLLM(handler=reranker(scale=8.0, shift=-4.0)) as srv:  # llama.cpp-style raw logits
        result = rerank(query, chunks, 5, 1.0, backend="rerank-api", base_url=srv.url)
    raw = [s * 8.0 - 4.0 for s in _overlap_scores(srv.requests[0])]
    assert any(not 0 <= s <= 1 for s in raw)
    ids = [c.id for c in validate_request(query, chunks).chunks]
    mapped = dict(zip(ids, map_scores(raw, "sigmoid"), strict=True))
    for r in result.ranked:
        assert r.score == pytest.approx(mapped[r.id], abs=1e-6)
    assert endpoint("http://h/v1/") == "http://h/v1/rerank" and endpoint("http://h/rerank") == "http://h/rerank"


def test_429_with_retry_after_then_success() -> None:
    query, chunks = _example()
    waits: list[float] = []
    with FakeLLM([Reply(429, {"message": "slow down"}, headers={"Retry-After": "3"})],
                 handler=reranker()) as srv:
        result = rerank(query, chunks, 3, backend="rerank-api", base_url=srv.url, policy=_policy(waits))
    assert waits == [3.0]
    assert result.meta.attempts == 2 and len(srv.requests) == 2
    assert result.ranked


def test_500_is_retried_and_401_fails_fast_without_the_key() -> None:
    query, chunks = _example()
    waits: list[float] = []
    with FakeLLM([Reply(500, "internal error"), Reply(503, "busy")], handler=reranker()) as srv:
        result = rerank(query, chunks, 3, backend="rerank-api", base_url=srv.url, policy=_policy(waits))
    assert result.meta.attempts == 3 and len(waits) == 2
    with FakeLLM([Reply(401, {"message": f"invalid api token {KEY}"})], handler=reranker()) as srv, \
            pytest.raises(BackendError) as err:
        rerank(query, chunks, 3, backend="rerank-api", base_url=srv.url, api_key=KEY, policy=_policy(waits))
    assert len(srv.requests) == 1
    assert [a.kind for a in err.value.attempts] == ["fatal"]
    assert "HTTP 401" in str(err.value) and "RERANK_API_KEY" in str(err.value)
    assert KEY not in str(err.value) and "***" in str(err.value)


def test_a_server_that_does_not_implement_post_fails_at_once() -> None:
    """Regression: a base URL pointing at a static file server (`python -m http.server` answers a
    POST with 501 Not Implemented) was retried six times, as if the server were overloaded."""
    query, chunks = _example()
    waits: list[float] = []
    with FakeLLM([Reply(501, "Unsupported method ('POST')")], handler=reranker()) as srv, \
            pytest.raises(BackendError) as err:
        rerank(query, chunks, 3, backend="rerank-api", base_url=srv.url, policy=_policy(waits))
    assert len(srv.requests) == 1 and waits == []
    assert [a.kind for a in err.value.attempts] == ["fatal"] and "HTTP 501" in str(err.value)


def test_malformed_json_and_bad_indexes_are_fatal_and_named() -> None:
    query, chunks = _example()
    request = validate_request(query, chunks)
    bodies = {
        "not JSON": "<html>Bad gateway</html>",
        "no 'results' list": {"data": []},
        "index 7 is not a document index": {"results": [{"index": 7, "relevance_score": 0.9}]},
        "repeats index 0": {"results": [{"index": 0, "relevance_score": 0.9},
                                        {"index": 0, "relevance_score": 0.8}]},
        "relevance_score 'high' is not a": {"results": [{"index": 0, "relevance_score": "high"}]},
    }
    for message, body in bodies.items():
        with FakeLLM([Reply(200, body)]) as srv:
            backend = RerankAPIBackend(base_url=srv.url)
            with pytest.raises(FatalFailure, match=re.escape(message)):
                backend.complete("", request, max_tokens=0)
    # through the pipeline: one attempt, no retry, and the local fallback still answers
    with FakeLLM([Reply(200, "{not json")]) as srv:
        with pytest.raises(BackendError, match="not JSON") as err:
            rerank(query, chunks, backend="rerank-api", base_url=srv.url)
        assert len(err.value.attempts) == 1
    with FakeLLM([Reply(200, {"results": [{"index": 99, "relevance_score": 1.0}]})]) as srv:
        result = rerank(query, chunks, backend="rerank-api", base_url=srv.url, fallback="local")
    assert result.meta.fallback == "local" and "index 99" in result.meta.notes[0]


def test_timeout_is_transient_and_unreturned_chunks_are_accounted_for() -> None:
    query, chunks = _example()
    request = validate_request(query, chunks)
    with FakeLLM([Reply(200, {"results": []}, delay=1.0)]) as srv:
        backend = RerankAPIBackend(base_url=srv.url, timeout=0.2)
        with pytest.raises(TransientFailure, match="timed out"):
            backend.complete("", request, max_tokens=0)
    # a server that caps top_n: the chunks it did not return are dropped, saying why
    with FakeLLM([Reply(200, {"results": [{"index": 2, "relevance_score": 0.9}]})]) as srv:
        result = rerank(query, chunks, 3, backend="rerank-api", base_url=srv.url)
    assert result.ids == ["c3"]
    assert {d.reason for d in result.dropped} == {"not_selected: not returned by the rerank API"}


def test_long_documents_are_cut_to_max_chars_and_noted() -> None:
    chunks = [{"id": "long", "text": "vector search " * 100}, {"id": "short", "text": "vector index"}]
    with FakeLLM(handler=reranker()) as srv:
        result = rerank("vector search", chunks, backend="rerank-api", base_url=srv.url,
                        backend_options={"max_chars": 50})
    assert [len(d) for d in srv.requests[0].body["documents"]] == [50, 12]
    assert any("1 document cut to max_chars=50" in n for n in result.meta.notes)


def test_async_batch_key_from_the_environment_and_option_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    query, chunks = _example()
    monkeypatch.setenv("RERANK_API_KEY", KEY)
    with FakeLLM(handler=reranker()) as srv:
        monkeypatch.setenv("RERANK_BASE_URL", srv.url)
        one = asyncio.run(arerank(query, chunks, 3, backend="rerank-api"))
        many = asyncio.run(arerank_many([{"query": query, "chunks": chunks, "top_k": 3}] * 3,
                                        backend="rerank-api", concurrency=2))
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in srv.requests)
    assert len(srv.requests) == 4
    assert all(m.to_dict() == one.to_dict() for m in many)
    monkeypatch.delenv("RERANK_BASE_URL")
    with pytest.raises(InputError, match="needs the server's URL"):
        rerank(query, chunks, backend="rerank-api")
    with pytest.raises(InputError) as err:
        rerank(query, chunks, backend="rerank-api", base_url="http://127.0.0.1:1",
               backend_options={"score_mapping": "tanh", "batch_size": 2})
    text = str(err.value)
    assert "backend_options.batch_size" in text and "takes no option" in text
    with pytest.raises(InputError, match="score_mapping"):
        RerankAPIBackend(base_url="http://127.0.0.1:1", score_mapping="tanh")


def test_cli_and_call_tool(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    query, chunks = _example()
    path = tmp_path / "chunks.jsonl"
    path.write_text(chunks, encoding="utf-8")
    with FakeLLM(handler=reranker()) as srv:
        code = main(["rerank", "-q", query, "-c", str(path), "-k", "2", "--backend", "rerank-api",
                     "--base-url", f"{srv.url}/v1", "--model", "m"])
        out = json.loads(capsys.readouterr().out)
        tool = call_tool({"query": query, "chunks": [json.loads(x) for x in chunks.splitlines() if x],
                          "top_k": 2}, backend="rerank-api", base_url=srv.url)
    assert code == 0 and len(out["ranked"]) == 2
    assert tool == out
    assert srv.requests[0].body["model"] == "m"
    assert main(["rerank", "-q", query, "-c", str(path), "--backend", "rerank-api", "--batch-size", "2",
                 "--base-url", "http://127.0.0.1:1"]) == 2
    assert "--batch-size applies to --backend cross-encoder only" in capsys.readouterr().err


def test_eval_measures_the_rerank_api_order(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ir_measures")  # the eval extra
    cands = tmp_path / "c.jsonl"
    # input order puts the judged-relevant chunk last; the server's scores put it first
    cands.write_text(json.dumps({"qid": "1", "query": "ivf memory savings", "chunks": [
        {"id": "b", "text": "HNSW is a graph"}, {"id": "a", "text": "IVF memory savings explained"}]}) + "\n",
        encoding="utf-8")
    qrels = tmp_path / "q.txt"
    qrels.write_text("1 0 a 1\n", encoding="utf-8")
    with FakeLLM(handler=reranker()) as srv:
        code = main(["eval", "--candidates", str(cands), "--qrels", str(qrels), "--no-progress", "--json",
                     "--backend", "rerank-api", "--base-url", srv.url])
    assert code == 0 and len(srv.requests) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["info"]["backend"] == "rerank-api" and report["info"]["failed"] == {}
    assert report["input"]["MRR@10"] == 0.5 and report["reranked"]["MRR@10"] == 1.0


def test_no_url_and_no_key_are_both_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: with neither a base URL nor a key, only the key was reported; fixing it led to a
    # second run that reported the URL. Every violation is collected, the options' too.
    monkeypatch.delenv("RERANK_BASE_URL", raising=False)
    monkeypatch.delenv("RERANK_API_KEY", raising=False)
    query, chunks = _example()
    with pytest.raises(InputError) as err:
        rerank(query, chunks, backend="rerank-api")
    assert [v.path for v in err.value.violations] == ["base_url", "api_key"]
    assert "RERANK_BASE_URL" in str(err.value) and "RERANK_API_KEY" in str(err.value)
    with pytest.raises(InputError) as err:
        RerankAPIBackend(score_mapping="tanh")
    assert [v.path for v in err.value.violations] == ["score_mapping", "base_url", "api_key"]
    monkeypatch.setenv("RERANK_API_KEY", KEY)  # a key but no URL: only the URL is missing
    with pytest.raises(InputError) as err:
        rerank(query, chunks, backend="rerank-api")
    assert [v.path for v in err.value.violations] == ["base_url"]
