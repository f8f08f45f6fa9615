"""Vectors kept on disk between processes, for texts that are embedded again and again.

A semantic router embeds the same 1,500 example requests every time it is built (about 12 s
with MiniLM on a CPU); a benchmark embeds the same passages on every run. Both wrap their
embedder in `DiskCachedEmbedder`, which keeps one file per embedder name, keyed by each text's
SHA-1, so the second process pays only for the model load.

The cache is a cache: a file that cannot be read is ignored (and rewritten), a directory that
cannot be written is skipped silently, and `RAG_RERANK_CACHE_DIR=off` turns it off.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from . import Embedder

CACHE_ENV = "RAG_RERANK_CACHE_DIR"


def default_cache_dir() -> Path | None:
    """`$RAG_RERANK_CACHE_DIR`, else `$XDG_CACHE_HOME/rag-rerank`, else `~/.cache/rag-rerank`;
    None when the variable is `off` (or empty)."""
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        return None if value.strip().lower() in ("", "off", "0", "none") else Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rag-rerank"


class DiskCachedEmbedder:
    """`inner` with a per-name vector file under `directory`; call `save()` after embedding."""

    def __init__(self, inner: Embedder, directory: Path) -> None:
        self._inner = inner
        self.name = inner.name
        self.duplicate_threshold = float(getattr(inner, "duplicate_threshold", 0.95))
        self._file = Path(directory) / (hashlib.sha1(self.name.encode()).hexdigest()[:12] + ".npz")
        self._cache: dict[str, np.ndarray] = {}
        self._dirty = False
        try:
            with np.load(self._file) as z:
                self._cache = dict(zip(z["keys"].tolist(), z["vecs"], strict=True))
        except (OSError, ValueError, KeyError, EOFError):
            self._cache = {}  # absent or unreadable: start again

    def embed(self, texts: list[str]) -> np.ndarray:
        keys = [hashlib.sha1(t.encode("utf-8", "surrogatepass")).hexdigest() for t in texts]
        missing = {k: t for k, t in zip(keys, texts, strict=True) if k not in self._cache}
        if missing:
            vecs = self._inner.embed(list(missing.values()))
            for k, v in zip(missing, vecs, strict=True):
                self._cache[k] = np.asarray(v, dtype=np.float32)
            self._dirty = True
        if not keys:
            return self._inner.embed([])
        return np.stack([self._cache[k] for k in keys])

    def save(self) -> None:
        """Write the file if anything was added (atomically: a crash leaves the old file)."""
        if not self._dirty or not self._cache:
            return
        tmp: str | None = None
        try:
            self._file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self._file.parent, suffix=".npz.tmp")
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, keys=np.array(list(self._cache)), vecs=np.stack(list(self._cache.values())))
            os.replace(tmp, self._file)
            tmp = None
            self._dirty = False
        except OSError:
            pass  # a read-only home or a full disk: the cache is optional
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
