"""backends/common.py: the HTTP backends' clients in a production service -- copied into worker
processes and framework components, closed when done, never leaking a socket.

Real SDK clients (openai, anthropic, httpx) against the scripted server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import os
import pickle
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rag_rerank import arerank, make_backend, rerank
from tests.support.fake_llm import FakeLLM, auto_ranker

KEY = "sk-test-0000-common"
CHUNKS = [{"id": f"c{i}", "text": f"IVF partitions the vectors to save index memory, part {i}"}
          for i in range(6)]
QUERY = "When does IVF save index memory?"
NAMES = ("openai", "anthropic")


@pytest.fixture(scope="module")
def server() -> Iterator[FakeLLM]:
    with FakeLLM(handler=auto_ranker()) as srv:
        yield srv


def _options(name: str, srv: FakeLLM) -> dict[str, Any]:
    url = srv.openai_url if name == "openai" else srv.anthropic_url
    return {"model": "fake", "base_url": url, "api_key": KEY}


def _sockets() -> int:
    """Sockets this process holds open (client and server ends of the test server's connections)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed between listdir and readlink
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return n


def _leaks(run: Callable[[], object]) -> list[str]:
    """The ResourceWarnings (unclosed sockets / transports) `run` leaves for the garbage collector."""
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        run()
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


@pytest.mark.parametrize("name", NAMES)
def test_a_backend_rerank_builds_from_a_name_is_closed_after_the_call(name: str, server: FakeLLM) -> None:
    """Each `rerank(backend="openai")` made a client of its own and left its connection open until
    the garbage collector found it: a ResourceWarning per call, sockets piling up in a busy service."""
    opts = _options(name, server)
    before = _sockets()
    assert _leaks(lambda: [rerank(QUERY, CHUNKS, top_k=2, backend=name, **opts) for _ in range(3)]) == []
    assert _leaks(lambda: asyncio.run(arerank(QUERY, CHUNKS, top_k=2, backend=name, **opts))) == []
    assert _sockets() <= before


def _settled(limit: int) -> int:
    """Open sockets, once the server's side of closed connections has noticed (at most 2 s)."""
    for _ in range(100):
        if (n := _sockets()) <= limit:
            return n
        time.sleep(0.02)
    return _sockets()


@pytest.mark.parametrize("name", NAMES)
def test_a_shared_backend_reuses_one_connection_until_closed(name: str, server: FakeLLM) -> None:
    """A backend the caller built is reused (its connection pool is the point), then closed by
    `with` / `async with` (`close()` / `aclose()`); closed, it still works, with new clients."""
    before = _settled(_sockets())
    with make_backend(name, **_options(name, server)) as backend:
        results = {rerank(QUERY, CHUNKS, top_k=2, backend=backend).to_json() for _ in range(3)}
        assert len(results) == 1
        assert _sockets() <= before + 2  # one connection (both ends), not one per call
    assert _settled(before) == before

    async def gathered() -> None:
        async with make_backend(name, **_options(name, server)) as shared:
            await asyncio.gather(*(arerank(QUERY, CHUNKS, top_k=2, backend=shared) for _ in range(3)))

    assert _leaks(lambda: asyncio.run(gathered())) == []
    assert _settled(before) == before
    assert rerank(QUERY, CHUNKS, top_k=2, backend=backend).to_json() in results
    backend.close()
    assert _settled(before) == before


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_used_backend_pickles_and_its_copy_has_its_own_clients(name: str, how: str,
                                                                  server: FakeLLM) -> None:
    """The SDK clients (locks, sockets, lambdas) made a backend impossible to pickle or deep-copy:
    no worker process could get one, and LlamaIndex silently dropped it from a pickled component."""
    with make_backend(name, **_options(name, server)) as backend:
        alone = rerank(QUERY, CHUNKS, top_k=2, backend=backend).to_json()
        asyncio.run(arerank(QUERY, CHUNKS, top_k=2, backend=backend))
        copied = pickle.loads(pickle.dumps(backend)) if how == "pickle" else copy.deepcopy(backend)
    assert type(copied) is type(backend) and repr(copied) == repr(backend)
    assert copied._clients is not backend._clients and copied._clients._sync is None
    with copied:
        assert rerank(QUERY, CHUNKS, top_k=2, backend=copied).to_json() == alone
        assert asyncio.run(arerank(QUERY, CHUNKS, top_k=2, backend=copied)).to_json() == alone


def test_the_rerank_api_backend_pickles_too() -> None:
    backend = make_backend("rerank-api", base_url="http://127.0.0.1:9/v1")
    for copied in (pickle.loads(pickle.dumps(backend)), copy.deepcopy(backend)):
        assert (copied.url, copied.timeout) == (backend.url, backend.timeout)
        copied.close()


def _rerank_in_worker(backend: Any) -> Any:
    with backend:
        return rerank(QUERY, CHUNKS, top_k=2, backend=backend)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_backend_instance_goes_to_worker_processes_and_results_come_back(method: str,
                                                                           server: FakeLLM) -> None:
    """`ProcessPoolExecutor` pickles the backend to each worker (which opens its own connection to
    the server) and the `RerankResult` back; with either start method."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with make_backend("openai", **_options("openai", server)) as backend:
        alone = rerank(QUERY, CHUNKS, top_k=2, backend=backend)
        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context(method)) as pool:
            results = list(pool.map(_rerank_in_worker, [backend] * 3))
    assert [r.to_json() for r in results] == [alone.to_json()] * 3
    assert {r.meta.backend for r in results} == {"openai"}


# --------------------------------------------------------------------------- http="aiohttp"


@pytest.fixture()
def aiohttp_clients(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every SDK aiohttp client made while the test runs (the real class, counted)."""
    pytest.importorskip("aiohttp")
    import anthropic
    import openai

    made: list[Any] = []
    for sdk in (openai, anthropic):
        real = sdk.DefaultAioHttpClient

        def counted(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            client = _real(*args, **kwargs)
            made.append(client)
            return client

        monkeypatch.setattr(sdk, "DefaultAioHttpClient", counted)
    return made


@pytest.mark.parametrize("name", NAMES)
def test_the_aiohttp_transport_answers_as_httpx_does_and_closes(name: str, server: FakeLLM,
                                                                 aiohttp_clients: list[Any]) -> None:
    """`http="aiohttp"`: the async calls go through the SDK's aiohttp client (the sync ones stay on
    httpx), with the same results, and a one-shot call leaves no socket or transport behind."""
    opts = _options(name, server)
    plain = asyncio.run(arerank(QUERY, CHUNKS, top_k=2, backend=name, **opts)).to_json()
    aio = {"backend_options": {"http": "aiohttp"}, **opts}
    assert asyncio.run(arerank(QUERY, CHUNKS, top_k=2, backend=name, **aio)).to_json() == plain
    assert len(aiohttp_clients) == 1
    assert rerank(QUERY, CHUNKS, top_k=2, backend=name, **aio).to_json() == plain
    assert len(aiohttp_clients) == 1  # the sync call did not use it
    before = _settled(_sockets())
    assert _leaks(lambda: asyncio.run(arerank(QUERY, CHUNKS, top_k=2, backend=name, **aio))) == []
    assert _settled(before) <= before


@pytest.mark.parametrize("name", NAMES)
def test_the_aiohttp_transport_keeps_timeouts_and_refusals_classified(name: str,
                                                                       aiohttp_clients: list[Any]) -> None:
    """aiohttp's own exceptions come back as the SDK's (the vendored transport maps them): a slow
    server is a transient timeout, a closed port an unreachable server, as with httpx."""
    from rag_rerank.backends.anthropic import AnthropicBackend
    from rag_rerank.backends.openai import OpenAIBackend
    from rag_rerank.errors import TransientFailure, UnreachableFailure
    from rag_rerank.guard import validate_request
    from tests.support.fake_llm import Reply

    request = validate_request(QUERY, CHUNKS, 2, 0.7)
    slow = (Reply.openai_text("{}", delay=2.0) if name == "openai"
            else Reply.anthropic_tool({"ranked": []}, delay=2.0))
    kind = OpenAIBackend if name == "openai" else AnthropicBackend
    async def ask(url: str, timeout: float) -> None:
        async with kind(base_url=url, api_key=KEY, timeout=timeout, http="aiohttp") as backend:
            await backend.acomplete("P", request, max_tokens=20)

    with FakeLLM([slow]) as srv:
        url = srv.openai_url if name == "openai" else srv.anthropic_url
        with pytest.raises(TransientFailure, match="timed out"):
            asyncio.run(ask(url, 0.3))
    with pytest.raises(UnreachableFailure, match="connection refused"):  # fails fast, not a timeout
        asyncio.run(ask(url, 2))
    assert len(aiohttp_clients) == 2


def test_an_unknown_transport_or_a_missing_aiohttp_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from rag_rerank.errors import InputError, MissingDependencyError

    with pytest.raises(InputError, match="http: must be one of httpx, aiohttp"):
        make_backend("openai", base_url="http://127.0.0.1:9/v1", api_key=KEY, http="curl")
    with pytest.raises(InputError, match="the local backend takes no option 'http'"):
        make_backend("local", http="aiohttp")
    monkeypatch.setitem(__import__("sys").modules, "aiohttp", None)  # as if not installed
    for name in NAMES:
        with pytest.raises(MissingDependencyError, match=r"rag-rerank\[aiohttp\]"):
            make_backend(name, base_url="http://127.0.0.1:9/v1", api_key=KEY, http="aiohttp")


def test_the_generation_schemas_are_the_output_schema_rewritten_and_fresh_each_call() -> None:
    """`strict_schema` / `generation_schema` build the schema from a literal compiled once (issue 37):
    equal, key order included, to the output schema stripped (and made strict) afresh, with the ids
    as an enum; a new object each call, down to every dict and list (a caller may change it)."""
    import json

    from rag_rerank.backends.common import _strictify, _strip, generation_schema, strict_schema
    from rag_rerank.guard.limits import load_schema
    from rag_rerank.models import Chunk, RerankRequest

    request = RerankRequest("q", (Chunk("a", "x"), Chunk("ñ b", "y")), 2, 0.7)
    for make, strict in ((strict_schema, True), (generation_schema, False)):
        expected = _strip(copy.deepcopy(load_schema("output")))
        expected = _strictify(expected) if strict else expected
        for section in ("ranked", "dropped"):
            props = expected["properties"].get(section, {}).get("items", {}).get("properties", {})
            if "id" in props:
                props["id"]["enum"] = ["a", "ñ b"]
        first, second = make(request), make(request)
        assert json.dumps(first) == json.dumps(expected) and first == expected
        assert "enum" in first["properties"]["ranked"]["items"]["properties"]["id"]

        def every(node: Any) -> list[Any]:
            if isinstance(node, dict):
                return [node, *(c for v in node.values() for c in every(v))]
            if isinstance(node, list):
                return [node, *(c for v in node for c in every(v))]
            return []

        ours, theirs = every(first), every(second)
        assert len(ours) == len(theirs) and not {id(c) for c in ours} & {id(c) for c in theirs}
        first["properties"]["ranked"]["items"]["properties"]["id"]["enum"].append("z")
        assert make(request) == expected
        # Too many ids for an enum (`ids_enum` gives None): the schema without one, fresh as well.
        many = RerankRequest("q", tuple(Chunk(f"c{i}", "x") for i in range(501)), 2, 0.7)
        plain = _strip(copy.deepcopy(load_schema("output")))
        plain = _strictify(plain) if strict else plain
        got = make(many)
        assert json.dumps(got) == json.dumps(plain) and "enum" not in json.dumps(got)
        assert not {id(c) for c in every(got)} & {id(c) for c in every(make(many))}


@settings(max_examples=120, deadline=None, derandomize=True)
@given(st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=30), st.integers(0, 4))
@example(["a", "b", "a", "c", "b"], 0).via("repeated ids, made by hand: dropped, first kept")
@example(["é", "ß", "中"], 0).via("unique non-ASCII ids")
def test_ids_enum_is_the_ids_in_order_without_repeats(ids: list[str], repeats: int) -> None:
    """`ids_enum` gives every id once, in first-seen order, within the structured-output limits,
    whether the request's ids are unique (as the input guard makes them) or repeat (a request made
    by hand): the set test that skips the ordered de-duplication must not change the enum."""
    from rag_rerank.backends.common import ids_enum
    from rag_rerank.models import Chunk, RerankRequest

    ids = ids + ids[:repeats]
    request = RerankRequest("q", tuple(Chunk(i, "t") for i in ids), 1, 0.7)
    got = ids_enum(request)
    assert got == list(dict.fromkeys(ids))
    assert isinstance(got, list) and got is not ids
