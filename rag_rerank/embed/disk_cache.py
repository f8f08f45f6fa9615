"""Vectors kept on disk between processes, for texts that are embedded again and again.

A semantic router embeds the same 1,500 example requests every time it is built (about 12 s
with MiniLM on a CPU); a benchmark embeds the same passages on every run. Both wrap their
embedder in `DiskCachedEmbedder`, which keeps one file per embedder name, keyed by each text's
SHA-1, so the second process pays only for the model load.

The cache is a cache: a file that cannot be read, or holds anything but one finite vector per
key, is ignored (and rewritten), and so is a file that is a symlink, another user's, writable by
group or others, or compressed (nothing is ever unpickled); a directory that cannot be written is
skipped silently; and `RAG_RERANK_CACHE_DIR=off` turns it off. Two processes saving at once each
replace the file whole (last one wins, a torn file is impossible).

A name does not pin a model (a re-trained model folder, another server behind `openai:MODEL`,
other `dimensions`), so before the first cached vector is used, one cached text is embedded again
and compared: a file written by another model is dropped, never mixed with this one's vectors.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from . import Embedder

# Two embeddings of one text by one model differ by float noise (batching, GPU kernels, an API's
# nondeterminism: cosine above 0.999); another model's vector is far away (unit vectors: distance
# about 1 or more).
SAME_MODEL_DISTANCE = 0.05


def _trusted(st: os.stat_result) -> bool:
    """Whether a cache file may be read: a regular file that only this user could have written.
    A file of another user, or one that group or others may write (a shared or mis-set
    RAG_RERANK_CACHE_DIR), could hold vectors planted to steer rankings; it is ignored, never
    trusted for the texts its keys name."""
    if not stat.S_ISREG(st.st_mode):
        return False
    getuid = getattr(os, "getuid", None)  # POSIX; Windows has no owner bits to check here
    return getuid is None or (st.st_uid == getuid() and not st.st_mode & 0o022)


def _stored_only(fh: Any, size: int) -> bool:
    """Whether the zip holds only uncompressed members that fit in the file: `save` writes
    `np.savez` (stored, not deflated), so a compressed member can only be a crafted file, and a
    few kilobytes of deflate can expand to gigabytes in memory."""
    try:
        with zipfile.ZipFile(fh) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return False
    stored = all(i.compress_type == zipfile.ZIP_STORED for i in infos)
    return stored and sum(i.file_size for i in infos) <= size


def _read(file: Path) -> dict[str, np.ndarray]:
    """The file's vectors by key, or {} for a file that is absent, not exactly what `save` writes,
    or not to be trusted (a symlink, another user's, writable by others, compressed)."""
    try:
        # O_NOFOLLOW: a symlink planted where the cache file goes is not followed; the checks are
        # made on the open descriptor, so the file cannot be swapped between check and read.
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0))
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not _trusted(st) or not _stored_only(fh, st.st_size):
                return {}
            fh.seek(0)
            with np.load(fh, allow_pickle=False) as z:  # never unpickle: the file is data only
                keys, vecs = z["keys"], z["vecs"]
    except Exception:  # truncated, not a zip (BadZipFile), bad CRC, a plain .npy, object arrays: start again
        return {}
    ok = (
        keys.ndim == 1
        and keys.dtype.kind == "U"
        and vecs.ndim == 2
        and vecs.dtype.kind == "f"
        and len(keys) == len(vecs)
        and bool(np.isfinite(vecs).all())
    )
    return dict(zip(keys.tolist(), vecs.astype(np.float32), strict=True)) if ok else {}


class DiskCachedEmbedder:
    """`inner` with a per-name vector file under `directory`; call `save()` after embedding."""

    def __init__(self, inner: Embedder, directory: Path) -> None:
        self._inner = inner
        self.name = inner.name
        self.duplicate_threshold = float(getattr(inner, "duplicate_threshold", 0.95))
        self._file = Path(directory) / (hashlib.sha1(self.name.encode()).hexdigest()[:12] + ".npz")
        self._cache = _read(self._file)
        self._dirty = False
        # Keys read from the file and not yet checked against `inner` (see the module docstring).
        self._unchecked = set(self._cache)

    def embed(self, texts: list[str]) -> np.ndarray:
        keys = [hashlib.sha1(t.encode("utf-8", "surrogatepass")).hexdigest() for t in texts]
        if self._unchecked:
            self._verify(keys, texts)
        missing = {k: t for k, t in zip(keys, texts, strict=True) if k not in self._cache}
        if missing:
            vecs = np.asarray(self._inner.embed(list(missing.values())), dtype=np.float32)
            if self._cache and vecs.shape[1:] != next(iter(self._cache.values())).shape:
                # another model's dimension: none of the file's vectors fits
                self._cache, self._unchecked = {}, set()
            for k, v in zip(missing, vecs, strict=True):
                self._cache[k] = v
            self._dirty = True
        if not keys:
            return self._inner.embed([])
        return np.stack([self._cache[k] for k in keys])

    def _verify(self, keys: list[str], texts: list[str]) -> None:
        """Embed one of `texts` that the file holds again; drop all of the file's vectors if the
        answer differs. Nothing to check until a call asks for a text the file holds."""
        for key, text in zip(keys, texts, strict=True):
            if key not in self._unchecked:
                continue
            cached = self._cache[key]
            fresh = np.asarray(self._inner.embed([text]), dtype=np.float32)
            same = fresh.shape == (1, cached.shape[0]) and float(np.linalg.norm(fresh[0] - cached)) <= (
                SAME_MODEL_DISTANCE * max(float(np.linalg.norm(cached)), 1e-12)
            )
            if not same:
                for stale in self._unchecked:
                    del self._cache[stale]
                self._dirty = True
            self._unchecked = set()
            return

    def save(self) -> None:
        """Write the file if anything was added (atomically: a crash leaves the old file)."""
        if not self._dirty or not self._cache:
            return
        tmp: str | None = None
        try:
            # Private to this user (vectors and text hashes say what was embedded): 0700 folder,
            # and mkstemp's 0600 file, renamed over the old one atomically.
            self._file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
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
