"""A kernel logistic regression fitted by damped Newton steps, on a sparse feature matrix's Gram
matrix: the router's per-card classifier (`router.py`), a few hundred examples, numpy only,
deterministic (from zero, no random start).

With a linear kernel (the Gram matrix X X') this is L2-regularised logistic regression, which
scikit-learn's `LogisticRegression(C=1/lam)` with the same sample weights also fits. Kept because
the router is in the core install and its answers must be the same on every machine: on the
router's own fit (1,443 examples x 17,701 features, `python bench/libraries.py`) scikit-learn at a
tight tolerance reaches the same probabilities to 4.8e-7 with no decision changed, and at its
default tolerance took 0.5-0.9x our time (6.2-10.7 s against 11.6-12.4 s, load average 12-16 on a
shared 2-core machine: a once-per-process cost either way), for 149 MB more install (with SciPy).
"""

from __future__ import annotations

import numpy as np

# Newton steps for the classifier; it converges in about ten.
FIT_STEPS = 50


def sparse_gram(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n: int) -> np.ndarray:
    """X X' for X given as coordinates. A feature only one example has adds to that example's
    diagonal entry alone; the others (about half) form a dense float32 block for one BLAS call."""
    gram = np.zeros((n, n))
    if not len(cols):
        return gram
    df = np.bincount(cols)
    single = df[cols] == 1
    np.add.at(gram, (rows[single], rows[single]), vals[single] ** 2)
    shared = ~single
    if shared.any():
        _, dense_cols = np.unique(cols[shared], return_inverse=True)
        block = np.zeros((n, int(dense_cols.max()) + 1), dtype=np.float32)
        block[rows[shared], dense_cols] = vals[shared]
        gram += (block @ block.T).astype(np.float64)
    return gram


def fit_kernel_logistic(
    gram: np.ndarray, y: np.ndarray, sample_w: np.ndarray, *, lam: float, steps: int = FIT_STEPS
) -> tuple[np.ndarray, float]:
    """Minimise sum_i w_i logloss(y_i, (K a)_i + b) + lam/2 a'Ka over (a, b) by damped Newton.

    With z = K a + b, the gradient in a is K (g + lam a) where g = w (p - y), so a Newton step
    solves (D K + lam I) da + D 1 db = -(g + lam a), 1'D K da + 1'D 1 db = -1'g (D = w p (1-p)),
    the system with K factored out (exact when K is invertible, a valid descent step otherwise).
    Halving the step until the objective falls keeps it safe from any start.
    """
    n = len(y)
    alpha, bias = np.zeros(n), 0.0
    if n == 0:
        return alpha, bias

    def objective(a: np.ndarray, b: float) -> float:
        z = gram @ a + b
        return float(sample_w @ (np.logaddexp(0.0, z) - y * z) + 0.5 * lam * a @ (gram @ a))

    current = objective(alpha, bias)
    for _ in range(steps):
        z = gram @ alpha + bias
        p = 1.0 / (1.0 + np.exp(-z))
        g = sample_w * (p - y)
        d = sample_w * p * (1.0 - p)
        system = np.empty((n + 1, n + 1))
        system[:n, :n] = d[:, None] * gram
        system[:n, :n][np.diag_indices(n)] += lam
        system[:n, n] = d
        system[n, :n] = d @ gram
        system[n, n] = d.sum()
        rhs = -np.concatenate([g + lam * alpha, [g.sum()]])
        try:
            step = np.linalg.solve(system, rhs)
        except np.linalg.LinAlgError:
            step = np.linalg.lstsq(system, rhs, rcond=None)[0]
        t = 1.0
        while t > 1e-4:
            cand_a, cand_b = alpha + t * step[:n], bias + t * float(step[n])
            value = objective(cand_a, cand_b)
            if value <= current:
                break
            t /= 2
        else:
            break
        improvement = current - value
        alpha, bias, current = cand_a, cand_b, value
        # Close enough: the last step moved the loss by under a billionth (probabilities by far
        # less than any threshold's precision).
        if improvement <= 1e-9 * max(abs(current), 1.0):
            break
    return alpha, bias


__all__ = ["FIT_STEPS", "fit_kernel_logistic", "sparse_gram"]
