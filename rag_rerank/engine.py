"""The engine: every decision of one rerank, written once, without I/O.

    plan ─► flow:  [one call | windows ─► survivors ─► final pass]  ─► post-pass ─► RerankResult
                    └─ a failed call, with fallback="local": the local backend answers it

`plan()` checks the request and its options (every problem in one `InputError`) and renders what
the scorer is asked. `flow(plan)` is a generator, as httpx's `Auth.auth_flow` is: it yields the
work to do and receives its results, and returns the `RerankResult`. It never calls a backend
itself, so the same decisions serve the synchronous and the asynchronous worlds; the two short
drivers that differ live in `session.py`. It yields two kinds of step:

* `Calls`: backend calls to make, each through the retry loop (`retry.py`) and the output guard,
  at most `workers` at once; the driver sends back, per call, its `Outcome` or the exception it
  ended with (every call finishes; the engine decides what a failure means).
* `Work`: a computation (the post-pass) the async driver runs in a worker thread when `heavy`
  (a model or an HTTP embedder), so one request does not stall the event loop; an exception it
  raises is thrown back into the flow, where the fallback decides.

**Fallback** (`fallback="local"`) lives here, in one place for one call, each window and the
final pass: a `BackendError` of another backend is answered by the local backend (meta says
`fallback: "local"`, notes say why); an `EmbedderError` (the embedder failed, whoever scored) puts
lexical vectors in its place for the rest of the request (`meta.embedder_fallback`).

**candidate_k** (`windows.asked`): the scorer is asked for more than `top_k` candidates so that
MMR and the removal of near-duplicates have room; the post-pass picks the final `top_k`.

The caller's query, chunk list and dicts are only read: the input guard builds new frozen
`Chunk`s and nothing downstream touches the originals.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import math
import os
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from . import reasons
from .backends.base import Backend
from .backends.factory import make_backend
from .cache import ResponseCache, call_key
from .calibration_map import VERSION, apply, as_calibration, mismatch
from .calibration_map import load as load_calibration
from .concurrency import check_concurrency
from .cost import (
    Budget,
    CallEstimate,
    CostPlan,
    Prices,
    Spending,
    as_budget,
    as_prices,
    makes_requests,
    over_budget,
    refuse,
    request_tokens,
    usage_tokens,
)
from .embed import get_embedder
from .errors import BackendError, ConfigError, EmbedderError, InputError, Violation
from .fusion import MetaFusion, check_embed_meta_fields, fuse, meta_fusion, meta_values, with_embedded_meta
from .guard import validate_request
from .guard.input import ChunkSource, duplicate_threshold_violations
from .guard.limits import Limits, as_limits
from .models import Dropped, Ranked, RerankRequest, RerankResult, RunMeta, add_usage
from .options import Options
from .postpass import postpass
from .ranks import kendall_tau
from .redaction import scrub, secrets_of
from .render import render
from .retry import Outcome, RetryPolicy
from .windows import Survivors, Window, asked, final_window, loser_reason, select_survivors, split, windowed
from .wording import counted

log = logging.getLogger("rag_rerank.rerank")


# --------------------------------------------------------------------------- the steps a flow yields


@dataclass(frozen=True)
class Call:
    """One backend call with its retries: `ask` shown through `prompt`, judged for `guard_top_k`.

    With a response cache, `key` is the call's key in `cache` (the driver answers from it, or
    stores the new answer under it); `label` names the call in a replay miss. `spending` is the
    budget's meter, shared by the request's calls."""

    backend: Backend
    ask: RerankRequest
    prompt: str
    policy: RetryPolicy | None
    limits: Limits
    repair: bool = True
    label: str = "the call"
    cache: ResponseCache | None = None
    key: str | None = None
    spending: Spending | None = None


@dataclass(frozen=True)
class Calls:
    """Calls to make, at most `workers` at once (sync) or under `limit` slots (async: the batch's
    shared bound when there is one). The driver answers with one `Outcome` or exception per call,
    in order. `progress` counts them toward a windowed request's progress callback."""

    calls: tuple[Call, ...]
    workers: int = 1
    limit: int | None = None
    progress: tuple[int, int] | None = None  # (calls done before these, calls in all)


@dataclass(frozen=True)
class Work:
    """A computation for the driver to run: inline, or in a worker thread from async code when
    `heavy`. Its exception, if any, is thrown back into the flow."""

    run: Callable[[], Any]
    heavy: bool = False


@dataclass(frozen=True)
class Progress:
    """Tell a synchronous caller's progress callback (`windows.WINDOW_PROGRESS`) how far the calls are."""

    done: int
    total: int


Step = Calls | Work | Progress
Flow = Generator[Step, Any, RerankResult]


# --------------------------------------------------------------------------- what a session built


