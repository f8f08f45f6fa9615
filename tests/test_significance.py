"""The paired bootstrap interval and randomisation test agree with scipy's on generated paired
samples, within Monte Carlo error; Holm's correction; degenerate and symmetric cases.

Tolerances are Monte Carlo error, not fudge: two estimates from R independent resamples differ by
about sqrt(2) times one's standard error. For a one-sided p-value that is sqrt(p (1 - p) / R)
(twice that of p / 2 for a two-sided one); for a bootstrap quantile q of a mean it is about
sqrt(q (1 - q) / R) / density at the quantile, with the bootstrap distribution close to normal
with sd s = sd(d) / sqrt(n): 0.027 s at q = 0.025. Every comparison allows 4 times the
difference's standard error."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rag_rerank.significance import bootstrap_interval, holm, sign_flip_pvalue

stats = pytest.importorskip("scipy.stats")

R = 10_000


def paired_sample(n: int, shift: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-query scores of two systems in [0, 1]: B is A moved by `shift` plus noise."""
    rng = np.random.default_rng(seed)
    a = rng.beta(2, 3, n)
    b = np.clip(a + rng.normal(shift, 0.15, n), 0, 1)
    return a, b


def p_tolerance(p: float, alternative: str = "less") -> float:
    """4 standard errors of the difference of two estimates of `p` (a two-sided p is twice a
    one-sided estimate of p / 2, so twice its standard error)."""
    if alternative == "two-sided":
        q = min(p, 1.0) / 2
        se = 2 * math.sqrt(max(q * (1 - q), 1 / R) / R)
    else:
        se = math.sqrt(max(p * (1 - p), 1 / R) / R)
    return 4 * math.sqrt(2) * se + 2 / R


def mean_diff(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x - y, axis=axis)


@pytest.mark.parametrize(
    ("n", "shift", "seed"), [(30, 0.0, 1), (40, 0.03, 2), (200, 0.02, 3), (1000, 0.005, 4)]
)
@pytest.mark.parametrize("method", ["bca", "percentile"])
def test_the_interval_agrees_with_scipy_bootstrap(n: int, shift: float, seed: int, method: str) -> None:
    a, b = paired_sample(n, shift, seed)
    d = b - a
    ours = bootstrap_interval(d, n_resamples=R, method=method, rng=seed)[0]
    theirs = stats.bootstrap(
        (b, a), mean_diff, paired=True, n_resamples=R, method=method, random_state=seed + 100
    ).confidence_interval
    s = d.std(ddof=1) / math.sqrt(n)
    tol = 4 * math.sqrt(2) * 0.027 * s * 1.5  # BCa moves the levels a little: a wider allowance
    assert ours[0] == pytest.approx(theirs.low, abs=tol)
    assert ours[1] == pytest.approx(theirs.high, abs=tol)


@pytest.mark.parametrize(
    ("n", "shift", "seed"), [(40, 0.0, 5), (40, 0.06, 6), (300, 0.02, 7), (1000, 0.01, 8)]
)
@pytest.mark.parametrize("alternative", ["two-sided", "less", "greater"])
def test_the_p_value_agrees_with_scipy_permutation_test(
    n: int, shift: float, seed: int, alternative: str
) -> None:
    a, b = paired_sample(n, shift, seed)
    ours = float(sign_flip_pvalue(b - a, n_resamples=R, alternative=alternative, rng=seed)[0])
    theirs = stats.permutation_test(
        (b, a),
        mean_diff,
        permutation_type="samples",
        n_resamples=R,
        alternative=alternative,
        random_state=seed + 100,
    ).pvalue
    assert ours == pytest.approx(theirs, abs=p_tolerance(theirs, alternative))


