"""What every backend returns and the failure classes the retry policy acts on.

A backend only talks to its model: it sends the rendered prompt (plus, on a re-ask, the guard's
violations) and returns the raw text. It never retries by itself (SDKs run with max_retries=0)
and never judges the output; `retry.py` and the output guard own those decisions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ..errors import RerankError, Violation
from ..models import RerankRequest


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str = "stop"  # "stop" | "length" (truncated) | "refusal" | backend-specific
    model: str | None = None
    usage: Mapping[str, int] = field(default_factory=dict)
    # What the backend had to negotiate for this call (e.g. a response_format downgrade);
    # call_with_retries surfaces it in Outcome.notes.
    notes: tuple[str, ...] = ()
    # Characters of reasoning the server returned apart from the answer (`reasoning_content`):
    # they count against max_tokens, so a truncation report says where the budget went.
    reasoning_chars: int = 0


class BackendFailure(RerankError):
    """Raised by a backend for one failed call, already classified."""

    kind = "fatal"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class TransientFailure(BackendFailure):
    """Rate limit, 5xx, overloaded, timeout, connection reset: worth a backoff and another try."""

    kind = "transient"

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message, status=status)


class FatalFailure(BackendFailure):
    """Auth, bad request, refusal, missing model: retrying cannot help, fail fast."""

    kind = "fatal"


class UnreachableFailure(FatalFailure):
    """Nothing to talk to: the connection was refused (nothing listens on that port) or the host
    name does not resolve. A server being started, a wrong port or a typo in the URL does not
    change in the seconds a backoff waits, so this fails fast (`fallback="local"` answers at once)
    instead of six transient attempts over 18 s. A timeout or a dropped connection, where a
    server is there, stays a `TransientFailure`."""


@runtime_checkable
class Backend(Protocol):
    name: str
    model: str | None

    def complete(
        self,
        prompt: str,
        request: RerankRequest,
        *,
        max_tokens: int,
        feedback: Sequence[Violation] = (),
        previous: str | None = None,
        timeout: float | None = None,
    ) -> Completion:
        """One call. `feedback` and `previous` are set on a re-ask after the guard rejected `previous`.

        `timeout` (optional for a backend to accept) is what is left of the caller's deadline: a
        blocking call must give up by then. The HTTP backends pass it to their SDK request."""
        ...

    async def acomplete(
        self,
        prompt: str,
        request: RerankRequest,
        *,
        max_tokens: int,
        feedback: Sequence[Violation] = (),
        previous: str | None = None,
    ) -> Completion: ...