@dataclass(frozen=True)
class Setup:
    """What a session built once and every request shares: the backend (`backend_name` is the name
    the caller gave it), the embedder, and the API key every message is scrubbed of."""

    backend: Backend
    backend_name: str
    embedder: Any
    api_key: str | None = field(default=None, repr=False)
    cache: ResponseCache | None = None  # the response cache (`cache.py`), None without one


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class Plan:
    """Everything decided before any call, and the options the flow follows."""

    request: RerankRequest  # the caller's request, top_k as asked
    ask: RerankRequest  # what the scorer is shown: the view below with top_k = candidate_k
    prompt: str
    setup: Setup
    options: Options
    limits: Limits
    started: float
    # The caller's request with embed_meta_fields prefixed to each text: what every scorer and the
    # post-pass embedder see (the request itself when no field is listed).
    view: RerankRequest
    embedder: Any
    fusion: MetaFusion | None = None
    meta_values: Mapping[str, float | None] | None = None
    window_size: int | None = None  # set only when the request is ranked in windows
    # Why the embedder was replaced by the lexical one (`fallback="local"` after an EmbedderError).
    embedder_note: str | None = None
    prices: Prices | None = None
    budget: Budget | None = None
    spending: Spending | None = None  # the budget's meter (a batch's, shared, when it sets one)
    calibration: Any = None  # the calibration.Calibration applied to the backend's scores, or None
    calibration_file: str | None = None  # the file it was read from

    @property
    def backend(self) -> Backend:
        return self.setup.backend

    @property
    def backend_name(self) -> str:
        return self.setup.backend_name

    @property
    def fallback(self) -> str | None:
        return self.options.fallback  # type: ignore[no-any-return]

    def call(self, ask: RerankRequest, prompt: str, backend: Backend | None = None,
             repair: bool | None = None, label: str = "the call") -> Call:
        """A call of `backend` (default: the session's) for `ask`, under this plan's policy and
        limits, with its cache key when the session has a cache and the backend says what it sends."""
        repair = (not self.options.strict) if repair is None else repair
        key = self.key(ask, prompt, repair) if backend is None else None
        # The budget meters the session backend's requests; the local fallback's calls cost nothing.
        spending = self.spending if backend is None and makes_requests(self.backend) else None
        return Call(backend or self.backend, ask, prompt, self.options.policy, self.limits, repair, label,
                    self.setup.cache if key is not None else None, key, spending)

    def key(self, ask: RerankRequest, prompt: str, repair: bool | None = None) -> str | None:
        """The response cache's key of the session backend's call for `ask` (None without a cache)."""
        identity = getattr(self.backend, "cache_identity", None)
        if self.setup.cache is None or not callable(identity):
            return None
        repair = (not self.options.strict) if repair is None else repair
        max_tokens = (self.options.policy or RetryPolicy()).output_budget(ask, ask.top_k)
        return call_key(identity(prompt, ask, max_tokens), ask.top_k, self.limits, repair)


def check_options(options: Options) -> None:
    """The options that are wrong whatever the request: each an `InputError` of its own, before
    the request is read (as `rerank()` always reported them)."""
    if options.fallback not in (None, "local"):
        raise InputError([Violation(path="fallback", value=options.fallback,
                                    message=f"fallback must be None or 'local', got {options.fallback!r}")])
    if options.policy is not None and not isinstance(options.policy, RetryPolicy):
        msg = f"policy must be None or a RetryPolicy, got {type(options.policy).__name__}"
        raise InputError([Violation(path="policy", message=msg)])
    check_concurrency(options.concurrency)
    k = options.consistency
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_CONSISTENCY:
        raise InputError([Violation(path="consistency", value=repr(k),
                                    message=f"consistency must be a whole number from 1 to {MAX_CONSISTENCY} "
                                    f"(passes over shuffled orders), got {k!r}")])


MAX_CONSISTENCY = 20
# Calibration files read so far: path -> ((modification time, size), the calibration). A service
# reads its file once, and again only when it changes (one entry per file, however often it does).
_CALIBRATIONS: dict[str, tuple[tuple[int, int], Any]] = {}


def resolve_calibration(value: Any) -> tuple[Any, str | None]:
    """(the Calibration, the file it came from) for a `calibration=` option, (None, None) without
    one; a file that cannot be used is a `ConfigError` naming it and what is wrong."""
    if value is None:
        return None, None
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        where = os.path.abspath(path)
        try:
            st = os.stat(path)
            version: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            version = None
        seen = _CALIBRATIONS.get(where)
        if version is not None and seen is not None and seen[0] == version:
            return seen[1], path
        try:
            loaded = load_calibration(path)
        except InputError as exc:
            raise ConfigError(f"calibration file {path}: {'; '.join(v.message for v in exc.violations)}"
                              ) from None
        if version is not None:
            _CALIBRATIONS[where] = (version, loaded)
        return loaded, path
    try:
        return as_calibration(value), None
    except InputError as exc:
        raise ConfigError(f"calibration: {'; '.join(v.message for v in exc.violations)}") from None


def check_request(query: Any, chunks: ChunkSource, options: Options) -> RerankRequest:
    """The request as `plan` would accept it, or the `InputError` it would raise: for a caller that
    must judge a request before anything is built (the tool call judges the calling model's
    arguments before the operator's settings)."""
    check_options(options)
    return _validated(query, chunks, options, as_limits(options.limits))[0]


def plan(setup: Setup, query: Any, chunks: ChunkSource, options: Options, *, enforce: bool = True) -> Plan:
    """Every check and decision before the backend is called: the request, the options, the
    metadata values (all parsed before any call), the prompt or the windows; and, with a budget,
    the refusal of a plan that would exceed it (`BudgetError`; not when `enforce` is False, for a
    dry run that only reports it)."""
    check_options(options)
    started = time.perf_counter()
    lim = as_limits(options.limits)
    request, fields, fusion, prices, budget = _validated(query, chunks, options, lim)
    values = meta_values(request, fusion) if fusion is not None else None
    view = with_embedded_meta(request, fields)
    spending = BATCH_SPENDING.get() or (Spending(budget, prices) if budget else None)
    calibration, calibration_file = resolve_calibration(options.calibration)
    window_size = options.window_size
    if window_size is not None and windowed(request, int(window_size)):
        # Each window and the final pass render their own prompt (windows.py).
        out = Plan(request, view, "", setup, options, lim, started, view, setup.embedder, fusion, values,
                   window_size=int(window_size), prices=prices, budget=budget, spending=spending,
                   calibration=calibration, calibration_file=calibration_file)
    else:
        ask = asked(view)
        out = Plan(request, ask, render(ask), setup, options, lim, started, view, setup.embedder, fusion,
                   values, prices=prices, budget=budget, spending=spending, calibration=calibration,
                   calibration_file=calibration_file)
    if budget and enforce:
        refuse(cost_plan(out))
    return out


