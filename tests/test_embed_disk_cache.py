"""The on-disk vector cache: a second process embeds only one text it has seen (to check the
file was written by the same model), and a broken or stale cache never breaks the caller."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_rerank.embed import get_embedder, l2_normalise
from rag_rerank.embed.disk_cache import DiskCachedEmbedder
from rag_rerank.paths import default_cache_dir


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
    assert second.seen == texts[:1]  # the one check that the file is this model's
    assert np.array_equal(va, vb) and np.array_equal(va, first.inner.embed(texts))
    b.embed(["a new text"])
    assert second.seen == [texts[0], "a new text"]


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


def _saved(tmp_path: Path, texts: list[str]) -> Path:
    cached = DiskCachedEmbedder(Counting(), tmp_path)
    cached.embed(texts)
    cached.save()
    (file,) = tmp_path.glob("*.npz")
    return file


def _rewrite(file: Path, **arrays: np.ndarray) -> None:
    with file.open("wb") as fh:
        np.savez(fh, **arrays)


def _flip_middle_byte(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


TEXTS = ["IVF partitions vectors", "HNSW builds a graph"]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda f: f.write_bytes(f.read_bytes()[:200]), id="truncated zip"),
        pytest.param(lambda f: f.write_bytes(f.read_bytes()[: f.stat().st_size // 2]), id="half a zip"),
        pytest.param(lambda f: _flip_middle_byte(f), id="flipped byte (bad CRC)"),
        pytest.param(lambda f: np.save(f.open("wb"), np.zeros(3)), id="a .npy, not an .npz"),
        pytest.param(
            lambda f: _rewrite(f, keys=np.array([hashlib.sha1(t.encode()).hexdigest() for t in TEXTS]),
                               vecs=np.array([1.0, 2.0])),
            id="one number per key",
        ),
        pytest.param(
            lambda f: _rewrite(f, keys=np.array([hashlib.sha1(t.encode()).hexdigest() for t in TEXTS]),
                               vecs=np.array([["a", "b"], ["c", "d"]])),
            id="text vectors",
        ),
        pytest.param(
            lambda f: _rewrite(f, keys=np.array([hashlib.sha1(t.encode()).hexdigest() for t in TEXTS]),
                               vecs=np.full((2, 8), np.nan)),
            id="NaN vectors",
        ),
        pytest.param(lambda f: _rewrite(f, keys=np.array([1, 2]), vecs=np.zeros((2, 3))), id="number keys"),
    ],
)
def test_a_damaged_cache_file_gives_the_embedders_own_vectors(tmp_path: Path, damage: Any) -> None:
    """Any file that is not exactly what `save` writes is ignored, then rewritten; the README
    promises "an unreadable cache is rebuilt" (a truncated zip used to raise BadZipFile)."""
    damage(_saved(tmp_path, TEXTS))
    emb = Counting()
    cached = DiskCachedEmbedder(emb, tmp_path)
    assert np.array_equal(cached.embed(TEXTS), emb.inner.embed(TEXTS))
    cached.embed(["one more text"])
    cached.save()
    again = Counting()
    assert np.array_equal(DiskCachedEmbedder(again, tmp_path).embed(TEXTS), again.inner.embed(TEXTS))


class Other(Counting):
    """Another model under the same name (a re-trained folder, another server behind
    `openai:MODEL`): the lexical vectors reversed, or cut to `dim` dimensions."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def embed(self, texts: list[str]) -> np.ndarray:
        vecs = super().embed(texts)
        return -vecs if self.dim is None else l2_normalise(vecs[:, : self.dim])


@pytest.mark.parametrize("dim", [None, 16])
def test_a_file_written_by_another_model_of_the_same_name_is_not_used(
    tmp_path: Path, dim: int | None
) -> None:
    _saved(tmp_path, TEXTS)
    other = Other(dim)
    cached = DiskCachedEmbedder(other, tmp_path)
    assert cached.name == Counting().name
    assert np.array_equal(cached.embed(TEXTS), other.embed(TEXTS))
    # Texts the file does not hold first, then ones it does: the stale vectors never come back.
    assert np.array_equal(cached.embed(["new", *TEXTS]), other.embed(["new", *TEXTS]))
    cached.save()
    assert np.array_equal(DiskCachedEmbedder(Other(dim), tmp_path).embed(TEXTS), other.embed(TEXTS))


