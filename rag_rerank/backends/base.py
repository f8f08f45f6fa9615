"""What every backend is and returns: the `Backend` protocol and its `Completion`.

A backend only talks to its model: it sends the rendered prompt (plus, on a re-ask, the guard's
violations) and returns the raw text. It never retries by itself (SDKs run with max_retries=0)
and never judges the output; `retry.py` and the output guard own those decisions. A failed call is
raised as one of the classified failures of `errors.py` (`TransientFailure`, `FatalFailure`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ..errors import Violation
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
