"""`fallback=`: who answers when a call or the embedder fails, decided in one place.

One call, each window and the final pass ask through `answers`: a `BackendError` of another
backend is answered by the fallback chain's steps in order (`fallback_chain.py`; `"local"`, the
local backend, is the usual one: meta says `fallback: "local"`, notes say why), and every call
made, the failed one and each step tried, is written down as a `CallRecord`; an
`EmbedderError` (the embedder failed, whoever scored) puts lexical vectors in its place for the
rest of the request (`meta.embedder_fallback`). The post-pass (`postpass_step`) falls back the same
way, keeping the ranking the backend already gave. Without the option, a failure is raised with
every API key removed from its text.

The calibration (`calibration=`) maps the session backend's scores here, as they arrive: it was
fitted on that backend's scores, not on the fallback's.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .backends.base import Backend
from .backends.factory import model_of
from .calibration_map import calibrate_answer
from .embed import get_embedder
from .errors import BackendError, EmbedderError, RerankError
from .fallback_chain import CROSS_ENCODER, as_chain, build_step, step_name
from .frozen import direct_init
from .fusion import fuse
from .meta import cache_meta, embedder_name, run_meta, scores_of, scoring_notes
from .models import CallRecord, Dropped, Ranked, RerankRequest, RerankResult, add_usage
from .postpass import postpass, postpass_guarded
from .redaction import failure_summary, redacted
from .retry import Outcome
from .steps import Call, Calls, Flow, Plan, Step, Work
from .wording import counted


@direct_init
@dataclass(frozen=True)
class Answer:
    """How one ask was answered: by the session's backend (`outcome`), by a step of the fallback
    chain after `error` (`outcome`, `error`, the plan it scored under, `used`, and the step's name,
    `step`), or not at all (`error`). `records` holds every call made for it, in order: the
    session backend's, then each step tried (`models.CallRecord`, what meta.status and the spans read)."""

    outcome: Outcome | None
    error: BaseException | None = None
    used: Plan | None = None
    step: str | None = None
    records: tuple[CallRecord, ...] = ()


def falls_back(plan: Plan, error: BaseException) -> bool:
    """Whether the fallback chain answers `error`: any failure of another backend, and a failure of
    the embedder the local backend scores with."""
    return (isinstance(error, BackendError) and bool(plan.chain)
            and (plan.backend_name != "local" or isinstance(error, EmbedderError)))


def offline(plan: Plan, error: EmbedderError) -> Plan:
    """`plan` with the lexical embedder in place of the one that failed, and why (for meta.notes;
    the log line is written from the result, `observe.py`)."""
    if plan.embedder_note is not None:
        return plan
    summary = failure_summary(error, plan.setup.api_key)
    note = (f"embedder {getattr(plan.embedder, 'name', plan.embedder)} failed, lexical vectors used instead "
            f"(fallback local): {summary}")
    return replace(plan, embedder=get_embedder("lexical"), embedder_note=note)


def _step_backend(plan: Plan, step: Any) -> Backend:
    """The scorer of a chain step under `plan`: the local backend with the plan's embedder (the
    lexical one once the embedder failed), the first-stage order, a cross-encoder built once per
    session (`Setup.fallbacks`), or the caller's backend instance."""
    if step_name(step) == CROSS_ENCODER:  # a model: loaded once per session, per model named
        kept = plan.setup.fallbacks
        if step not in kept:
            kept[step] = build_step(step, plan.embedder)
        return kept[step]  # type: ignore[no-any-return]
    return build_step(step, plan.embedder)  # type: ignore[no-any-return]


def _record(plan: Plan, where: tuple[str, int], ask: RerankRequest, label: str, scorer: str, role: str,
            result: Any, span: tuple[int, int], model: str | None) -> CallRecord:
    """One call as the record keeps it: the model asked for, its requests (timed by the retry loop;
    each says which model answered), or for a call that made none (a cache hit, a refusal, a scorer
    that could not be built) the step's time."""
    stage, index = where
    if isinstance(result, Outcome):
        attempts = result.attempts
        start, end = (attempts[0].start_ns, attempts[-1].end_ns) if attempts else span
        return CallRecord(stage, index, scorer, role, True, attempts, dict(result.usage), model,
                          result.cached, size=len(ask.chunks), label=label, repairs=tuple(result.repairs),
                          start_ns=start, end_ns=end)
    clean = redacted(result, plan.setup.api_key) if isinstance(result, BackendError) else result
    attempts = tuple(getattr(clean, "attempts", ()))
    start, end = (attempts[0].start_ns, attempts[-1].end_ns) if attempts else span
    return CallRecord(stage, index, scorer, role, False, attempts, dict(getattr(clean, "usage", {}) or {}),
                      model, error_type=type(result).__name__,
                      refused=bool(getattr(result, "refused", False)), size=len(ask.chunks), label=label,
                      start_ns=start, end_ns=end)


