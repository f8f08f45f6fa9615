"""The bias meter (`rag-rerank bias`): does the backend's order depend on the order it was shown?

An LLM reranker tends to favour what comes first (or last) in its prompt, and a model sampled
twice may order the same chunks differently. Neither shows in a single run. The meter reranks each
query of a candidates file (`rag-rerank eval`'s format) three times through one `Reranker`: in the
given order, reversed, and shuffled (seeded per query, so a run is repeatable), and compares:

* **Kendall tau-b between the orders** (mean over queries, per pair of orders and overall): 1 when
  the backend's order ignores the order it was shown, lower as presentation moves it.
* **Mean rank shift by input position** (deciles of the position a chunk was shown at): per query,
  each chunk's consensus rank is its mean rank over the three runs; in each run its shift is
  consensus minus its rank there (positive: it ranked higher than usual). Averaged by the decile of
  the position it was shown at, a primacy bias is a positive first decile and a negative last one;
  noise alone averages out to about zero everywhere.

**What order is compared.** Every request asks for the scorer's own relevance order over all the
chunks, not the product's default output: `top_k` = every chunk (or `top_k`), `lambda_=1.0` (no
diversity re-ordering), the minimum score 0 and `duplicate_threshold=1.0` (nothing removed for
being below 0.2 or a near-copy). A run's order is then the scores the backend gave: a ranked
chunk's score, a dropped chunk's when its reason carries one (`not_selected: 0.410`), and below
them all, tied, the chunks without one. Equal scores are a tie in tau-b (the post-pass breaks such
ties by input order, which is ours, not the backend's). Other request options (those a caller passes) reach
every request unchanged, so a mechanism that ought to remove position bias can be measured.

Kendall tau-b is implemented here in numpy (O(n^2) pairs, n at most 50), so the meter needs no
scipy.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import reasons
from .backends.factory import model_of
from .batchfile import error_kind
from .concurrency import check_concurrency, run_coroutine
from .errors import InputError, Violation
from .guard.limits import as_limits
from .judgments import CandidateQuery, read_candidates
from .models import RerankResult
from .options import split_options
from .ranks import average_ranks, kendall_tau
from .session import Reranker
from .significance import bootstrap_counts

ORDERS = ("given", "reversed", "shuffled")
PAIRS = (("given", "reversed"), ("given", "shuffled"), ("reversed", "shuffled"))
DECILES = 10
# What every request of the meter sets (module docstring): the scorer's full relevance order.
PURE_ORDER: Mapping[str, Any] = {"lambda_": 1.0, "limits": {"min_score": 0.0}, "duplicate_threshold": 1.0}


def pair_name(a: str, b: str) -> str:
    return f"{a}~{b}"


# --------------------------------------------------------------------------- Kendall tau


# --------------------------------------------------------------------------- orders of one query


def shown_orders(ids: Sequence[str], seed: int, qid: str) -> dict[str, list[str]]:
    """The three orders a query is shown in: given, reversed, shuffled (by `seed` and the qid,
    so one query's shuffle does not depend on which other queries are in the file)."""
    digest = hashlib.blake2b(f"{seed}\x1f{qid}".encode(), digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "big"))
    shuffled = [ids[i] for i in rng.permutation(len(ids))]
    return {"given": list(ids), "reversed": list(reversed(ids)), "shuffled": shuffled}


def result_scores(result: RerankResult) -> dict[str, float]:
    """Each chunk's score in a result: `RerankResult.scores` (a ranked chunk's, a dropped one's
    from its reason, a window's loser's from its window's answer); for a result built without
    them, the ranked chunks' and the ones dropped reasons carry (`reasons.score_in`)."""
    if result.scores:
        return {cid: float(v) for cid, v in result.scores.items() if isinstance(v, float)}
    out = {r.id: float(r.score) for r in result.ranked}
    for d in result.dropped:
        s = reasons.score_in(d.reason)
        if s is not None:
            out[d.id] = s
    return out


def order_keys(result: RerankResult, ids: Sequence[str]) -> np.ndarray:
    """One number per id of `ids`, higher = earlier (module docstring): the score the backend gave
    it (a ranked chunk's, or the one its dropped reason carries), -1 for a chunk without one.

    Scores, not list positions: the post-pass breaks a tie between equal scores by input order,
    so the list's order among equal scores is our tie-break, not the backend's judgement; counted
    as positions it would read as a position bias of the backend."""
    key = result_scores(result)
    return np.array([key.get(i, -1.0) for i in ids])


