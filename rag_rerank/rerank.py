"""The pipeline: one call from a query and chunks to a `RerankResult`.

    validate_request ─► render (candidate_k) ─► call_with_retries (backend + output guard)
                     ─► postpass (MMR, duplicates, min score, accounting) ─► RerankResult + meta

This module only wires stages together; each stage is owned elsewhere. Two decisions live here:

* **candidate_k.** The model is asked for more than `top_k` candidates,
  `candidate_k = min(n, max(2 * top_k, top_k + 5) + copies)` (copies: chunks whose text repeats
  an earlier one exactly), and the output guard judges it against
  that number. The post-pass then picks the final `top_k`: if the model only returned `top_k`,
  removing one near-duplicate would leave MMR nothing to promote in its place.
* **fallback.** With `fallback="local"`, a `BackendError` (every attempt failed) is answered with
  the local backend's ranking instead of an exception; `meta.fallback` says so and `meta.notes`
  carries the error summary, with any API key redacted.

The caller's query, chunk list and dicts are only read: the input guard builds new frozen
`Chunk`s and nothing downstream touches the originals.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .backends.base import Backend
from .backends.factory import (
    backend_kwargs,
    make_backend,
    resolve_embedder,
)
from .concurrency import DEFAULT_CONCURRENCY, call_slot, check_concurrency
from .errors import BackendError, EmbedderError, InputError, Violation
from .fusion import MetaFusion, check_embed_meta_fields, meta_fusion, meta_values, with_embedded_meta
from .guard import validate_request
from .guard.input import ChunkSource, duplicate_threshold_violations
from .guard.limits import Limits, as_limits
from .models import Dropped, Ranked, RerankRequest, RerankResult, RunMeta, add_usage
from .redaction import scrub, secrets_of
from .render import render
from .wording import counted

log = logging.getLogger("rag_rerank.rerank")

def candidate_k(n_chunks: int, top_k: int, copies: int = 0) -> int:
    """How many ranked candidates to ask the model for (see the module docstring).

    `copies` is how many chunks repeat an earlier chunk's text exactly: they score alike, the
    post-pass drops all but one, so each gets a slot of its own instead of crowding out a
    distinct chunk (ten copies of the answer would otherwise fill the candidate list)."""
    return max(1, min(n_chunks, max(2 * top_k, top_k + 5) + max(copies, 0)))


@dataclass(frozen=True)
class _Plan:
    """Everything decided before the backend is called, shared by the sync and async paths."""

    request: RerankRequest  # the caller's request, top_k as asked
    ask: RerankRequest  # what the scorer is shown: the view below with top_k = candidate_k
    prompt: str
    backend: Backend
    backend_name: str
    embedder: Any
    limits: Limits
    started: float
    # The caller's request with embed_meta_fields prefixed to each text: what every scorer and the
    # post-pass embedder see (the request itself when no field is listed).
    view: RerankRequest | None = None
    fusion: MetaFusion | None = None
    meta_values: Mapping[str, float | None] | None = None
    window_size: int | None = None  # set only when the request is ranked in windows (windows.py)
    concurrency: int = 4
    # Why the embedder was replaced by the lexical one (`fallback="local"` after an EmbedderError).
    embedder_note: str | None = None


def _plan(
    query: Any,
    chunks: ChunkSource,
    top_k: Any,
    lambda_: Any,
    *,
    backend: str | Backend,
    model: str | None,
    base_url: str | None,
    api_key: str | None,
    embedder: Any,
    limits: Limits | Mapping[str, Any] | None,
    fallback: str | None,
    policy: Any,
    backend_options: Mapping[str, Any] | None = None,
    scoring: Mapping[str, Any] | None = None,
    window_size: Any = None,
    concurrency: Any = DEFAULT_CONCURRENCY,
    duplicate_threshold: Any = None,
) -> _Plan:
    """Every check and decision shared by `rerank` and `arerank`, before the backend is called.

    `scoring` holds the metadata options (`meta_*`, `embed_meta_fields`); they are all checked,
    and every chunk's metadata value parsed, before any backend is built or called."""
    from .windows import windowed

    _check_fallback(fallback)
    _check_policy(policy)
    concurrency = check_concurrency(concurrency)
    started = time.perf_counter()
    lim = as_limits(limits)
    request, fields, fusion = _validated(query, chunks, top_k, lambda_, lim, scoring or {}, window_size,
                                         duplicate_threshold)
    values = meta_values(request, fusion) if fusion is not None else None
    view = with_embedded_meta(request, fields)
    emb = resolve_embedder(embedder, backend, base_url)
    be = make_backend(backend, model=model, base_url=base_url, api_key=api_key, embedder=emb,
                      **backend_kwargs(backend, backend_options))
    name = backend if isinstance(backend, str) else str(getattr(be, "name", type(be).__name__))
    if window_size is not None and windowed(request, int(window_size)):
        # Each window and the final pass render their own prompt (windows.py).
        return _Plan(request, view, "", be, name, emb, lim, started, view, fusion, values,
                     window_size=int(window_size), concurrency=concurrency)
    copies = len(view.chunks) - len({c.text for c in view.chunks})
    ask = replace(view, top_k=candidate_k(len(view.chunks), view.top_k, copies))
    return _Plan(request, ask, render(ask), be, name, emb, lim, started, view, fusion, values,
                 concurrency=concurrency)


