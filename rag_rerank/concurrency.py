"""One bound on backend calls in flight, shared by `batch` and the windows of a request.

`arerank_many` (and so `rag-rerank batch` and `eval`) bounds how many requests run at once. A
request with `window_size` fans out into several calls; if each of them only counted as part of
its request, a batch at concurrency 4 of requests with 5 windows would put 20 calls on the wire.
So the batch also publishes a call-level semaphore of the same size in a context variable, and
every backend call of `arerank` (a window, a final pass, or a plain single call) takes a slot from
it. Outside a batch there is no shared semaphore and a windowed request makes its own, sized by
its `concurrency` argument (default `DEFAULT_CONCURRENCY`, the batch's own default).

A request slot never waits for another request's slot and a call slot is always released after
its call, so the two semaphores cannot deadlock.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, TypeVar

from .errors import InputError, Violation

DEFAULT_CONCURRENCY = 4
T = TypeVar("T")

CALL_LIMIT: ContextVar[asyncio.Semaphore | None] = ContextVar("rag_rerank_call_limit", default=None)


def check_concurrency(value: object, path: str = "concurrency") -> int:
    """`value` as a positive int, or an `InputError` naming `path`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{path} must be an integer of at least 1, got {value!r}"
        raise InputError([Violation(path=path, value=value, message=msg)])
    return value


@contextlib.asynccontextmanager
async def call_slot(fallback: asyncio.Semaphore | None = None) -> AsyncIterator[None]:
    """Hold one slot of the shared call limit (a batch's), else of `fallback`, else none."""
    limit = CALL_LIMIT.get() or fallback
    if limit is None:
        yield
        return
    async with limit:
        yield


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """`coro` run to completion from synchronous code, in a new event loop closed afterwards.

    `asyncio.run` when no loop runs in this thread; inside a running one (a Jupyter cell, a sync
    function called from an async web handler) `asyncio.run` refuses, so the loop runs in a worker
    thread (with a copy of the caller's context) and the caller blocks until it is done, as for any
    synchronous call."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1, thread_name_prefix="rag-rerank-loop") as pool:
        return pool.submit(contextvars.copy_context().run, asyncio.run, coro).result()