def answers(plan: Plan, asks: Sequence[tuple[RerankRequest, str, str]], *, workers: int, limit: int | None,
            progress: tuple[int, int] | None = None, where: Sequence[tuple[str, int]] | None = None
            ) -> Generator[Step, Any, list[Answer]]:
    """Each ask answered by the session's backend, and where that fails and a fallback chain is set,
    by its steps in order until one answers: the local backend with the plan's embedder, unless
    that is what failed (or fails now), then again fully offline with the lexical one. `where`
    names each ask's call for the record (`(stage, index)`; the only call by default)."""
    where = list(where) if where is not None else [("call", 1)] * len(asks)
    began = time.time_ns()
    outcomes = yield Calls(tuple(plan.call(ask, prompt, label=label) for ask, prompt, label in asks), workers,
                           limit, progress)
    span = (began, time.time_ns())
    asked_model = model_of(plan.backend)
    records = [[_record(plan, where[i], asks[i][0], asks[i][2], plan.backend_name, "primary", o, span,
                        asked_model)] for i, o in enumerate(outcomes)]
    # ask -> (the plan it scores under, the step to try)
    pending: dict[int, tuple[Plan, int]] = {i: (offline(plan, o) if isinstance(o, EmbedderError) else plan, 0)
                                            for i, o in enumerate(outcomes)
                                            if not isinstance(o, Outcome) and falls_back(plan, o)}
    # The calibration maps the session backend's scores (it was fitted on them), not the fallback's.
    if not pending:  # nearly every call: answered by the session's backend, or failed with no step to try
        return [Answer(_calibrated(plan, o), None, None, None, tuple(r)) if isinstance(o, Outcome)
                else Answer(None, o, None, None, tuple(r)) for o, r in zip(outcomes, records, strict=True)]
    out = [Answer(_calibrated(plan, o)) if isinstance(o, Outcome) else Answer(None, o) for o in outcomes]
    chain = plan.chain
    for _ in range(2 * len(chain)):  # each step at most twice: the second time on lexical vectors
        if not pending:
            break
        again: dict[int, tuple[Plan, int]] = {}
        called: list[tuple[int, Call]] = []
        for i, (used, k) in pending.items():
            try:
                backend = _step_backend(used, chain[k])
            except RerankError as exc:  # a scorer that cannot be built here (its package is missing)
                now = time.time_ns()
                records[i].append(_record(plan, where[i], asks[i][0], asks[i][2], step_name(chain[k]),
                                          "fallback", exc, (now, now), None))
                if k + 1 < len(chain):
                    again[i] = (used, k + 1)
                continue
            called.append((i, plan.call(asks[i][0], asks[i][1], backend=backend, repair=True)))
        began = time.time_ns()
        # The fallback's scorers are local and CPU-bound (or the caller's backend): one at a time.
        results = (yield Calls(tuple(c for _, c in called), 1, limit)) if called else []
        span = (began, time.time_ns())
        for (i, call), result in zip(called, results, strict=True):
            used, k = pending[i]
            name = step_name(chain[k])
            records[i].append(_record(plan, where[i], asks[i][0], asks[i][2], name, "fallback", result, span,
                                      model_of(call.backend)))
            if isinstance(result, Outcome):
                out[i] = Answer(result, out[i].error, used, name)
            elif isinstance(result, EmbedderError) and used.embedder_note is None:
                again[i] = (offline(used, result), k)
            elif isinstance(result, BackendError):
                if k + 1 < len(chain):
                    again[i] = (used, k + 1)
            else:
                out[i] = Answer(None, result)  # a bug of the fallback, not a failure: raised as it is
        pending = again
    return [Answer(a.outcome, a.error, a.used, a.step, tuple(r)) for a, r in zip(out, records, strict=True)]