def test_with_few_queries_the_p_value_is_exact_and_equals_scipys() -> None:
    # 2**10 assignments <= R: both enumerate them all, no Monte Carlo error at all
    a, b = paired_sample(10, 0.05, 9)
    for alternative in ("two-sided", "less", "greater"):
        ours = float(sign_flip_pvalue(b - a, n_resamples=R, alternative=alternative)[0])
        theirs = stats.permutation_test(
            (b, a), mean_diff, permutation_type="samples", n_resamples=R, alternative=alternative
        ).pvalue
        assert ours == pytest.approx(theirs, abs=1e-12)


def test_a_shifted_null_is_scipys_test_of_the_shifted_pairs() -> None:
    # the gate's "B is worse by more than the margin": mean(d + margin) < 0
    a, b = paired_sample(200, -0.04, 10)
    margin = 0.01
    ours = float(sign_flip_pvalue(b - a, n_resamples=R, alternative="less", shift=margin, rng=1)[0])
    theirs = stats.permutation_test(
        (b + margin, a),
        mean_diff,
        permutation_type="samples",
        n_resamples=R,
        alternative="less",
        random_state=2,
    ).pvalue
    assert ours == pytest.approx(theirs, abs=p_tolerance(theirs))
    assert ours < 0.05  # the sample was drawn 0.04 worse


def test_columns_are_tested_as_if_alone() -> None:
    a, b = paired_sample(300, 0.02, 11)
    c, e = paired_sample(300, -0.01, 12)
    both = np.column_stack([b - a, e - c])
    together = sign_flip_pvalue(both, rng=3)
    alone = [float(sign_flip_pvalue(col, rng=3)[0]) for col in both.T]
    assert together[0] == pytest.approx(alone[0])  # same draws: the first column is bit for bit the same test
    assert together[1] == pytest.approx(alone[1], abs=p_tolerance(alone[1], "two-sided"))


def test_identical_scores_give_difference_zero_and_p_one() -> None:
    d = np.zeros(43)
    assert bootstrap_interval(d).tolist() == [[0.0, 0.0]]
    assert sign_flip_pvalue(d).tolist() == [1.0]
    assert bootstrap_interval(np.full(20, 0.1)).tolist() == [[0.1, 0.1]]


@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=2, max_size=60), st.integers(0, 2**32 - 1))
@example([0.0, 0.0], 0)
@example([1.0, -1.0, 0.5], 7)
@settings(max_examples=40, deadline=None, derandomize=True)
def test_p_values_are_probabilities_and_symmetric_in_the_sign(values: list[float], seed: int) -> None:
    d = np.asarray(values)
    p = float(sign_flip_pvalue(d, n_resamples=500, rng=seed)[0])
    assert 0 < p <= 1
    assert float(sign_flip_pvalue(-d, n_resamples=500, rng=seed)[0]) == pytest.approx(p)
    low, high = bootstrap_interval(d, n_resamples=500, rng=seed)[0]
    assert low <= high + 1e-12
    assert min(values) - 1e-9 <= low and high <= max(values) + 1e-9


def test_holm_matches_the_step_down_by_hand() -> None:
    # sorted 0.01, 0.03, 0.04, 0.2 -> 4*0.01, max(0.04, 3*0.03), max(0.09, 2*0.04), max(0.09, 0.2)
    assert holm([0.01, 0.04, 0.03, 0.2]).tolist() == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert holm([0.5, 0.6]).tolist() == pytest.approx([1.0, 1.0])
    assert holm([0.02]).tolist() == [0.02]


@given(st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=12))
@settings(max_examples=60, deadline=None, derandomize=True)
def test_holm_never_lowers_a_p_value_and_keeps_their_order(ps: list[float]) -> None:
    adjusted = holm(ps)
    assert all(adj >= p - 1e-12 and adj <= 1 for p, adj in zip(ps, adjusted, strict=True))
    order = np.argsort(ps, kind="stable")
    assert all(np.diff(adjusted[order]) >= -1e-12)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="method"):
        bootstrap_interval([0.1, 0.2], method="student")
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_interval([0.1, 0.2], confidence=1.5)
    with pytest.raises(ValueError, match="alternative"):
        sign_flip_pvalue([0.1, 0.2], alternative="both")
