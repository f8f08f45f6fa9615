"""The response cache (`rag_rerank/cache.py`): an identical call is answered from disk with no
request, on every surface; anything that changes the answer misses; only guard-valid answers are
kept; threads and processes share one file without losing or corrupting an entry; replay pins a
pipeline. Every call goes over HTTP to a real test server (tests/support/fake_llm.py), which
counts the requests it gets."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import pickle
import sqlite3
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from rag_rerank import (
    BackendError,
    CacheMissError,
    ConfigError,
    InputError,
    Reranker,
    ResponseCache,
    RetryPolicy,
    arerank,
    rerank,
)
from rag_rerank.cache import CACHE_ENV, FILE_NAME, Entry, resolve_cache
from rag_rerank.cli import main
from tests.support.corpus import graded_chunks
from tests.support.fake_llm import FakeLLM, Reply, auto_ranker

QUERY = "What is the capital city of France?"
KEY = "sk-cache-SECRET-0123456789abcdef"
CHUNKS = [
    {"id": "paris", "text": "Paris is the capital city of France and its largest city."},
    {"id": "eiffel", "text": "The Eiffel Tower in Paris was finished in 1889 for a world fair."},
    {"id": "berlin", "text": "Berlin has been the seat of the German government since 1999."},
    {"id": "louvre", "text": "The capital of France, Paris, hosts the Louvre museum."},
    {"id": "leaves", "text": "Photosynthesis turns sunlight into chemical energy in green leaves."},
]


def _opts(srv: FakeLLM, **extra: Any) -> dict[str, Any]:
    return {"backend": "openai", "model": "fake-gpt", "base_url": srv.openai_url, "api_key": KEY, **extra}


def _llm_calls(srv: FakeLLM) -> int:
    return sum(1 for r in srv.requests if r.api == "openai")


@pytest.fixture
def srv() -> Any:
    with FakeLLM(handler=auto_ranker()) as server:
        yield server


# --- the second identical call --------------------------------------------------------------


def test_the_second_identical_call_makes_no_request_and_returns_the_same_result(srv: FakeLLM,
                                                                                tmp_path: Path) -> None:
    first = rerank(QUERY, CHUNKS, 3, cache=tmp_path, **_opts(srv))
    assert _llm_calls(srv) == 1
    assert first.meta.cache == {"hits": 0, "misses": 1, "saved_tokens": 0}
    second = rerank(QUERY, CHUNKS, 3, cache=tmp_path, **_opts(srv))
    assert _llm_calls(srv) == 1  # no request
    assert second.to_json() == first.to_json()  # byte for byte
    assert second.scores == first.scores
    assert second.meta.cache == {"hits": 1, "misses": 0, "saved_tokens": 120}
    assert second.meta.attempts == 0  # nothing was sent
    assert second.meta.usage == first.meta.usage  # what the call would have cost
    assert second.meta.model == first.meta.model


def test_async_and_sync_share_the_cache(srv: FakeLLM, tmp_path: Path) -> None:
    first = asyncio.run(arerank(QUERY, CHUNKS, 3, cache=tmp_path, **_opts(srv)))
    second = rerank(QUERY, CHUNKS, 3, cache=tmp_path, **_opts(srv))
    third = asyncio.run(arerank(QUERY, CHUNKS, 3, cache=tmp_path, **_opts(srv)))
    assert _llm_calls(srv) == 1
    assert first.to_json() == second.to_json() == third.to_json()
    assert third.meta.cache["hits"] == 1


def test_each_window_and_the_final_pass_are_cached_apart(srv: FakeLLM, tmp_path: Path) -> None:
    chunks = graded_chunks(30)
    with Reranker(cache=tmp_path, **_opts(srv)) as reranker:
        first = reranker.rerank(QUERY, chunks, 5, window_size=10)
        made = _llm_calls(srv)
        assert made == first.meta.calls
        second = reranker.rerank(QUERY, chunks, 5, window_size=10)
        assert _llm_calls(srv) == made
        assert second.to_json() == first.to_json()
        assert second.meta.cache == {"hits": 4, "misses": 0, "saved_tokens": 480}
        assert [w["cached"] for w in second.meta.windows] == [True] * 4
        # An overlapping candidate list reuses the windows it shares: only the changed window and
        # the final pass are asked.
        changed = [*chunks[:20], *graded_chunks(10, tag="new")]
        third = reranker.rerank(QUERY, changed, 5, window_size=10)
        stages = [(w["stage"], w["cached"]) for w in third.meta.windows]
        assert stages[:2] == [("window", True), ("window", True)] and stages[2] == ("window", False)
        assert _llm_calls(srv) == made + third.meta.cache["misses"]


@pytest.mark.parametrize("change", ["chunk", "top_k", "model", "min_score", "temperature", "strict"])
def test_anything_that_changes_the_answer_makes_a_request(srv: FakeLLM, tmp_path: Path, change: str) -> None:
    chunks, top_k, opts = graded_chunks(20), 3, _opts(srv)
    rerank(QUERY, chunks, top_k, cache=tmp_path, **opts)
    if change == "chunk":
        chunks[1] = {**chunks[1], "text": chunks[1]["text"] + " It is 330 metres tall."}
    elif change == "top_k":
        top_k = 8  # the model is asked for 13 candidates instead of 8
    elif change == "model":
        opts["model"] = "fake-gpt-2"
    elif change == "min_score":
        opts["limits"] = {"min_score": 0.3}
    elif change == "temperature":
        opts["backend_options"] = {"temperature": 0.7}
    elif change == "strict":
        opts["strict"] = True
    again = rerank(QUERY, chunks, top_k, cache=tmp_path, **opts)
    assert _llm_calls(srv) == 2
    assert again.meta.cache == {"hits": 0, "misses": 1, "saved_tokens": 0}


def test_a_top_k_that_asks_the_model_the_same_reuses_its_answer(srv: FakeLLM, tmp_path: Path) -> None:
    """With five chunks, top_k 1 and 3 both ask the model for all five candidates (`candidate_k`):
    the same call, answered once; the post-pass still keeps as many as each asked for."""
    three = rerank(QUERY, CHUNKS, 3, cache=tmp_path, **_opts(srv))
    one = rerank(QUERY, CHUNKS, 1, cache=tmp_path, **_opts(srv))
    assert _llm_calls(srv) == 1 and one.meta.cache["hits"] == 1
    assert len(three.ranked) == 2 and [r.id for r in one.ranked] == [three.ranked[0].id]


def test_the_key_never_holds_credentials_and_the_file_is_private(srv: FakeLLM, tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    url = srv.openai_url.replace("http://", "http://user:pw-SECRET-42@")
    rerank(QUERY, CHUNKS, 3, cache=folder, **_opts(srv, base_url=url))
    data = b"".join(p.read_bytes() for p in folder.iterdir())
    assert KEY.encode() not in data and b"pw-SECRET-42" not in data
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / FILE_NAME).stat().st_mode) == 0o600


# --- what is stored -------------------------------------------------------------------------


def test_only_the_guard_valid_answer_is_stored(tmp_path: Path) -> None:
    valid = json.dumps({"ranked": [{"id": "paris", "score": 0.9, "reason": "says Paris is the capital city"}],
                        "dropped": [{"id": c["id"], "reason": "off_topic"} for c in CHUNKS[1:]]})
    script = [Reply.openai_text("not json at all"), Reply.openai_text(valid)]
    with FakeLLM(script) as server:
        first = rerank(QUERY, CHUNKS, 1, cache=tmp_path, **_opts(server))
        assert first.meta.attempts == 2 and _llm_calls(server) == 2
        with ResponseCache(tmp_path) as cache:
            assert cache.stats().entries == 1
        second = rerank(QUERY, CHUNKS, 1, cache=tmp_path, **_opts(server))
        assert _llm_calls(server) == 2
        assert second.to_json() == first.to_json()
        assert second.meta.usage == first.meta.usage  # both attempts' tokens: what the call cost


def test_a_failure_is_never_stored(tmp_path: Path) -> None:
    with FakeLLM([Reply.openai_error(401, "bad key")] * 2) as server:
        for _ in range(2):
            with pytest.raises(BackendError):
                rerank(QUERY, CHUNKS, 3, cache=tmp_path, **_opts(server))
        assert _llm_calls(server) == 2  # asked again: nothing was kept
    with ResponseCache(tmp_path) as cache:
        assert cache.stats().entries == 0


def test_a_fallback_answer_is_not_stored_as_the_backends(tmp_path: Path) -> None:
    with FakeLLM([Reply.openai_error(401, "bad key")]) as server:
        result = rerank(QUERY, CHUNKS, 3, cache=tmp_path, fallback="local", **_opts(server))
    assert result.meta.fallback == "local"
    assert result.meta.cache == {"hits": 0, "misses": 1, "saved_tokens": 0}
    with ResponseCache(tmp_path) as cache:
        assert cache.stats().entries == 0


def test_an_entry_the_guard_refuses_is_a_miss_and_is_replaced(srv: FakeLLM, tmp_path: Path) -> None:
    first = rerank(QUERY, CHUNKS, 3, cache=tmp_path, **_opts(srv))
    with sqlite3.connect(tmp_path / FILE_NAME) as conn:
        (value,) = conn.execute("SELECT value FROM responses").fetchone()
        tampered = json.loads(value)
        tampered["text"] = tampered["text"].replace('"paris"', '"planted-id"')
        conn.execute("UPDATE responses SET value = ?", (json.dumps(tampered),))
    second = rerank(QUERY, CHUNKS, 3, cache=tmp_path, **_opts(srv))
    assert _llm_calls(srv) == 2 and second.meta.cache["misses"] == 1
    assert second.to_json() == first.to_json()
    third = rerank(QUERY, CHUNKS, 3, cache=tmp_path, **_opts(srv))
    assert _llm_calls(srv) == 2 and third.meta.cache["hits"] == 1


def test_size_cap_evicts_the_least_recently_used(tmp_path: Path) -> None:
    entry = Entry(text="x" * 1000)
    with ResponseCache(tmp_path, max_bytes=5000) as cache:
        for i in range(4):
            cache.put(f"k{i}", entry)
        assert cache.get("k0") is not None  # k0 is now the most recently used
        cache.put("k4", entry)
        cache.put("k5", entry)
        kept = {k for k in (f"k{i}" for i in range(6)) if cache.contains(k)}
        assert "k0" in kept and "k5" in kept and "k1" not in kept
        assert cache.stats().bytes <= 5000


def test_time_to_live_expires_old_answers(tmp_path: Path) -> None:
    with ResponseCache(tmp_path, ttl_s=3600) as cache:
        cache.put("old", Entry(text="{}"))
        cache.put("new", Entry(text="{}"))
    with sqlite3.connect(tmp_path / FILE_NAME) as conn:
        conn.execute("UPDATE responses SET created = created - 7200 WHERE key = 'old'")
    with ResponseCache(tmp_path, ttl_s=3600) as cache:
        assert cache.stats().expired == 1
        assert cache.get("old") is None and cache.get("new") is not None
        assert not cache.contains("old")


def test_a_file_others_may_write_is_refused(tmp_path: Path) -> None:
    if not hasattr(os, "getuid"):
        pytest.skip("POSIX permissions")
    ResponseCache(tmp_path).close()
    os.chmod(tmp_path / FILE_NAME, 0o666)
    with pytest.raises(ConfigError, match="not private"):
        ResponseCache(tmp_path)


def test_stats_and_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ResponseCache(tmp_path) as cache:
        cache.put("a", Entry(text="{}"))
        cache.put("b", Entry(text="{}"))
    assert main(["cache", "stats", "--cache", str(tmp_path)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["entries"] == 2 and stats["path"] == str(tmp_path / FILE_NAME)
    assert main(["cache", "clear", "--cache", str(tmp_path), "--older-than", "3600"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 0
    assert main(["cache", "clear", "--cache", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 2
    assert main(["cache", "stats", "--older-than", "5"]) == 2


def test_a_cache_pickles_as_its_settings(tmp_path: Path) -> None:
    ResponseCache(tmp_path).close()  # recorded (empty): a replay cache reads an existing file only
    cache = ResponseCache(tmp_path, max_bytes=12345, ttl_s=60, replay=True)
    copy = pickle.loads(pickle.dumps(cache))
    assert (copy.folder, copy.max_bytes, copy.ttl_s, copy.replay) == (tmp_path, 12345, 60, True)


# --- the option and the environment ---------------------------------------------------------


def test_the_environment_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert resolve_cache(None) is None
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env"))
    assert resolve_cache(None).folder == tmp_path / "env"  # type: ignore[union-attr]
    assert resolve_cache(False) is None  # an explicit no wins over the environment
    monkeypatch.setenv(CACHE_ENV, "1")
    monkeypatch.setenv("RAG_RERANK_CACHE_DIR", str(tmp_path / "default"))
    assert resolve_cache(None).folder == tmp_path / "default"  # type: ignore[union-attr]
    monkeypatch.setenv(CACHE_ENV, f"replay:{tmp_path / 'pinned'}")
    with pytest.raises(ConfigError, match="pinned"):  # nothing recorded there yet
        resolve_cache(None)
    ResponseCache(tmp_path / "pinned").close()
    pinned = resolve_cache(None)
    assert pinned is not None and pinned.replay and pinned.folder == tmp_path / "pinned"
    monkeypatch.setenv(CACHE_ENV, "off")
    assert resolve_cache(None) is None
    with pytest.raises(InputError, match="cache must be"):
        resolve_cache(3.5)


def test_the_environment_turns_the_cache_on_for_rerank(srv: FakeLLM, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    rerank(QUERY, CHUNKS, 3, **_opts(srv))
    second = rerank(QUERY, CHUNKS, 3, **_opts(srv))
    assert _llm_calls(srv) == 1 and second.meta.cache["hits"] == 1
    third = rerank(QUERY, CHUNKS, 3, cache=False, **_opts(srv))
    assert _llm_calls(srv) == 2 and third.meta.cache is None


def test_local_backend_results_say_nothing_about_a_cache(tmp_path: Path) -> None:
    result = rerank(QUERY, CHUNKS, 3, cache=tmp_path)
    assert result.meta.cache is None  # the local scorer makes no request: nothing to keep


# --- replay ---------------------------------------------------------------------------------


def test_replay_answers_from_the_cache_and_fails_on_a_miss(srv: FakeLLM, tmp_path: Path) -> None:
    recorded = rerank(QUERY, CHUNKS, 3, cache=tmp_path, **_opts(srv))
    replay = ResponseCache(tmp_path, replay=True)
    pinned = rerank(QUERY, CHUNKS, 3, cache=replay, **_opts(srv))
    assert pinned.to_json() == recorded.to_json() and _llm_calls(srv) == 1
    with pytest.raises(CacheMissError, match="no cached answer") as caught:
        rerank(QUERY + " today", CHUNKS, 3, cache=replay, fallback="local", **_opts(srv))
    assert _llm_calls(srv) == 1  # replay never asks, and the fallback does not hide the miss
    assert len(caught.value.key) == 64
    with pytest.raises(CacheMissError, match="window 1 of 3"):
        rerank(QUERY, graded_chunks(30), 3, cache=replay, window_size=10, **_opts(srv))
    assert replay.stats().entries == 1  # replay writes nothing


def test_replay_from_a_folder_with_nothing_recorded_fails_naming_it_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Replay is read-only: pointed at a missing folder (a mistyped path) or at one holding no
    recorded answers, it creates neither the folder nor the file and says so at once, naming it,
    rather than failing every call as a miss (docs/cost.md)."""
    missing = tmp_path / "rerank-answer"
    with pytest.raises(ConfigError, match="rerank-answer") as caught:
        ResponseCache(missing, replay=True)
    assert "record" in str(caught.value)
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=FILE_NAME):
        ResponseCache(empty, replay=True)
    assert list(empty.iterdir()) == []
    chunks = tmp_path / "chunks.jsonl"
    chunks.write_text("".join(json.dumps(c) + "\n" for c in CHUNKS), encoding="utf-8")
    code = main(["rerank", "-q", QUERY, "-c", str(chunks), "--backend", "openai", "-m", "m",
                 "--base-url", "http://127.0.0.1:9/v1", "--cache", str(missing), "--replay"])
    err = capsys.readouterr().err
    assert code == 2 and str(missing) in err and "Traceback" not in err
    assert not missing.exists()


