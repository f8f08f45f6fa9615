"""Each text embedded once per call: a small, bounded, thread-safe memo around a model embedder.

Why: with a model-backed profile (sentence-transformers, an OpenAI-compatible endpoint), the local
backend embeds the query and the chunks to score them, and the post-pass embeds the same chunks
again for MMR and near-duplicates. The pipeline hands both the same `Memo`, so the second request
is a dictionary lookup. It is bounded (least recently used texts go first) because `batch` and
the Ray engine share one embedder across millions of requests; it is locked because concurrent
requests embed in worker threads. The model is called outside the lock, once per batch of texts
it has not seen.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

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
