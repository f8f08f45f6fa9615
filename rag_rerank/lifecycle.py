"""`with` and `async with` for anything that closes: a backend holding SDK clients, a `Reranker`.

One mixin, so every closable object of the package closes the same way: `__exit__` calls
`close()`, `__aexit__` awaits `aclose()`. And the one way to close what a session built (a backend,
an embedder holding a model or an HTTP client, an SDK's client), whichever of `close()`,
`aclose()` and `release_loop()` it has (`close`, `aclose`, `release_loop` below).
"""

from __future__ import annotations

import asyncio
from typing import Any


class Closing:
    """Context managers over `close()` / `aclose()`, which the class defines."""

    def close(self) -> None:  # pragma: no cover - every user defines its own
        raise NotImplementedError

    async def aclose(self) -> None:  # pragma: no cover - every user defines its own
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def close(obj: Any) -> None:
    """Close `obj` when it closes (a sync `close()`); anything else is left as it is."""
    closer = getattr(obj, "close", None)
    if callable(closer):
        closer()


async def aclose(obj: Any) -> None:
    """Close `obj` from async code: `aclose()` when it has one (an async client is closed on its own
    loop), else `close()`, awaited when it is a coroutine (an SDK's async client)."""
    closer = getattr(obj, "aclose", None) or getattr(obj, "close", None)
    if callable(closer):
        result = closer()
        if asyncio.iscoroutine(result):
            await result


async def release_loop(obj: Any) -> None:
    """Close `obj`'s async clients of the running loop, one about to end (`asyncio.run`), when it
    keeps any; `obj` goes on, and a later loop gets clients of its own."""
    release = getattr(obj, "release_loop", None)
    if callable(release):
        await release()


__all__ = ["Closing", "aclose", "close", "release_loop"]
