"""The refill: a scored backend's list is never left short while a chunk it scored waits outside.

Why a module of its own. The scorer is asked for `candidate_k` candidates (`windows.asked`) so the
post-pass has room; its merges of near-duplicates can use that room up. A listwise LLM chose those
candidates itself, and asking it again would bill a second call; a scored backend (local,
cross-encoder, a rerank API: `Capabilities.scored`) scores every chunk on its own, so the chunks it
left out are known with their scores (each dropped `not_selected` reason carries it). When the
list is short while one of them scored above the minimum, the backend is asked again for all the
chunks and the post-pass runs over that answer. One call and the windows' final pass both end here.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import replace
from typing import Any

from . import reasons
from .backends.factory import capabilities
from .fallback import answers, heavy, postpass_step, run_postpass
from .models import RerankRequest, RerankResult
from .redaction import failure_summary
from .render import render
from .steps import Plan, Step, Work


def postpass_refilled(plan: Plan, obj: Mapping[str, Any], view: RerankRequest, ask: RerankRequest
                      ) -> Generator[Step, Any, tuple[RerankResult, Plan]]:
    """The post-pass over the answer to `ask` (`fallback.postpass_step`, with the plan's fallback),
    then, when its list is short while a chunk the scored backend scored waits, the refill."""
    result, plan = yield from postpass_step(plan, obj, view, plan.fallback)
    if waiting(plan, ask, result):
        result = yield from refill(plan, ask, view, result)
    return result, plan


def waiting(plan: Plan, ask: RerankRequest, result: RerankResult) -> bool:
    """Whether a scored backend's list is short while a chunk it scored above the minimum waits
    outside the candidates it was asked for (its `not_selected` detail holds the score): the
    post-pass's merges used the candidates up. A word budget's cut is not a short list."""
    if not capabilities(plan.backend).scored or ask.top_k >= len(ask.chunks) \
            or len(result.ranked) >= wanted(plan, ask):
        return False
    said = [reasons.split(d.reason) for d in result.dropped]
    if any(p is not None and p[0] == reasons.OVER_WORD_BUDGET for p in said):
        return False
    floor = plan.limits.min_score
    return any((s := reasons.score_in(d.reason)) is not None and s > floor and p is not None
               and p[0] == reasons.NOT_SELECTED for d, p in zip(result.dropped, said, strict=True))


def wanted(plan: Plan, ask: RerankRequest) -> int:
    """The caller's top_k, at most the chunks the ask holds."""
    return min(plan.request.top_k, len(ask.chunks))


def refill(plan: Plan, ask: RerankRequest, view: RerankRequest, short: RerankResult
           ) -> Generator[Step, Any, RerankResult]:
    """The scored backend asked again for every chunk of `ask` (its scores are the same: it scores
    each chunk on its own), and the post-pass over that answer; the short list stays, noted, if
    that call fails."""
    wider = replace(ask, top_k=len(ask.chunks))
    (answer,) = yield from answers(plan, [(wider, render(wider), "the refill")], workers=1, limit=None,
                                   where=[("refill", 1)])
    if answer.outcome is None or answer.error is not None:
        why = failure_summary(answer.error, plan.setup.api_key) if answer.error else "no answer"
        return replace(short, meta=replace(short.meta, notes=(*short.meta.notes, f"refill failed: {why}")))
    obj = answer.outcome.obj
    result = yield Work(lambda: run_postpass(plan, obj, view), heavy(plan))
    note = (f"refill: merges used up the {ask.top_k} candidates; all {len(ask.chunks)} chunks' scores "
            f"asked for again, {len(result.ranked)} ranked")
    return replace(result, meta=replace(result.meta, notes=(*result.meta.notes, note)))


__all__ = ["postpass_refilled", "refill", "waiting", "wanted"]
