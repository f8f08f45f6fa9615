"""Spans and log lines of a rerank: views of the one record the engine writes (`RunMeta.records`).

The engine already decides every call, re-ask, repair, fallback step and cache hit, and writes
each call down as a `CallRecord` (with its requests, `errors.Attempt`, timed); `meta.status` is
derived from that record (`models.RunMeta.status`). This module reads the same record once a
rerank is over and turns it into

* **OpenTelemetry spans**, when the application has set a tracer provider: one `rag_rerank.rerank`
  span per rerank (opened by the driver, `session.py`, so that HTTP client spans made meanwhile
  nest under it), and under it one span per consistency pass, window and final pass, and one per
  request to a scorer (the LLM requests carry the GenAI semantic conventions' attributes). The
  child spans are written afterwards with the times the record holds.
* **log lines** under the `rag_rerank` logger: one DEBUG line per request, a WARNING per re-ask,
  repair, fallback and budget refusal; each with the span's facts in `extra={"rag_rerank": ...}`.
  Silent unless the application configures logging (the package adds a `NullHandler`).

Neither carries a key, the query or any chunk text: only counts, names, kinds and numbers. The
OpenInference reranker attributes (`reranker.query`, the documents with their text) are added to
the rerank span only when the caller opts in (`capture_content(True)`, or the GenAI conventions'
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`).

**No cost without OpenTelemetry.** This module never imports `opentelemetry` itself: tracing is on
only when the application has imported it and set a real tracer provider (not the API's default
proxy or no-op one). Without that, a rerank pays one dictionary lookup and the log level checks.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import Attempt, BackendError, BudgetError
from .models import CallRecord, RerankRequest, RerankResult, RunMeta, usage_tokens

log = logging.getLogger("rag_rerank.rerank")

# --------------------------------------------------------------------------- names, declared once

TRACER_NAME = "rag_rerank"

SPAN_RERANK = "rag_rerank.rerank"
SPAN_PASS = "rag_rerank.pass"  # one consistency pass (`consistency=k`)
SPAN_WINDOW = "rag_rerank.window"
SPAN_FINAL = "rag_rerank.final_pass"
SPAN_CACHE_HIT = "rag_rerank.cache_hit"  # a call the response cache answered: no request was made
# A request to a scorer is named as the GenAI conventions say: "{operation} {model}" ("chat gpt-4o").


class GenAI:
    """Attribute names of the OpenTelemetry GenAI semantic conventions, on each request span."""

    OPERATION = "gen_ai.operation.name"
    PROVIDER = "gen_ai.provider.name"
    REQUEST_MODEL = "gen_ai.request.model"
    RESPONSE_MODEL = "gen_ai.response.model"
    INPUT_TOKENS = "gen_ai.usage.input_tokens"
    OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
    FINISH_REASONS = "gen_ai.response.finish_reasons"
    ERROR_TYPE = "error.type"


class Attr:
    """rag-rerank's own facts, all under the `rag_rerank.` namespace (docs/observability.md)."""

    # the rerank span
    BACKEND = "rag_rerank.backend"
    MODEL = "rag_rerank.model"
    CANDIDATES = "rag_rerank.candidates"
    TOP_K = "rag_rerank.top_k"
    LAMBDA = "rag_rerank.lambda"
    RANKED = "rag_rerank.ranked"
    DROPPED = "rag_rerank.dropped"
    CALLS = "rag_rerank.calls"
    ATTEMPTS = "rag_rerank.attempts"
    CACHE_HITS = "rag_rerank.cache.hits"
    REASKS = "rag_rerank.reasks"
    REPAIRS = "rag_rerank.repairs"
    FALLBACK = "rag_rerank.fallback"
    FALLBACK_REASON = "rag_rerank.fallback.reason"
    EMBEDDER_FALLBACK = "rag_rerank.embedder.fallback"
    STATUS = "rag_rerank.status"
    WINDOWS = "rag_rerank.windows"
    PASSES = "rag_rerank.consistency.passes"
    AGREEMENT = "rag_rerank.consistency.agreement"
    # a pass, window or final pass span
    PASS = "rag_rerank.pass.index"
    WINDOW = "rag_rerank.window.index"
    SIZE = "rag_rerank.window.size"
    STEPS = "rag_rerank.fallback.steps"  # the scorers tried for this call, in order ("openai", "local")
    # a request span
    STAGE = "rag_rerank.stage"  # "call", "window" or "final"
    SCORER = "rag_rerank.scorer"
    ROLE = "rag_rerank.role"  # "primary" (the session's backend) or "fallback" (a step of the chain)
    ATTEMPT = "rag_rerank.attempt"
    ATTEMPT_KIND = "rag_rerank.attempt.kind"  # ok, transient, invalid_output, truncated, fatal
    REASK = "rag_rerank.reask"  # this request re-asked after the guard refused the one before
    REPAIRED = "rag_rerank.repairs.applied"
    CACHED = "rag_rerank.cached"
    REFUSED = "rag_rerank.budget.refused"


