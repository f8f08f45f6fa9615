"""Each text embedded once: a small, bounded, thread-safe memo around a model embedder (`Memo`),
the rows the numpy embedders computed for texts they saw before (`TextRows`, which also takes rows
made from their non-zero entries, `UnitEntries`), and a bounded per-word memo read in C (`RunMemo`).

Why: with a model-backed profile (sentence-transformers, an OpenAI-compatible endpoint), the local
backend embeds the query and the chunks to score them, and the post-pass embeds the same chunks
again for MMR and near-duplicates. The pipeline hands both the same `Memo`, so the second request
is a dictionary lookup. It is bounded (least recently used texts go first) because `batch` and
the Ray engine share one embedder across millions of requests; it is locked because concurrent
requests embed in worker threads. The model is called outside the lock, once per batch of texts
it has not seen.
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import numpy as np


class Memo:
    """An embedder that remembers the last `max_texts` texts' rows; name and threshold are the inner's."""

    def __init__(self, inner: Any, max_texts: int = 4096) -> None:
        self.inner = inner
        self.name = str(getattr(inner, "name", type(inner).__name__))
        self.duplicate_threshold = inner.duplicate_threshold
        self.max_texts = max_texts
        self._rows: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.asarray(self.inner.embed([]))
        distinct = list(dict.fromkeys(texts))
        with self._lock:
            rows = {t: self._rows[t] for t in distinct if t in self._rows}
            for t in rows:
                self._rows.move_to_end(t)
        missing = [t for t in distinct if t not in rows]
        if missing:
            fresh = np.asarray(self.inner.embed(missing))
            with self._lock:
                for text, row in zip(missing, fresh, strict=True):
                    rows[text] = row
                    self._rows[text] = row
                    self._rows.move_to_end(text)
                while len(self._rows) > self.max_texts:
                    self._rows.popitem(last=False)
        return np.stack([rows[t] for t in texts])

    def __getstate__(self) -> dict[str, Any]:
        # Pickled (a worker process) or deep-copied (a framework copying its components): the
        # inner embedder and the bound, with a lock of its own and nothing remembered yet.
        return {"inner": self.inner, "max_texts": self.max_texts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["inner"], state["max_texts"])  # type: ignore[misc]

    def __getattr__(self, item: str) -> Any:  # model, base_url, close, ... of the inner embedder
        if item == "inner":  # not set yet (unpickling): looking it up here would recurse forever
            raise AttributeError(item)
        return getattr(self.inner, item)


class MemoInfo(NamedTuple):
    """How full a `RunMemo` is (the fields of `functools.lru_cache`'s `cache_info()` it has)."""

    maxsize: int
    currsize: int


class RunMemo(dict[str, Any]):
    """`rule` of each key met, filled on first sight and emptied when it holds `maxsize` keys (a
    key longer than `longest` is never kept: computed each time): a per-word memo read with
    `map(memo.__getitem__, words)`, a dictionary look-up done in C.

    Why not `lru_cache`: most of a text's words (or runs) were met before, and its call costs more
    than the look-up (an argument tuple, the recency list: about 370 instructions a word). Emptying
    when full keeps it bounded; the words that recur come back at once."""

    def __init__(self, rule: Callable[[str], Any], maxsize: int, longest: int | None = None) -> None:
        super().__init__()
        self.rule = rule
        self.maxsize = maxsize
        self.longest = longest

    def __missing__(self, key: str) -> Any:
        if self.longest is not None and len(key) > self.longest:
            return self.rule(key)
        if len(self) >= self.maxsize:
            self.clear()
        value = self[key] = self.rule(key)
        return value

    def __call__(self, key: str) -> Any:
        return self[key]

    def cache_info(self) -> MemoInfo:
        return MemoInfo(self.maxsize, len(self))


@dataclass(frozen=True)
class UnitEntries:
    """Rows an embedder made from their non-zero entries, for `TextRows.rows`: `matrix` the (n, dim)
    float64 rows, `stored` each row's non-zero entries as `TextRows(sparse=True)` keeps them. Why:
    the store need not scan the dense rows for entries the embedder has just placed."""

    matrix: np.ndarray
    stored: list[tuple[bytes, bytes]]


# The bytes of one stored entry's column (int32), and of its value (float32).
_ENTRY_BYTES = np.dtype(np.int32).itemsize


def row_entries(flat: np.ndarray, values: np.ndarray, n: int, dim: int) -> list[tuple[bytes, bytes]]:
    """Each of `n` rows' entries as (its int32 columns, its float32 values), each as native bytes,
    from the entries of an (n, dim) block at ascending flat positions `flat` (non-zero values: what
    `np.flatnonzero` finds); a column is `flat & (dim - 1)` for a power-of-two width (the lexical
    embedder's: `flat % dim` for a non-negative one, without a division per entry).

    Why bytes: a row's stretch sliced off a bytes object is a copy of its own (a stored row does not
    keep the whole block alive) made without a numpy view and copy per row, and `TextRows._placed`
    joins the rows it places with one `bytes.join` where arrays took a concatenation each."""
    columns = (flat & (dim - 1) if dim & (dim - 1) == 0 else flat % dim).astype(np.int32).tobytes()
    values = values.astype(np.float32, copy=False).tobytes()
    # each row's end, in bytes (`flat` ascends)
    ends = (np.searchsorted(flat, np.arange(1, n + 1) * dim) * _ENTRY_BYTES).tolist()
    return [(columns[a:b], values[a:b]) for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def dense_entries(block: np.ndarray) -> list[tuple[bytes, bytes]]:
    """`row_entries` of a dense (n, dim) block: its non-zero entries (what `np.flatnonzero` keeps:
    NaN too, -0.0 not), found in one pass over the whole block, not one pass per row."""
    n, dim = block.shape
    flat = np.flatnonzero(block)
    return row_entries(flat, block.reshape(-1)[flat], n, dim)


_is_none = partial(operator.is_, None)  # `row is None`, for `map` (a row may be an array)


class TextRows:
    """The rows a numpy embedder computed for the texts it saw last: at most `max_texts`, least
    recently used first out, thread-safe; `sparse` keeps only a row's non-zero entries
    (`row_entries`: the lexical embedder's 4096-wide rows hold a few hundred).

    Why: the same chunks come back (a corpus's popular passages, a batch's repeated queries, a
    window and the final pass over its survivors); their vectors depend on their own text only,
    so a text seen before costs a lookup, and the result is the same bits as computing it again.
    """

    def __init__(self, max_texts: int, *, sparse: bool = False) -> None:
        self.max_texts = max_texts
        self.sparse = sparse
        self._rows: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()

    def rows(self, keys: list[Any], texts: list[str], compute: Any, dim: int,
             dtype: Any = np.float32) -> np.ndarray:
        """float32 rows for `texts` (cached under `keys`, one per text), `compute(missing texts)`
        making those not cached in one call; with `dtype=np.float64`, the same values in float64
        (what a similarity product reads: no float32 copy made to be converted). `compute` may hand
        back `UnitEntries` (float64 rows with their non-zero entries) instead of a float32 matrix."""
        found, missing = self._lookup(keys)
        if not missing and not self.sparse:  # every row cached, in order: one conversion
            return np.array([row for _, row in found], dtype=dtype).reshape(len(texts), dim)
        if not missing:
            return self._placed(found, len(texts), dim, dtype)
        firsts = [at[0] for at in missing.values()]
        made = compute([texts[k] for k in firsts])
        entries = made.stored if isinstance(made, UnitEntries) and self.sparse else None
        fresh = made.matrix if isinstance(made, UnitEntries) else np.asarray(made, dtype=np.float32)
        if not found and fresh.shape == (len(texts), dim):  # each text new and once (first sight)
            out = fresh.astype(dtype, copy=False)
        else:
            out = self._placed(found, len(texts), dim, dtype)
            places = [k for at in missing.values() for k in at]  # each key's places, in key order
            out[places] = fresh[np.repeat(np.arange(len(firsts)), [len(at) for at in missing.values()])]
        stored = self._stored(fresh.astype(np.float32, copy=False)) if entries is None else entries
        with self._lock:
            for key, row in zip(missing, stored, strict=True):
                self._rows[key] = row
                self._rows.move_to_end(key)
            while len(self._rows) > self.max_texts:
                self._rows.popitem(last=False)
        return out

    def _stored(self, fresh: np.ndarray) -> list[Any]:
        """What is kept of each row of `fresh`: a copy of its own (not a view holding the whole
        block), or, `sparse`, its non-zero entries as (int32 columns, float32 values) bytes (`row_entries`
        of the block's non-zero entries, found in one pass over it, not one pass per row)."""
        if not self.sparse:
            return [row.copy() for row in fresh]
        return dense_entries(fresh)

    def _lookup(self, keys: list[Any]) -> tuple[list[tuple[int, Any]], dict[Any, list[int]]]:
        """(place and stored row of each key stored, each key not stored -> its places); the
        stored ones become the most recently used."""
        missing: dict[Any, list[int]] = {}
        with self._lock:
            rows = list(map(self._rows.get, keys))
            if not any(map(_is_none, rows)):  # every key stored (a list seen before)
                move = self._rows.move_to_end
                for key in keys:
                    move(key)
                return list(enumerate(rows)), missing
            found: list[tuple[int, Any]] = []
            for k, (key, row) in enumerate(zip(keys, rows, strict=True)):
                if row is None:
                    missing.setdefault(key, []).append(k)
                else:
                    self._rows.move_to_end(key)
                    found.append((k, row))
        return found, missing

    def _placed(self, found: list[tuple[int, Any]], n: int, dim: int, dtype: Any) -> np.ndarray:
        """An (n, dim) matrix of zeros with the cached rows `found` in their places, placed in one
        assignment (a sparse row's entries through the matrix's flat view)."""
        out = np.zeros((n, dim), dtype=dtype)
        if not found:
            return out
        at, rows = zip(*found, strict=True)
        if not self.sparse:
            out[list(at)] = np.array(rows, dtype=dtype)
            return out
        idx, vals = zip(*rows, strict=True)
        per_row = np.fromiter(map(len, idx), dtype=np.int64, count=len(idx)) // _ENTRY_BYTES
        starts = np.repeat(np.array(at, dtype=np.int64) * dim, per_row)
        flat = np.frombuffer(b"".join(idx), dtype=np.int32).astype(np.int64) + starts  # one conversion
        # the values converted first: a scatter that converts as it goes is about twice as slow
        out.reshape(-1)[flat] = np.frombuffer(b"".join(vals), dtype=np.float32).astype(dtype, copy=False)
        return out