def _validated(
    query: Any, chunks: ChunkSource, top_k: Any, lambda_: Any, lim: Limits, scoring: Mapping[str, Any],
    window_size: Any = None,
    duplicate_threshold: Any = None,
) -> tuple[RerankRequest, tuple[str, ...], MetaFusion | None]:
    """The request and the options, every problem with any of them in one `InputError`."""
    opts = dict(scoring)
    problems: list[Violation] = duplicate_threshold_violations(duplicate_threshold)
    fields: tuple[str, ...] = ()
    fusion: MetaFusion | None = None
    try:
        fields = check_embed_meta_fields(opts.pop("embed_meta_fields", None))
    except InputError as exc:
        problems.extend(exc.violations)
    try:
        fusion = meta_fusion(**opts)
    except InputError as exc:
        problems.extend(exc.violations)
    try:
        request = validate_request(query, chunks, top_k, lambda_, limits=lim, window_size=window_size)
    except InputError as exc:
        problems.extend(exc.violations)
    if problems:
        raise InputError(problems)
    return request, fields, fusion


def _scored(obj: Mapping[str, Any]) -> tuple[list[Ranked], list[Dropped]]:
    """The guarded output object as value types (the guard already checked every field)."""
    ranked = [
        Ranked(
            id=r["id"], score=float(r["score"]), reason=r["reason"], diversity_note=r.get("diversity_note")
        )
        for r in obj.get("ranked", ())
    ]
    dropped = [Dropped(id=d["id"], reason=d["reason"]) for d in obj.get("dropped", ()) or ()]
    return ranked, dropped


def _postpass(
    plan: _Plan, obj: Mapping[str, Any], layout: str, duplicate_threshold: float | None
) -> RerankResult:
    from .postpass import postpass

    ranked, dropped = _scored(obj)
    if plan.fusion is not None and plan.meta_values is not None:
        from .fusion import fuse

        ranked, dropped = fuse(ranked, dropped, plan.meta_values, plan.fusion, plan.limits.min_score)
    return postpass(
        plan.view or plan.request,
        ranked,
        dropped,
        embedder=plan.embedder,
        duplicate_threshold=duplicate_threshold,
        layout=layout,
        min_score=plan.limits.min_score,
    )


def _meta(
    plan: _Plan,
    *,
    model: str | None,
    attempts: int,
    repairs: Sequence[str],
    usage: Mapping[str, int],
    fallback: str | None = None,
    notes: Sequence[str] = (),
    calls: int = 1,
    windows: Sequence[Mapping[str, Any]] = (),
) -> RunMeta:
    return RunMeta(
        backend=plan.backend_name,
        model=model,
        attempts=attempts,
        repairs=tuple(repairs),
        usage=dict(usage),
        latency_ms=(time.perf_counter() - plan.started) * 1000.0,
        fallback=fallback,
        embedder=_embedder_name(plan),
        notes=(*notes, *([plan.embedder_note] if plan.embedder_note else [])),
        calls=calls,
        windows=tuple(windows),
        embedder_fallback="lexical" if plan.embedder_note else None,
    )


