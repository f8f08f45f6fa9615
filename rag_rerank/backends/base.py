"""What every backend is and returns: the `Backend` protocol, its `Capabilities` and its `Completion`.

A backend only talks to its model: it sends the rendered prompt (plus, on a re-ask, the guard's
violations) and returns the raw text. It never retries by itself (SDKs run with max_retries=0)
and never judges the output; `retry.py` and the output guard own those decisions. A failed call is
raised as one of the classified failures of `errors.py` (`TransientFailure`, `FatalFailure`).

What a backend can do is declared, not discovered: its `capabilities` say whether it scores
(numbers built into the card's answer, never re-asked) or ranks listwise, whether the response
cache may answer its calls (it says what it sends: `cache_identity`), whether `complete` takes a
`timeout`, whether it holds clients to close, whether it needs an API key. The registry
(`backends/factory.py`) is the one place that reads them (`capabilities(backend)`), and the one
place that infers them for a backend written before they were declared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..errors import Violation
from ..frozen import direct_init
from ..models import RerankRequest


@direct_init  # every call's answer: built without a setattr per field
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
    # A scored backend's score of a chunk shown as its evidence is its best passage's: per chunk id,
    # that passage as [start, end) in the chunk's text as shown (`shortening.decided_spans`); meta
    # maps it to the original text (`meta.evidence[id]["decided"]`). Empty for an LLM.
    decided: Mapping[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do (module docstring)."""

    scored: bool = False  # numeric scores, the answer built by backends/scored.py; else listwise (an LLM)
    cacheable: bool = False  # `cache_identity` says what a call sends: the response cache may answer it
    timeout: bool = False  # `complete` takes `timeout=` (what is left of the caller's deadline)
    closes: bool = False  # holds clients: `close()`, `aclose()`, `release_loop()` (`Closable`)
    needs_key: bool = False  # calls a service that wants an API key (none for a local server)

    @property
    def makes_requests(self) -> bool:
        """Whether its calls are billed requests: an LLM, or a scored backend that calls a server (a
        rerank API, which says what it sends); not the local scorers (local, cross-encoder)."""
        return not self.scored or self.cacheable


@runtime_checkable
class Backend(Protocol):
    name: str
    model: str | None

    @property
    def capabilities(self) -> Capabilities:
        """What this backend can do (module docstring); read through `factory.capabilities`."""
        ...

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


class Cacheable(Protocol):
    """A backend whose `capabilities.cacheable` is True."""

    def cache_identity(self, prompt: str, request: RerankRequest, max_tokens: int) -> Mapping[str, Any]:
        """What decides this call's answer (server, model, messages, format), for the cache's key."""
        ...


class Closable(Protocol):
    """A backend whose `capabilities.closes` is True."""

    def close(self) -> None: ...

    async def aclose(self) -> None: ...

    async def release_loop(self) -> None: ...
