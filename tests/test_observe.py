"""Spans and log lines (rag_rerank/observe.py), read from the engine's record of each rerank.

With the OpenTelemetry SDK's in-memory exporter: the span tree and the attributes of a plain call,
a re-ask, a repair, windows with one failing window, a consistency run, a cache hit and a fallback
chain; the real OpenAI SDK talks HTTP to the fake server on 127.0.0.1. Then: no span and no import
of opentelemetry without it (subprocesses), the OTLP/HTTP exporter end to end into a receiver on
127.0.0.1, and no chunk text or key in any exported attribute or log record unless opted in.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from rag_rerank import (
    BackendError,
    BudgetError,
    Reranker,
    ResponseCache,
    RetryPolicy,
    arerank,
    make_backend,
    observe,
    rerank,
)
from rag_rerank.observe import SPAN_CACHE_HIT, SPAN_FINAL, SPAN_PASS, SPAN_RERANK, SPAN_WINDOW
from tests.support.fake_llm import FakeLLM, RecordedRequest, Reply
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.quoting_ranker import answer_for, quoting_ranker

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-observe-test-0123456789abcdef"
# Text no attribute or log line may carry unless the caller opts in.
SECRET_TEXT = "quokkamarmalade"
QUERY = "When does IVF beat HNSW for index memory?"
CHUNKS = [{"id": f"c{i}", "text": f"IVF partitions vectors into cells; {SECRET_TEXT} note {i} on HNSW memory"}
          for i in range(6)]
MANY = [{"id": f"w{i:02d}", "text": f"IVF and HNSW memory trade-off {SECRET_TEXT} number {i}"}
        for i in range(24)]

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider (set once; OpenTelemetry allows one) exporting to memory."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    if not getattr(provider, "_rag_rerank_test", False):
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        provider._rag_rerank_test = True  # type: ignore[attr-defined]
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()
    observe.capture_content(None)


def _tree(finished: Any) -> tuple[Any, ...]:
    """(name, [children...]) of the one rerank span, children in start order."""
    by_parent: dict[int | None, list[Any]] = {}
    for s in finished:
        by_parent.setdefault(s.parent.span_id if s.parent else None, []).append(s)

    def node(s: Any) -> tuple[Any, ...]:
        kids = sorted(by_parent.get(s.context.span_id, []), key=lambda k: (k.start_time, k.name))
        return (s.name, [node(k) for k in kids])

    (root,) = by_parent[None]
    return node(root)


def _named(finished: Any, name: str) -> list[Any]:
    return [s for s in finished if s.name == name]


def _root(finished: Any) -> Any:
    (root,) = _named(finished, SPAN_RERANK)
    return root


def _openai(srv: FakeLLM, **kw: Any) -> dict[str, Any]:
    return {"backend": "openai", "base_url": srv.openai_url, "api_key": KEY, "model": "m", **kw}


# --------------------------------------------------------------------------- the span trees


def test_a_plain_call(spans: InMemorySpanExporter) -> None:
    with FakeLLM(handler=quoting_ranker()) as srv:
        result = rerank(QUERY, CHUNKS, top_k=2, **_openai(srv))
    finished = spans.get_finished_spans()
    assert _tree(finished) == (SPAN_RERANK, [("chat m", [])])
    root, (request,) = _root(finished), _named(finished, "chat m")
    assert dict(root.attributes) == {
        "rag_rerank.backend": "openai", "rag_rerank.model": "fake-gpt", "rag_rerank.status": "ok",
        "rag_rerank.calls": 1, "rag_rerank.attempts": 1, "rag_rerank.reasks": 0, "rag_rerank.repairs": 0,
        "rag_rerank.candidates": 6, "rag_rerank.top_k": 2, "rag_rerank.lambda": 0.7,
        "rag_rerank.ranked": len(result.ranked), "rag_rerank.dropped": len(result.dropped),
        "gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 20}
    assert request.kind == SpanKind.CLIENT and request.status.status_code == StatusCode.UNSET
    assert dict(request.attributes) == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "m",
        "gen_ai.response.model": "fake-gpt", "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.output_tokens": 20, "gen_ai.response.finish_reasons": ("stop",),
        "rag_rerank.stage": "call", "rag_rerank.scorer": "openai", "rag_rerank.role": "primary",
        "rag_rerank.attempt": 1, "rag_rerank.attempt.kind": "ok"}
    assert root.start_time <= request.start_time <= request.end_time <= root.end_time
    assert result.meta.status == "ok"


def test_arerank_writes_the_same_tree(spans: InMemorySpanExporter) -> None:
    with FakeLLM(handler=quoting_ranker()) as srv:
        asyncio.run(arerank(QUERY, CHUNKS, top_k=2, **_openai(srv)))
    assert _tree(spans.get_finished_spans()) == (SPAN_RERANK, [("chat m", [])])


def test_a_reask(spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture) -> None:
    with FakeLLM([Reply.openai_text("I would rank c0 first.")], handler=quoting_ranker()) as srv, \
            caplog.at_level(logging.WARNING, logger="rag_rerank"):
        result = rerank(QUERY, CHUNKS, top_k=2, **_openai(srv))
    finished = spans.get_finished_spans()
    assert _tree(finished) == (SPAN_RERANK, [("chat m", []), ("chat m", [])])
    first, second = sorted(_named(finished, "chat m"), key=lambda s: s.start_time)
    assert first.attributes["rag_rerank.attempt.kind"] == "invalid_output"
    assert first.attributes["error.type"] == "invalid_output"
    assert first.status.status_code == StatusCode.ERROR
    assert second.attributes["rag_rerank.reask"] is True and second.attributes["rag_rerank.attempt"] == 2
    root = _root(finished)
    assert root.attributes["rag_rerank.status"] == "reasked" == result.meta.status
    assert root.attributes["rag_rerank.reasks"] == 1 and root.attributes["rag_rerank.attempts"] == 2
    assert [r.getMessage() for r in caplog.records] == [
        "openai re-asked 1 time for the call: the output guard refused its answer"]


def test_a_repair(spans: InMemorySpanExporter) -> None:
    def fenced(req: RecordedRequest) -> Reply:
        return Reply.openai_text("```json\n" + json.dumps(answer_for(req.prompt)) + "\n```")

    with FakeLLM([fenced]) as srv:
        result = rerank(QUERY, CHUNKS, top_k=2, **_openai(srv))
    finished = spans.get_finished_spans()
    assert _tree(finished) == (SPAN_RERANK, [("chat m", [])])
    (request,) = _named(finished, "chat m")
    assert request.attributes["rag_rerank.repairs.applied"] == 1
    root = _root(finished)
    assert root.attributes["rag_rerank.status"] == "repaired" == result.meta.status
    assert root.attributes["rag_rerank.repairs"] == 1


def test_windows_with_one_failing_window(spans: InMemorySpanExporter) -> None:
    """Three windows and a final pass, one request at a time; the second request (window 2) is
    refused (401): the fallback chain's "input" step answers that window alone."""
    seen: list[int] = []
    ranker = quoting_ranker()

    def answer(req: RecordedRequest) -> Reply:
        seen.append(1)
        return Reply.openai_error(401, "invalid api key") if len(seen) == 2 else ranker(req)

    with FakeLLM(handler=answer) as srv:
        result = rerank(QUERY, MANY, top_k=3, window_size=10, concurrency=1, fallback=["input"],
                        **_openai(srv))
    finished = spans.get_finished_spans()
    assert _tree(finished) == (SPAN_RERANK, [
        (SPAN_WINDOW, [("chat m", [])]),
        (SPAN_WINDOW, [("chat m", []), ("rerank first-stage-order", [])]),
        (SPAN_WINDOW, [("chat m", [])]),
        (SPAN_FINAL, [("chat m", [])])])
    windows = sorted(_named(finished, SPAN_WINDOW), key=lambda s: s.attributes["rag_rerank.window.index"])
    assert [dict(w.attributes) for w in windows] == [
        {"rag_rerank.window.index": 1, "rag_rerank.window.size": 10},
        {"rag_rerank.window.index": 2, "rag_rerank.window.size": 10,
         "rag_rerank.fallback.steps": ("openai", "input"), "rag_rerank.fallback": "input"},
        {"rag_rerank.window.index": 3, "rag_rerank.window.size": 4}]
    failed = next(s for s in finished if s.name == "chat m" and s.status.status_code == StatusCode.ERROR)
    assert failed.attributes["error.type"] == "401" and failed.attributes["rag_rerank.window.index"] == 2
    (step,) = _named(finished, "rerank first-stage-order")
    assert step.attributes["rag_rerank.role"] == "fallback"
    assert step.attributes["gen_ai.provider.name"] == "input"
    root = _root(finished)
    assert root.attributes["rag_rerank.status"] == "partial" == result.meta.status
    assert root.attributes["rag_rerank.fallback"] == "input" == result.meta.fallback
    assert root.attributes["rag_rerank.fallback.reason"] == "openai failed in 1 of 4 calls (fatal: 401)"
    assert root.attributes["rag_rerank.windows"] == 3 and root.attributes["rag_rerank.calls"] == 4
    assert [w["fallback"] for w in result.meta.windows] == [None, "input", None, None]