def test_a_router_over_a_stale_cache_routes_as_without_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The router used to crash (a matmul of 4096 against 16 dimensions) or score with the
    old model's example vectors when a same-named embedder changed."""
    from rag_rerank.router import Router

    def named(emb: Counting) -> Counting:
        emb.name = "semantic-test"  # not "lexical": the router keeps a semantic embedder's vectors
        return emb

    monkeypatch.setenv("RAG_RERANK_CACHE_DIR", str(tmp_path))
    first = Router(embedder=named(Counting()))  # writes the examples' vectors
    assert first.semantic and list(tmp_path.glob("vectors/*.npz"))
    utterance = "rerank these passages for my question"
    fresh = Router(embedder=named(Other(16))).decide(utterance)
    monkeypatch.setenv("RAG_RERANK_CACHE_DIR", "off")
    uncached = Router(embedder=named(Other(16))).decide(utterance)
    assert (fresh.skill, fresh.score, fresh.reason) == (uncached.skill, uncached.score, uncached.reason)


def test_no_home_folder_means_no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("RAG_RERANK_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert default_cache_dir() is None


def test_a_tilde_in_the_cache_variable_is_the_home_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Was a folder literally named "~" under the current directory (no shell expands it in an
    MCP host's env block)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RAG_RERANK_CACHE_DIR", "~/rr-cache")
    assert default_cache_dir() == tmp_path / "rr-cache"


# --- a cache file is data another local user must not be able to plant ----------------------------------

def _poisoned(file: Path, save: Any = np.savez) -> np.ndarray:
    """Rewrite `file` so that it passes the same-model check (the first text's vector is right)
    while the second text's vector is planted; returns the planted vector."""
    emb = Counting().inner
    good = emb.embed(TEXTS)
    planted = -good[1]
    keys = np.array([hashlib.sha1(t.encode()).hexdigest() for t in TEXTS])
    with file.open("wb") as fh:
        save(fh, keys=keys, vecs=np.stack([good[0], planted]).astype(np.float32))
    return planted


def _second_vector(directory: Path) -> np.ndarray:
    return DiskCachedEmbedder(Counting(), directory).embed(TEXTS)[1]


def test_the_poisoning_recipe_works_on_a_file_this_user_wrote(tmp_path: Path) -> None:
    """The control for the tests below: a private file of ours is trusted, planted vector and all."""
    planted = _poisoned(_saved(tmp_path, TEXTS))
    assert np.array_equal(_second_vector(tmp_path), planted)


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permission bits")
def test_a_file_others_may_write_is_not_trusted(tmp_path: Path) -> None:
    file = _saved(tmp_path, TEXTS)
    planted = _poisoned(file)
    file.chmod(0o666)
    assert not np.array_equal(_second_vector(tmp_path), planted)


def test_a_symlink_in_place_of_the_cache_file_is_not_followed(tmp_path: Path) -> None:
    file = _saved(tmp_path / "cache", TEXTS)
    elsewhere = tmp_path / "planted.npz"
    planted = _poisoned(elsewhere)
    elsewhere.chmod(0o600)
    file.unlink()
    file.symlink_to(elsewhere)
    assert not np.array_equal(_second_vector(tmp_path / "cache"), planted)


def test_a_compressed_cache_file_is_not_read(tmp_path: Path) -> None:
    """`save` never deflates; a deflated member is a crafted file (and a zip bomb's shape)."""
    planted = _poisoned(_saved(tmp_path, TEXTS), save=np.savez_compressed)
    assert not np.array_equal(_second_vector(tmp_path), planted)


class _Marker:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (Path.touch, (self.path,))


def test_a_pickled_array_in_the_cache_is_never_unpickled(tmp_path: Path) -> None:
    file = _saved(tmp_path, TEXTS)
    marker = tmp_path / "unpickled"
    with file.open("wb") as fh:
        np.savez(fh, keys=np.array([_Marker(marker)], dtype=object), vecs=np.zeros((1, 4)))
    assert _second_vector(tmp_path).shape[0] > 0
    assert not marker.exists()


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permission bits")
def test_the_cache_folder_and_file_are_private(tmp_path: Path) -> None:
    file = _saved(tmp_path / "new" / "vectors", TEXTS)
    assert (tmp_path / "new" / "vectors").stat().st_mode & 0o777 == 0o700
    assert file.stat().st_mode & 0o777 == 0o600
