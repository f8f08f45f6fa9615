"""`with` and `async with` for anything that closes: a backend holding SDK clients, a `Reranker`.

One mixin, so every closable object of the package closes the same way: `__exit__` calls
`close()`, `__aexit__` awaits `aclose()`.
"""

from __future__ import annotations

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


__all__ = ["Closing"]
