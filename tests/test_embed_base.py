"""embed/base.py: unit rows, and float32 row norms from a row's non-zero entries alone."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rag_rerank.embed.base import l2_normalise, numpy_sums_as_assumed, sparse_row_norms

_VALUES = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.sampled_from([16, 32, 128, 256, 4096]), st.integers(1, 4), st.data())
@example(4096, 2, None)
def test_sparse_row_norms_are_numpys_bit_for_bit(dim: int, n: int, data: st.DataObject | None) -> None:
    """`sparse_row_norms` of a matrix's non-zero entries is `np.linalg.norm(m, axis=1)`, the same
    float32 bits: rows empty, sparse or full, values of any size (subnormal, huge, signed zeros)."""
    if data is None:  # a full row of values far apart in size: any other order of sums rounds otherwise
        m = (np.random.default_rng(5).standard_normal((n, dim)) * np.logspace(-8, 8, dim)).astype(np.float32)
    else:
        m = np.zeros((n, dim), dtype=np.float32)
        cells = data.draw(st.lists(st.integers(0, n * dim - 1), max_size=3 * dim, unique=True))
        m.reshape(-1)[cells] = data.draw(st.lists(_VALUES, min_size=len(cells), max_size=len(cells)))
    flat = np.flatnonzero(m)
    with np.errstate(over="ignore"):
        got = sparse_row_norms(flat, m.reshape(-1)[flat], n, dim)
        expected = np.linalg.norm(m, axis=1)
    assert got.dtype == np.float32 and got.tobytes() == expected.tobytes()


def test_numpy_sums_as_assumed_here_and_the_check_can_tell() -> None:
    """This numpy sums as `sparse_row_norms` assumes; a row summed in plain order gives other bits on
    the kind of row the check uses (so the check would notice a numpy that sums otherwise)."""
    assert numpy_sums_as_assumed()
    row = (np.random.default_rng(1).standard_normal(4096) * 1e3).astype(np.float32)
    plain = np.float32(0)
    for v in row * row:
        plain = np.float32(plain + v)
    assert np.sqrt(plain) != np.linalg.norm(row[None], axis=1)[0]


def test_l2_normalise_keeps_a_zero_row_zero() -> None:
    out = l2_normalise(np.array([[3.0, 4.0], [0.0, 0.0]]))
    assert out.dtype == np.float32 and out.tolist() == [[0.6000000238418579, 0.800000011920929], [0.0, 0.0]]
