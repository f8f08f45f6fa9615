"""A server that is not there fails fast; one that is there but fails stays transient.

Regression: `rag-rerank rerank --backend openai --base-url http://127.0.0.1:9/v1 --fallback local`
took 17.8 s, six transient attempts with backoff against a port nothing listens on, before the
local fallback answered (the MCP tool waited the same). A refused connection or a host name that
does not resolve is now an `UnreachableFailure`: one attempt, no wait, and the fallback answers at
once. A reset connection, a timeout, 5xx and 429 (a server that is there) keep their backoff.

Real parts throughout: the real openai / anthropic SDKs and httpx against real sockets on
127.0.0.1 (a port bound and closed, a listener that resets every connection). Only the name lookup
of the unresolvable host is stubbed (`socket.getaddrinfo`), so that no test sends a DNS query off
the machine.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rag_rerank import arerank, rerank
from rag_rerank.backends.common import unreachable_reason
from rag_rerank.backends.openai import OpenAIBackend
from rag_rerank.cli import main
from rag_rerank.errors import BackendError, TransientFailure, UnreachableFailure
from rag_rerank.guard import validate_request
from rag_rerank.retry import RetryPolicy
from rag_rerank.skill import load_skill
from tests.support.sockets import Resetter, closed_port

EXAMPLE = load_skill().example("happy-path")
QUERY, CHUNKS = EXAMPLE.query, EXAMPLE.chunks
NOWHERE = "nowhere.invalid"  # RFC 2606: never resolves; looked up through the stub below


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
                "RERANK_API_KEY", "RERANK_BASE_URL"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def no_dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`nowhere.invalid` fails to resolve as a resolver says so (EAI_NONAME), without a query leaving
    the machine; every other name resolves as usual."""
    real = socket.getaddrinfo

    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, (str, bytes)) and (host.decode() if isinstance(host, bytes) else host) == NOWHERE:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    yield


def _url(backend: str, host: str, port: int) -> str:
    return f"http://{host}:{port}" + ("" if backend == "anthropic" else "/v1")


def _options(backend: str, url: str) -> dict[str, Any]:
    return {"backend": backend, "base_url": url, "api_key": "sk-test-key-0123456789",
            "model": "m" if backend != "openai" else None}