# A batch's meter (`Reranker.arerank_many(budget=...)`): every request of the batch spends from it.
BATCH_SPENDING: contextvars.ContextVar[Spending | None] = contextvars.ContextVar("BATCH_SPENDING",
                                                                                 default=None)


def cost_plan(plan: Plan) -> CostPlan:
    """What `plan` will do and cost, without any request (`cost.py`): its calls (the windows and a
    final pass as large as a window, or the one call; each of them once per pass with
    `consistency=k`), which of them the cache already holds, the round trips, the re-ask bound and
    the estimated tokens and cost."""
    backend = plan.backend
    scored = bool(getattr(backend, "scored", False))
    remote = makes_requests(backend)
    policy = plan.options.policy or RetryPolicy()
    estimates: list[CallEstimate] = []
    round_trips = 0
    concurrency = int(plan.options.concurrency)
    for sub in pass_plans(plan):
        if sub.window_size is None:
            stages = [("call", sub.ask, sub.prompt)]
        else:
            windows = split(sub.view, sub.window_size)
            stages = [("window", w.ask, w.prompt) for w in windows]
            # The final pass: as many chunks as the fullest window (the survivors are at most that many).
            fullest = max(windows, key=lambda w: len(w.ask.chunks))
            stages.append(("final", fullest.ask, fullest.prompt))
        for stage, ask, prompt in stages:
            key = sub.key(ask, prompt) if stage != "final" else None
            cached = key is not None and sub.setup.cache is not None and sub.setup.cache.contains(key)
            tokens = request_tokens(backend, prompt, ask) if remote else (0, 0)
            budget_out = policy.output_budget(ask, ask.top_k) if remote and not scored else 0
            estimates.append(CallEstimate(stage, len(ask.chunks), tokens[0], tokens[1], budget_out, cached))
        windows_n = len(stages) - 1 if sub.window_size is not None else 0
        round_trips += (-(-windows_n // concurrency) + 1) if windows_n else 1  # passes run one after another
    billed = [e for e in estimates if remote and not e.cached]
    prompt_tokens = sum(e.prompt_tokens for e in billed)
    completion_tokens = sum(e.completion_tokens for e in billed)
    cost = plan.prices.cost(prompt_tokens, completion_tokens) if plan.prices is not None else None
    requests = len(billed)
    reasks = 0 if scored else requests * policy.max_reasks
    return CostPlan(
        backend=plan.backend_name, model=getattr(backend, "model", None), calls=len(estimates),
        requests=requests, round_trips=round_trips if remote else 0, max_reasks=reasks,
        max_requests=requests * (1 if scored else policy.max_attempts), prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens, max_completion_tokens=sum(e.max_tokens for e in billed),
        cost=cost, prices=plan.prices, budget=plan.budget,
        exceeded=over_budget(plan.budget, requests, prompt_tokens + completion_tokens, cost),
        estimates=tuple(estimates))


def _validated(query: Any, chunks: ChunkSource, options: Options, lim: Limits
               ) -> tuple[RerankRequest, tuple[str, ...], MetaFusion | None, Prices | None, Budget | None]:
    """The request and the options (embedded meta fields, metadata fusion, prices, budget), every
    problem with any of them in one `InputError`."""
    opts = options.scoring()
    problems: list[Violation] = duplicate_threshold_violations(options.duplicate_threshold)
    prices: Prices | None = None
    budget: Budget | None = None
    try:
        prices = as_prices(options.prices)
    except InputError as exc:
        problems.extend(exc.violations)
        prices = Prices(0.0, 0.0)  # given, if wrong: a cost limit is not also reported as without prices
    try:
        budget = as_budget(options.budget, prices)
    except InputError as exc:
        problems.extend(exc.violations)
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
        request = validate_request(query, chunks, options.top_k, options.lambda_, limits=lim,
                                   window_size=options.window_size)
    except InputError as exc:
        problems.extend(exc.violations)
    if problems:
        raise InputError(problems)
    return request, fields, fusion, prices, budget


# --------------------------------------------------------------------------- the flow


def flow(plan: Plan) -> Flow:
    """The whole rerank as steps for a driver (module docstring)."""
    if int(plan.options.consistency) > 1:
        return (yield from _consistent(plan))
    if plan.window_size is not None:
        return (yield from _windowed(plan))
    return (yield from _single(plan))


@dataclass(frozen=True)
class Scored:
    """One call's guard-valid answer (a window, the final pass or the only call) and how it came."""

    obj: Mapping[str, Any]
    attempts: int
    repairs: tuple[str, ...]
    usage: Mapping[str, int]
    model: str | None
    latency_ms: float
    notes: tuple[str, ...] = ()
    fallback: str | None = None
    note: str | None = None  # why the fallback answered
    offline: Plan | None = None  # the plan with the lexical embedder, when the embedder failed here
    cached: bool = False  # the response cache answered it


def _scored(outcome: Outcome, started: float, fallback: str | None = None, note: str | None = None,
            failed: BackendError | None = None, offline: Plan | None = None) -> Scored:
    """A call's answer; after a fallback, `failed` is the backend's failure, whose attempts and
    tokens count too."""
    attempts, usage = len(outcome.attempts), dict(outcome.usage)
    if failed is not None:
        attempts, usage = attempts + len(failed.attempts), add_usage(failed.usage, usage)
    return Scored(outcome.obj, attempts, tuple(outcome.repairs), usage, outcome.model,
                  (time.perf_counter() - started) * 1000.0, tuple(outcome.notes), fallback, note, offline,
                  outcome.cached and failed is None)


def _falls_back(plan: Plan, error: BaseException) -> bool:
    """Whether `fallback="local"` answers `error`: any failure of another backend, and a failure of
    the embedder the local backend scores with."""
    return (isinstance(error, BackendError) and plan.fallback == "local"
            and (plan.backend_name != "local" or isinstance(error, EmbedderError)))


def _offline(plan: Plan, error: EmbedderError) -> Plan:
    """`plan` with the lexical embedder in place of the one that failed, and why (for meta.notes)."""
    if plan.embedder_note is not None:
        return plan
    summary = failure_summary(error, plan.setup.api_key)
    note = (f"embedder {getattr(plan.embedder, 'name', plan.embedder)} failed, lexical vectors used instead "
            f"(fallback local): {summary}")
    log.warning("%s", note)  # meta.embedder_fallback says so per result; an operator needs it in the log
    return replace(plan, embedder=get_embedder("lexical"), embedder_note=note)


def _local(plan: Plan) -> Backend:
    """The local backend scoring with `plan`'s embedder: the fallback's scorer."""
    return make_backend("local", embedder=plan.embedder)


@dataclass(frozen=True)
class Answer:
    """How one ask was answered: by the session's backend (`outcome`), by the local backend after
    `error` (`outcome`, `error` and the plan it scored under, `used`), or not at all (`error`)."""

    outcome: Outcome | None
    error: BaseException | None = None
    used: Plan | None = None


def _answers(plan: Plan, asks: Sequence[tuple[RerankRequest, str, str]], *, workers: int, limit: int | None,
             progress: tuple[int, int] | None = None) -> Generator[Step, Any, list[Answer]]:
    """Each ask answered by the session's backend, and where that fails and the fallback applies,
    by the local backend: with the plan's embedder, unless that is what failed (or fails now), then
    fully offline with the lexical one."""
    outcomes = yield Calls(tuple(plan.call(ask, prompt, label=label) for ask, prompt, label in asks), workers,
                           limit, progress)
    # The calibration maps the session backend's scores (it was fitted on them), not the fallback's.
    out = [Answer(_calibrated(plan, o)) if isinstance(o, Outcome) else Answer(None, o) for o in outcomes]
    pending: dict[int, Plan] = {}
    for i, answer in enumerate(out):
        error = answer.error
        if error is None or not _falls_back(plan, error):
            continue
        if isinstance(error, EmbedderError):
            pending[i] = _offline(plan, error)
        else:  # meta.fallback says so per result; an operator watching a service needs it in the log
            log.warning("%s failed, ranking with the local backend (fallback local): %s", plan.backend_name,
                        failure_summary(error, plan.setup.api_key))  # type: ignore[arg-type]
            pending[i] = plan
    for _ in range(2):  # the second round only after the local backend's own embedder failed
        if not pending:
            break
        order = list(pending)
        calls = tuple(plan.call(asks[i][0], asks[i][1], backend=_local(pending[i]), repair=True)
                      for i in order)
        results = yield Calls(calls, 1, limit)  # the local backend: CPU-bound, one thread
        again: dict[int, Plan] = {}
        for i, result in zip(order, results, strict=True):
            if isinstance(result, Outcome):
                out[i] = Answer(result, out[i].error, pending[i])
            elif isinstance(result, EmbedderError) and pending[i].embedder_note is None:
                again[i] = _offline(pending[i], result)
            elif not isinstance(result, BackendError):
                out[i] = Answer(None, result)  # a bug of the fallback, not a failure: raised as it is
        pending = again
    return out


def _calibrated(plan: Plan, outcome: Outcome) -> Outcome:
    """The answer with every score the backend gave mapped by the plan's calibration: the ranked
    chunks' scores and the ones dropped reasons carry (`not_selected: 0.410`). The map is monotone,
    so the order the backend gave stands; the minimum score and MMR then see probabilities."""
    if plan.calibration is None:
        return outcome
    obj = dict(outcome.obj)
    ranked = [dict(item) for item in obj.get("ranked", ())]
    dropped = [dict(item) for item in obj.get("dropped", ()) or ()]
    raw = [float(item["score"]) for item in ranked]
    carried = [(i, reasons.score_in(item["reason"])) for i, item in enumerate(dropped)]
    carried = [(i, v) for i, v in carried if v is not None]
    mapped = apply(plan.calibration, raw + [v for _, v in carried]) if raw or carried else []
    for item, value in zip(ranked, mapped[:len(raw)], strict=True):
        item["score"] = round(float(value), 4)
    for (i, _), value in zip(carried, mapped[len(raw):], strict=True):
        token = reasons.split(dropped[i]["reason"])[0]  # type: ignore[index]
        dropped[i]["reason"] = reasons.reason(token, reasons.score_detail(float(value)))
    obj["ranked"] = ranked
    if "dropped" in outcome.obj:
        obj["dropped"] = dropped
    return replace(outcome, obj=obj)


def _heavy(plan: Plan) -> bool:
    """Whether the post-pass embeds with a model or a server (then off the event loop): lexical
    and caller vectors cost well under a millisecond per chunk."""
    name = _embedder_name(plan)
    return not (name.startswith("lexical") or name == "caller")


def _postpass_step(plan: Plan, obj: Mapping[str, Any], view: RerankRequest, fallback: str | None,
                   ask: RerankRequest | None = None) -> Generator[Step, Any, tuple[RerankResult, Plan]]:
    """The post-pass; with `fallback="local"`, on lexical vectors when the embedder fails, keeping
    the ranking the backend already gave (asking the LLM again would bill it twice). Given the
    `ask` a scored backend answered, a list left short while chunks it scored above the minimum
    wait outside its candidates is refilled (`_refill`)."""
    try:
        result = yield Work(lambda: _postpass(plan, obj, view), _heavy(plan))
    except EmbedderError as exc:
        if fallback != "local":
            raise _redacted(exc, plan.setup.api_key) from None
        plan = _offline(plan, exc)
        result = yield Work(lambda: _postpass(plan, obj, view), _heavy(plan))
    if ask is not None and _waiting(plan, ask, result):
        result = yield from _refill(plan, ask, view, result)
    return result, plan


def _waiting(plan: Plan, ask: RerankRequest, result: RerankResult) -> bool:
    """Whether a scored backend's list is short while a chunk it scored above the minimum waits
    outside the candidates it was asked for (its `not_selected` detail holds the score): the
    post-pass's merges used the candidates up. A word budget's cut is not a short list."""
    if not getattr(plan.backend, "scored", False) or ask.top_k >= len(ask.chunks) \
            or len(result.ranked) >= _wanted(plan, ask):
        return False
    said = [reasons.split(d.reason) for d in result.dropped]
    if any(p is not None and p[0] == reasons.OVER_WORD_BUDGET for p in said):
        return False
    floor = plan.limits.min_score
    return any((s := reasons.score_in(d.reason)) is not None and s > floor and p is not None
               and p[0] == reasons.NOT_SELECTED for d, p in zip(result.dropped, said, strict=True))


def _wanted(plan: Plan, ask: RerankRequest) -> int:
    """The caller's top_k, at most the chunks the ask holds."""
    return min(plan.request.top_k, len(ask.chunks))


def _refill(plan: Plan, ask: RerankRequest, view: RerankRequest, short: RerankResult
            ) -> Generator[Step, Any, RerankResult]:
    """The scored backend asked again for every chunk of `ask` (its scores are the same: it scores
    each chunk on its own), and the post-pass over that answer; the short list stays, noted, if
    that call fails."""
    wider = replace(ask, top_k=len(ask.chunks))
    (answer,) = yield from _answers(plan, [(wider, render(wider), "the refill")], workers=1, limit=None)
    if answer.outcome is None or answer.error is not None:
        why = failure_summary(answer.error, plan.setup.api_key) if answer.error else "no answer"
        return replace(short, meta=replace(short.meta, notes=(*short.meta.notes, f"refill failed: {why}")))
    obj = answer.outcome.obj
    result = yield Work(lambda: _postpass(plan, obj, view), _heavy(plan))
    note = (f"refill: merges used up the {ask.top_k} candidates; all {len(ask.chunks)} chunks' scores "
            f"asked for again, {len(result.ranked)} ranked")
    return replace(result, meta=replace(result.meta, notes=(*result.meta.notes, note)))


def _postpass(plan: Plan, obj: Mapping[str, Any], view: RerankRequest) -> RerankResult:
    ranked, dropped = _ranked_and_dropped(obj)
    if plan.fusion is not None and plan.meta_values is not None:
        ranked, dropped = fuse(ranked, dropped, plan.meta_values, plan.fusion, plan.limits.min_score)
    return postpass(view, ranked, dropped, embedder=plan.embedder,
                    duplicate_threshold=plan.options.duplicate_threshold, layout=plan.options.layout,
                    min_score=plan.limits.min_score)


def _ranked_and_dropped(obj: Mapping[str, Any]) -> tuple[list[Ranked], list[Dropped]]:
    """The guarded output object as value types (the guard already checked every field)."""
    ranked = [Ranked(id=r["id"], score=float(r["score"]), reason=r["reason"],
                     diversity_note=r.get("diversity_note")) for r in obj.get("ranked", ())]
    dropped = [Dropped(id=d["id"], reason=d["reason"]) for d in obj.get("dropped", ()) or ()]
    return ranked, dropped


# --------------------------------------------------------------------------- one call


def _single(plan: Plan) -> Flow:
    (answer,) = yield from _answers(plan, [(plan.ask, plan.prompt, "the call")], workers=1, limit=None)
    if answer.outcome is None:
        error = answer.error
        assert error is not None
        raise _redacted(error, plan.setup.api_key) if isinstance(error, BackendError) else error
    if answer.error is None:
        return (yield from _finish(plan, answer.outcome))
    return (yield from _fallback_result(plan, answer))


def _finish(plan: Plan, outcome: Outcome) -> Flow:
    result, plan = yield from _postpass_step(plan, outcome.obj, plan.view, plan.fallback, plan.ask)
    notes = [*outcome.notes, *result.meta.notes]
    if plan.ask.top_k != plan.request.top_k:
        notes.append(f"candidate_k={plan.ask.top_k}")
    notes.extend(_scoring_notes(plan))
    meta = _meta(plan, model=outcome.model or getattr(plan.backend, "model", None),
                 attempts=len(outcome.attempts), repairs=outcome.repairs, usage=outcome.usage, notes=notes,
                 cache=_cache_meta(plan, [(outcome.cached, outcome.usage)]))
    return replace(result, meta=meta, scores=scores_of(plan.request, [outcome.obj], result.ranked))


def _fallback_result(plan: Plan, answer: Answer) -> Flow:
    """The local ranking after the backend's failure, flagged in meta.

    After an `EmbedderError` (the embedder failed, whoever scored) the local backend scores with
    the lexical embedder and only `meta.embedder_fallback` says so; after any other failure of
    another backend, `meta.fallback` is "local"."""
    error, outcome, used = answer.error, answer.outcome, answer.used
    assert isinstance(error, BackendError) and outcome is not None and used is not None
    result, used = yield from _postpass_step(used, outcome.obj, used.view, "local")
    backend_failed = not (isinstance(error, EmbedderError) and used.backend_name == "local")
    summary = failure_summary(error, used.setup.api_key)
    notes = [f"{used.backend_name} failed after {counted(len(error.attempts), 'attempt')}: {summary}"
             ] if backend_failed else []
    meta = _meta(used, model=outcome.model, attempts=len(error.attempts) + len(outcome.attempts),
                 repairs=outcome.repairs, usage=add_usage(error.usage, outcome.usage),
                 fallback="local" if backend_failed else None, notes=(*notes, *_scoring_notes(used)),
                 cache=_cache_meta(plan, [(False, {})]))
    return replace(result, meta=meta, scores=scores_of(used.request, [outcome.obj], result.ranked))


# --------------------------------------------------------------------------- consistency


def pass_plans(plan: Plan) -> list[Plan]:
    """The plans of `consistency=k`'s passes: the first in the given order, each other in its own
    shuffle, seeded by the pass number, the query and the chunk ids (the same request gets the same
    orders every time, so the cache answers a repeated one). One plan, `plan`, when k is 1."""
    k = int(plan.options.consistency)
    if k <= 1:
        return [plan]
    out = []
    ids = "\x1f".join(c.id for c in plan.request.chunks)
    options = replace(plan.options, consistency=1)
    for p in range(k):
        order = list(range(len(plan.request.chunks)))
        if p:
            digest = hashlib.blake2b(f"{p}\x1e{plan.request.query}\x1e{ids}".encode(), digest_size=8).digest()
            order = [int(i) for i in _permutation(len(order), int.from_bytes(digest, "big"))]
        request = replace(plan.request, chunks=tuple(plan.request.chunks[i] for i in order))
        view = replace(plan.view, chunks=tuple(plan.view.chunks[i] for i in order))
        if plan.window_size is not None:
            out.append(replace(plan, request=request, view=view, ask=view, options=options))
        else:
            ask = asked(view)
            out.append(replace(plan, request=request, view=view, ask=ask, prompt=render(ask),
                               options=options))
    return out


# How the passes' scores become one: "mean_score" (each chunk's mean), or "debiased_mean" (the mean
# with a position effect linear in where the chunk was shown, fitted on the passes themselves,
# taken out: each chunk scored as if shown where the model favours least). Measured on the
# simulated judge by bench/bias.py --part consistency.
AGGREGATES = ("mean_score", "debiased_mean")
AGGREGATE = "debiased_mean"


def aggregate(scores: Sequence[Sequence[float]], where: Sequence[Sequence[float]], how: str
              ) -> tuple[list[float], float | None]:
    """One score per chunk from `scores[pass][chunk]`, shown at relative position `where[pass][chunk]`
    (0 first, 1 last), and the fitted position slope (None for `mean_score`).

    `debiased_mean` fits s = t_chunk + slope * position by least squares within each chunk (the
    chunk's own mean takes out what it is worth), then scores each chunk at the least favoured end:
    mean + slope * (end - its mean position), end = 1 when the slope favours the first (primacy),
    0 when it favours the last (recency); clipped to [0, 1]. A bias that is not linear in position
    keeps the part a line does not fit."""
    k, n = len(scores), len(scores[0]) if scores else 0
    means = [sum(scores[p][j] for p in range(k)) / k for j in range(n)]
    if how == "mean_score" or k < 2 or n < 2:
        return means, None
    centre = [sum(where[p][j] for p in range(k)) / k for j in range(n)]
    num = sum((where[p][j] - centre[j]) * (scores[p][j] - means[j]) for p in range(k) for j in range(n))
    den = sum((where[p][j] - centre[j]) ** 2 for p in range(k) for j in range(n))
    if den <= 0:
        return means, 0.0
    slope = num / den
    end = 1.0 if slope < 0 else 0.0
    return [min(1.0, max(0.0, means[j] + slope * (end - centre[j]))) for j in range(n)], slope


def _permutation(n: int, seed: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).permutation(n)]


def _consistent(plan: Plan) -> Flow:
    """`consistency=k`: the whole rerank (windows per window) once per pass, over its own order;
    each chunk's scores over the passes (0 where a pass gave none) become one by `aggregate`, and
    the post-pass ranks those once. `meta.consistency` says how far the passes agreed: the mean
    Kendall tau between their scores."""
    passes = pass_plans(plan)
    results: list[RerankResult] = []
    for sub in passes:
        results.append((yield from (_windowed(sub) if sub.window_size is not None else _single(sub))))
    ids = [c.id for c in plan.request.chunks]

    def number(value: Any) -> float | None:
        return float(value) if isinstance(value, float) else None

    table = [[number(r.scores.get(i)) for i in ids] for r in results]
    filled = [[v if v is not None else 0.0 for v in row] for row in table]
    shown = [{c.id: n for n, c in enumerate(sub.request.chunks)} for sub in passes]
    where = [[shown[p][i] / max(1, len(ids) - 1) for i in ids] for p in range(len(passes))]
    mean, slope = aggregate(filled, where, AGGREGATE)
    mean = dict(zip(ids, mean, strict=True))
    scored_any = {i for j, i in enumerate(ids) if any(row[j] is not None for row in table)}
    taus = [kendall_tau(filled[a], filled[b]) for a in range(len(filled)) for b in range(a + 1, len(filled))]
    kept = [t for t in taus if not math.isnan(t)]
    agreement = round(sum(kept) / len(kept), 4) if kept else None

    # What the post-pass ranks: the candidates by combined score, each with a reason a pass gave it.
    said = {}
    for r in results:
        for item in r.ranked:
            said.setdefault(item.id, item.reason)
    order = sorted((i for i in ids if i in scored_any), key=lambda i: -mean[i])
    ask_k = asked(plan.view).top_k
    ranked = [{"id": i, "score": round(mean[i], 4),
               "reason": said.get(i, f"combined score over {len(passes)} passes in shuffled orders")}
              for i in order[:ask_k]]
    first = {d.id: d.reason for d in results[0].dropped}
    in_ranked = {item["id"] for item in ranked}
    dropped = [{"id": i, "reason": (reasons.reason(reasons.NOT_SELECTED, reasons.score_detail(mean[i]))
                                    if i in scored_any else first.get(i, reasons.NOT_SELECTED))}
               for i in ids if i not in in_ranked]
    obj = {"ranked": ranked, "dropped": dropped}
    result, used = yield from _postpass_step(plan, obj, plan.view, plan.fallback)

    metas = [r.meta for r in results]
    caches = [m.cache for m in metas if m.cache is not None]
    cache = ({key: sum(int(c.get(key, 0)) for c in caches) for key in ("hits", "misses", "saved_tokens")}
             if caches else None)
    windows = tuple({"pass": p, **w} for p, m in enumerate(metas) for w in m.windows)
    notes = list(dict.fromkeys(n for m in metas for n in m.notes))
    notes.append(f"consistency: {len(passes)} passes over shuffled orders, {AGGREGATE}; agreement "
                 f"(mean Kendall tau) {agreement if agreement is not None else 'n/a'}")
    meta = _meta(used, model=next((m.model for m in metas if m.model), None),
                 attempts=sum(m.attempts for m in metas),
                 repairs=[f"pass {p}: {r}" for p, m in enumerate(metas) for r in m.repairs],
                 usage=add_usage(*(m.usage for m in metas)),
                 fallback="local" if any(m.fallback for m in metas) else None, notes=notes,
                 calls=sum(m.calls for m in metas), windows=windows, cache=cache)
    summary = {"passes": len(passes), "aggregate": AGGREGATE, "agreement": agreement,
               "position_slope": None if slope is None else round(slope, 4),
               "taus": [None if math.isnan(t) else round(t, 4) for t in taus]}
    meta = replace(meta, consistency=summary,
                   embedder=result.meta.embedder or meta.embedder)
    scores: dict[str, float | str] = {i: round(mean[i], 4) if i in scored_any else results[0].scores.get(
        i, _UNSCORED) for i in ids}
    for item in result.ranked:
        scores[item.id] = item.score
    return replace(result, meta=meta, scores=scores)


# --------------------------------------------------------------------------- windows


def _windowed(plan: Plan) -> Flow:
    """Windows scored concurrently, one final pass over the survivors, the post-pass over them."""
    assert plan.window_size is not None
    windows = split(plan.view, plan.window_size)
    concurrency = int(plan.options.concurrency)
    # Threads for the synchronous driver: the local backend is CPU-bound (the GIL would only add
    # switching), a remote one waits on the network.
    workers = 1 if plan.backend_name == "local" else max(1, min(concurrency, len(windows)))
    total = len(windows) + 1
    answers = yield from _answers(plan, [(w.ask, w.prompt, w.label) for w in windows], workers=workers,
                                  limit=concurrency, progress=(0, total))
    scored = [_window_answer(plan, w, a) for w, a in zip(windows, answers, strict=True)]
    survivors = select_survivors(plan.view, plan.limits, windows, [s.obj for s in scored], plan.window_size)
    final = None
    if survivors.indices:
        window = final_window(plan.view, survivors, len(windows))
        (answer,) = yield from _answers(plan, [(window.ask, window.prompt, window.label)], workers=1,
                                        limit=concurrency)
        final = (window, _window_answer(plan, window, answer))
    yield Progress(total, total)
    return (yield from _assemble(plan, windows, scored, survivors, final))


def _window_answer(plan: Plan, window: Window, answer: Answer) -> Scored:
    """A window's (or the final pass's) answer, or its failure raised with the window named."""
    started = time.perf_counter()
    if answer.outcome is None:
        error = answer.error
        if isinstance(error, BackendError):
            raise _named(plan, window, error)
        raise error  # type: ignore[misc]
    if answer.error is None:
        return _scored(answer.outcome, started)
    error, used = answer.error, answer.used
    assert isinstance(error, BackendError) and used is not None
    offline = used if used.embedder_note is not None else None
    if isinstance(error, EmbedderError) and plan.backend_name == "local":
        return _scored(answer.outcome, started, failed=error, offline=offline)
    summary = failure_summary(error, plan.setup.api_key)
    note = (f"{window.name}: {plan.backend_name} failed after {counted(len(error.attempts), 'attempt')}, "
            f"ranked by the local backend: {summary}")
    return _scored(answer.outcome, started, "local", note, error, offline)


def _named(plan: Plan, window: Window, error: BackendError) -> BackendError:
    """The failure with the window it happened in at the front, API keys removed."""
    clean = _redacted(error, plan.setup.api_key)
    head = str(clean).split(" [#", 1)[0]
    return BackendError(f"{window.label}: {head}", clean.attempts, usage=clean.usage)


def _entry(window: Window, answer: Scored, survivors: Survivors | None, cache: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"stage": "final" if window.final else "window", "index": window.index,
                             "size": len(window.ask.chunks)}
    if not window.final:
        entry["chunks"] = [window.first, window.end]
        if survivors is not None:
            entry["survivors"] = sum(1 for i in survivors.indices if window.first <= i < window.end)
    entry.update({"attempts": answer.attempts, "usage": dict(answer.usage), "fallback": answer.fallback,
                  "latency_ms": round(answer.latency_ms, 3)})
    if cache:
        entry["cached"] = answer.cached
    return entry


def _assemble(plan: Plan, windows: Sequence[Window], scored: Sequence[Scored], survivors: Survivors,
              final: tuple[Window, Scored] | None) -> Flow:
    """The post-pass over the survivors, the losers' reasons, and the meta of every call."""
    request = plan.request
    # Once the embedder failed in a window, the rest of the request compares lexical vectors too.
    plan = next((a.offline for a in (*scored, *([final[1]] if final else [])) if a.offline), plan)
    if final is not None:
        window, answer = final
        kept = survivors.indices
        sub = replace(plan, request=replace(request, chunks=tuple(request.chunks[i] for i in kept)))
        result, sub = yield from _postpass_step(sub, answer.obj, replace(plan.view, chunks=window.ask.chunks),
                                                plan.fallback, window.ask)
        plan = replace(plan, embedder=sub.embedder, embedder_note=sub.embedder_note)
    else:  # no chunk scored above the minimum in any window: nothing to rank
        result = RerankResult(ranked=())
    ranked_ids = {r.id for r in result.ranked}
    reason_of = {d.id: d.reason for d in result.dropped}
    for i, why in survivors.reasons.items():
        reason_of[request.chunks[i].id] = why
    for i, (window, own) in survivors.window_dropped.items():
        reason_of[request.chunks[i].id] = loser_reason(window, own, ranked_ids)
    dropped = tuple(Dropped(c.id, reason_of[c.id]) for c in request.chunks if c.id not in ranked_ids)

    calls = [*zip(windows, scored, strict=True), *([final] if final is not None else [])]
    usage = add_usage(*(answer.usage for _, answer in calls))
    repairs = [f"{w.name}: {r}" for w, a in calls for r in a.repairs]
    notes = [a.note for _, a in calls if a.note] + _scoring_notes(plan)
    notes.append(f"windows: {len(windows)} of at most {counted(windows[0].end - windows[0].first, 'chunk')}, "
                 f"{counted(len(survivors.indices), 'survivor')}"
                 + (", final pass skipped (no chunk above the minimum score)" if final is None else ""))
    model = next((a.model for w, a in reversed(calls) if a.fallback is None and a.model), None)
    cache = _cache_meta(plan, [(a.cached, a.usage) for _, a in calls])
    meta = _meta(plan, model=model or getattr(plan.backend, "model", None),
                 attempts=sum(a.attempts for _, a in calls), repairs=repairs, usage=usage,
                 fallback="local" if any(a.fallback for _, a in calls) else None, notes=notes,
                 calls=len(calls),
                 windows=tuple(_entry(w, a, survivors, cache is not None) for w, a in calls),
                 cache=cache)
    meta = replace(meta, embedder=result.meta.embedder or meta.embedder,
                   notes=(*meta.notes, *result.meta.notes))
    answers = [a.obj for a in scored] + ([final[1].obj] if final is not None else [])
    return RerankResult(ranked=result.ranked, dropped=dropped, meta=meta,
                        scores=scores_of(request, answers, result.ranked))


# --------------------------------------------------------------------------- meta and messages


_UNSCORED = "not scored: the model neither ranked nor dropped it"
_NO_NUMBER = "no score: the model dropped it without one"


def scores_of(request: RerankRequest, answers: Sequence[Mapping[str, Any]], ranked: Sequence[Ranked]
              ) -> dict[str, float | str]:
    """Every input id's score, in input order: the ranked chunks' final scores, else the last
    answer's (the final pass over the windows') score for the chunk, in `ranked` or in a dropped
    reason's detail (`not_selected: 0.410`, as the scored backends write them); or why there is none."""
    out: dict[str, float | str] = {}
    for obj in answers:
        for item in obj.get("ranked", ()):
            out[item["id"]] = float(item["score"])
        for item in obj.get("dropped", ()) or ():
            score = reasons.score_in(item["reason"])
            if score is not None:
                out[item["id"]] = score
            elif not isinstance(out.get(item["id"]), float):
                out[item["id"]] = _NO_NUMBER
    for item in ranked:
        out[item.id] = item.score
    return {c.id: out.get(c.id, _UNSCORED) for c in request.chunks}


def _cache_meta(plan: Plan, calls: Sequence[tuple[bool, Mapping[str, int]]]) -> dict[str, int] | None:
    """`meta.cache`: the session backend's calls the cache answered (hits) and not (misses), and the
    tokens the hits did not spend; None when the session has no cache for this backend."""
    if plan.setup.cache is None or not callable(getattr(plan.backend, "cache_identity", None)):
        return None
    hits = [usage for cached, usage in calls if cached]
    return {"hits": len(hits), "misses": len(calls) - len(hits),
            "saved_tokens": sum(sum(usage_tokens(u)) for u in hits)}


def _meta(plan: Plan, *, model: str | None, attempts: int, repairs: Sequence[str], usage: Mapping[str, int],
          fallback: str | None = None, notes: Sequence[str] = (), calls: int = 1,
          windows: Sequence[Mapping[str, Any]] = (), cache: Mapping[str, int] | None = None) -> RunMeta:
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
        cache=cache,
        calibration=_calibration_meta(plan),
    )


