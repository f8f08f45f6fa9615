"""concurrency.py: the shared call limit, and running a coroutine from synchronous code anywhere."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from rag_rerank.concurrency import check_concurrency, run_coroutine
from rag_rerank.errors import InputError

_REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


async def _where() -> tuple[str, str]:
    await asyncio.sleep(0)
    return threading.current_thread().name, _REQUEST_ID.get()


def test_run_coroutine_outside_a_loop_runs_here() -> None:
    token = _REQUEST_ID.set("req-1")
    try:
        assert run_coroutine(_where()) == (threading.current_thread().name, "req-1")
    finally:
        _REQUEST_ID.reset(token)


def test_run_coroutine_inside_a_running_loop_blocks_on_a_worker_thread_with_the_callers_context() -> None:
    """What a Jupyter cell or an async handler calling synchronous code gets: an answer, not
    `asyncio.run() cannot be called from a running event loop`."""
    async def handler() -> tuple[str, str]:
        _REQUEST_ID.set("req-2")
        return run_coroutine(_where())

    thread, request_id = asyncio.run(handler())
    assert thread.startswith("rag-rerank-loop") and request_id == "req-2"


def test_check_concurrency_names_the_argument() -> None:
    assert check_concurrency(3) == 3
    with pytest.raises(InputError, match="workers must be an integer of at least 1"):
        check_concurrency(0, path="workers")