class OpenInference:
    """The OpenInference reranker attributes (Arize Phoenix), set only with content capture on."""

    SPAN_KIND = "openinference.span.kind"
    RERANKER = "RERANKER"
    QUERY = "reranker.query"
    MODEL_NAME = "reranker.model_name"
    TOP_K = "reranker.top_k"
    INPUT_DOCUMENTS = "reranker.input_documents"
    OUTPUT_DOCUMENTS = "reranker.output_documents"
    DOCUMENT_ID = "document.id"
    DOCUMENT_CONTENT = "document.content"
    DOCUMENT_SCORE = "document.score"


# Providers the GenAI conventions name; any other scorer is named as rag-rerank names it.
_PROVIDERS = {"openai": "openai", "anthropic": "anthropic"}
_CHAT = frozenset(_PROVIDERS)
CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_capture: bool | None = None


def capture_content(on: bool | None) -> None:
    """Record the query and the chunks (id, text, score) on rerank spans as OpenInference's reranker
    attributes (`True`), never (`False`), or as `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`
    says (`None`, the default: off unless it is `true`). Keys are never recorded."""
    global _capture
    _capture = on


def capturing() -> bool:
    """Whether spans carry the query and chunk text (`capture_content`)."""
    if _capture is not None:
        return _capture
    return os.environ.get(CAPTURE_ENV, "").strip().lower() == "true"


def tracer() -> Any:
    """The tracer to write spans with, or None: OpenTelemetry not imported by the application, or no
    tracer provider set (the API's default proxy / no-op provider). Never imports it."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    from . import __version__

    return provider.get_tracer(TRACER_NAME, __version__)


# --------------------------------------------------------------------------- the facts


def _op(scorer: str) -> str:
    return "chat" if scorer in _CHAT else "rerank"


def request_facts(record: CallRecord, attempt: Attempt) -> dict[str, Any]:
    """The attributes of one request's span, and its log line's facts."""
    prompt, completion = usage_tokens(attempt.usage)
    facts: dict[str, Any] = {
        GenAI.OPERATION: _op(record.scorer),
        GenAI.PROVIDER: _PROVIDERS.get(record.scorer, record.scorer),
        Attr.STAGE: record.stage, Attr.SCORER: record.scorer, Attr.ROLE: record.role,
        Attr.ATTEMPT: attempt.number, Attr.ATTEMPT_KIND: attempt.kind,
    }
    if record.model:
        facts[GenAI.REQUEST_MODEL] = record.model
    if attempt.model:
        facts[GenAI.RESPONSE_MODEL] = attempt.model
    if attempt.usage:
        facts[GenAI.INPUT_TOKENS], facts[GenAI.OUTPUT_TOKENS] = prompt, completion
    if attempt.finish_reason:
        facts[GenAI.FINISH_REASONS] = (attempt.finish_reason,)
    if attempt.kind != "ok":
        facts[GenAI.ERROR_TYPE] = attempt.error_type or attempt.kind
    if record.stage != "call":
        facts[Attr.WINDOW] = record.index
    if record.pass_index is not None:
        facts[Attr.PASS] = record.pass_index
    previous = record.attempts[attempt.number - 2] if attempt.number > 1 else None
    if previous is not None and previous.kind == "invalid_output":
        facts[Attr.REASK] = True
    if attempt.kind == "ok" and record.repairs:
        facts[Attr.REPAIRED] = len(record.repairs)
    return facts


def rerank_facts(meta: RunMeta, result: RerankResult | None = None,
                 request: RerankRequest | None = None) -> dict[str, Any]:
    """The attributes of the rerank span: the request's shape and every count `meta` holds."""
    facts: dict[str, Any] = {Attr.BACKEND: meta.backend, Attr.STATUS: meta.status, Attr.CALLS: meta.calls,
                             Attr.ATTEMPTS: meta.attempts, Attr.REASKS: meta.reasks,
                             Attr.REPAIRS: len(meta.repairs)}
    if meta.model:
        facts[Attr.MODEL] = meta.model
    if request is not None:
        facts.update({Attr.CANDIDATES: len(request.chunks), Attr.TOP_K: request.top_k,
                      Attr.LAMBDA: request.lambda_})
    if result is not None:
        facts.update({Attr.RANKED: len(result.ranked), Attr.DROPPED: len(result.dropped)})
    if meta.cache is not None:
        facts[Attr.CACHE_HITS] = int(meta.cache.get("hits", 0))
    if meta.fallback:
        facts[Attr.FALLBACK] = meta.fallback
    if meta.fallback_reason:
        facts[Attr.FALLBACK_REASON] = meta.fallback_reason
    if meta.embedder_fallback:
        facts[Attr.EMBEDDER_FALLBACK] = meta.embedder_fallback
    windows = sum(1 for w in meta.windows if w.get("stage") == "window")
    if windows:
        facts[Attr.WINDOWS] = windows
    if meta.consistency:
        facts[Attr.PASSES] = int(meta.consistency.get("passes", 0))
        if meta.consistency.get("agreement") is not None:
            facts[Attr.AGREEMENT] = float(meta.consistency["agreement"])
    prompt, completion = usage_tokens(meta.usage)
    if prompt or completion:
        facts[GenAI.INPUT_TOKENS], facts[GenAI.OUTPUT_TOKENS] = prompt, completion
    return facts


