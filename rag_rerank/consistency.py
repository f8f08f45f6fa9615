"""`consistency=k`: the rerank run k times over shuffled orders, the scores combined into one.

An LLM judges a chunk partly by where it is shown (first and last places are favoured). k passes,
the first in the given order and each other in its own seeded shuffle, show every chunk in several
places; each chunk's scores over the passes become one (`aggregate`), the post-pass ranks those
once, and `meta.consistency` says how far the passes agreed (the mean Kendall tau between their
scores) and the position effect the debiased mean took out.

The orders are seeded by the pass number, the query and the chunk ids: the same request gets the
same orders every time, so the response cache answers a repeated one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from . import reasons
from .fallback import postpass_step
from .meta import UNSCORED, run_meta
from .models import RerankResult, add_usage
from .ranks import kendall_tau
from .render import render
from .steps import Flow, Plan
from .windows import asked

# How the passes' scores become one: "mean_score" (each chunk's mean), or "debiased_mean" (the mean
# with a position effect linear in where the chunk was shown, fitted on the passes themselves,
# taken out: each chunk scored as if shown where the model favours least). Measured on the
# simulated judge by bench/bias.py --part consistency.
AGGREGATES = ("mean_score", "debiased_mean")
AGGREGATE = "debiased_mean"


def pass_plans(plan: Plan) -> list[Plan]:
    """The plans of `consistency=k`'s passes: the first in the given order, each other in its own
    shuffle, seeded by the pass number, the query and the chunk ids (the same request gets the same
    orders every time, so the cache answers a repeated one). One plan, `plan`, when k is 1."""
    k = plan.settings.consistency
    if k <= 1:
        return [plan]
    out = []
    ids = "\x1f".join(c.id for c in plan.request.chunks)
    options = replace(plan.options, consistency=1)
    settings = replace(plan.settings, consistency=1)
    for p in range(k):
        order = list(range(len(plan.request.chunks)))
        if p:
            digest = hashlib.blake2b(f"{p}\x1e{plan.request.query}\x1e{ids}".encode(), digest_size=8).digest()
            order = [int(i) for i in _permutation(len(order), int.from_bytes(digest, "big"))]
        request = replace(plan.request, chunks=tuple(plan.request.chunks[i] for i in order))
        view = replace(plan.view, chunks=tuple(plan.view.chunks[i] for i in order))
        if plan.window_size is not None:
            out.append(replace(plan, request=request, view=view, ask=view, options=options,
                               settings=settings))
        else:
            ask = asked(view)
            out.append(replace(plan, request=request, view=view, ask=ask, prompt=render(ask),
                               options=options, settings=settings))
    return out


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


def consistent_flow(plan: Plan, one_pass: Callable[[Plan], Flow]) -> Flow:
    """`consistency=k`: the whole rerank (`one_pass`: one call, or windows per window) once per
    pass, over its own order; each chunk's scores over the passes (0 where a pass gave none) become
    one by `aggregate`, and the post-pass ranks those once. `meta.consistency` says how far the
    passes agreed: the mean Kendall tau between their scores."""
    passes = pass_plans(plan)
    results: list[RerankResult] = []
    for sub in passes:
        results.append((yield from one_pass(sub)))
    ids = [c.id for c in plan.request.chunks]

    def number(value: object) -> float | None:
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
    result, used = yield from postpass_step(plan, obj, plan.view, plan.fallback)

    metas = [r.meta for r in results]
    caches = [m.cache for m in metas if m.cache is not None]
    cache = ({key: sum(int(c.get(key, 0)) for c in caches) for key in ("hits", "misses", "saved_tokens")}
             if caches else None)
    windows = tuple({"pass": p, **w} for p, m in enumerate(metas) for w in m.windows)
    notes = list(dict.fromkeys(n for m in metas for n in m.notes))
    notes.append(f"consistency: {len(passes)} passes over shuffled orders, {AGGREGATE}; agreement "
                 f"(mean Kendall tau) {agreement if agreement is not None else 'n/a'}")
    meta = run_meta(used, model=next((m.model for m in metas if m.model), None),
                    attempts=sum(m.attempts for m in metas),
                    repairs=[f"pass {p}: {r}" for p, m in enumerate(metas) for r in m.repairs],
                    usage=add_usage(*(m.usage for m in metas)),
                    fallback=", ".join(dict.fromkeys(m.fallback for m in metas if m.fallback)) or None,
                    notes=notes, calls=sum(m.calls for m in metas), windows=windows, cache=cache,
                    records=[replace(r, pass_index=p) for p, m in enumerate(metas) for r in m.records])
    # A scored backend reads each chunk's score from the same passage in every order: the first pass's.
    meta = replace(meta, evidence=next((m.evidence for m in metas if m.evidence), meta.evidence))
    summary = {"passes": len(passes), "aggregate": AGGREGATE, "agreement": agreement,
               "position_slope": None if slope is None else round(slope, 4),
               "taus": [None if math.isnan(t) else round(t, 4) for t in taus]}
    meta = replace(meta, consistency=summary,
                   embedder=result.meta.embedder or meta.embedder)
    scores: dict[str, float | str] = {i: round(mean[i], 4) if i in scored_any else results[0].scores.get(
        i, UNSCORED) for i in ids}
    for item in result.ranked:
        scores[item.id] = item.score
    return replace(result, meta=meta, scores=scores)


__all__ = ["AGGREGATE", "AGGREGATES", "aggregate", "consistent_flow", "pass_plans"]