def _offline(plan: _Plan, error: EmbedderError, api_key: str | None) -> _Plan:
    """`plan` with the lexical embedder in place of the one that failed, and why (for meta.notes)."""
    from .embed import get_embedder

    if plan.embedder_note is not None:
        return plan
    summary = failure_summary(error, api_key)
    note = (f"embedder {getattr(plan.embedder, 'name', plan.embedder)} failed, lexical vectors used instead "
            f"(fallback local): {summary}")
    log.warning("%s", note)  # meta.embedder_fallback says so per result; an operator needs it in the log
    return replace(plan, embedder=get_embedder("lexical"), embedder_note=note)


def _falls_back(plan: _Plan, fallback: str | None, error: BackendError) -> bool:
    """Whether `fallback="local"` answers `error`: any failure of another backend, and a failure of
    the embedder the local backend scores with."""
    return fallback == "local" and (plan.backend_name != "local" or isinstance(error, EmbedderError))


def _local_outcome(plan: _Plan, error: BackendError, api_key: str | None, score: Any) -> tuple[Any, _Plan]:
    """`score(local backend)` after `error`, and the plan it was scored under: with the plan's
    embedder, unless that is what failed (or fails now), then fully offline with the lexical one."""
    if isinstance(error, EmbedderError):
        plan = _offline(plan, error, api_key)
    else:  # meta.fallback says so per result; an operator watching a service needs it in the log
        log.warning("%s failed, ranking with the local backend (fallback local): %s", plan.backend_name,
                    failure_summary(error, api_key))
    try:
        return score(make_backend("local", embedder=plan.embedder)), plan
    except EmbedderError as exc:
        plan = _offline(plan, exc, api_key)
        return score(make_backend("local", embedder=plan.embedder)), plan


def _postpass_or_offline(plan: _Plan, obj: Mapping[str, Any], layout: str, duplicate_threshold: float | None,
                         fallback: str | None, api_key: str | None) -> tuple[RerankResult, _Plan]:
    """The post-pass; with `fallback="local"`, on lexical vectors when the embedder fails, keeping
    the ranking the backend already gave (asking the LLM again would bill it twice)."""
    try:
        return _postpass(plan, obj, layout, duplicate_threshold), plan
    except EmbedderError as exc:
        if fallback != "local":
            raise _redacted(exc, api_key) from None
        plan = _offline(plan, exc, api_key)
        return _postpass(plan, obj, layout, duplicate_threshold), plan


def _scoring_notes(plan: _Plan) -> list[str]:
    f = plan.fusion
    if f is None:
        return []
    return [f"meta_fusion: field={f.field} weight={f.weight:g} mode={f.ranking_mode} order={f.sort_order} "
            f"missing={f.missing} type={f.value_type}"]


def _embedder_name(plan: _Plan) -> str:
    """What the post-pass compared: the caller's vectors when every chunk carries one."""
    if all(c.embedding is not None for c in plan.request.chunks):
        return "caller"
    return str(getattr(plan.embedder, "name", plan.embedder))


def _finish(plan: _Plan, outcome: Any, layout: str, duplicate_threshold: float | None,
            fallback: str | None = None, api_key: str | None = None) -> RerankResult:
    result, plan = _postpass_or_offline(plan, outcome.obj, layout, duplicate_threshold, fallback, api_key)
    model = outcome.model or getattr(plan.backend, "model", None)
    notes = [*getattr(outcome, "notes", ())]
    if plan.ask.top_k != plan.request.top_k:
        notes.append(f"candidate_k={plan.ask.top_k}")
    notes.extend(_scoring_notes(plan))
    meta = _meta(
        plan,
        model=model,
        attempts=len(outcome.attempts),
        repairs=outcome.repairs,
        usage=outcome.usage,
        notes=notes,
    )
    return replace(result, meta=meta)


