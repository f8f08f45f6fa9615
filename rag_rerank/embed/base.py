"""What every embedder is: the `Embedder` protocol, and unit rows (`l2_normalise`).

A leaf below every embedder module and `embed/__init__` (which picks one by name), so an embedder
never imports the package that imports it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Embedder(Protocol):
    """Anything with a name and `embed(texts) -> (n, d) float32`, rows of unit length (or zero).

    `duplicate_threshold` is the cosine at or above which two chunks count as near-duplicates
    for this embedder (cosine scales differ between models, so the threshold travels with it).
    """

    name: str
    duplicate_threshold: float

    def embed(self, texts: list[str]) -> np.ndarray: ...


def l2_normalise(matrix: np.ndarray) -> np.ndarray:
    """Unit rows as float32; an all-zero row stays zero instead of becoming NaN."""
    m = np.asarray(matrix, dtype=np.float32)
    if m.ndim != 2:
        m = m.reshape(len(m), -1)
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    positive = norms > 0
    if positive.all():  # the usual case: a plain division (a masked one costs several times more)
        return m / norms
    return np.divide(m, norms, out=np.zeros_like(m), where=positive)


# numpy sums a float32 row of more than 8 values pairwise: runs of at most 128 (halving longer ones at
# multiples of 8), each in 8 interleaved running sums combined as ((0+1)+(2+3))+((4+5)+(6+7)), and the
# halves' sums added back up the tree (`FLOAT_pairwise_sum`). For a width that is a power of two of
# at least 16, every run is a whole block of `min(width, 128)` columns.
_BLOCK, _LANES = 128, 8


def sparse_row_norms(cells: np.ndarray, values: np.ndarray, n: int, dim: int) -> np.ndarray:
    """`np.linalg.norm(m, axis=1)` of the (n, dim) float32 matrix `m` holding `values` at the flat
    positions `cells` (row * dim + column, ascending) and +0.0 elsewhere: the same float32 bits,
    from the entries alone (`dim` a power of two of at least 16).

    Why: `l2_normalise` of a mostly empty row reads and squares every cell; a zero adds nothing to
    a sum, so each of numpy's running sums (the comment above) is the sum of its non-zero squares,
    taken in column order. They are added in that order one by one (`np.add.at` is unbuffered),
    then combined as numpy combines them: the eight of a block ((0+1)+(2+3))+((4+5)+(6+7)), then
    the blocks pairwise, which is one halving tree of neighbours over a row's blocks' running sums
    laid out in order. `numpy_sums_as_assumed` checks the rule on this numpy."""
    block = min(dim, _BLOCK)
    squares = values * values
    sums = np.zeros(n * (dim // block) * _LANES, dtype=np.float32)
    # a cell's running sum: its block's (`cell // block`, row * blocks + column // block: the width is
    # a multiple of the block) eight, at its column modulo 8 (the block a multiple of 8)
    lane = (cells >> (block.bit_length() - 1)) << 3
    lane |= cells & (_LANES - 1)
    np.add.at(sums, lane, squares)
    total = sums.reshape(n, -1)
    while total.shape[1] > 1:  # the halving tree, a level at a time
        total = total[:, 0::2] + total[:, 1::2]
    return np.sqrt(total[:, 0])


@lru_cache(maxsize=1)
def numpy_sums_as_assumed() -> bool:
    """Whether this numpy's `np.linalg.norm` of float32 rows is `sparse_row_norms`' rule: checked
    once on rows whose sums round differently in any other order (a numpy that summed otherwise,
    with wider running sums for one, would fail it; the caller then takes the dense path)."""
    rng = np.random.default_rng(20261129)
    for dim in (16, 64, 4096):
        dense = rng.standard_normal((3, dim)).astype(np.float32) * np.float32(1e3)
        dense[rng.random((3, dim)) < 0.5] = 0
        dense[2] = 0
        flat = np.flatnonzero(dense)
        got = sparse_row_norms(flat, dense.reshape(-1)[flat], 3, dim)
        if got.tobytes() != np.linalg.norm(dense, axis=1).tobytes():
            return False
    return True


__all__ = ["Embedder", "l2_normalise", "numpy_sums_as_assumed", "sparse_row_norms"]