def test_cli_cache_and_replay(srv: FakeLLM, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    chunks = tmp_path / "chunks.jsonl"
    chunks.write_text("".join(json.dumps(c) + "\n" for c in CHUNKS), encoding="utf-8")
    args = ["rerank", "-q", QUERY, "-c", str(chunks), "-k", "3", "--backend", "openai", "-m", "fake-gpt",
            "--base-url", srv.openai_url, "--cache", str(tmp_path / "c")]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main([*args, "--meta"]) == 0
    out = capsys.readouterr()
    assert out.out == first and _llm_calls(srv) == 1
    assert json.loads(out.err)["cache"] == {"hits": 1, "misses": 0, "saved_tokens": 120}
    assert main([*args, "--replay"]) == 0 and capsys.readouterr().out == first
    changed = [a if a != QUERY else QUERY + "?" for a in args]
    assert main([*changed, "--replay"]) == 3
    assert "no cached answer" in capsys.readouterr().err
    plain = args[:-2]  # without --cache DIR
    assert main([*plain, "--no-cache"]) == 0 and _llm_calls(srv) == 2
    assert main([*args, "--no-cache"]) == 2
    assert "--no-cache excludes" in capsys.readouterr().err


def test_cli_batch_second_run_makes_no_request(srv: FakeLLM, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    lines = [{"query": QUERY, "chunks": CHUNKS, "top_k": 2},
             {"query": "Where is the Louvre?", "chunks": CHUNKS},
             {"query": QUERY, "chunks": graded_chunks(30), "window_size": 10}]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    base = ["batch", "-i", str(src), "--backend", "openai", "-m", "fake-gpt", "--base-url", srv.openai_url,
            "--cache", str(tmp_path / "c"), "--no-progress"]
    assert main([*base, "-o", str(tmp_path / "a.jsonl")]) == 0
    made = _llm_calls(srv)
    assert main([*base, "-o", str(tmp_path / "b.jsonl")]) == 0
    capsys.readouterr()
    assert _llm_calls(srv) == made
    a = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [r["result"] for r in a] == [r["result"] for r in b]
    assert all(r["meta"]["cache"]["misses"] == 0 for r in b)
    assert a[0]["config"] == b[0]["config"]  # the cache does not change what a record's result depends on


def test_a_framework_component_uses_the_cache(srv: FakeLLM, tmp_path: Path) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document

    from rag_rerank.integrations.langchain import RagRerankCompressor

    docs = [Document(page_content=c["text"], id=c["id"]) for c in CHUNKS]
    compressor = RagRerankCompressor(top_n=3, cache=str(tmp_path), **_opts(srv))
    first = compressor.compress_documents(docs, QUERY)
    second = compressor.compress_documents(docs, QUERY)
    assert _llm_calls(srv) == 1
    assert [d.id for d in first] == [d.id for d in second]


# --- sharing: threads and processes ---------------------------------------------------------


def _requests(tag: str, n: int) -> list[tuple[str, list[dict[str, str]]]]:
    """`n` requests of their own (`tag`) and four every worker shares."""
    own = [(f"{QUERY} ({tag} {i})", graded_chunks(6, tag=f"{tag}{i}")) for i in range(n)]
    shared = [(f"{QUERY} shared {i}", graded_chunks(6, tag=f"s{i}")) for i in range(4)]
    return own + shared


def test_sixteen_threads_share_one_cache(srv: FakeLLM, tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path)
    results: dict[tuple[str, str], str] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    with Reranker(cache=cache, **_opts(srv)) as reranker:

        def work(t: int) -> None:
            try:
                for query, chunks in _requests(f"t{t}", 3):
                    out = reranker.rerank(query, chunks, 3).to_json()
                    with lock:
                        results[(f"t{t}", query)] = out
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(16)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []
        distinct = 16 * 3 + 4
        assert cache.stats().entries == distinct
        made = _llm_calls(srv)
        assert distinct <= made <= 16 * 7  # the shared four may race before one is stored
        for (tag, query), out in results.items():
            chunks = dict(_requests(tag, 3))[query]
            again = reranker.rerank(query, chunks, 3)
            assert again.to_json() == out and again.meta.cache["hits"] == 1
        assert _llm_calls(srv) == made
    with sqlite3.connect(tmp_path / FILE_NAME) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def _process_worker(args: tuple[str, str, int]) -> dict[str, str]:
    """One process's requests through its own session on the shared cache folder."""
    folder, url, worker = args
    out = {}
    with Reranker(backend="openai", model="fake-gpt", base_url=url, api_key=KEY, cache=folder) as reranker:
        for query, chunks in _requests(f"p{worker}", 6):
            out[query] = reranker.rerank(query, chunks, 3).to_json()
    return out


def test_four_processes_share_one_cache(srv: FakeLLM, tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        outs = pool.map(_process_worker, [(str(tmp_path), srv.openai_url, w) for w in range(4)])
    distinct = 4 * 6 + 4
    with ResponseCache(tmp_path) as cache:
        assert cache.stats().entries == distinct
    with sqlite3.connect(tmp_path / FILE_NAME) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    made = _llm_calls(srv)
    with Reranker(cache=tmp_path, **_opts(srv)) as reranker:
        for worker, out in enumerate(outs):
            for query, chunks in _requests(f"p{worker}", 6):
                again = reranker.rerank(query, chunks, 3)
                assert again.to_json() == out[query] and again.meta.cache["hits"] == 1
    assert _llm_calls(srv) == made


def test_the_retry_policy_is_part_of_the_key_through_the_output_budget(srv: FakeLLM, tmp_path: Path) -> None:
    rerank(QUERY, CHUNKS, 3, cache=tmp_path, **_opts(srv))
    rerank(QUERY, CHUNKS, 3, cache=tmp_path, policy=RetryPolicy(max_tokens=2000), **_opts(srv))
    assert _llm_calls(srv) == 2  # another max_tokens: another request
    rerank(QUERY, CHUNKS, 3, cache=tmp_path, policy=RetryPolicy(deadline_s=30), **_opts(srv))
    assert _llm_calls(srv) == 2  # a deadline does not change the answer


def test_cache_stats_of_a_folder_without_a_cache_creates_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    """`cache stats --cache /no/such/dir` made the folder and an empty database: reading never
    writes. A folder holding no cache is an error naming it (a mistyped path would otherwise look
    like an empty cache); `clear` of one has nothing to do and says so."""
    missing = tmp_path / "no" / "such"
    assert main(["cache", "stats", "--cache", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"no response cache in {missing}" in err and "nothing was created" in err
    assert main(["cache", "clear", "--cache", str(missing)]) == 0
    assert json.loads(capsys.readouterr().out) == {"path": str(missing / FILE_NAME), "removed": 0}
    monkeypatch.setenv("RAG_RERANK_CACHE_DIR", str(missing))  # the default folder, absent
    assert main(["cache", "stats"]) == 2
    assert not (tmp_path / "no").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["cache", "stats", "--cache", str(empty)]) == 2
    assert list(empty.iterdir()) == []