def _fallback_result(
    plan: _Plan,
    error: BackendError,
    api_key: str | None,
    policy: Any,
    layout: str,
    duplicate_threshold: float | None,
) -> RerankResult:
    """The local ranking after `error`, flagged in meta; re-raises `error` if local fails too.

    After an `EmbedderError` (the embedder failed, whoever scored) the local backend scores with
    the lexical embedder and only `meta.embedder_fallback` says so; after any other failure of
    another backend, `meta.fallback` is "local"."""
    from .retry import call_with_retries

    def score(local: Backend) -> Any:
        return call_with_retries(local, plan.ask, plan.prompt, guard_top_k=plan.ask.top_k, policy=policy,
                                 limits=plan.limits)

    try:
        outcome, plan = _local_outcome(plan, error, api_key, score)
    except BackendError:
        raise _redacted(error, api_key) from None
    result, plan = _postpass_or_offline(plan, outcome.obj, layout, duplicate_threshold, "local", api_key)
    backend_failed = not (isinstance(error, EmbedderError) and plan.backend_name == "local")
    summary = failure_summary(error, api_key)
    notes = [f"{plan.backend_name} failed after {counted(len(error.attempts), 'attempt')}: {summary}"
             ] if backend_failed else []
    meta = _meta(
        plan,
        model=outcome.model,
        attempts=len(error.attempts) + len(outcome.attempts),
        repairs=outcome.repairs,
        usage=add_usage(error.usage, outcome.usage),
        fallback="local" if backend_failed else None,
        notes=(*notes, *_scoring_notes(plan)),
    )
    return replace(result, meta=meta)


def failure_summary(error: BackendError, api_key: str | None) -> str:
    """A failure as `meta.notes` and the log show it: its text with every secret of the call masked."""
    return scrub(str(error), secrets_of(api_key))


def _redacted(error: BackendError, api_key: str | None) -> BackendError:
    """The same failure with any API key removed from its text (attempt details come from SDKs)."""
    secrets = secrets_of(api_key)
    text = str(error)
    if scrub(text, secrets) == text:
        return error
    attempts = [replace(a, detail=scrub(a.detail, secrets)) for a in error.attempts]
    head = scrub(text.split(" [#", 1)[0], secrets)
    return type(error)(head, attempts, usage=error.usage)  # an EmbedderError stays one