def test_a_consistency_run(spans: InMemorySpanExporter) -> None:
    with FakeLLM(handler=quoting_ranker()) as srv:
        result = rerank(QUERY, CHUNKS, top_k=2, consistency=2, **_openai(srv))
    finished = spans.get_finished_spans()
    assert _tree(finished) == (SPAN_RERANK, [(SPAN_PASS, [("chat m", [])]), (SPAN_PASS, [("chat m", [])])])
    assert sorted(s.attributes["rag_rerank.pass.index"] for s in _named(finished, SPAN_PASS)) == [0, 1]
    assert sorted(s.attributes["rag_rerank.pass.index"] for s in _named(finished, "chat m")) == [0, 1]
    root = _root(finished)
    assert root.attributes["rag_rerank.consistency.passes"] == 2
    assert root.attributes["rag_rerank.consistency.agreement"] == result.meta.consistency["agreement"]
    assert root.attributes["rag_rerank.calls"] == 2


def test_a_cache_hit(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    with FakeLLM(handler=quoting_ranker()) as srv, \
            Reranker(cache=ResponseCache(tmp_path), **_openai(srv)) as rr:
        rr.rerank(QUERY, CHUNKS, top_k=2)
        spans.clear()
        result = rr.rerank(QUERY, CHUNKS, top_k=2)
    finished = spans.get_finished_spans()
    assert _tree(finished) == (SPAN_RERANK, [(SPAN_CACHE_HIT, [])])
    (hit,) = _named(finished, SPAN_CACHE_HIT)
    assert dict(hit.attributes) == {"rag_rerank.stage": "call", "rag_rerank.scorer": "openai",
                                    "rag_rerank.role": "primary", "rag_rerank.cached": True,
                                    "gen_ai.request.model": "m"}
    root = _root(finished)
    assert root.attributes["rag_rerank.cache.hits"] == 1 and root.attributes["rag_rerank.status"] == "ok"
    assert result.to_cohere()["meta"]["billed_units"] == {"search_units": 1, "input_tokens": 0,
                                                          "output_tokens": 0}
    assert result.to_cohere()["meta"]["tokens"] == {"input_tokens": 100, "output_tokens": 20}


def test_a_fallback_chain(spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture) -> None:
    """The session's backend fails, the first step (another server, the caller's backend instance)
    fails too, the last resort ("input") answers: each step a span and an entry of meta."""
    refuse = [Reply.openai_error(401, "invalid api key")]
    with FakeLLM(refuse) as srv, FakeLLM([Reply.openai_error(503, "overloaded")] * 9) as other, \
            caplog.at_level(logging.WARNING, logger="rag_rerank"):
        backup = make_backend("openai", base_url=other.openai_url, api_key="sk-other", model="m2")
        policy = RetryPolicy(max_attempts=2, initial_wait_s=0, jitter_s=0)
        result = rerank(QUERY, CHUNKS, top_k=2, fallback=[backup, "input"], policy=policy, **_openai(srv))
    finished = spans.get_finished_spans()
    assert _tree(finished) == (SPAN_RERANK, [("chat m", []), ("chat m2", []), ("chat m2", []),
                                             ("rerank first-stage-order", [])])
    roles = [(s.name, s.attributes["rag_rerank.role"], s.attributes.get("error.type"))
             for s in sorted(finished, key=lambda s: s.start_time) if s.name != SPAN_RERANK]
    assert roles == [("chat m", "primary", "401"), ("chat m2", "fallback", "503"),
                     ("chat m2", "fallback", "503"), ("rerank first-stage-order", "fallback", None)]
    assert result.meta.status == "fallback" and result.meta.fallback == "input"
    assert result.meta.fallback_steps == ({"stage": "call", "index": 1, "steps": [
        {"scorer": "openai", "ok": False, "error": "fatal: 401"},
        {"scorer": "openai", "ok": False, "error": "transient: 503"},
        {"scorer": "input", "ok": True}]},)
    assert [r.getMessage() for r in caplog.records] == [
        "openai failed for the call (fatal: 401); fallback openai failed too (transient: 503)",
        "openai failed for the call (fatal: 401); fallback input answered"]
    assert [c["id"] for c in CHUNKS[:2]] == result.ids  # the first-stage order


def test_a_failure_and_a_budget_refusal_mark_the_rerank_span(spans: InMemorySpanExporter,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    with FakeLLM([Reply.openai_error(401, "invalid api key")]) as srv, pytest.raises(BackendError):
        rerank(QUERY, CHUNKS, top_k=2, **_openai(srv))
    finished = spans.get_finished_spans()
    assert _tree(finished) == (SPAN_RERANK, [("chat m", [])])
    root = _root(finished)
    assert root.status.status_code == StatusCode.ERROR and root.attributes["error.type"] == "BackendError"
    assert _named(finished, "chat m")[0].attributes["error.type"] == "401"
    spans.clear()
    with caplog.at_level(logging.WARNING, logger="rag_rerank"), pytest.raises(BudgetError):
        rerank(QUERY, CHUNKS, top_k=2, backend="openai", base_url="http://127.0.0.1:9/v1", api_key=KEY,
               model="m", budget={"max_calls": 0})
    root = _root(spans.get_finished_spans())
    assert root.attributes["rag_rerank.budget.refused"] is True
    assert root.attributes["error.type"] == "BudgetError"
    assert "the budget refused the rerank before any request" in caplog.text


def test_a_reask_the_budget_refuses(spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture) -> None:
    """max_calls=1: the first request is sent, its answer refused by the guard, and the re-ask is
    not sent: a WARNING, the request span, and the rerank span marked as refused; with the chain,
    the input step answers and the record keeps the refusal."""
    with FakeLLM([Reply.openai_text("c1 is best")] * 2) as srv, \
            caplog.at_level(logging.WARNING, logger="rag_rerank"), pytest.raises(BackendError) as err:
        rerank(QUERY, CHUNKS, top_k=2, budget={"max_calls": 1}, **_openai(srv))
    assert err.value.refused
    root = _root(spans.get_finished_spans())
    assert root.attributes["rag_rerank.budget.refused"] is True
    assert _tree(spans.get_finished_spans()) == (SPAN_RERANK, [("chat m", []), ("chat m", [])])
    assert "openai: the budget refused a request for the call; none was sent" in caplog.text
    spans.clear()
    with FakeLLM([Reply.openai_text("c1 is best")] * 2) as srv:
        result = rerank(QUERY, CHUNKS, top_k=2, budget={"max_calls": 1}, fallback=["input"], **_openai(srv))
    assert result.meta.fallback_reason == "openai failed (budget refused)"
    assert result.meta.records[0].refused and result.meta.status == "fallback"


# --------------------------------------------------------------------------- text and keys


def _everything(finished: Any, records: list[logging.LogRecord]) -> str:
    parts = []
    for s in finished:
        parts.append(s.name)
        parts.extend(f"{k}={v!r}" for k, v in (s.attributes or {}).items())
        parts.extend(repr(e.attributes) for e in s.events)
        parts.append(repr(s.status.description))
    for r in records:
        parts.append(r.getMessage())
        parts.append(repr(r.__dict__))
    return "\n".join(parts)


def _scenarios(srv: FakeLLM) -> None:
    rerank(QUERY, CHUNKS, top_k=2, **_openai(srv))
    rerank(QUERY, MANY, top_k=3, window_size=10, fallback="local", **_openai(srv))
    rerank(QUERY, CHUNKS, top_k=2, consistency=2, **_openai(srv))
    with pytest.raises(BackendError):
        rerank(QUERY, CHUNKS, top_k=2, **_openai(srv, base_url="http://127.0.0.1:9/v1"))


def test_no_chunk_text_query_or_key_in_spans_or_logs(spans: InMemorySpanExporter,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Every exported attribute, event and status, every log record at DEBUG (its message and its
    `extra`), for calls that answer, re-ask, fail with the key echoed back, and fall back."""
    # the first call: an answer that only echoes (re-asked), a 500 echoing the key (retried), a valid
    # answer; the windows' first request: a 401 echoing both (the local fallback answers that window)
    echo: list[Reply | None] = [Reply.openai_text(f"{SECRET_TEXT} {KEY}"),
                                Reply.openai_error(500, f"bad key {KEY} {SECRET_TEXT}"), None,
                                Reply.openai_error(401, f"bad key {KEY} {SECRET_TEXT}")]
    ranker = quoting_ranker()

    def answer(req: RecordedRequest) -> Reply:
        reply = echo.pop(0) if echo else None
        return reply if reply is not None else ranker(req)

    with FakeLLM(handler=answer) as srv, caplog.at_level(logging.DEBUG, logger="rag_rerank"):
        _scenarios(srv)
    finished = spans.get_finished_spans()
    text = _everything(finished, caplog.records)
    assert len(finished) > 10 and len(caplog.records) > 10
    assert "invalid_output" in text and "rerank local-fusion" in text  # the scenarios did happen
    for secret in (SECRET_TEXT, KEY, QUERY, "IVF partitions"):
        assert secret not in text, secret


def test_content_is_recorded_only_when_opted_in(spans: InMemorySpanExporter) -> None:
    observe.capture_content(True)
    with FakeLLM(handler=quoting_ranker()) as srv:
        result = rerank(QUERY, CHUNKS, top_k=2, **_openai(srv))
    root = _root(spans.get_finished_spans())
    attrs = dict(root.attributes)
    assert attrs["openinference.span.kind"] == "RERANKER" and attrs["reranker.query"] == QUERY
    assert attrs["reranker.top_k"] == 2 and attrs["reranker.model_name"] == "fake-gpt"
    assert [attrs[f"reranker.input_documents.{i}.document.id"] for i in range(6)] == [c["id"] for c in CHUNKS]
    assert attrs["reranker.input_documents.3.document.content"] == CHUNKS[3]["text"]
    assert attrs["reranker.output_documents.0.document.id"] == result.ids[0]
    assert attrs["reranker.output_documents.0.document.score"] == result.ranked[0].score
    assert KEY not in _everything(spans.get_finished_spans(), [])
    observe.capture_content(None)
    os.environ[observe.CAPTURE_ENV] = "true"
    try:
        assert observe.capturing()
    finally:
        del os.environ[observe.CAPTURE_ENV]
    assert not observe.capturing()


# --------------------------------------------------------------------------- without OpenTelemetry


def _python(*parts: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "\n".join(textwrap.dedent(p) for p in parts)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          cwd=ROOT)


_RERANKS = """
    from rag_rerank import rerank
    chunks = [{"id": f"c{i}", "text": f"IVF partitions vectors, note {i}"} for i in range(30)]
    statuses = [rerank("IVF memory?", chunks[:5], top_k=2).meta.status,
                rerank("IVF memory?", chunks, top_k=2, window_size=10).meta.status,
                rerank("IVF memory?", chunks[:5], top_k=2, consistency=2).meta.status]
"""


def test_no_import_and_no_span_when_opentelemetry_is_absent() -> None:
    """With every `opentelemetry` module unimportable, reranks work and nothing tries to import it."""
    done = _python("""
        import sys
        tried = []
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "opentelemetry":
                    tried.append(name)
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
    """, _RERANKS, """
        from rag_rerank import observe
        print(statuses, tried, observe.tracer())
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['ok', 'ok', 'ok'] [] None"


def test_installed_but_unused_opentelemetry_is_never_imported() -> None:
    done = _python(_RERANKS, """
        import sys
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_api_without_a_provider_writes_nothing() -> None:
    """The application imported the API but set no provider: no tracer, no SDK imported."""
    done = _python("""
        import opentelemetry.trace
    """, _RERANKS, """
        import sys
        from rag_rerank import observe
        print(observe.tracer(), "opentelemetry.sdk" in sys.modules, statuses)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None False ['ok', 'ok', 'ok']"


def test_without_a_tracer_a_failure_is_logged_and_raised_as_it_was() -> None:
    """No tracer: the observation (a plain `__enter__` / `__exit__`) still tells the log of a failed
    rerank and lets the very exception through, and a later rerank in the same session works."""
    done = _python("""
        import logging, io
        from rag_rerank import Reranker, observe
        from rag_rerank.errors import BudgetError
        out = io.StringIO()
        logging.getLogger("rag_rerank").addHandler(logging.StreamHandler(out))
        logging.getLogger("rag_rerank").setLevel(logging.WARNING)
        chunks = [{"id": f"c{i}", "text": f"IVF partitions vectors, note {i}"} for i in range(5)]
        session = Reranker("openai", base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
        try:
            session.rerank("IVF memory?", chunks, top_k=2, budget={"max_calls": 0})
        except BudgetError as exc:
            caught = type(exc).__name__
        ok = Reranker("local").rerank("IVF memory?", chunks, top_k=2).meta.status
        logged = "the budget refused the rerank before any request" in out.getvalue()
        print(observe.tracer(), caught, ok, logged)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None BudgetError ok True"


# --------------------------------------------------------------------------- OTLP over HTTP


def test_spans_reach_an_otlp_http_receiver_whole() -> None:
    """The SDK's OTLP/HTTP exporter, batched, sends a windowed rerank with a fallback to a receiver
    on 127.0.0.1; the protobuf decodes to the same tree with every attribute."""
    with OtlpReceiver() as rx:
        done = _python(f"""
            from opentelemetry import trace
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            provider = TracerProvider(resource=Resource.create({{"service.name": "rag-rerank-test"}}))
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint={rx.endpoint!r})))
            trace.set_tracer_provider(provider)
            from rag_rerank import rerank
            chunks = [{{"id": f"c{{i}}", "text": f"IVF partitions vectors, note {{i}}"}} for i in range(30)]
            result = rerank("IVF memory?", chunks, top_k=2, window_size=10, fallback=["input"])
            provider.shutdown()
            print(result.meta.status)
        """)
        assert done.returncode == 0, done.stderr
    got = rx.spans
    assert done.stdout.strip() == "ok"
    assert sorted(s["name"] for s in got) == sorted(
        [SPAN_RERANK, *[SPAN_WINDOW] * 3, SPAN_FINAL, *["rerank local-fusion:static"] * 4])
    assert len({s["trace_id"] for s in got}) == 1
    ids = {s["span_id"]: s for s in got}
    (root,) = [s for s in got if s["parent_span_id"] is None]
    for s in got:
        if s is not root:
            parent = ids[s["parent_span_id"]]  # every parent arrived
            assert parent["start"] <= s["start"] <= s["end"] <= parent["end"] or parent is root
    assert root["attributes"]["rag_rerank.status"] == "ok"
    assert root["attributes"]["rag_rerank.candidates"] == 30 and root["attributes"]["rag_rerank.windows"] == 3
    assert root["resource"]["service.name"] == "rag-rerank-test" and root["scope"] == "rag_rerank"
    requests = [s for s in got if s["name"].startswith("rerank ")]
    assert {s["attributes"]["gen_ai.provider.name"] for s in requests} == {"local"}
    assert sorted(s["attributes"].get("rag_rerank.window.index") for s in requests) == [1, 2, 3, 4]
