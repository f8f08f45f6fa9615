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
import itertools
import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .batchfile import error_kind
from .bias import PURE_ORDER, rerank_each, result_scores
from .concurrency import check_concurrency
from .errors import InputError, Violation
from .guard.limits import as_limits
from .judgments import CandidateQuery, read_candidates, read_grades
from .models import RerankResult
from .options import split_options
from .session import Reranker

FORMAT = "rag-rerank-calibration"
VERSION = 1
METHODS = ("isotonic", "platt")
BINS = 10
PLATT_STEPS = 100


# --------------------------------------------------------------------------- figures


def _arrays(probs: Sequence[float] | np.ndarray, labels: Sequence[float] | np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if p.shape != y.shape or p.ndim != 1:
        raise ValueError(f"scores and labels must be 1-d and of one length, got {p.shape} and {y.shape}")
    return p, y


def ece(probs: Sequence[float] | np.ndarray, labels: Sequence[float] | np.ndarray, bins: int = BINS) -> float:
    """Expected calibration error: over `bins` equal-width bins of [0, 1] (the last one closed),
    the gap between the mean score and the share judged relevant, weighted by the bin's share of
    the chunks. NaN for no chunks."""
    p, y = _arrays(probs, labels)
    if len(p) == 0:
        return math.nan
    which = np.minimum((np.clip(p, 0.0, 1.0) * bins).astype(int), bins - 1)
    counts = np.bincount(which, minlength=bins)
    gap = np.abs(np.bincount(which, weights=p, minlength=bins)
                 - np.bincount(which, weights=y, minlength=bins))
    return float(gap.sum() / len(p)) if counts.sum() else math.nan


def brier(probs: Sequence[float] | np.ndarray, labels: Sequence[float] | np.ndarray) -> float:
    """Mean squared difference between the score and the judgement (1 relevant, 0 not)."""
    p, y = _arrays(probs, labels)
    return float(np.mean((np.clip(p, 0.0, 1.0) - y) ** 2)) if len(p) else math.nan


def figures(probs: Sequence[float] | np.ndarray, labels: Sequence[float] | np.ndarray) -> dict[str, float]:
    """`{"ece": ..., "brier": ...}` of these scores against these judgements."""
    return {"ece": ece(probs, labels), "brier": brier(probs, labels)}


# --------------------------------------------------------------------------- the maps


def pav(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray
        ) -> tuple[np.ndarray, np.ndarray]:
    """Isotonic regression of `y` on `x` by pool-adjacent-violators: the knots (each block's mean
    x, strictly increasing) and their fitted values (non-decreasing; strictly, blocks being pooled
    until no two neighbours are out of order or equal). Equal x values are pooled first."""
    xs, ys = _arrays(x, y)
    if len(xs) == 0:
        raise ValueError("pav needs at least one point")
    ux, inverse = np.unique(xs, return_inverse=True)
    weight = np.bincount(inverse).astype(np.float64)
    ysum = np.bincount(inverse, weights=ys)
    xsum = ux * weight
    # a stack of blocks: (weight, sum of y, sum of x)
    w_stack: list[float] = []
    y_stack: list[float] = []
    x_stack: list[float] = []
    for w, sy, sx in zip(weight, ysum, xsum, strict=True):
        w_stack.append(float(w))
        y_stack.append(float(sy))
        x_stack.append(float(sx))
        while len(w_stack) > 1 and y_stack[-2] / w_stack[-2] >= y_stack[-1] / w_stack[-1]:
            w, sy, sx = w_stack.pop(), y_stack.pop(), x_stack.pop()
            w_stack[-1] += w
            y_stack[-1] += sy
            x_stack[-1] += sx
    wa = np.array(w_stack)
    return np.array(x_stack) / wa, np.array(y_stack) / wa


def fit_platt(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """(a, b) of p = sigmoid(a * x + b), a >= 0, by damped Newton steps on the log-loss against
    Platt's smoothed targets (module docstring)."""
    xs, ys = _arrays(x, y)
    pos = float(ys.sum())
    neg = float(len(ys) - pos)
    target = np.where(ys > 0.5, (pos + 1.0) / (pos + 2.0), 1.0 / (neg + 2.0))
    a, b = 0.0, math.log((pos + 1.0) / (neg + 1.0))
    design = np.column_stack([xs, np.ones_like(xs)])

    def loss(a_: float, b_: float) -> float:
        z = a_ * xs + b_
        return float(np.sum(np.logaddexp(0.0, z) - target * z))

    current = loss(a, b)
    for _ in range(PLATT_STEPS):
        p = 1.0 / (1.0 + np.exp(-(a * xs + b)))
        grad = design.T @ (p - target)
        hess = design.T @ (design * (p * (1.0 - p))[:, None]) + 1e-9 * np.eye(2)
        try:
            step = np.linalg.solve(hess, grad)
        except np.linalg.LinAlgError:
            break
        t = 1.0
        while t > 1e-6:
            na, nb = a - t * float(step[0]), b - t * float(step[1])
            value = loss(na, nb)
            if value <= current:
                break
            t /= 2
        else:
            break
        done = current - value <= 1e-12 * max(1.0, abs(current))
        a, b, current = na, nb, value
        if done:
            break
    if a < 0:  # a decreasing fit (scores that mean the opposite) cannot be a calibration map
        a, b = 0.0, math.log((pos + 1.0) / (neg + 1.0))
    return a, b


@dataclass(frozen=True)
class Calibration:
    """A fitted map (module docstring) and what it was fitted for. `knots` / `values` hold an
    isotonic map, `a` / `b` a Platt one. Call `apply(calibration, scores)` (or the instance)."""

    method: str
    knots: tuple[float, ...] = ()
    values: tuple[float, ...] = ()
    a: float = 0.0
    b: float = 0.0
    fitted_for: Mapping[str, Any] = field(default_factory=dict)
    rel_level: int = 1
    split: Mapping[str, Any] = field(default_factory=dict)
    figures: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, scores: Sequence[float] | np.ndarray) -> np.ndarray:
        return apply(self, scores)

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON object (see `save`)."""
        mapping: dict[str, Any] = ({"knots": list(self.knots), "values": list(self.values)}
                                   if self.method == "isotonic" else {"a": self.a, "b": self.b})
        return {"format": FORMAT, "version": VERSION, "method": self.method, "map": mapping,
                "fitted_for": dict(self.fitted_for), "rel_level": self.rel_level, "split": dict(self.split),
                "figures": _json_safe(dict(self.figures))}


def fit(raw: Sequence[float] | np.ndarray, labels: Sequence[float] | np.ndarray,
        method: str = "isotonic") -> Calibration:
    """A map from raw scores to the probability of a relevant judgement (labels 1 / 0)."""
    x, y = _arrays(raw, labels)
    if len(x) == 0:
        raise ValueError("fit needs at least one judged score")
    if method == "isotonic":
        knots, values = pav(x, y)
        return Calibration("isotonic", tuple(float(v) for v in knots), tuple(float(v) for v in values))
    if method == "platt":
        a, b = fit_platt(x, y)
        return Calibration("platt", a=a, b=b)
    raise ValueError(f"unknown calibration method {method!r} (known: {', '.join(METHODS)})")


def apply(calibration: Calibration, scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """`scores` (raw, in the backend's scale) as calibrated probabilities: monotone
    non-decreasing in the raw score, clipped to [0, 1]; a float64 array of the same length."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if calibration.method == "isotonic":
        out = np.interp(s, np.asarray(calibration.knots), np.asarray(calibration.values))
    else:
        out = 1.0 / (1.0 + np.exp(-np.clip(calibration.a * s + calibration.b, -500.0, 500.0)))
    return np.clip(out, 0.0, 1.0)


def mismatch(calibration: Calibration, **used: Any) -> str | None:
    """Why `calibration` may not suit the backend in use (`backend=..., model=...`: each key the
    file also records is compared), or None. Scores mean different things under another model."""
    diffs = [f"{key} {used[key]!r} (fitted for {calibration.fitted_for[key]!r})"
             for key in used if key in calibration.fitted_for and used[key] != calibration.fitted_for[key]]
    return f"calibration fitted for another setup: {', '.join(diffs)}" if diffs else None


# --------------------------------------------------------------------------- the file


def save(calibration: Calibration, path: str | Path) -> Path:
    """Write the calibration file (JSON), replacing `path` at once (a temporary file renamed)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(calibration.to_dict(), indent=1, ensure_ascii=False, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=str(target.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _bad(path: str | Path, message: str) -> InputError:
    return InputError([Violation(path=str(path), message=message)],
                      headline=f"invalid calibration file {path}")


def _numbers(path: str | Path, name: str, value: Any) -> list[float]:
    def finite(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if not isinstance(value, list) or not value or not all(finite(v) for v in value):
        raise _bad(path, f"map.{name} must be a non-empty list of finite numbers")
    return [float(v) for v in value]


def from_dict(data: Any, path: str | Path = "calibration") -> Calibration:
    """A `Calibration` from the file's JSON object, or an `InputError` naming `path` and the fault."""
    if not isinstance(data, Mapping):
        raise _bad(path, f"expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise _bad(path, f"not a rag-rerank calibration file (its 'format' is {data.get('format')!r}, "
                   f"expected {FORMAT!r}; make one with rag-rerank calibrate)")
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _bad(path, f"'version' must be a whole number, got {version!r}")
    if version > VERSION:
        raise _bad(path, f"version {version} is newer than this rag-rerank reads ({VERSION}); "
                   "upgrade rag-rerank")
    method = data.get("method")
    if method not in METHODS:
        raise _bad(path, f"'method' must be one of {', '.join(METHODS)}, got {method!r}")
    mapping = data.get("map")
    if not isinstance(mapping, Mapping):
        raise _bad(path, "'map' must be an object")
    knots: list[float] = []
    values: list[float] = []
    a = b = 0.0
    if method == "isotonic":
        knots = _numbers(path, "knots", mapping.get("knots"))
        values = _numbers(path, "values", mapping.get("values"))
        if len(knots) != len(values):
            raise _bad(path, f"map.knots ({len(knots)}) and map.values ({len(values)}) differ in length")
        if any(k2 <= k1 for k1, k2 in itertools.pairwise(knots)):
            raise _bad(path, "map.knots must be strictly increasing")
        if any(v2 < v1 for v1, v2 in itertools.pairwise(values)):
            raise _bad(path, "map.values must not decrease (a calibration map is monotone)")
        if any(not 0.0 <= v <= 1.0 for v in values):
            raise _bad(path, "map.values must be probabilities in [0, 1]")
    else:
        for name in ("a", "b"):
            v = mapping.get(name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise _bad(path, f"map.{name} must be a finite number, got {v!r}")
        a, b = float(mapping["a"]), float(mapping["b"])
        if a < 0:
            raise _bad(path, f"map.a must be >= 0 (a calibration map is monotone), got {a:g}")
    rel_level = data.get("rel_level", 1)
    if isinstance(rel_level, bool) or not isinstance(rel_level, int):
        raise _bad(path, f"'rel_level' must be a whole number, got {rel_level!r}")
    parts = {}
    for name in ("fitted_for", "split", "figures"):
        value = data.get(name, {})
        if not isinstance(value, Mapping):
            raise _bad(path, f"'{name}' must be an object")
        parts[name] = dict(value)
    return Calibration(method, tuple(knots), tuple(values), a, b, parts["fitted_for"], rel_level,
                       parts["split"], parts["figures"])


def load(path: str | Path) -> Calibration:
    """Read a calibration file; a missing, unreadable or malformed one is an `InputError` naming the
    file and what is wrong."""
    where = Path(path)
    if where.is_dir():
        raise _bad(path, "is a directory, not a calibration file")
    try:
        text = where.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise _bad(path, "no such file (make one with rag-rerank calibrate)") from None
    except OSError as exc:
        raise _bad(path, f"cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise _bad(path, f"not UTF-8 text (byte {exc.start}); a calibration file is JSON") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise _bad(path, f"not valid JSON ({exc})") from None
    return from_dict(data, path)


def as_calibration(value: Any) -> Calibration:
    """What a `calibration=` option may be: a `Calibration`, a path to its file (str or Path), or
    the file's JSON object; anything else is an `InputError` naming it."""
    if isinstance(value, Calibration):
        return value
    if isinstance(value, (str, os.PathLike)):
        return load(value)
    if isinstance(value, Mapping):
        return from_dict(value)
    raise InputError([Violation(path="calibration", value=type(value).__name__,
                                message="calibration must be a Calibration, the path of a calibration "
                                f"file or its JSON object, got {type(value).__name__}")])


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
    fitted_for = {"backend": reranker.backend_name, "model": getattr(reranker.backend, "model", None),
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
    return CalibrationRun(cal, failed, kinds, unjudged, unscored)


def _json_safe(value: Any) -> Any:
    """NaN (a figure over nothing) as null: JSON has no NaN."""
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, Mapping):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


__all__ = ["BINS", "FORMAT", "METHODS", "VERSION", "Calibration", "CalibrationRun", "Scored", "apply",
           "as_calibration", "brier", "calibrate", "collect", "ece", "figures", "fit", "fit_judged",
           "fit_option_violations", "fit_platt", "from_dict", "load", "mismatch", "pav", "raw_scores", "save",
           "split_queries"]
