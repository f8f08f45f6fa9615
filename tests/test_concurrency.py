"""concurrency.py: the shared call limit, a batch's request slots and their hand-on, and running a
coroutine from synchronous code anywhere."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from rag_rerank.concurrency import RequestSlots, check_concurrency, hand_on_request_slot, run_coroutine
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


async def _requests(slots: RequestSlots, n: int, release_calls: asyncio.Event, release_ends: asyncio.Event,
                    seen: dict[str, int]) -> None:
    """`n` requests through `slots`: each "calls" until `release_calls`, hands its slot on, then
    "finishes" until `release_ends`; `seen` keeps the most of each kind at once."""
    now = {"calling": 0, "finishing": 0}

    async def one() -> None:
        async with slots.held():
            now["calling"] += 1
            seen["calling"] = max(seen["calling"], now["calling"])
            await release_calls.wait()
            now["calling"] -= 1
            await hand_on_request_slot()
            await hand_on_request_slot()  # a second time: nothing more
            now["finishing"] += 1
            seen["finishing"] = max(seen["finishing"], now["finishing"])
            await release_ends.wait()
            now["finishing"] -= 1
        seen["done"] += 1

    await asyncio.gather(*(one() for _ in range(n)))


def test_request_slots_bound_the_requests_calling_and_those_finishing_each_to_the_concurrency() -> None:
    async def run() -> dict[str, int]:
        calls, ends = asyncio.Event(), asyncio.Event()
        seen = {"calling": 0, "finishing": 0, "done": 0}
        task = asyncio.ensure_future(_requests(RequestSlots(2), 7, calls, ends, seen))
        for _ in range(20):
            await asyncio.sleep(0)
        assert seen == {"calling": 2, "finishing": 0, "done": 0}
        calls.set()  # answers in: two requests finish while two more call, then the rest wait
        for _ in range(20):
            await asyncio.sleep(0)
        assert seen["finishing"] == 2 and seen["done"] == 0
        ends.set()
        await asyncio.wait_for(task, 5)
        return seen

    assert asyncio.run(run()) == {"calling": 2, "finishing": 2, "done": 7}


def test_a_request_hands_its_slot_on_to_the_next_before_finishing() -> None:
    """At concurrency 1, the second request starts while the first is still finishing."""
    async def run() -> list[str]:
        order: list[str] = []
        slots, started = RequestSlots(1), asyncio.Event()

        async def first() -> None:
            async with slots.held():
                order.append("first calls")
                await hand_on_request_slot()
                order.append("first finishes")
                await asyncio.wait_for(started.wait(), 5)
                order.append("first done")

        async def second() -> None:
            await asyncio.sleep(0)  # queued behind the first
            async with slots.held():
                order.append("second calls")
                started.set()

        await asyncio.gather(first(), second())
        return order

    assert asyncio.run(run()) == ["first calls", "second calls", "first finishes", "first done"]


def test_a_request_cancelled_while_waiting_to_finish_gives_its_slot_back() -> None:
    """No slot leaks: a request cancelled while both finishing slots are taken releases its
    request slot, and a later request still gets one."""
    async def run() -> bool:
        slots, hold = RequestSlots(1), asyncio.Event()

        async def finishing_for_ever() -> None:
            async with slots.held():
                await hand_on_request_slot()
                await hold.wait()

        async def stuck() -> None:
            async with slots.held():
                await hand_on_request_slot()  # waits: the one finishing slot is taken

        busy = asyncio.ensure_future(finishing_for_ever())
        for _ in range(10):
            await asyncio.sleep(0)
        waiting = asyncio.ensure_future(stuck())
        for _ in range(10):
            await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        got_in = asyncio.Event()

        async def later() -> None:
            async with slots.held():
                got_in.set()

        await asyncio.wait_for(later(), 5)
        hold.set()
        await busy
        return got_in.is_set()

    assert asyncio.run(run())


def test_hand_on_outside_a_batch_does_nothing() -> None:
    assert asyncio.run(hand_on_request_slot()) is None
