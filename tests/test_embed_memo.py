"""embed/memo.py: each text embedded once per call, bounded, and shared by backend and post-pass."""

from __future__ import annotations

import threading

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_rerank import rerank
from rag_rerank.embed.lexical import LexicalEmbedder
from rag_rerank.embed.memo import Memo, RunMemo, TextRows, dense_entries
from tests.support.fake_llm import FakeLLM


class _Counting:
    """A real embedder (the lexical one) that counts the texts it is asked for."""

    name = "counting"
    duplicate_threshold = 0.5

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._inner = LexicalEmbedder()

    def embed(self, texts: list[str]) -> np.ndarray:
        self.seen.extend(texts)
        return self._inner.embed(texts)


def test_a_text_is_embedded_once_and_rows_come_back_in_order() -> None:
    inner = _Counting()
    memo = Memo(inner)
    first = memo.embed(["a b", "c d", "a b"])
    second = memo.embed(["c d", "e f"])
    assert inner.seen == ["a b", "c d", "e f"]
    assert np.array_equal(first[0], first[2]) and np.array_equal(first[1], second[0])
    assert np.array_equal(second, LexicalEmbedder().embed(["c d", "e f"]))
    assert memo.name == "counting" and memo.duplicate_threshold == 0.5
    assert memo.embed([]).shape[0] == 0


def test_the_memo_is_bounded_least_recently_used_first() -> None:
    inner = _Counting()
    memo = Memo(inner, max_texts=2)
    memo.embed(["a"])
    memo.embed(["b"])
    memo.embed(["a"])  # a is now the most recent
    memo.embed(["c"])  # evicts b
    memo.embed(["a", "b"])
    assert inner.seen == ["a", "b", "c", "b"]


