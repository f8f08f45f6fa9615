"""Paired tests of chance for per-query differences: a bootstrap confidence interval of the mean
difference, a paired randomisation (sign-flip) test, and Holm's correction for several of them.

Why these. Two rankers are scored on the same queries, so the unit of evidence is the per-query
difference `d = B - A`; queries differ far more among themselves than the two systems do, and a
paired test looks only at the differences. Both procedures make no normality assumption.

* **Bootstrap interval** of `mean(d)`: queries are drawn with replacement `n_resamples` times.
  `bca` (the default, as `scipy.stats.bootstrap`'s) corrects the percentile interval for bias and
  skew with the jackknife; `percentile` is the plain one. A constant `d` (a run compared with
  itself) has the degenerate interval `[d, d]`.
* **Randomisation test**: under "no difference" each query's two scores are exchangeable, so
  the sign of each `d_i` is a coin flip. The p-value is the share of sign-flipped means at least
  as extreme as the observed one, counting the observed assignment (`(hits + 1) / (R + 1)`, as
  scipy's `permutation_test` does when it samples). With `2**n <= n_resamples` every assignment is
  enumerated and the p-value is exact. Two-sided is twice the smaller one-sided p, at most 1.
  `shift` tests "mean(d) >= -shift" instead of "= 0" (the CI gate's "worse by more than a margin").

Vectorised: the resamples are count matrices (`W[r, i]` = times query `i` is drawn), so every
metric's bootstrap means are one matrix product `W @ D / n`, and sign flips likewise; blocks of
rows keep memory bounded. Comparing two 1,000-query runs on four metrics with 10,000 resamples
takes a fraction of a second (`bench/compare.py`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from statistics import NormalDist

import numpy as np

BLOCK = 1024  # resamples per matrix product: (BLOCK x n) floats at a time
METHODS = ("bca", "percentile")
ALTERNATIVES = ("two-sided", "less", "greater")
_NORMAL = NormalDist()


def _matrix(diffs: Sequence[float] | np.ndarray) -> np.ndarray:
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim == 1:
        d = d[:, None]
    if d.ndim != 2 or d.shape[0] < 1:
        raise ValueError("differences must be a non-empty vector or an (n queries, m metrics) matrix")
    return d


def bootstrap_counts(n: int, n_resamples: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Blocks of at most `BLOCK` rows of `n_resamples` bootstrap resamples of `n` items, as counts:
    row r, column i = how many times item i was drawn in resample r (each row sums to n). A
    statistic that is a ratio of sums (a weighted mean) is then two matrix products."""
    for start in range(0, n_resamples, BLOCK):
        rows = min(BLOCK, n_resamples - start)
        draws = rng.integers(0, n, size=(rows, n))
        flat = (draws + (np.arange(rows) * n)[:, None]).ravel()
        yield np.bincount(flat, minlength=rows * n).reshape(rows, n)


