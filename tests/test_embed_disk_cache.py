"""The on-disk vector cache: a second process embeds nothing it has seen, and a broken cache
never breaks the caller."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rag_rerank.embed import get_embedder
from rag_rerank.embed.disk_cache import DiskCachedEmbedder, default_cache_dir


class Counting:
    """The real lexical embedder, counting the texts it is asked for."""

    def __init__(self) -> None:
        self.inner = get_embedder("lexical")
        self.name = self.inner.name
        self.duplicate_threshold = self.inner.duplicate_threshold
        self.seen: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.seen += texts
        return self.inner.embed(texts)


def test_a_second_instance_reads_the_vectors_back(tmp_path: Path) -> None:
    texts = ["IVF partitions vectors", "HNSW builds a graph", "IVF partitions vectors"]
    first = Counting()
    a = DiskCachedEmbedder(first, tmp_path)
    va = a.embed(texts)
    assert first.seen == texts[:2]  # each distinct text once
    a.save()
    second = Counting()
    b = DiskCachedEmbedder(second, tmp_path)
    vb = b.embed(texts)
    assert second.seen == []
    assert np.array_equal(va, vb) and np.array_equal(va, first.inner.embed(texts))
    b.embed(["a new text"])
    assert second.seen == ["a new text"]


def test_a_corrupt_cache_file_is_ignored_and_rewritten(tmp_path: Path) -> None:
    emb = Counting()
    cached = DiskCachedEmbedder(emb, tmp_path)
    cached.embed(["x y"])
    cached.save()
    (file,) = tmp_path.glob("*.npz")
    file.write_bytes(b"not a zip file")
    again = DiskCachedEmbedder(Counting(), tmp_path)
    assert again.embed(["x y"]).shape == (1, emb.inner.embed(["x"]).shape[1])
    again.save()
    assert DiskCachedEmbedder(Counting(), tmp_path).embed(["x y"]).shape[0] == 1


def test_an_unwritable_cache_folder_is_skipped(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder should be", encoding="utf-8")
    cached = DiskCachedEmbedder(Counting(), blocker / "vectors")
    assert cached.embed(["x"]).shape[0] == 1
    cached.save()  # no exception, nothing written
    assert list(tmp_path.iterdir()) == [blocker]


def test_the_cache_folder_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RAG_RERANK_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    for off in ("off", "", "0"):
        monkeypatch.setenv("RAG_RERANK_CACHE_DIR", off)
        assert default_cache_dir() is None
    monkeypatch.delenv("RAG_RERANK_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "rag-rerank"
