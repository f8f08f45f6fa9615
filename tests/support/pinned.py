"""A fixed query and texts whose token ids, vectors and scores the tests pin (see test_embed_static),
and how a pinned float is compared.

The pinned floats were recorded as exact doubles (`float.hex`) on one machine, from float32
vectors. Their last bits depend on the CPU: numpy and BLAS sum a float32 row in an order set by
the SIMD width they dispatch to (SSE, AVX2, AVX-512), so the same code gives results a few float32
ulps apart on another machine (about 1e-7 relative; the recorded values differ by 5e-8 on an
AVX-512 machine). `assert_pinned` therefore compares within 1e-6 relative (about 8 float32 ulps)
and 1e-7 absolute, still far below any change a real edit to a feature would make, and checks the
order of the values only between those whose pinned values are far enough apart that no rounding
can swap them. What is exact by construction (token ids, the zero row of a text without tokens)
the tests still compare exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PIN_QUERY = "Why does my Kubernetes pod keep restarting with OOMKilled?"
PIN_TEXTS = [
    "kubectl logs --previous shows why the last container instance exited (exit code 137: OOMKilled).",
    "Raise the memory limit in the pod spec; the kubelet kills a container that exceeds it.",
    "naïve Ünïcode — “quotes” 東京タワー 123,456.78 e-mail ΟΔΟΣ Σ\u2028line\u2029para",
    "Fold the egg whites gently into the batter and bake for 40 minutes.",
    "\x00ctrl\u200bzero\tTab\r\nnewline Straße ﬁne ½ ㎏ İstanbul 🙂 café",
    "",
]

RTOL, ATOL = 1e-6, 1e-7
# Two pinned values closer than this may come out in either order on another CPU: each may move
# by up to ATOL + RTOL * |value|, so the gap must be well over twice that (1e-5 is ten times more
# for values up to 1).
ORDER_GAP = 1e-5


def floats(hexes: Sequence[str]) -> np.ndarray:
    """The recorded exact doubles."""
    return np.array([float.fromhex(h) for h in hexes])


def assert_pinned(actual: Sequence[float] | np.ndarray, hexes: Sequence[str], what: str) -> None:
    """`actual` equals the pinned values within the cross-CPU tolerance, and ranks them the same
    way wherever a tie is impossible (pinned values at least ORDER_GAP apart)."""
    got, want = np.asarray(actual, dtype=np.float64), floats(hexes)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)
    for i in range(len(want)):
        for j in range(len(want)):
            if want[i] - want[j] > ORDER_GAP:
                assert got[i] > got[j], f"{what}: [{i}] {got[i]!r} should rank above [{j}] {got[j]!r}"