def bootstrap_means(
    diffs: Sequence[float] | np.ndarray, n_resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """(n_resamples, m) means of `diffs` over queries drawn with replacement."""
    d = _matrix(diffs)
    n = d.shape[0]
    return np.concatenate([counts @ d / n for counts in bootstrap_counts(n, n_resamples, rng)])


def bootstrap_interval(
    diffs: Sequence[float] | np.ndarray,
    *,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    method: str = "bca",
    rng: np.random.Generator | int | None = 0,
) -> np.ndarray:
    """(m, 2) lower and upper bounds of the bootstrap interval of each column's mean."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    d = _matrix(diffs)
    gen = np.random.default_rng(rng)
    means = bootstrap_means(d, n_resamples, gen)
    observed = d.mean(axis=0)
    alpha = (1 - confidence) / 2
    out = np.empty((d.shape[1], 2))
    for j in range(d.shape[1]):
        col = d[:, j]
        if np.ptp(col) == 0:  # every query moved by the same amount: nothing varies
            out[j] = col[0]
            continue
        lo, hi = alpha, 1 - alpha
        if method == "bca":
            lo, hi = _bca_levels(col, means[:, j], observed[j], alpha)
        out[j] = np.percentile(means[:, j], [100 * lo, 100 * hi])
    return out


def _bca_levels(col: np.ndarray, boot: np.ndarray, observed: float, alpha: float) -> tuple[float, float]:
    """The bias-corrected and accelerated percentile levels (Efron 1987; scipy's definitions)."""
    # With few distinct per-query values many resampled means equal the observed one; computed by
    # matrix products of different widths they differ from it in the last bits, which must not move
    # them across it (the bias correction would jump): equal within rounding counts as equal.
    tol = 1e-10 * max(1.0, abs(observed))
    share = (np.sum(boot < observed - tol) + np.sum(boot <= observed + tol)) / (2 * len(boot))
    share = min(max(share, 1 / (2 * len(boot))), 1 - 1 / (2 * len(boot)))
    z0 = _NORMAL.inv_cdf(share)
    n = len(col)
    jack = (col.sum() - col) / (n - 1)  # leave-one-out means
    dev = jack.mean() - jack
    den = 6 * np.sum(dev**2) ** 1.5
    accel = float(np.sum(dev**3) / den) if den > 0 else 0.0
    levels = []
    for z in (_NORMAL.inv_cdf(alpha), _NORMAL.inv_cdf(1 - alpha)):
        levels.append(_NORMAL.cdf(z0 + (z0 + z) / (1 - accel * (z0 + z))))
    return levels[0], levels[1]


def sign_flip_pvalue(
    diffs: Sequence[float] | np.ndarray,
    *,
    n_resamples: int = 10_000,
    alternative: str = "two-sided",
    shift: float | Sequence[float] = 0.0,
    rng: np.random.Generator | int | None = 0,
) -> np.ndarray:
    """p-value per column of the paired randomisation test of `mean(d + shift) = 0`.

    `alternative="less"`: evidence that the mean is below `-shift`; "greater": above it."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")
    d = _matrix(diffs) + np.asarray(shift, dtype=np.float64)
    n, m = d.shape
    observed = d.mean(axis=0)
    # Floating-point sums of the same values in another order differ in the last bits: a flipped
    # mean equal to the observed one must count as "as extreme" (a run against itself: p = 1).
    tol = 1e-12 * np.maximum(1.0, np.abs(d).sum(axis=0) / n)
    if 2**n <= n_resamples:  # every assignment of signs: the exact p-value
        signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1).astype(np.float64)
        null = signs @ d / n
        greater = (null >= observed - tol).mean(axis=0)
        less = (null <= observed + tol).mean(axis=0)
    else:
        gen = np.random.default_rng(rng)
        hits_ge, hits_le = np.zeros(m), np.zeros(m)
        for start in range(0, n_resamples, BLOCK):
            rows = min(BLOCK, n_resamples - start)
            # one random bit per sign: the cheapest fair coin numpy draws
            bits = np.unpackbits(np.frombuffer(gen.bytes(-(-rows * n // 8)), dtype=np.uint8))[: rows * n]
            signs = 1.0 - 2.0 * bits.reshape(rows, n)
            null = signs @ d / n
            hits_ge += (null >= observed - tol).sum(axis=0)
            hits_le += (null <= observed + tol).sum(axis=0)
        greater = (hits_ge + 1) / (n_resamples + 1)
        less = (hits_le + 1) / (n_resamples + 1)
    if alternative == "greater":
        return np.asarray(greater)
    if alternative == "less":
        return np.asarray(less)
    return np.minimum(1.0, 2 * np.minimum(greater, less))


def holm(pvalues: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (step-down, monotone, at most 1), in the given order."""
    p = np.asarray(pvalues, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    k = len(p)
    adjusted = np.maximum.accumulate((k - np.arange(k)) * p[order])
    out = np.empty(k)
    out[order] = np.minimum(adjusted, 1.0)
    return out


__all__ = [
    "ALTERNATIVES",
    "BLOCK",
    "METHODS",
    "bootstrap_counts",
    "bootstrap_interval",
    "bootstrap_means",
    "holm",
    "sign_flip_pvalue",
]
