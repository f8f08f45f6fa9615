"""Backpressure for one worker process: a bounded number of requests in flight and a bounded queue.

Without a bound, a burst of clients makes a worker hold every request's documents and every
upstream connection at once, memory grows with the burst, and every answer gets slower until
clients time out. Here at most `max_in_flight` requests are reranked at once and at most
`max_queue` more wait for a slot; a request beyond that is refused at once (`Overloaded`, answered
with 429 and `Retry-After`), so a client backs off instead of piling on, and memory stays bounded
by the two numbers. A request that waited `queue_timeout_s` without getting a slot is refused the
same way: a queue that does not move (the upstream slowed down, the machine is short of CPU) must
not turn into clients' timeouts.

`draining` is set when the process is asked to stop (SIGTERM): new requests are refused with 503
while those admitted finish.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Overloaded(Exception):
    """No slot and no room in the queue: the request is refused without being started."""


class Draining(Exception):
    """The process is shutting down: the request is refused without being started."""


class Admission:
    """The in-flight bound and the queue of one event loop (module docstring)."""

    def __init__(self, max_in_flight: int, max_queue: int, queue_timeout_s: float | None = None) -> None:
        self.max_in_flight, self.max_queue, self.queue_timeout_s = max_in_flight, max_queue, queue_timeout_s
        self._slots: asyncio.Semaphore | None = None
        self.in_flight = 0
        self.waiting = 0
        self.draining = False

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the in-flight slots while the block runs; raise `Overloaded` when the queue is
        full, `Draining` when the process is stopping."""
        if self.draining:
            raise Draining()
        if self._slots is None:  # made on the serving loop (the app may be built before it runs)
            self._slots = asyncio.Semaphore(self.max_in_flight)
        if self._slots.locked() and self.waiting >= self.max_queue:
            raise Overloaded()
        self.waiting += 1
        try:
            await asyncio.wait_for(self._slots.acquire(), self.queue_timeout_s)
        except asyncio.TimeoutError:
            raise Overloaded() from None
        finally:
            self.waiting -= 1
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self._slots.release()


__all__ = ["Admission", "Draining", "Overloaded"]