def rerank(
    query: str,
    chunks: ChunkSource,
    top_k: int | None = None,
    lambda_: float | None = None,
    *,
    backend: str | Backend = "local",
    model: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    embedder: Any = "lexical",
    fallback: str | None = None,
    policy: Any = None,
    limits: Limits | Mapping[str, Any] | None = None,
    layout: str = "mmr",
    duplicate_threshold: float | None = None,
    strict: bool = False,
    backend_options: Mapping[str, Any] | None = None,
    meta_field: str | None = None,
    meta_weight: float = 1.0,
    meta_ranking_mode: str = "reciprocal_rank_fusion",
    meta_sort_order: str = "descending",
    missing_meta: str = "bottom",
    meta_value_type: str = "float",
    embed_meta_fields: Sequence[str] | None = None,
    window_size: int | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> RerankResult:
    """Rerank `chunks` for `query`: at most `top_k` ranked (default 5), MMR with `lambda_` (default 0.7).

    `chunks` is JSONL text, a path, or a list of dicts / `Chunk`s. `backend` is "local" (offline,
    deterministic), "openai" (any OpenAI-compatible server through `base_url`), "anthropic", or a
    backend instance. `embedder` drives MMR similarity: "lexical", "sentence-transformers[:MODEL]",
    "openai[:MODEL]" or an Embedder; with the local backend it also picks the scorer (the static
    MiniLM-distilled table for "lexical", the model itself otherwise). Near-duplicates are judged on
    lexical vectors whatever the embedder (`duplicate_threshold`, a cosine in [0, 1]). `strict=True`
    turns off the formatting-only repair (fences, prose, <think>) so the model's raw text must pass
    as is.
    `fallback="local"` returns the local ranking, flagged in `meta`, if the backend fails for good.
    `policy` is a `RetryPolicy` (attempts, re-asks, a wall-clock `deadline_s` that also cuts a call
    still running); `limits` a `Limits` or a mapping overriding some of its fields
    (`{"max_chunks": 100}`).
    "cross-encoder" (a sentence-transformers CrossEncoder, `model` a folder or cached hub name) and
    "rerank-api" (a Cohere / Jina `/v1/rerank` server at `base_url`) score without an LLM;
    `backend_options` carries their knobs (batch_size, device, max_length, calibration_factor;
    timeout, max_chars, score_mapping). `meta_field` and the other `meta_*` options fuse the scorer's
    order with a metadata field (dates, ratings) before MMR; `embed_meta_fields` lists meta keys whose
    values are put before each chunk's text for every scorer (see `rag_rerank.fusion`).
    `window_size` (at most `max_chunks`) ranks up to `max_total_chunks` candidates: windows of that
    many scored concurrently (at most `concurrency` calls in flight), then one final pass over the
    best survivors and the post-pass over them (see `rag_rerank.windows`); without it, more than
    `max_chunks` is an `InputError`.

    Raises `InputError` for bad input and `BackendError` (every attempt attached) when the backend
    fails and there is no fallback.
    """
    plan = _plan(
        query,
        chunks,
        top_k,
        lambda_,
        backend=backend,
        model=model,
        base_url=base_url,
        api_key=api_key,
        embedder=embedder,
        limits=limits,
        fallback=fallback,
        policy=policy,
        backend_options=backend_options,
        scoring={"meta_field": meta_field, "meta_weight": meta_weight, "meta_ranking_mode": meta_ranking_mode,
                 "meta_sort_order": meta_sort_order, "missing_meta": missing_meta,
                 "meta_value_type": meta_value_type, "embed_meta_fields": embed_meta_fields},
        window_size=window_size,
        concurrency=concurrency,
        duplicate_threshold=duplicate_threshold,
    )
    try:
        return _run(plan, api_key=api_key, policy=policy, strict=strict, fallback=fallback, layout=layout,
                    duplicate_threshold=duplicate_threshold)
    finally:
        close_built(((plan.backend, backend), (plan.embedder, embedder)))


def _run(plan: _Plan, *, api_key: str | None, policy: Any, strict: bool, fallback: str | None, layout: str,
         duplicate_threshold: float | None) -> RerankResult:
    """`rerank` after planning: the backend call(s), the fallback, the post-pass."""
    if plan.window_size is not None:
        from .windows import run_windows

        return run_windows(plan, api_key=api_key, policy=policy, strict=strict, fallback=fallback,
                           layout=layout, duplicate_threshold=duplicate_threshold)
    from .retry import call_with_retries

    try:
        outcome = call_with_retries(
            plan.backend,
            plan.ask,
            plan.prompt,
            guard_top_k=plan.ask.top_k,
            policy=policy,
            limits=plan.limits,
            repair=not strict,
        )
    except BackendError as exc:
        if not _falls_back(plan, fallback, exc):
            raise _redacted(exc, api_key) from None
        return _fallback_result(plan, exc, api_key, policy, layout, duplicate_threshold)
    return _finish(plan, outcome, layout, duplicate_threshold, fallback, api_key)


async def arerank(
    query: str,
    chunks: ChunkSource,
    top_k: int | None = None,
    lambda_: float | None = None,
    *,
    backend: str | Backend = "local",
    model: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    embedder: Any = "lexical",
    fallback: str | None = None,
    policy: Any = None,
    limits: Limits | Mapping[str, Any] | None = None,
    layout: str = "mmr",
    duplicate_threshold: float | None = None,
    strict: bool = False,
    backend_options: Mapping[str, Any] | None = None,
    meta_field: str | None = None,
    meta_weight: float = 1.0,
    meta_ranking_mode: str = "reciprocal_rank_fusion",
    meta_sort_order: str = "descending",
    missing_meta: str = "bottom",
    meta_value_type: str = "float",
    embed_meta_fields: Sequence[str] | None = None,
    window_size: int | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> RerankResult:
    """`rerank` for asyncio: the backend call is awaited (the backend's `acomplete`), so many
    requests share one event loop. Arguments, result and errors are those of `rerank`."""
    plan = _plan(
        query,
        chunks,
        top_k,
        lambda_,
        backend=backend,
        model=model,
        base_url=base_url,
        api_key=api_key,
        embedder=embedder,
        limits=limits,
        fallback=fallback,
        policy=policy,
        backend_options=backend_options,
        scoring={"meta_field": meta_field, "meta_weight": meta_weight, "meta_ranking_mode": meta_ranking_mode,
                 "meta_sort_order": meta_sort_order, "missing_meta": missing_meta,
                 "meta_value_type": meta_value_type, "embed_meta_fields": embed_meta_fields},
        window_size=window_size,
        concurrency=concurrency,
        duplicate_threshold=duplicate_threshold,
    )
    try:
        return await _arun(plan, api_key=api_key, policy=policy, strict=strict, fallback=fallback,
                           layout=layout, duplicate_threshold=duplicate_threshold)
    finally:
        await aclose_built(((plan.backend, backend), (plan.embedder, embedder)))


async def _arun(plan: _Plan, *, api_key: str | None, policy: Any, strict: bool, fallback: str | None,
                layout: str, duplicate_threshold: float | None) -> RerankResult:
    """`arerank` after planning: the awaited backend call(s), the fallback, the post-pass."""
    if plan.window_size is not None:
        from .windows import arun_windows

        return await arun_windows(plan, api_key=api_key, policy=policy, strict=strict, fallback=fallback,
                                  layout=layout, duplicate_threshold=duplicate_threshold)
    from .retry import acall_with_retries

    try:
        async with call_slot():  # inside a batch, the batch's bound on calls in flight
            outcome = await acall_with_retries(
                plan.backend,
                plan.ask,
                plan.prompt,
                guard_top_k=plan.ask.top_k,
                policy=policy,
                limits=plan.limits,
                repair=not strict,
            )
    except BackendError as exc:
        if not _falls_back(plan, fallback, exc):
            raise _redacted(exc, api_key) from None
        return await _offload(plan, _fallback_result, plan, exc, api_key, policy, layout, duplicate_threshold)
    return await _offload(plan, _finish, plan, outcome, layout, duplicate_threshold, fallback, api_key)


def _built(pairs: Sequence[tuple[Any, Any]]) -> list[Any]:
    """Of `(object, spec)` pairs, the objects built from a name (spec a str): nobody else holds
    them, so whoever built them closes them. An object the caller passed in is the caller's, kept
    open (its connection pool) for its next call."""
    return [obj for obj, spec in pairs if isinstance(spec, str)]


def close_built(pairs: Sequence[tuple[Any, Any]]) -> None:
    """Close the HTTP clients of a backend / embedder built for this call: left to the garbage
    collector, each call's connections stayed open until then (a ResourceWarning apiece)."""
    for obj in _built(pairs):
        close = getattr(obj, "close", None)
        if callable(close):
            close()


async def aclose_built(pairs: Sequence[tuple[Any, Any]]) -> None:
    """`close_built` from async code: a backend's async client is closed on the loop it belongs to."""
    for obj in _built(pairs):
        aclose = getattr(obj, "aclose", None)
        close = getattr(obj, "close", None)
        if callable(aclose):
            await aclose()
        elif callable(close):
            close()


async def _offload(plan: _Plan, func: Any, *args: Any) -> RerankResult:
    """Run a post-pass inline when it is cheap (lexical / caller vectors: well under a millisecond
    per chunk); in a worker thread when the embedder is a model or an HTTP endpoint, so that one
    request's embedding does not stall every other request on the event loop."""
    name = _embedder_name(plan)
    if name.startswith("lexical") or name == "caller":
        return func(*args)
    return await asyncio.to_thread(func, *args)


def _check_policy(policy: Any) -> None:
    """A wrong `policy` would otherwise surface as an AttributeError inside the retry loop."""
    from .retry import RetryPolicy

    if policy is not None and not isinstance(policy, RetryPolicy):
        msg = f"policy must be None or a RetryPolicy, got {type(policy).__name__}"
        raise InputError([Violation(path="policy", message=msg)])


def _check_fallback(fallback: str | None) -> None:
    if fallback not in (None, "local"):
        raise InputError(
            [
                Violation(
                    path="fallback",
                    value=fallback,
                    message=f"fallback must be None or 'local', got {fallback!r}",
                )
            ]
        )