@dataclass(frozen=True)
class QueryBias:
    """One query's figures: tau per pair of orders, and each chunk's rank shift by position shown."""

    qid: str
    n: int
    taus: Mapping[str, float]
    # (decile of the position shown, rank shift) for every chunk in every order
    shifts: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class BiasReport:
    """The meter's figures over a candidates file (module docstring); `failed` maps a qid whose
    reranks failed (any of its three) to the error, `failure_kinds` to "input", "backend" or
    "internal" (the CLI's exit code follows the worst)."""

    queries: tuple[QueryBias, ...]
    failed: Mapping[str, str] = field(default_factory=dict)
    failure_kinds: Mapping[str, str] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def tau_by_pair(self) -> dict[str, float]:
        """Mean tau over the queries, per pair of orders (queries where it is undefined left out)."""
        return {pair_name(a, b): _mean([q.taus[pair_name(a, b)] for q in self.queries]) for a, b in PAIRS}

    @property
    def tau_mean(self) -> float:
        """The mean of the three pairs' means."""
        return _mean(list(self.tau_by_pair.values()))

    @property
    def shift_by_decile(self) -> list[float]:
        """Mean rank shift (positive: ranked higher than its consensus) by the decile of the input
        position a chunk was shown at, first decile first; NaN for a decile no chunk fell in."""
        sums, counts = np.zeros(DECILES), np.zeros(DECILES)
        for q in self.queries:
            for decile, shift in q.shifts:
                sums[decile] += shift
                counts[decile] += 1
        with np.errstate(invalid="ignore", divide="ignore"):
            return [float(v) for v in np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)]

    def shift_band(self, confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0
                   ) -> tuple[list[float], list[float]]:
        """A bootstrap band of `shift_by_decile` over queries (queries drawn with replacement, each
        decile's mean recomputed from the drawn queries' chunks; percentile interval): how far the
        curve could move with other queries of the same kind. NaN where no chunk fell."""
        if not self.queries:
            return [math.nan] * DECILES, [math.nan] * DECILES
        sums, counts = np.zeros((len(self.queries), DECILES)), np.zeros((len(self.queries), DECILES))
        for i, q in enumerate(self.queries):
            for decile, shift in q.shifts:
                sums[i, decile] += shift
                counts[i, decile] += 1
        rng = np.random.default_rng(seed)
        blocks = []
        for weights in bootstrap_counts(len(self.queries), n_resamples, rng):
            with np.errstate(invalid="ignore", divide="ignore"):
                blocks.append((weights @ sums) / (weights @ counts))
        means = np.concatenate(blocks)
        tail = 100 * (1 - confidence) / 2
        low, high = [], []
        for d in range(DECILES):
            col = means[:, d][~np.isnan(means[:, d])]
            lo, hi = np.percentile(col, [tail, 100 - tail]) if len(col) else (math.nan, math.nan)
            low.append(float(lo))
            high.append(float(hi))
        return low, high

    def to_dict(self) -> dict[str, Any]:
        def clean(x: float) -> float | None:  # JSON has no NaN
            return None if math.isnan(x) else round(x, 4)

        low, high = self.shift_band()
        return {"kendall_tau": {"mean": clean(self.tau_mean),
                                **{k: clean(v) for k, v in self.tau_by_pair.items()}},
                "rank_shift_by_decile": [clean(v) for v in self.shift_by_decile],
                "rank_shift_band": {"confidence": 0.95, "low": [clean(v) for v in low],
                                    "high": [clean(v) for v in high]},
                "per_query": [{"qid": q.qid, "n": q.n, **{k: clean(v) for k, v in q.taus.items()}}
                              for q in self.queries],
                "info": {"queries": len(self.queries) + len(self.failed), "measured": len(self.queries),
                         "failed": dict(self.failed), "failure_kinds": dict(self.failure_kinds),
                         "wall_s": round(self.wall_s, 3), **dict(self.config)}}


