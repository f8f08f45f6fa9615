"""Calibration from the user's own judgements: a monotone map from a backend's raw score to the
probability that a person judges the chunk relevant (`rag-rerank calibrate`).

Why. A score's meaning depends on the model: one LLM writes 0.9 for anything on the subject,
another 0.6 for a perfect answer, and the minimum score (0.2) then drops too little or too much.
Judged queries of your own say what a score means for your backend on your data. The map is
fitted on part of the queries and its figures are measured on the others: ECE (expected
calibration error, 10 equal-width bins: the mean gap between the score and the share judged
relevant, weighted by the bin's size) and the Brier score (mean squared gap between score and
judgement), before (the raw scores read as probabilities) and after.

Two maps, both monotone non-decreasing, so the backend's order is kept (a map may tie scores it
cannot tell apart; it never swaps two):

* **isotonic** (`isotonic`): pool-adjacent-violators on the (raw score, judged 0/1) pairs, kept as
  knots (each pooled block's mean score and its share judged relevant) and interpolated linearly
  between them (strictly increasing there), flat beyond the first and last knot. Any monotone
  shape, given enough judgements.
* **Platt scaling** (`platt`): p = sigmoid(a * raw + b), a >= 0, fitted by Newton steps on the
  log-loss with Platt's smoothed targets (N+ + 1) / (N+ + 2) and 1 / (N- + 2), so separable data
  cannot push a to infinity. Two parameters: steadier on few judgements, wrong when the true map is
  not a sigmoid.

`method="auto"` picks one without looking at the reported queries: two-fold cross-validation
(by query) on the fit part, the lower pooled Brier score wins; both methods' figures on the
held-out part are reported beside the chosen one, so the choice can be checked.

**Raw scores.** Every query is reranked through a `Reranker`, asking for the scorer's own score of
every chunk (all chunks as `top_k`, `lambda_=1`, minimum score 0, `duplicate_threshold=1.0`: the
bias meter's `PURE_ORDER`). A ranked chunk's score is its raw score; a dropped one's is the score
its reason carries (`below_min_score: 0.150`, `not_selected: 0.410`); a chunk without either, or
not judged in the qrels, is left out (and counted).

**The file** (`save` / `load`) is JSON: format name and version, the method and its map, what it
was fitted for (backend, model, embedder, backend options), the split (fraction, seed, the qids on
each side) and the figures. A missing or bad file is an `InputError` naming the file and what is
wrong. `apply(calibration, scores)` is what a pipeline calls: monotone, clipped to [0, 1].
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .backends.factory import model_of
from .batchfile import error_kind
from .bias import PURE_ORDER, rerank_each, result_scores
from .calibration_map import (
    BINS,
    FORMAT,
    METHODS,
    VERSION,
    Calibration,
    apply,
    as_calibration,
    brier,
    ece,
    figures,
    fit,
    fit_platt,
    from_dict,
    load,
    mismatch,
    pav,
    reliability,
    save,
)
from .concurrency import check_concurrency
from .errors import InputError, Violation
from .guard.limits import as_limits
from .judgments import CandidateQuery, read_candidates, read_grades
from .models import RerankResult
from .options import split_options
from .session import Reranker

# --------------------------------------------------------------------------- fitting on judged queries


def split_queries(qids: Sequence[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """The qids to fit on and the qids to measure on: a seeded shuffle, `fraction` of them (at
    least one, leaving at least one) to fit."""
    order = sorted(qids, key=lambda q: hashlib.blake2b(f"{seed}\x1f{q}".encode(), digest_size=8).digest())
    n_fit = min(len(order) - 1, max(1, round(fraction * len(order))))
    return sorted(order[:n_fit]), sorted(order[n_fit:])


@dataclass(frozen=True)
class Scored:
    """One judged chunk's raw score."""

    qid: str
    id: str
    score: float
    grade: int


def raw_scores(result: RerankResult) -> dict[str, float]:
    """Each chunk's raw score in a result (`bias.result_scores`)."""
    return result_scores(result)


def _cross_validated(points: Sequence[Scored], rel_level: int, seed: int) -> dict[str, float]:
    """Pooled Brier score of each method under two-fold cross-validation by query."""
    qids = sorted({p.qid for p in points})
    if len(qids) < 2:
        return {}
    half_a, half_b = split_queries(qids, 0.5, seed + 1)
    folds = [(set(half_a), set(half_b)), (set(half_b), set(half_a))]
    out = {}
    for method in METHODS:
        probs, labels = [], []
        for train, test in folds:
            tr = [p for p in points if p.qid in train]
            te = [p for p in points if p.qid in test]
            cal = fit([p.score for p in tr], [p.grade >= rel_level for p in tr], method)
            probs += list(apply(cal, [p.score for p in te]))
            labels += [float(p.grade >= rel_level) for p in te]
        out[method] = brier(probs, labels)
    return out