def content_facts(request: RerankRequest, result: RerankResult | None, model: str | None) -> dict[str, Any]:
    """OpenInference's reranker attributes: the query and the documents in and out, with text."""
    oi = OpenInference
    facts: dict[str, Any] = {oi.SPAN_KIND: oi.RERANKER, oi.QUERY: request.query, oi.TOP_K: request.top_k}
    if model:
        facts[oi.MODEL_NAME] = model
    for i, chunk in enumerate(request.chunks):
        prefix = f"{oi.INPUT_DOCUMENTS}.{i}."
        facts[prefix + oi.DOCUMENT_ID] = chunk.id
        facts[prefix + oi.DOCUMENT_CONTENT] = request.own_text(chunk)
        if chunk.score is not None:
            facts[prefix + oi.DOCUMENT_SCORE] = float(chunk.score)
    text = {c.id: request.own_text(c) for c in request.chunks}
    for i, item in enumerate(result.ranked if result is not None else ()):
        prefix = f"{oi.OUTPUT_DOCUMENTS}.{i}."
        facts.update({prefix + oi.DOCUMENT_ID: item.id, prefix + oi.DOCUMENT_SCORE: item.score,
                      prefix + oi.DOCUMENT_CONTENT: text.get(item.id, "")})
    return facts


# --------------------------------------------------------------------------- log lines


_STAGE_WORDS = {"call": "the call", "final": "the final pass"}


def _where(record: CallRecord) -> str:
    where = _STAGE_WORDS.get(record.stage) or f"window {record.index}"
    return where if record.pass_index is None else f"{where} of pass {record.pass_index}"


def log_record(records: Sequence[CallRecord]) -> None:
    """The log lines of a rerank's calls: DEBUG per request, WARNING per re-ask, repair, fallback
    and budget refusal, each with its facts in `extra["rag_rerank"]`."""
    debug = log.isEnabledFor(logging.DEBUG)
    warn = log.isEnabledFor(logging.WARNING)
    if not (debug or warn):
        return
    primary_failed: dict[tuple[int | None, str, int], CallRecord] = {}
    for record in records:
        # Where and the facts are built only for a record that logs a line: a rerank's usual record
        # (one call, answered, nothing repaired) logs none at WARNING, the level nobody configured.
        repaired = record.ok and record.repairs and not record.cached
        warns = warn and bool(record.reasks or repaired or record.refused or record.role == "fallback")
        if debug or warns:
            where = _where(record)
        if debug:
            for attempt in record.attempts:
                facts = request_facts(record, attempt)
                ms = (attempt.end_ns - attempt.start_ns) / 1e6 if attempt.end_ns else 0.0
                tokens = (f", {facts[GenAI.INPUT_TOKENS]} in / {facts[GenAI.OUTPUT_TOKENS]} out tokens"
                          if GenAI.INPUT_TOKENS in facts else "")
                log.debug("%s request %d for %s: %s%s, %.1f ms", record.scorer, attempt.number, where,
                          attempt.kind, tokens, ms, extra={"rag_rerank": facts})
            if record.cached:
                log.debug("%s: %s answered by the response cache", record.scorer, where,
                          extra={"rag_rerank": {Attr.SCORER: record.scorer, Attr.CACHED: True}})
        if not warn:
            continue
        if not record.ok and record.role == "primary":
            primary_failed[record.where] = record
        if not warns:
            continue
        facts = {Attr.SCORER: record.scorer, Attr.STAGE: record.stage, Attr.ROLE: record.role}
        if record.reasks:
            log.warning("%s re-asked %d time%s for %s: the output guard refused its answer", record.scorer,
                        record.reasks, "" if record.reasks == 1 else "s", where,
                        extra={"rag_rerank": {**facts, Attr.REASKS: record.reasks}})
        if repaired:
            log.warning("%s's answer for %s was repaired: %s", record.scorer, where,
                        "; ".join(record.repairs),
                        extra={"rag_rerank": {**facts, Attr.REPAIRS: len(record.repairs)}})
        if record.refused:
            log.warning("%s: the budget refused a request for %s; none was sent", record.scorer, where,
                        extra={"rag_rerank": {**facts, Attr.REFUSED: True}})
        if record.role == "fallback":
            failed = primary_failed.get(record.where)
            how = "answered" if record.ok else f"failed too ({record.failure})"
            log.warning("%s failed for %s (%s); fallback %s %s", failed.scorer if failed else "the backend",
                        where, failed.failure if failed else "failed", record.scorer, how,
                        extra={"rag_rerank": {**facts, Attr.FALLBACK: record.scorer}})


