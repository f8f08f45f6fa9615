"""What every embedder is: the `Embedder` protocol, and unit rows (`l2_normalise`).

A leaf below every embedder module and `embed/__init__` (which picks one by name), so an embedder
never imports the package that imports it.
"""

from __future__ import annotations

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


__all__ = ["Embedder", "l2_normalise"]