def fit_option_violations(fraction: Any, method: Any) -> list[Violation]:
    """What is wrong with a split fraction and a method name (checked before any rerank)."""
    out = []
    if method != "auto" and method not in METHODS:
        out.append(Violation(path="method", value=method,
                             message=f"method must be auto, {' or '.join(METHODS)}, got {method!r}"))
    if isinstance(fraction, bool) or not (isinstance(fraction, (int, float)) and 0 < fraction < 1):
        out.append(Violation(path="split", value=fraction,
                             message=f"split must be a fraction strictly between 0 and 1, got {fraction!r}"))
    return out


def fit_judged(points: Sequence[Scored], *, rel_level: int = 1, fraction: float = 0.5, seed: int = 0,
               method: str = "auto", fitted_for: Mapping[str, Any] | None = None) -> Calibration:
    """Split the judged scores by query, fit on one part, measure before/after on the other
    (module docstring); the figures and the split are kept in the result."""
    if problems := fit_option_violations(fraction, method):
        raise InputError(problems)
    qids = sorted({p.qid for p in points})
    if len(qids) < 2:
        shown = f"{len(qids)} quer{'y' if len(qids) == 1 else 'ies'}"
        raise InputError([Violation(path="candidates", message=f"{shown} with judged, scored chunks; "
                                    "calibration needs at least 2 (one to fit on, one to measure on), and "
                                    "more for figures worth reading")])
    fit_q, test_q = split_queries(qids, fraction, seed)
    train = [p for p in points if p.qid in set(fit_q)]
    test = [p for p in points if p.qid in set(test_q)]
    y_train = np.array([p.grade >= rel_level for p in train], dtype=np.float64)
    if y_train.min() == y_train.max():
        what = "relevant" if y_train.max() == 1 else "not relevant"
        raise InputError([Violation(path="qrels", message=f"every judged chunk of the {len(fit_q)} fit "
                                    f"queries is {what} at grade >= {rel_level}: a map needs both kinds "
                                    "(check --rel-level, or judge more queries)")])
    cv = _cross_validated(train, rel_level, seed)
    chosen = method if method != "auto" else (min(cv, key=lambda m: cv[m]) if cv else "platt")
    x_test = [p.score for p in test]
    y_test = [float(p.grade >= rel_level) for p in test]
    maps = {m: fit([p.score for p in train], y_train, m) for m in METHODS}
    held_out = {m: figures(apply(maps[m], x_test), y_test) for m in METHODS}
    result = maps[chosen]
    figs = {"fit": {"queries": len(fit_q), "chunks": len(train), "relevant": int(y_train.sum())},
            "test": {"queries": len(test_q), "chunks": len(test), "relevant": int(sum(y_test)),
                     "before": figures(np.clip(x_test, 0.0, 1.0), y_test), "after": held_out[chosen],
                     "methods": held_out},
            "choice": {"method": chosen, "asked": method,
                       "by": ("two-fold cross-validation by query on the fit queries, lower Brier"
                              if method == "auto" else "asked for"), "cv_brier": cv}}
    return Calibration(result.method, result.knots, result.values, result.a, result.b,
                       dict(fitted_for or {}), rel_level, {"fraction": fraction, "seed": seed, "fit": fit_q,
                                                           "test": test_q}, figs)


@dataclass(frozen=True)
class CalibrationRun:
    """What `calibrate` did: the calibration, and how many chunks could not be used and why."""

    calibration: Calibration
    failed: Mapping[str, str] = field(default_factory=dict)
    failure_kinds: Mapping[str, str] = field(default_factory=dict)
    unjudged: int = 0  # scored chunks the qrels do not judge
    unscored: int = 0  # chunks whose score the result did not carry (a redundant_with:, dropped_by_model)
    # Every judged chunk's raw score (fit and held-out queries): what the reliability diagram plots.
    points: tuple[Scored, ...] = ()

    def held_out_reliability(self) -> dict[str, list[tuple[float, float, int]]]:
        """Per score bin of the held-out queries' chunks, (mean score, share relevant, chunks) for
        the raw scores and for the calibrated ones (`calibration_map.reliability`)."""
        cal = self.calibration
        test = set(cal.split.get("test", ()))
        kept = [p for p in self.points if p.qid in test]
        raw = [p.score for p in kept]
        labels = [float(p.grade >= cal.rel_level) for p in kept]
        return {"before": reliability(raw, labels), "after": reliability(apply(cal, raw), labels)}