def _calibrated(plan: Plan, outcome: Outcome) -> Outcome:
    """The answer with the plan's calibration applied to its scores (`calibration_map.calibrate_answer`)."""
    if plan.calibration is None:
        return outcome
    return replace(outcome, obj=calibrate_answer(plan.calibration, outcome.obj))


def heavy(plan: Plan) -> bool:
    """Whether the post-pass embeds with a model or a server (then off the event loop): lexical
    and caller vectors cost well under a millisecond per chunk."""
    name = embedder_name(plan)
    return not (name.startswith("lexical") or name == "caller")


def postpass_step(plan: Plan, obj: Mapping[str, Any], view: RerankRequest, fallback: str | None
                  ) -> Generator[Step, Any, tuple[RerankResult, Plan]]:
    """The post-pass; with a fallback chain, on lexical vectors when the embedder fails, keeping
    the ranking the backend already gave (asking the LLM again would bill it twice). (A scored
    backend's list left short by the merges is refilled by `refill.postpass_refilled`.)"""
    try:
        result = yield Work(lambda: run_postpass(plan, obj, view), heavy(plan))
    except EmbedderError as exc:
        if not as_chain(fallback):
            raise redacted(exc, plan.setup.api_key) from None
        plan = offline(plan, exc)
        result = yield Work(lambda: run_postpass(plan, obj, view), heavy(plan))
    return result, plan


def run_postpass(plan: Plan, obj: Mapping[str, Any], view: RerankRequest) -> RerankResult:
    """The post-pass over a guarded answer under `plan`: read as it is (`postpass_guarded`: the
    guard and the options table checked it), or as value types when metadata fusion re-scores it
    first."""
    settings = {"embedder": plan.embedder, "duplicate_threshold": plan.settings.duplicate_threshold,
                "layout": plan.settings.layout, "min_score": plan.limits.min_score}
    if plan.fusion is None or plan.meta_values is None:
        return postpass_guarded(view, obj, **settings)
    ranked, dropped = fuse(*_ranked_and_dropped(obj), plan.meta_values, plan.fusion, plan.limits.min_score)
    return postpass(view, ranked, dropped, **settings)


def _ranked_and_dropped(obj: Mapping[str, Any]) -> tuple[list[Ranked], list[Dropped]]:
    """The guarded output object as value types (the guard already checked every field)."""
    # Positional arguments: a frozen dataclass's keywords cost a third more, per item.
    ranked = [Ranked(r["id"], float(r["score"]), r["reason"], r.get("diversity_note"))
              for r in obj.get("ranked", ())]
    dropped = [Dropped(d["id"], d["reason"]) for d in obj.get("dropped", ()) or ()]
    return ranked, dropped


def fallback_result(plan: Plan, answer: Answer) -> Flow:
    """The fallback's ranking of a one-call request after the backend's failure, flagged in meta.

    After an `EmbedderError` (the embedder failed, whoever scored) the local backend scores with
    the lexical embedder and only `meta.embedder_fallback` says so; after any other failure of
    another backend, `meta.fallback` names the step that answered ("local")."""
    error, outcome, used = answer.error, answer.outcome, answer.used
    assert isinstance(error, BackendError) and outcome is not None and used is not None
    result, used = yield from postpass_step(used, outcome.obj, used.view, "local")
    backend_failed = not (isinstance(error, EmbedderError) and used.backend_name == "local")
    summary = failure_summary(error, used.setup.api_key)
    notes = [f"{used.backend_name} failed after {counted(len(error.attempts), 'attempt')}: {summary}"
             ] if backend_failed else []
    meta = run_meta(used, model=outcome.model, attempts=len(error.attempts) + len(outcome.attempts),
                    repairs=outcome.repairs, usage=add_usage(error.usage, outcome.usage),
                    fallback=answer.step if backend_failed else None, notes=(*notes, *scoring_notes(used)),
                    cache=cache_meta(plan, [(False, {})]), records=answer.records, decided=outcome.decided)
    return replace(result, meta=meta, scores=scores_of(used.request, [outcome.obj], result.ranked))


__all__ = ["Answer", "answers", "fallback_result", "falls_back", "heavy", "offline", "postpass_step",
           "run_postpass"]