def test_concurrent_requests_get_their_own_rows() -> None:
    memo = Memo(_Counting(), max_texts=8)
    texts = [f"text number {i}" for i in range(40)]
    out: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        out[i] = memo.embed(texts[i : i + 5])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(0, 35, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, rows in out.items():
        assert np.array_equal(rows, LexicalEmbedder().embed(texts[i : i + 5]))


def test_rerank_sends_each_chunk_to_an_embeddings_server_once(monkeypatch) -> None:
    """Backend scoring and the post-pass share the memo: the server sees each text once."""
    chunks = [{"id": f"c{i}", "text": f"IVF partitions vectors into cells, variant {i}."} for i in range(6)]
    with FakeLLM() as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.openai_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        result = rerank("How does IVF work?", chunks, top_k=3, embedder="openai:fake-embed")
        sent = [t for r in srv.requests if r.api == "embeddings" for t in r.body["input"]]
    assert len(result.ranked) + len(result.dropped) == 6
    assert sorted(sent) == sorted(["How does IVF work?", *(c["text"] for c in chunks)])


def test_a_memo_pickles_and_deep_copies_with_a_lock_of_its_own() -> None:
    """Its lock made a Memo (what `embedder="sentence-transformers"` is wrapped in) impossible to
    pickle or deep-copy, and unpickling one recursed forever in `__getattr__`."""
    import copy
    import pickle

    memo = Memo(LexicalEmbedder(), max_texts=7)
    rows = memo.embed(["IVF cells", "HNSW graph"])
    for copied in (pickle.loads(pickle.dumps(memo)), copy.deepcopy(memo)):
        assert (copied.name, copied.max_texts, copied.duplicate_threshold) == ("lexical", 7,
                                                                               memo.duplicate_threshold)
        assert copied._lock is not memo._lock
        assert np.allclose(copied.embed(["IVF cells", "HNSW graph"]), rows)


@settings(max_examples=80, derandomize=True, deadline=None)
@given(st.lists(st.lists(st.sampled_from("abcdefg"), max_size=6), min_size=1, max_size=5), st.booleans(),
       st.sampled_from([np.float32, np.float64]), st.sampled_from([16, 12]))
def test_text_rows_are_the_computed_rows_in_their_places(calls: list[list[str]], sparse: bool,
                                                         dtype: type, dim: int) -> None:
    """`TextRows.rows` returns, for every call, each text's computed row in its place (a text twice
    in a call, texts stored and new mixed, a whole call new), and stores a sparse row as exactly
    its non-zero entries: what the rows placed one by one, and `np.flatnonzero` per row, gave (a
    power-of-two width and another: the column found by a mask or by a division)."""
    def row_of(text: str) -> np.ndarray:  # a fixed row per text, with zeros and a negative zero
        values = np.random.default_rng(ord(text)).standard_normal(dim).astype(np.float32)
        values[::3] = 0.0
        values[1] = -0.0
        return values

    store = TextRows(4, sparse=sparse)
    for texts in calls:
        out = store.rows(list(texts), list(texts), lambda fresh: np.stack([row_of(t) for t in fresh]), dim,
                         dtype=dtype)
        expected = np.zeros((len(texts), dim), dtype=dtype)
        for k, t in enumerate(texts):
            expected[k] = row_of(t)
        if sparse:  # a stored sparse row has no negative zero (`np.flatnonzero` drops it): + 0.0 too
            out, expected = out + 0.0, expected + 0.0
        assert out.dtype == dtype and out.tobytes() == expected.tobytes()
        for t in texts:
            found, _ = store._lookup([t])
            if not found:  # (the store holds 4)
                continue
            ((_, stored),) = found
            if sparse:
                nz = np.flatnonzero(row_of(t))
                idx, vals = stored
                assert np.frombuffer(idx, dtype=np.int32).tolist() == nz.tolist()
                assert vals == row_of(t)[nz].tobytes()
            else:
                assert stored.tobytes() == row_of(t).tobytes()


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.lists(st.text(max_size=6), max_size=40), st.integers(1, 5))
def test_a_run_memo_is_its_rule_and_stays_bounded(keys: list[str], maxsize: int) -> None:
    """`RunMemo` gives its rule's value for every key, looked up through `map` or called, across
    its emptying, and never holds more than `maxsize` keys."""
    calls: list[str] = []

    def rule(key: str) -> bytes:
        calls.append(key)
        return key.encode("utf-8")[::-1]

    memo = RunMemo(rule, maxsize)
    expected = [k.encode("utf-8")[::-1] for k in keys]
    assert list(map(memo.__getitem__, keys)) == expected
    assert [memo(k) for k in keys] == expected
    assert memo.cache_info().maxsize == maxsize and memo.cache_info().currsize == len(memo) <= maxsize
    if len(set(keys)) <= maxsize:  # nothing forgotten: the rule ran once per distinct key
        assert sorted(calls) == sorted(set(keys))


def test_a_run_memo_keeps_no_key_longer_than_its_longest() -> None:
    memo = RunMemo(str.upper, 8, longest=3)
    keys = ["abc", "abcd", "abc", "abcdefgh"]
    assert list(map(memo.__getitem__, keys)) == [k.upper() for k in keys]
    assert dict(memo) == {"abc": "ABC"}


@settings(max_examples=80, derandomize=True, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.0, -0.0, 1.5, -2.0, float("nan"), float("inf")]), min_size=8,
                         max_size=8), min_size=1, max_size=4), st.sampled_from([np.float32, np.float64]))
def test_dense_entries_are_each_rows_non_zero_entries(rows: list[list[float]], dtype: type) -> None:
    """`dense_entries` (the store's and the lexical embedder's fallback's one helper) keeps of each
    row what `np.flatnonzero` of that row keeps (NaN and infinity too, a negative zero not), as
    int32 columns and float32 values."""
    block = np.array(rows, dtype=dtype)
    entries = dense_entries(block)
    assert len(entries) == len(rows)
    for row, (idx, vals) in zip(block, entries, strict=True):
        nz = np.flatnonzero(row)
        assert np.frombuffer(idx, dtype=np.int32).tolist() == nz.tolist()
        assert vals == row[nz].astype(np.float32).tobytes()