BACKENDS = ["openai", "anthropic", "rerank-api"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_refused_connection_is_one_fatal_attempt(backend: str, mode: str) -> None:
    url = _url(backend, "127.0.0.1", closed_port())
    call = rerank if mode == "sync" else (lambda *a, **k: asyncio.run(arerank(*a, **k)))
    with pytest.raises(BackendError) as info:
        call(QUERY, CHUNKS, 2, **_options(backend, url))
    attempts = info.value.attempts
    assert [(a.kind, a.wait_s) for a in attempts] == [("fatal", 0.0)]
    port = url.split(":")[2].split("/")[0]
    assert f"connection refused at 127.0.0.1:{port}: nothing listens there" in attempts[0].detail
    assert "fatal error, not retried" in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_unresolvable_host_is_one_fatal_attempt(backend: str, no_dns: None) -> None:
    with pytest.raises(BackendError) as info:
        rerank(QUERY, CHUNKS, 2, **_options(backend, _url(backend, NOWHERE, 8000)))
    attempts = info.value.attempts
    assert [a.kind for a in attempts] == ["fatal"]
    assert f"the host name '{NOWHERE}' does not resolve (Name or service not known)" in attempts[0].detail


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_local_fallback_answers_a_refused_connection_at_once(backend: str) -> None:
    """The default policy (six attempts, backoff) but for its sleep, which records the waits: the
    fallback answers after one attempt and no wait at all, not after 17.8 s of backoff. (No timing
    is asserted: the waits the policy asked for are what would have cost the time.)"""
    url = _url(backend, "127.0.0.1", closed_port())
    waits: list[float] = []
    policy = RetryPolicy(sleep=lambda s: waits.append(s) if s else None)
    result = rerank(QUERY, CHUNKS, 2, fallback="local", policy=policy, **_options(backend, url))
    assert result.meta.fallback == "local"
    assert result.ids == rerank(QUERY, CHUNKS, 2).ids  # the local backend's own ranking
    assert any("connection refused" in note and "after 1 attempt" in note for note in result.meta.notes)
    assert waits == []  # was five backoffs, 17.8 s


def test_a_reset_connection_stays_transient_with_backoff() -> None:
    """A server that accepts and drops the connection is there: worth the backoff and retries."""
    waits: list[float] = []
    policy = RetryPolicy(max_attempts=3, sleep=waits.append, jitter_s=0.0)
    with Resetter() as server, pytest.raises(BackendError) as info:
        url = _url("openai", "127.0.0.1", server.port)
        rerank(QUERY, CHUNKS, 2, policy=policy, **_options("openai", url))
    kinds = [a.kind for a in info.value.attempts]
    assert kinds == ["transient"] * 3 and waits == [0.5, 1.0]
    assert server.accepted == 3
    assert "connection error" in info.value.attempts[0].detail


def test_the_backend_raises_unreachable_and_the_sdk_tries_once() -> None:
    """The SDK runs with max_retries=0, so one call is one connection attempt."""
    request = validate_request(QUERY, CHUNKS, 2, None)
    backend = OpenAIBackend(base_url=_url("openai", "127.0.0.1", closed_port()), api_key="x")
    with pytest.raises(UnreachableFailure, match="connection refused"):
        backend.complete("P", request, max_tokens=50)


def test_a_timeout_stays_transient() -> None:
    """A listener that never answers (the backlog accepts the connection): a timeout, not refused."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = _url("openai", "127.0.0.1", silent.getsockname()[1])
        request = validate_request(QUERY, CHUNKS, 2, None)
        with pytest.raises(TransientFailure, match="timed out"):
            OpenAIBackend(base_url=url, api_key="x", timeout=0.3).complete("P", request, max_tokens=50)


def test_the_cli_fallback_answers_a_refused_connection_after_one_attempt(tmp_path: Path, capsys) -> None:
    chunks = tmp_path / "chunks.jsonl"
    chunks.write_text(CHUNKS, encoding="utf-8")
    port = closed_port()
    code = main(["rerank", "-q", QUERY, "-c", str(chunks), "--backend", "openai", "--base-url",
                 f"http://127.0.0.1:{port}/v1", "--fallback", "local", "--meta"])
    out, err = capsys.readouterr()
    assert code == 0 and "ranked" in json.loads(out)
    meta = json.loads(err)
    assert meta["fallback"] == "local" and meta["attempts"] == 2  # one refused call, no retry, then local
    assert any(f"connection refused at 127.0.0.1:{port}" in note for note in meta["notes"])
    # without the fallback: exit 3 after one attempt, the cause on one line
    assert main(["rerank", "-q", QUERY, "-c", str(chunks), "--backend", "openai", "--base-url",
                 f"http://127.0.0.1:{port}/v1"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "after 1 attempt (fatal error, not retried)" in err
    assert "nothing listens there" in err


def test_the_mcp_tool_falls_back_at_once() -> None:
    pytest.importorskip("mcp")
    from tests.test_mcp_server import _happy_args, _session_do

    anyio = pytest.importorskip("anyio")
    env = {"RAG_RERANK_BACKEND": "openai", "RAG_RERANK_BASE_URL": f"http://127.0.0.1:{closed_port()}/v1",
           "RAG_RERANK_FALLBACK": "local"}
    _, (answer,) = anyio.run(_session_do, [("rerank_chunks", _happy_args())], env)
    assert not answer.is_error
    result = json.loads(answer.content[0].text)
    assert result["fallback"]["backend"] == "local" and "connection refused" in result["fallback"]["notice"]
    assert answer.meta["rag-rerank/run"]["attempts"] == 2  # one refused call, then the local answer


# --- the classification itself, on the exception chains the SDKs and anyio build ----------------------


def _chain(*errors: BaseException) -> BaseException:
    """errors[0] raised from errors[1] raised from ... (the way httpx wraps a socket error)."""
    for outer, inner in itertools.pairwise(errors):
        outer.__cause__ = inner
    return errors[0]


def _refused() -> OSError:
    return ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")


def _group(errors: list[Exception]) -> BaseException:
    """An ExceptionGroup as anyio raises it (the `exceptiongroup` backport before Python 3.11)."""
    import builtins

    cls = getattr(builtins, "ExceptionGroup", None) or pytest.importorskip("exceptiongroup").ExceptionGroup
    return cls("multiple connection attempts failed", errors)


def test_every_address_refused_or_unroutable_is_refused() -> None:
    """`localhost` is ::1 and 127.0.0.1: anyio reports both failures in an ExceptionGroup."""
    group = _group([OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"), _refused()])
    exc = _chain(RuntimeError("Connection error."), OSError("All connection attempts failed"), group)
    assert str(unreachable_reason(exc)).startswith("connection refused: nothing listens there")


def test_one_address_that_timed_out_keeps_the_failure_transient() -> None:
    group = _group([_refused(), TimeoutError("timed out")])
    assert unreachable_reason(_chain(OSError("All connection attempts failed"), group)) is None
    only_unroutable = _group([OSError(errno.ENETUNREACH, "Network is unreachable")])
    assert unreachable_reason(_chain(OSError("All connection attempts failed"), only_unroutable)) is None


def test_a_reset_or_a_bare_error_is_not_unreachable() -> None:
    reset = ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
    assert unreachable_reason(_chain(RuntimeError("Connection error."), reset)) is None
    assert unreachable_reason(RuntimeError("Connection error.")) is None
