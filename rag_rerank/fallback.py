"""`fallback="local"`: who answers when a call or the embedder fails, decided in one place.

One call, each window and the final pass ask through `answers`: a `BackendError` of another
backend is answered by the local backend (meta says `fallback: "local"`, notes say why); an
`EmbedderError` (the embedder failed, whoever scored) puts lexical vectors in its place for the
rest of the request (`meta.embedder_fallback`). The post-pass (`postpass_step`) falls back the same
way, keeping the ranking the backend already gave. Without the option, a failure is raised with
every API key removed from its text.

The calibration (`calibration=`) maps the session backend's scores here, as they arrive: it was
fitted on that backend's scores, not on the fallback's.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .backends.base import Backend
from .backends.factory import make_backend
from .calibration_map import calibrate_answer
from .embed import get_embedder
from .errors import BackendError, EmbedderError
from .fusion import fuse
from .meta import cache_meta, embedder_name, run_meta, scores_of, scoring_notes
from .models import Dropped, Ranked, RerankRequest, RerankResult, add_usage
from .postpass import postpass
from .redaction import failure_summary, redacted
from .retry import Outcome
from .steps import Calls, Flow, Plan, Step, Work
from .wording import counted

log = logging.getLogger("rag_rerank.rerank")


@dataclass(frozen=True)
class Answer:
    """How one ask was answered: by the session's backend (`outcome`), by the local backend after
    `error` (`outcome`, `error` and the plan it scored under, `used`), or not at all (`error`)."""

    outcome: Outcome | None
    error: BaseException | None = None
    used: Plan | None = None


def falls_back(plan: Plan, error: BaseException) -> bool:
    """Whether `fallback="local"` answers `error`: any failure of another backend, and a failure of
    the embedder the local backend scores with."""
    return (isinstance(error, BackendError) and plan.fallback == "local"
            and (plan.backend_name != "local" or isinstance(error, EmbedderError)))


def offline(plan: Plan, error: EmbedderError) -> Plan:
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


def answers(plan: Plan, asks: Sequence[tuple[RerankRequest, str, str]], *, workers: int, limit: int | None,
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
        if error is None or not falls_back(plan, error):
            continue
        if isinstance(error, EmbedderError):
            pending[i] = offline(plan, error)
        else:  # meta.fallback says so per result; an operator watching a service needs it in the log
            log.warning("%s failed, ranking with the local backend (fallback local): %s", plan.backend_name,
                        failure_summary(error, plan.setup.api_key))
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
                again[i] = offline(pending[i], result)
            elif not isinstance(result, BackendError):
                out[i] = Answer(None, result)  # a bug of the fallback, not a failure: raised as it is
        pending = again
    return out


def _calibrated(plan: Plan, outcome: Outcome) -> Outcome:
    """The answer with the plan's calibration applied to its scores (`calibration_map.calibrate_answer`)."""
    if plan.calibration is None:
        return outcome
    return replace(outcome, obj=calibrate_answer(plan.calibration, outcome.obj))


def _heavy(plan: Plan) -> bool:
    """Whether the post-pass embeds with a model or a server (then off the event loop): lexical
    and caller vectors cost well under a millisecond per chunk."""
    name = embedder_name(plan)
    return not (name.startswith("lexical") or name == "caller")


def postpass_step(plan: Plan, obj: Mapping[str, Any], view: RerankRequest, fallback: str | None
                  ) -> Generator[Step, Any, tuple[RerankResult, Plan]]:
    """The post-pass; with `fallback="local"`, on lexical vectors when the embedder fails, keeping
    the ranking the backend already gave (asking the LLM again would bill it twice)."""
    try:
        return (yield Work(lambda: _postpass(plan, obj, view), _heavy(plan))), plan
    except EmbedderError as exc:
        if fallback != "local":
            raise redacted(exc, plan.setup.api_key) from None
        plan = offline(plan, exc)
        return (yield Work(lambda: _postpass(plan, obj, view), _heavy(plan))), plan


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


def fallback_result(plan: Plan, answer: Answer) -> Flow:
    """The local ranking of a one-call request after the backend's failure, flagged in meta.

    After an `EmbedderError` (the embedder failed, whoever scored) the local backend scores with
    the lexical embedder and only `meta.embedder_fallback` says so; after any other failure of
    another backend, `meta.fallback` is "local"."""
    error, outcome, used = answer.error, answer.outcome, answer.used
    assert isinstance(error, BackendError) and outcome is not None and used is not None
    result, used = yield from postpass_step(used, outcome.obj, used.view, "local")
    backend_failed = not (isinstance(error, EmbedderError) and used.backend_name == "local")
    summary = failure_summary(error, used.setup.api_key)
    notes = [f"{used.backend_name} failed after {counted(len(error.attempts), 'attempt')}: {summary}"
             ] if backend_failed else []
    meta = run_meta(used, model=outcome.model, attempts=len(error.attempts) + len(outcome.attempts),
                    repairs=outcome.repairs, usage=add_usage(error.usage, outcome.usage),
                    fallback="local" if backend_failed else None, notes=(*notes, *scoring_notes(used)),
                    cache=cache_meta(plan, [(False, {})]))
    return replace(result, meta=meta, scores=scores_of(used.request, [outcome.obj], result.ranked))


__all__ = ["Answer", "answers", "fallback_result", "falls_back", "offline", "postpass_step"]
