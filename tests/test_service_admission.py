"""The in-flight bound and the queue of one worker (`rag_rerank.service.admission`)."""

from __future__ import annotations

import asyncio

import pytest

from rag_rerank.service.admission import Admission, Draining, Overloaded


def test_full_queue_and_a_queue_that_does_not_move_are_refused() -> None:
    async def scenario() -> list[str]:
        gate = Admission(max_in_flight=1, max_queue=1, queue_timeout_s=0.2)
        release = asyncio.Event()
        outcomes: list[str] = []

        async def request(name: str, hold: bool) -> None:
            try:
                async with gate.slot():
                    outcomes.append(f"{name} ran")
                    if hold:
                        await release.wait()
            except Overloaded:
                outcomes.append(f"{name} refused")

        first = asyncio.create_task(request("first", hold=True))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(request("second", hold=False))  # queued
        await asyncio.sleep(0.01)
        await request("third", hold=False)  # queue full: refused at once
        await second  # waited 0.2 s without a slot: refused
        release.set()
        await first
        await request("fourth", hold=False)  # room again
        assert gate.in_flight == 0 and gate.waiting == 0
        gate.draining = True
        with pytest.raises(Draining):
            async with gate.slot():
                pass
        return outcomes

    assert asyncio.run(scenario()) == ["first ran", "third refused", "second refused", "fourth ran"]