def collect(queries: Sequence[CandidateQuery], grades: Mapping[str, Mapping[str, int]], reranker: Reranker, *,
            depth: int, top_k: int | None = None, concurrency: int = 4,
            progress: Callable[[int, int], None] | None = None, close: bool = False,
            request_options: Mapping[str, Any] | None = None
            ) -> tuple[list[Scored], dict[str, str], dict[str, str], int, int]:
    """Rerank each query and keep each judged chunk's raw score: (scores, failed, failure kinds,
    unjudged, unscored)."""
    options = {**PURE_ORDER, **dict(request_options or {})}
    requests = [(q.query, [dict(c) for c in q.chunks[:depth]], min(top_k or depth, len(q.chunks[:depth])))
                for q in queries]
    outcomes = rerank_each(reranker, requests, options=options, concurrency=concurrency, progress=progress,
                           close=close)
    points: list[Scored] = []
    failed: dict[str, str] = {}
    kinds: dict[str, str] = {}
    unjudged = unscored = 0
    for q, outcome in zip(queries, outcomes, strict=True):
        if isinstance(outcome, Exception):
            failed[q.qid] = f"{type(outcome).__name__}: {' '.join(str(outcome).split())}"[:500]
            kinds[q.qid] = error_kind(outcome)
            continue
        scores = raw_scores(outcome)
        judged = grades.get(q.qid, {})
        for cid in q.ids[:depth]:
            if cid not in scores:
                unscored += 1
            elif cid not in judged:
                unjudged += 1
            else:
                points.append(Scored(q.qid, cid, scores[cid], int(judged[cid])))
    return points, failed, kinds, unjudged, unscored


def calibrate(
    candidates: str | Path | Sequence[CandidateQuery],
    qrels: str | Path | Mapping[str, Mapping[str, int]],
    *,
    rel_level: int = 1,
    split: float = 0.5,
    seed: int = 0,
    method: str = "auto",
    depth: int | None = None,
    top_k: int | None = None,
    concurrency: int = 4,
    progress: Callable[[int, int], None] | None = None,
    reranker: Reranker | None = None,
    request_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> CalibrationRun:
    """Rerank every query of `candidates`, and fit and measure a calibration on the judged chunks'
    raw scores (module docstring). `options` are rerank's keywords (backend, model, base_url,
    embedder, backend_options, ...) for the session built here, or pass `reranker`."""
    check_concurrency(concurrency)
    if problems := fit_option_violations(split, method):
        raise InputError(problems)
    queries = read_candidates(candidates) if isinstance(candidates, (str, Path)) else list(candidates)
    grades = (read_grades(qrels) if isinstance(qrels, (str, Path))
              else {str(q): dict(g) for q, g in qrels.items()})
    top = max((g for judged in grades.values() for g in judged.values()), default=0)
    if isinstance(rel_level, bool) or not isinstance(rel_level, int) or not 1 <= rel_level <= max(top, 1):
        raise InputError([Violation(path="rel_level", value=rel_level,
                                    message=f"rel_level must be a grade from 1 to {max(top, 1)} (the highest "
                                    f"grade in the qrels), got {rel_level!r}")])
    lim = as_limits(options.get("limits"))
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or
                              not 1 <= depth <= lim.max_chunks):
        raise InputError([Violation(path="depth", value=depth, message="depth must be a whole number from 1 "
                                    f"to {lim.max_chunks} (the chunks of one prompt), got {depth!r}")])
    if not {q.qid for q in queries} & set(grades):
        raise InputError([Violation(path="qrels", message=f"the qrels judge none of the {len(queries)} "
                                    "candidate queries (check the qid columns)")])
    own = reranker is None
    if reranker is None:
        session, request = split_options(options)
        reranker = Reranker(**session, **request)
    backend_options = options.get("backend_options") or {}
    fitted_for = {"backend": reranker.backend_name, "model": model_of(reranker.backend),
                  "embedder": str(getattr(reranker.embedder, "name", reranker.embedder)),
                  **{f"backend_options.{k}": v for k, v in sorted(backend_options.items())
                     if isinstance(v, (str, int, float, bool)) or v is None}}
    points, failed, kinds, unjudged, unscored = collect(
        queries, grades, reranker, depth=depth or lim.max_chunks, top_k=top_k, concurrency=concurrency,
        progress=progress, close=own, request_options=request_options)
    if not points:
        first = next(iter(failed.values()), "")
        why = f" ({len(failed)} of {len(queries)} queries failed: {first})" if failed else ""
        raise InputError([Violation(path="candidates", message=f"no judged chunk got a score{why}")])
    cal = fit_judged(points, rel_level=rel_level, fraction=split, seed=seed, method=method,
                     fitted_for=fitted_for)
    return CalibrationRun(cal, failed, kinds, unjudged, unscored, tuple(points))


__all__ = ["BINS", "FORMAT", "METHODS", "VERSION", "Calibration", "CalibrationRun", "Scored", "apply",
           "as_calibration", "brier", "calibrate", "collect", "ece", "figures", "fit", "fit_judged",
           "fit_option_violations", "fit_platt", "from_dict", "load", "mismatch", "pav", "raw_scores",
           "reliability", "save", "split_queries"]