# --------------------------------------------------------------------------- spans


def _set(span: Any, facts: Mapping[str, Any]) -> None:
    for key, value in facts.items():
        if value is not None:
            span.set_attribute(key, list(value) if isinstance(value, tuple) else value)


def _error(span: Any, description: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, description))


def _span(tracer_: Any, parent: Any, name: str, start: int, end: int, facts: Mapping[str, Any],
          kind: Any = None, error: str | None = None) -> Any:
    from opentelemetry import trace

    ctx = trace.set_span_in_context(parent)
    # The attributes given at the start: one check of them all, not one call per attribute.
    args: dict[str, Any] = {"context": ctx, "start_time": start or None,
                            "attributes": {k: v for k, v in facts.items() if v is not None}}
    if kind is not None:
        args["kind"] = kind
    span = tracer_.start_span(name, **args)
    if error is not None:
        _error(span, error)
    span.end(end_time=end or None)
    return span


def _record_spans(tracer_: Any, parent: Any, record: CallRecord) -> None:
    from opentelemetry.trace import SpanKind

    base = {Attr.STAGE: record.stage, Attr.SCORER: record.scorer, Attr.ROLE: record.role}
    if record.cached:
        _span(tracer_, parent, SPAN_CACHE_HIT, record.start_ns, record.end_ns,
              {**base, Attr.CACHED: True, GenAI.REQUEST_MODEL: record.model})
        return
    for attempt in record.attempts:
        facts = request_facts(record, attempt)
        name = f"{facts[GenAI.OPERATION]} {facts.get(GenAI.REQUEST_MODEL) or record.scorer}"
        _span(tracer_, parent, name, attempt.start_ns, attempt.end_ns, facts, SpanKind.CLIENT,
              None if attempt.kind == "ok" else attempt.kind)
    if record.refused:
        _span(tracer_, parent, f"{_op(record.scorer)} {record.model or record.scorer}", record.end_ns,
              record.end_ns, {**base, Attr.REFUSED: True, GenAI.ERROR_TYPE: "budget_refused"},
              SpanKind.CLIENT, "the budget refused the request")


def _bounds(records: Sequence[CallRecord]) -> tuple[int, int]:
    starts = [t for r in records for t in (r.start_ns, *(a.start_ns for a in r.attempts)) if t]
    ends = [t for r in records for t in (r.end_ns, *(a.end_ns for a in r.attempts)) if t]
    return (min(starts) if starts else 0), (max(ends) if ends else 0)


def write_spans(tracer_: Any, root: Any, records: Sequence[CallRecord]) -> None:
    """The spans under `root`: per consistency pass, per window or final pass, per request."""
    passes: dict[int | None, list[CallRecord]] = {}
    for r in records:
        passes.setdefault(r.pass_index, []).append(r)
    for pass_index, in_pass in passes.items():
        parent = root
        if pass_index is not None:
            start, end = _bounds(in_pass)
            parent = _span(tracer_, root, SPAN_PASS, start, end, {Attr.PASS: pass_index})
            # Children are written after their parent ended: OpenTelemetry keys them by parent id.
        calls: dict[tuple[str, int], list[CallRecord]] = {}
        for r in in_pass:
            calls.setdefault((r.stage, r.index), []).append(r)
        for (stage, index), tried in calls.items():
            holder = parent
            if stage != "call":
                start, end = _bounds(tried)
                facts: dict[str, Any] = {Attr.WINDOW: index, Attr.SIZE: tried[0].size}
                if pass_index is not None:
                    facts[Attr.PASS] = pass_index
                if len(tried) > 1:
                    facts[Attr.STEPS] = tuple(r.scorer for r in tried)
                answered = next((r for r in tried if r.ok), None)
                if answered is not None and answered.role == "fallback":
                    facts[Attr.FALLBACK] = answered.scorer
                holder = _span(tracer_, parent, SPAN_FINAL if stage == "final" else SPAN_WINDOW, start, end,
                               facts, error=None if answered is not None else "no scorer answered")
            for r in tried:
                _record_spans(tracer_, holder, r)


