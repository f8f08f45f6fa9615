"""Embedders for the post-pass and the local backend: texts in, L2-normalised float32 rows out.

One small protocol so that the post-pass never cares where vectors come from: the default
`lexical` embedder (numpy only), `sentence-transformers` (optional extra), an OpenAI-compatible
embeddings endpoint, or vectors the caller put in the chunk records.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Embedder(Protocol):
    """Anything with a name and `embed(texts) -> (n, d) float32`, rows of unit length (or zero)."""

    name: str

    def embed(self, texts: list[str]) -> np.ndarray: ...


def l2_normalise(matrix: np.ndarray) -> np.ndarray:
    """Unit rows as float32; an all-zero row stays zero instead of becoming NaN."""
    m = np.asarray(matrix, dtype=np.float32)
    if m.ndim != 2:
        m = m.reshape(len(m), -1)
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return np.divide(m, norms, out=np.zeros_like(m), where=norms > 0)
