"""`RunMeta` and `scores` of a result: how the rerank went, and every input id's score.

Why a module of its own. One call, the windows with their final pass, `consistency=k` and the
fallback each end a rerank, and each must say the same things the same way: the backend and model,
attempts and repairs, tokens, the response cache's hits, the calibration applied, the embedder the
post-pass compared with, and a score (or why there is none) for every id. They build it here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from .backends.factory import capabilities, model_of
from .calibration_map import describe
from .cost import usage_tokens
from .models import CallRecord, Ranked, RerankRequest, RunMeta
from .reasons import score_in_text
from .shortening import evidence_meta
from .steps import Plan

UNSCORED = "not scored: the model neither ranked nor dropped it"
NO_NUMBER = "no score: the model dropped it without one"


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
            reason = item["reason"]
            score = score_in_text(reason) if isinstance(reason, str) else None  # `reasons.score_in`
            if score is not None:
                out[item["id"]] = score
            else:  # kept when an earlier answer gave a number (`out` holds numbers and NO_NUMBER)
                out.setdefault(item["id"], NO_NUMBER)
    for item in ranked:
        out[item.id] = item.score
    return {c.id: out.get(c.id, UNSCORED) for c in request.chunks}


def cache_meta(plan: Plan, calls: Sequence[tuple[bool, Mapping[str, int]]]) -> dict[str, int] | None:
    """`meta.cache`: the session backend's calls the cache answered (hits) and not (misses), and the
    tokens the hits did not spend; None when the session has no cache for this backend."""
    if plan.setup.cache is None or not capabilities(plan.backend).cacheable:
        return None
    hits = [usage for cached, usage in calls if cached]
    return {"hits": len(hits), "misses": len(calls) - len(hits),
            "saved_tokens": sum(sum(usage_tokens(u)) for u in hits)}


def run_meta(plan: Plan, *, model: str | None, attempts: int, repairs: Sequence[str],
             usage: Mapping[str, int], fallback: str | None = None, notes: Sequence[str] = (), calls: int = 1,
             windows: Sequence[Mapping[str, Any]] = (), cache: Mapping[str, int] | None = None,
             records: Sequence[CallRecord] = (), decided: Mapping[str, tuple[int, int]] | None = None
             ) -> RunMeta:
    """The result's `meta`: what the caller of one rerank reads about how it went; `records` are its
    calls (`CallRecord`), what `meta.status`, the spans and the log lines are derived from; `decided`
    is the scored backend's best passage per shortened chunk (`Completion.decided`)."""
    return RunMeta(
        backend=plan.backend_name,
        model=model,
        attempts=attempts,
        repairs=tuple(repairs),
        usage=dict(usage),
        latency_ms=(time.perf_counter() - plan.started) * 1000.0,
        fallback=fallback,
        embedder=embedder_name(plan),
        notes=(*notes, *([plan.embedder_note] if plan.embedder_note else [])),
        calls=calls,
        windows=tuple(windows),
        embedder_fallback="lexical" if plan.embedder_note else None,
        cache=cache,
        calibration=describe(plan.calibration, plan.calibration_file, backend=plan.backend_name,
                             model=model_of(plan.backend)),
        records=tuple(records),
        evidence=evidence_meta(plan.evidence, decided),
    )


def scoring_notes(plan: Plan) -> list[str]:
    """The metadata fusion the ranking went through, as a note (none without `meta_field`)."""
    f = plan.fusion
    if f is None:
        return []
    return [f"meta_fusion: field={f.field} weight={f.weight:g} mode={f.ranking_mode} order={f.sort_order} "
            f"missing={f.missing} type={f.value_type}"]


def embedder_name(plan: Plan) -> str:
    """What the post-pass compared: the caller's vectors when every chunk carries one. (A loop,
    not `all()` of a generator: asked twice a call, it usually stops at the first chunk.)"""
    for chunk in plan.request.chunks:
        if chunk.embedding is None:
            return str(getattr(plan.embedder, "name", plan.embedder))
    return "caller"


__all__ = ["NO_NUMBER", "UNSCORED", "cache_meta", "embedder_name", "run_meta", "scores_of", "scoring_notes"]