class Observation:
    """One rerank being observed: the driver opens it around planning and the flow, and tells it the
    request and the result (or the error leaves through it). Without a tracer it only logs."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.tracer = tracer()
        self.span: Any = None
        self.request: RerankRequest | None = None
        self.backend_model: str | None = None
        self._current: Any = None  # the tracer's context manager that makes `span` the current one

    # A class's `__enter__` / `__exit__`, not a `contextlib.contextmanager` generator: entered on
    # every call, the generator's context manager cost about three times as many instructions.
    def __enter__(self) -> Observation:
        if self.tracer is not None:
            self._current = self.tracer.start_as_current_span(SPAN_RERANK, record_exception=False,
                                                              set_status_on_exception=False)
            self.span = self._current.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: Any) -> bool | None:
        if isinstance(error, Exception):
            self.failed(error)
        if self._current is not None:
            return self._current.__exit__(kind, error, trace)  # type: ignore[no-any-return]
        return None  # the error, if any, goes on to the caller

    def planned(self, request: RerankRequest, backend_model: str | None) -> None:
        self.request, self.backend_model = request, backend_model

    def done(self, result: RerankResult) -> None:
        """Log the result's record and, when tracing, write its spans and the rerank span's facts."""
        meta = result.meta
        log_record(meta.records)
        if meta.embedder_fallback and log.isEnabledFor(logging.WARNING):
            log.warning("the embedder failed: %s vectors compared instead (fallback)", meta.embedder_fallback,
                        extra={"rag_rerank": {Attr.EMBEDDER_FALLBACK: meta.embedder_fallback}})
        if self.span is None:
            return
        _set(self.span, rerank_facts(meta, result, self.request))
        if capturing() and self.request is not None:
            _set(self.span, content_facts(self.request, result, meta.model))
        write_spans(self.tracer, self.span, meta.records)

    def failed(self, error: BaseException) -> None:
        """The rerank raised: its requests (a `BackendError`'s attempts) logged and traced, the span
        marked as an error."""
        records: tuple[CallRecord, ...] = ()
        if isinstance(error, BackendError):
            records = (CallRecord("call", 1, self.backend, ok=False, attempts=error.attempts,
                                  model=self.backend_model, error_type=type(error).__name__,
                                  refused=error.refused, label="the call"),)
            log_record(records)
        elif isinstance(error, BudgetError) and log.isEnabledFor(logging.WARNING):
            log.warning("%s: the budget refused the rerank before any request (%s)", self.backend,
                        ", ".join(error.limits) or "over budget",
                        extra={"rag_rerank": {Attr.BACKEND: self.backend, Attr.REFUSED: True}})
        if self.span is None:
            return
        facts: dict[str, Any] = {Attr.BACKEND: self.backend, GenAI.ERROR_TYPE: type(error).__name__}
        if self.request is not None:
            facts.update({Attr.CANDIDATES: len(self.request.chunks), Attr.TOP_K: self.request.top_k,
                          Attr.LAMBDA: self.request.lambda_})
        if isinstance(error, BudgetError) or (isinstance(error, BackendError) and error.refused):
            facts[Attr.REFUSED] = True
        _set(self.span, facts)
        _error(self.span, type(error).__name__)
        write_spans(self.tracer, self.span, records)


def observed(backend: str) -> Observation:
    """Observe one rerank (`Observation`, a context manager): its span is the current one while the
    body runs, so the HTTP requests' spans of an instrumented client nest under it; an exception is
    recorded and raised."""
    return Observation(backend)


__all__ = ["CAPTURE_ENV", "SPAN_CACHE_HIT", "SPAN_FINAL", "SPAN_PASS", "SPAN_RERANK", "SPAN_WINDOW",
           "TRACER_NAME", "Attr", "GenAI", "Observation", "OpenInference", "capture_content", "capturing",
           "content_facts", "log_record", "observed", "request_facts", "rerank_facts", "tracer",
           "write_spans"]