def _mean(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return float(np.mean(kept)) if kept else math.nan


def query_bias(qid: str, ids: Sequence[str], shown: Mapping[str, Sequence[str]],
               results: Mapping[str, RerankResult]) -> QueryBias:
    """The figures of one query from its three runs (each result scored over `ids`)."""
    keys = {o: order_keys(results[o], ids) for o in ORDERS}
    taus = {pair_name(a, b): kendall_tau(keys[a], keys[b]) for a, b in PAIRS}
    ranks = {o: average_ranks(keys[o]) for o in ORDERS}
    consensus = np.mean([ranks[o] for o in ORDERS], axis=0)
    index = {cid: i for i, cid in enumerate(ids)}
    n = len(ids)
    shifts = []
    for o in ORDERS:
        for pos, cid in enumerate(shown[o]):
            i = index[cid]
            shifts.append((min(DECILES - 1, pos * DECILES // n), float(consensus[i] - ranks[o][i])))
    return QueryBias(qid, n, taus, tuple(shifts))


# --------------------------------------------------------------------------- the run


def rerank_each(reranker: Reranker, requests: Sequence[tuple[str, Sequence[Mapping[str, Any]], int]], *,
                options: Mapping[str, Any], concurrency: int = 4,
                progress: Callable[[int, int], None] | None = None, close: bool = False
                ) -> list[RerankResult | Exception]:
    """Every `(query, chunks, top_k)` reranked by `reranker` with `options`, at most `concurrency`
    at once on one event loop; one result or the exception it raised per request, in order. The
    session is closed afterwards when `close` (one built for this run), else only this loop's
    clients are released. (`rag-rerank bias` and `calibrate` both run their requests so.)"""
    total = len(requests)

    async def run_all() -> list[RerankResult | Exception]:
        sem = asyncio.Semaphore(concurrency)
        done = 0

        async def one(query: str, chunks: Sequence[Mapping[str, Any]], k: int) -> RerankResult | Exception:
            nonlocal done
            async with sem:
                try:
                    out: RerankResult | Exception = await reranker.arerank(query, list(chunks), k, **options)
                except Exception as exc:  # recorded per request, as eval does
                    out = exc
            done += 1
            if progress is not None:
                progress(done, total)
            return out

        try:
            return list(await asyncio.gather(*(one(*r) for r in requests)))
        finally:
            if close:
                await reranker.aclose()
            else:
                await reranker.release_loop()

    return run_coroutine(run_all())


def measure_bias(
    candidates: str | Path | Sequence[CandidateQuery],
    *,
    depth: int | None = None,
    top_k: int | None = None,
    seed: int = 0,
    concurrency: int = 4,
    progress: Callable[[int, int], None] | None = None,
    reranker: Reranker | None = None,
    request_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> BiasReport:
    """Rerank every query in three orders and measure how much the order shown moves the result.

    `depth`: the first N candidates of each query (default: all, at most the card's 50: the meter
    is about one prompt). `top_k`: how many the backend ranks (default: all of them). One session
    does every call: `reranker`, or one built from `options` (rerank's keywords: backend, model,
    base_url, embedder, ...) and closed at the end. `request_options` go to every request (after
    the meter's own `PURE_ORDER`, which they may override)."""
    check_concurrency(concurrency)
    queries = read_candidates(candidates) if isinstance(candidates, (str, Path)) else list(candidates)
    lim = as_limits(options.get("limits"))
    problems = []
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or not
                              1 <= depth <= lim.max_chunks):
        problems.append(Violation(path="depth", value=depth, message=f"depth must be a whole number from 1 "
                                  f"to {lim.max_chunks} (the chunks of one prompt), got {depth!r}"))
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 2):
        problems.append(Violation(path="top_k", value=top_k,
                                  message=f"top_k must be a whole number of at least 2, got {top_k!r}"))
    if problems:
        raise InputError(problems)
    cut = depth if depth is not None else lim.max_chunks
    own = reranker is None
    if reranker is None:
        session, request = split_options(options)
        reranker = Reranker(**session, **request)
    session_used = reranker
    extra = {**PURE_ORDER, **dict(request_options or {})}
    jobs: list[tuple[CandidateQuery, dict[str, list[str]], str]] = []
    for q in queries:
        ids = q.ids[:cut]
        shown = shown_orders(ids, seed, q.qid)
        jobs += [(q, shown, o) for o in ORDERS]
    requests = []
    for q, shown, o in jobs:
        by_id = {str(c["id"]): dict(c) for c in q.chunks}
        chunks = [by_id[i] for i in shown[o]]
        requests.append((q.query, chunks, min(top_k or len(chunks), len(chunks))))
    started = time.perf_counter()
    outcomes = rerank_each(session_used, requests, options=extra, concurrency=concurrency, progress=progress,
                           close=own)
    wall = time.perf_counter() - started
    measured: list[QueryBias] = []
    failed: dict[str, str] = {}
    kinds: dict[str, str] = {}
    for qi, q in enumerate(queries):
        runs = outcomes[3 * qi : 3 * qi + 3]
        errors = [r for r in runs if isinstance(r, Exception)]
        if errors:
            text = " ".join(str(errors[0]).split())
            failed[q.qid] = f"{type(errors[0]).__name__}: {text}"[:500]
            kinds[q.qid] = error_kind(errors[0])
            continue
        results = {o: r for o, r in zip(ORDERS, runs, strict=True) if isinstance(r, RerankResult)}
        ids = q.ids[:cut]
        measured.append(query_bias(q.qid, ids, shown_orders(ids, seed, q.qid), results))
    config = {"backend": session_used.backend_name, "model": model_of(session_used.backend),
              "depth": cut, "top_k": top_k, "seed": seed}
    return BiasReport(tuple(measured), failed, kinds, config, wall)


__all__ = ["DECILES", "ORDERS", "PAIRS", "PURE_ORDER", "BiasReport", "QueryBias", "average_ranks",
           "kendall_tau", "measure_bias", "order_keys", "query_bias", "rerank_each", "result_scores",
           "shown_orders"]
