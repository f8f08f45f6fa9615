"""What the engine's flow passes around: the plan of one request and the steps it yields.

Why a module of its own. The engine (`engine.py`) decides a rerank; the fallback (`fallback.py`),
the windows (`windows.py`), `consistency=k` (`consistency.py`) and the meta (`meta.py`) each take a
part of those decisions and yield or read the same values. Kept here, below all of them, those
modules share the values without importing the engine (no import circle).

A flow yields three kinds of step, which the drivers in `session.py` carry out:

* `Calls`: backend calls to make, each through the retry loop (`retry.py`) and the output guard,
  at most `workers` at once; the driver sends back, per call, its `Outcome` or the exception it
  ended with (every call finishes; the engine decides what a failure means).
* `Work`: a computation (the post-pass) the async driver runs in a worker thread when `heavy`
  (a model or an HTTP embedder), so one request does not stall the event loop; an exception it
  raises is thrown back into the flow, where the fallback decides.
* `Progress`: how far a windowed request's calls are, for a synchronous progress callback.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from .backends.base import Backend, Cacheable
from .backends.factory import capabilities
from .cache import ResponseCache, call_key
from .cost import Budget, Prices, Spending
from .frozen import direct_init, direct_init_read_often
from .fusion import MetaFusion
from .guard.limits import Limits
from .models import RerankRequest, RerankResult
from .options import Options, Settings
from .retry import RetryPolicy

# --------------------------------------------------------------------------- the steps a flow yields


@direct_init
@dataclass(frozen=True)
class Call:
    """One backend call with its retries: `ask` shown through `prompt`, judged for `guard_top_k`.

    With a response cache, `key` is the call's key in `cache` (the driver answers from it, or
    stores the new answer under it); `label` names the call in a replay miss. `spending` is the
    budget's meter, shared by the request's calls."""

    backend: Backend
    ask: RerankRequest
    prompt: str
    policy: RetryPolicy | None
    limits: Limits
    repair: bool = True
    label: str = "the call"
    cache: ResponseCache | None = None
    key: str | None = None
    spending: Spending | None = None


@direct_init
@dataclass(frozen=True)
class Calls:
    """Calls to make, at most `workers` at once (sync) or under `limit` slots (async: the batch's
    shared bound when there is one). The driver answers with one `Outcome` or exception per call,
    in order. `progress` counts them toward a windowed request's progress callback."""

    calls: tuple[Call, ...]
    workers: int = 1
    limit: int | None = None
    progress: tuple[int, int] | None = None  # (calls done before these, calls in all)


@direct_init
@dataclass(frozen=True)
class Work:
    """A computation for the driver to run: inline, or in a worker thread from async code when
    `heavy`. Its exception, if any, is thrown back into the flow."""

    run: Callable[[], Any]
    heavy: bool = False


@dataclass(frozen=True)
class Progress:
    """Tell a synchronous caller's progress callback (`windows.WINDOW_PROGRESS`) how far the calls are."""

    done: int
    total: int


Step = Calls | Work | Progress
Flow = Generator[Step, Any, RerankResult]


# --------------------------------------------------------------------------- what a session built


@dataclass(frozen=True)
class Setup:
    """What a session built once and every request shares: the backend (`backend_name` is the name
    the caller gave it), the embedder, and the API key every message is scrubbed of."""

    backend: Backend
    backend_name: str
    embedder: Any
    api_key: str | None = field(default=None, repr=False)
    cache: ResponseCache | None = None  # the response cache (`cache.py`), None without one
    # The fallback chain's scorers that are costly to build (a cross-encoder's model), built on
    # first use by `fallback.py` and kept for the session's later requests.
    fallbacks: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


# --------------------------------------------------------------------------- the plan


@direct_init_read_often  # its fields are read dozens of times a call
@dataclass(frozen=True)
class Plan:
    """Everything decided before any call, and the options the flow follows."""

    request: RerankRequest  # the caller's request, top_k as asked
    ask: RerankRequest  # what the scorer is shown: the view below with top_k = candidate_k
    prompt: str
    setup: Setup
    options: Options
    limits: Limits
    started: float
    # The caller's request with embed_meta_fields prefixed to each text: what every scorer and the
    # post-pass embedder see (the request itself when no field is listed).
    view: RerankRequest
    embedder: Any
    fusion: MetaFusion | None = None
    meta_values: Mapping[str, float | None] | None = None
    window_size: int | None = None  # set only when the request is ranked in windows
    # Why the embedder was replaced by the lexical one (`fallback="local"` after an EmbedderError).
    embedder_note: str | None = None
    prices: Prices | None = None
    budget: Budget | None = None
    spending: Spending | None = None  # the budget's meter (a batch's, shared, when it sets one)
    calibration: Any = None  # the calibration.Calibration applied to the backend's scores, or None
    calibration_file: str | None = None  # the file it was read from
    settings: Settings = field(default_factory=Settings)  # the options as typed values (`options.Settings`)
    # The chunks shown as their evidence (`shortening.py`), by id: what meta.evidence reports.
    evidence: Mapping[str, Any] = field(default_factory=dict)

    @property
    def backend(self) -> Backend:
        return self.setup.backend

    @property
    def backend_name(self) -> str:
        return self.setup.backend_name

    @property
    def fallback(self) -> str | Sequence[Any] | None:
        return self.settings.fallback

    @property
    def chain(self) -> tuple[Any, ...]:
        """The fallback chain's steps in order (`Settings.chain`, checked once), () without one."""
        return self.settings.chain

    def call(self, ask: RerankRequest, prompt: str, backend: Backend | None = None,
             repair: bool | None = None, label: str = "the call") -> Call:
        """A call of `backend` (default: the session's) for `ask`, under this plan's policy and
        limits, with its cache key when the session has a cache and the backend says what it sends."""
        repair = (not self.settings.strict) if repair is None else repair
        key = self.key(ask, prompt, repair) if backend is None else None
        # The budget meters the session backend's requests; the local fallback's calls cost nothing.
        spending = (self.spending if self.spending is not None and backend is None
                    and capabilities(self.backend).makes_requests else None)
        return Call(backend or self.backend, ask, prompt, self.settings.policy, self.limits, repair, label,
                    self.setup.cache if key is not None else None, key, spending)

    def key(self, ask: RerankRequest, prompt: str, repair: bool | None = None) -> str | None:
        """The response cache's key of the session backend's call for `ask` (None without a cache)."""
        if self.setup.cache is None or not capabilities(self.backend).cacheable:
            return None
        repair = (not self.settings.strict) if repair is None else repair
        max_tokens = self.settings.policy.output_budget(ask, ask.top_k)
        identity = cast(Cacheable, self.backend).cache_identity(prompt, ask, max_tokens)
        return call_key(identity, ask.top_k, self.limits, repair)


__all__ = ["Call", "Calls", "Flow", "Plan", "Progress", "Setup", "Step", "Work"]
