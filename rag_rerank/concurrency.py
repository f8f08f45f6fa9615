"""A batch's bounds: backend calls in flight, and requests under way (`RequestSlots`).

`arerank_many` (and so `rag-rerank batch` and `eval`) bounds how many requests run at once. A
request with `window_size` fans out into several calls; if each of them only counted as part of
its request, a batch at concurrency 4 of requests with 5 windows would put 20 calls on the wire.
So the batch also publishes a call-level semaphore of the same size in a context variable, and
every backend call of `arerank` (a window, a final pass, or a plain single call) takes a slot from
it. Outside a batch there is no shared semaphore and a windowed request makes its own, sized by
its `concurrency` argument (default `DEFAULT_CONCURRENCY`, the batch's own default).

A request holds its request slot while it plans and calls; once its calls to a server are done
it hands the slot on to the next request (`hand_on_request_slot`) and finishes (the post-pass) in
a slot of a second kind, of which there are as many (a local scorer's request keeps its slot: its
call is CPU work in this process, with no wait to overlap). So the next request's wait on the
server overlaps this one's CPU work, and a batch still holds at most `concurrency` calls in flight
and twice as many requests under way (answers waiting for a slow post-pass do not pile up).

A request waits for a finishing slot only while it holds its request slot; a finishing request
waits for nothing but a call slot (a refill), and every call gives its call slot back: so the
semaphores cannot deadlock.
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

# How many turns of the event loop a request gives the next one after handing its slot on: the
# httpx transport writes a request's head and its body in two turns (measured with the openai SDK:
# after one turn 62 of 125 requests had both on the wire, after two all of them).
_HAND_ON_TURNS = 3


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


class RequestSlots:
    """A batch's `concurrency` request slots, and as many for requests finishing (`held`)."""

    def __init__(self, concurrency: int) -> None:
        self._calling = asyncio.Semaphore(concurrency)
        self._finishing = asyncio.Semaphore(concurrency)

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """One request slot for the request run inside, or the finishing slot it is handed on for."""
        await self._calling.acquire()
        slot = _Slot(self)
        token = _REQUEST_SLOT.set(slot)
        try:
            yield
        finally:
            _REQUEST_SLOT.reset(token)
            (self._finishing if slot.handed_on else self._calling).release()


class _Slot:
    """The request slot the running request holds, and whether it has handed it on."""

    def __init__(self, slots: RequestSlots) -> None:
        self.slots = slots
        self.handed_on = False

    async def hand_on(self) -> None:
        if self.handed_on:
            return
        await self.slots._finishing.acquire()
        self.handed_on = True
        self.slots._calling.release()
        for _ in range(_HAND_ON_TURNS):  # the next request plans and puts its call on the wire
            await asyncio.sleep(0)


# The running request's slot in a batch (`RequestSlots.held`); None outside one.
_REQUEST_SLOT: ContextVar[_Slot | None] = ContextVar("rag_rerank_request_slot", default=None)


async def hand_on_request_slot() -> None:
    """Once a batch request's backend calls are done: give its slot to the next request, and let
    that one start, before this one's post-pass (module docstring). Outside a batch, and after the
    first time, nothing."""
    slot = _REQUEST_SLOT.get()
    if slot is not None:
        await slot.hand_on()


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