def _calibration_meta(plan: Plan) -> dict[str, Any] | None:
    """`meta.calibration`: which map was applied (its method, file and the file format's version),
    and why it may not suit this backend when it was fitted for another one."""
    if plan.calibration is None:
        return None
    cal = plan.calibration
    out: dict[str, Any] = {"method": cal.method, "file": plan.calibration_file, "version": VERSION}
    warning = mismatch(cal, backend=plan.backend_name, model=getattr(plan.backend, "model", None))
    if warning:
        out["warning"] = warning
    return out


def _scoring_notes(plan: Plan) -> list[str]:
    f = plan.fusion
    if f is None:
        return []
    return [f"meta_fusion: field={f.field} weight={f.weight:g} mode={f.ranking_mode} order={f.sort_order} "
            f"missing={f.missing} type={f.value_type}"]


def _embedder_name(plan: Plan) -> str:
    """What the post-pass compared: the caller's vectors when every chunk carries one."""
    if all(c.embedding is not None for c in plan.request.chunks):
        return "caller"
    return str(getattr(plan.embedder, "name", plan.embedder))


def failure_summary(error: BaseException, api_key: str | None) -> str:
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


__all__ = ["BATCH_SPENDING", "MAX_CONSISTENCY", "Call", "Calls", "Flow", "Plan", "Progress", "Setup", "Step",
           "Work", "check_options", "check_request", "cost_plan", "failure_summary", "flow", "pass_plans",
           "plan", "resolve_calibration", "scores_of"]
