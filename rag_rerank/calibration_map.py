"""The calibration map itself, without the machinery that fits it on judged queries
(`calibration.py`): the `Calibration` value, `apply`, the figures (ECE, Brier), the fitting
functions (PAV, Platt) and the versioned file (`save`, `load`, `as_calibration`). The engine
applies a map (`calibration=`) from here: `resolve` reads the option (a file is read once and again
only when it changes), `calibrate_answer` maps a backend's answer, `describe` is `meta.calibration`.
`calibration.py` re-exports the names of the map and its file.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import reasons
from .errors import ConfigError, InputError, Violation

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


# --------------------------------------------------------------------------- the calibration= option

# Calibration files read so far: path -> ((modification time, size), the calibration). A service
# reads its file once, and again only when it changes (one entry per file, however often it does).
_FILES: dict[str, tuple[tuple[int, int], Calibration]] = {}


def resolve(value: Any) -> tuple[Calibration | None, str | None]:
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
        seen = _FILES.get(where)
        if version is not None and seen is not None and seen[0] == version:
            return seen[1], path
        try:
            loaded = load(path)
        except InputError as exc:
            raise ConfigError(f"calibration file {path}: {'; '.join(v.message for v in exc.violations)}"
                              ) from None
        if version is not None:
            _FILES[where] = (version, loaded)
        return loaded, path
    try:
        return as_calibration(value), None
    except InputError as exc:
        raise ConfigError(f"calibration: {'; '.join(v.message for v in exc.violations)}") from None


def calibrate_answer(calibration: Calibration, answer: Mapping[str, Any]) -> dict[str, Any]:
    """A backend's answer with every score it gave mapped: the ranked chunks' scores and the ones
    dropped reasons carry (`not_selected: 0.410`). The map is monotone, so the order the backend
    gave stands; the minimum score and MMR then see probabilities."""
    obj = dict(answer)
    ranked = [dict(item) for item in obj.get("ranked", ())]
    dropped = [dict(item) for item in obj.get("dropped", ()) or ()]
    raw = [float(item["score"]) for item in ranked]
    carried = [(i, reasons.score_in(item["reason"])) for i, item in enumerate(dropped)]
    carried = [(i, v) for i, v in carried if v is not None]
    mapped = apply(calibration, raw + [v for _, v in carried]) if raw or carried else []
    for item, value in zip(ranked, mapped[:len(raw)], strict=True):
        item["score"] = round(float(value), 4)
    for (i, _), value in zip(carried, mapped[len(raw):], strict=True):
        token = reasons.split(dropped[i]["reason"])[0]  # type: ignore[index]
        dropped[i]["reason"] = reasons.reason(token, reasons.score_detail(float(value)))
    obj["ranked"] = ranked
    if "dropped" in answer:
        obj["dropped"] = dropped
    return obj


def describe(calibration: Calibration | None, file: str | None, *, backend: str, model: str | None
             ) -> dict[str, Any] | None:
    """`meta.calibration`: which map was applied (its method, file and the file format's version),
    and why it may not suit this backend when it was fitted for another one."""
    if calibration is None:
        return None
    out: dict[str, Any] = {"method": calibration.method, "file": file, "version": VERSION}
    warning = mismatch(calibration, backend=backend, model=model)
    if warning:
        out["warning"] = warning
    return out


def _json_safe(value: Any) -> Any:
    """NaN (a figure over nothing) as null: JSON has no NaN."""
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, Mapping):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


__all__ = ["BINS", "FORMAT", "METHODS", "PLATT_STEPS", "VERSION", "Calibration", "apply", "as_calibration",
           "brier", "calibrate_answer", "describe", "ece", "figures", "fit", "fit_platt", "from_dict", "load",
           "mismatch", "pav", "resolve", "save"]
