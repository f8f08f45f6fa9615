"""`Reranker`: the session a user holds, and the two drivers that run the engine's flow.

A session takes the configuration once (backend, model, base_url, api_key, embedder, and defaults
for every request option: fallback, policy, limits, layout, ...), builds the backend and the
embedder once (an SDK client and its connection pool, a sentence-transformers model), and reranks
many requests with them: `rerank` / `arerank`, `rerank_many` / `arerank_many`. Close it when done
(`with Reranker(...) as reranker:`, `async with`), or let `rerank()` / `arerank()` (`api.py`) make
a one-shot session per call, as httpx's `httpx.get` does with a `Client`.

The drivers are the only place where sync and async differ: `_run` executes the engine's steps
(`engine.Calls`, `engine.Work`, `engine.Progress`) with threads, `_arun` with awaits. Every
decision (windows, fallback, post-pass, meta) is in `engine.flow`, written once.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import lifecycle
from .backends.factory import backend_kwargs, capabilities, make_backend, model_of, name_of, resolve_embedder
from .cache import ResponseCache, recall, remember, resolve_cache
from .concurrency import (
    CALL_LIMIT,
    RequestSlots,
    call_slot,
    check_concurrency,
    hand_on_request_slot,
    run_coroutine,
)
from .cost import CostPlan, Spending, as_budget, as_prices, refuse, summed
from .engine import BATCH_SPENDING, cost_plan, flow, plan
from .errors import InputError, RerankError, Violation
from .guard.input import ChunkSource
from .lifecycle import Closing
from .models import RerankResult
from .observe import Observation, observed
from .options import REQUEST_OPTIONS, Options, check_names, check_options, request_call, split_options
from .retry import Outcome, acall_with_retries, call_with_retries
from .steps import Call, Calls, Flow, Progress, Setup, Step, Work
from .windows import WINDOW_PROGRESS

if TYPE_CHECKING:
    from .backends.base import Backend

Result = RerankResult | Exception


class Reranker(Closing):
    """A reranking session: configured once, used for many requests (module docstring).

    `backend` is "local" (offline, deterministic; the default), "openai" (any OpenAI-compatible
    server through `base_url`), "anthropic", "cross-encoder", "rerank-api", or a backend instance
    (kept open: it is the caller's). `embedder` drives MMR similarity ("lexical", the default;
    "sentence-transformers[:MODEL]", "openai[:MODEL]", or an Embedder). `backend_options` carries a
    named backend's own knobs (timeout, temperature, batch_size, ...). Every other keyword is the
    session's default for that request option (`top_k`, `lambda_`, `fallback`, `policy`, `limits`,
    `layout`, `duplicate_threshold`, `strict`, `window_size`, `concurrency`, the `meta_*` options,
    `embed_meta_fields`); a call may override any of them.

    Bad configuration is an `InputError` naming every problem, raised here, before any request.
    What the session built from names (the backend's HTTP clients, an embedder's connections) is
    closed by `close()` / `aclose()`; objects passed in are the caller's and stay open.
    """

    def __init__(self, backend: str | Backend = "local", *, model: str | None = None,
                 base_url: str | None = None, api_key: str | None = None, embedder: Any = "lexical",
                 backend_options: Mapping[str, Any] | None = None,
                 cache: bool | str | os.PathLike[str] | ResponseCache | None = None, **defaults: Any) -> None:
        check_names(defaults, REQUEST_OPTIONS)
        self._defaults = Options(**defaults)
        self._given = frozenset(defaults)  # request options the session sets (a batch line may not, but some)
        check_options(self._defaults)
        self._embedder = resolve_embedder(embedder, backend, base_url)
        self._backend = make_backend(backend, model=model, base_url=base_url, api_key=api_key,
                                     embedder=self._embedder, **backend_kwargs(backend, backend_options))
        name = backend if isinstance(backend, str) else name_of(self._backend)
        self._cache = resolve_cache(cache)
        # What the session built is its own to close; objects passed in stay the caller's.
        self._owned: list[Any] = [obj for obj, spec in ((self._backend, backend), (self._embedder, embedder))
                                  if isinstance(spec, str)]
        if self._cache is not None and not isinstance(cache, ResponseCache):
            self._owned.append(self._cache)
        self._setup = Setup(self._backend, name, self._embedder, api_key, self._cache)

    def __repr__(self) -> str:
        embedder = getattr(self._embedder, "name", self._embedder)
        return f"Reranker(backend={self._backend!r}, embedder={embedder!r})"

    @property
    def backend(self) -> Backend:
        """The backend every request of this session is scored by."""
        return self._backend

    @property
    def embedder(self) -> Any:
        """The embedder of the post-pass (and of the local backend's scoring)."""
        return self._embedder

    @property
    def cache(self) -> ResponseCache | None:
        """The response cache every call of this session reads and writes (None without one)."""
        return self._cache

    @property
    def backend_name(self) -> str:
        """The backend's name as the caller gave it (`meta.backend` of every result)."""
        return self._setup.backend_name

    @property
    def defaults(self) -> Options:
        """The session's request options, before a call's own."""
        return self._defaults

    def options(self, **overrides: Any) -> Options:
        """The options a call with these keywords runs with: the session's, then the call's."""
        return self._defaults.merged(overrides)

    # --- one request -------------------------------------------------------------------------

    def _call_options(self, top_k: int | None, lambda_: float | None, options: Mapping[str, Any]) -> Options:
        # One merge (each copies every option: 10 us): top_k and lambda_ are parameters of their
        # own, so `options` never names them.
        given = {**options, **({"top_k": top_k} if top_k is not None else {}),
                 **({"lambda_": lambda_} if lambda_ is not None else {})}
        return self._defaults.merged(given)

    def flow(self, query: Any, chunks: ChunkSource, top_k: int | None = None, lambda_: float | None = None,
             **options: Any) -> Flow:
        """The engine's flow for one request (for a custom driver); `rerank` runs it."""
        return flow(plan(self._setup, query, chunks, self._call_options(top_k, lambda_, options)))

    def rerank(self, query: str, chunks: ChunkSource, top_k: int | None = None, lambda_: float | None = None,
               **options: Any) -> RerankResult:
        """Rerank `chunks` for `query`: at most `top_k` ranked (default 5), MMR with `lambda_`
        (default 0.7). `options` override the session's request options for this call.

        Raises `InputError` for bad input and `BackendError` (every attempt attached) when the
        backend fails and there is no fallback."""
        with observed(self.backend_name) as seen:
            result = _run(self._observed_flow(seen, query, chunks, top_k, lambda_, options))
            seen.done(result)
            return result

    async def arerank(self, query: str, chunks: ChunkSource, top_k: int | None = None,
                      lambda_: float | None = None, **options: Any) -> RerankResult:
        """`rerank` for asyncio: the backend calls are awaited, so many requests share one loop."""
        with observed(self.backend_name) as seen:
            if _heavy_plan(chunks, options, self._defaults):
                # Shortening long chunks costs milliseconds a chunk: off the event loop, which other
                # requests (a server's health check) share.
                steps = await off_loop(self._observed_flow, seen, query, chunks, top_k, lambda_, options)
            else:
                steps = self._observed_flow(seen, query, chunks, top_k, lambda_, options)
            result = await _arun(steps)
            seen.done(result)
            return result

    def _observed_flow(self, seen: Observation, query: Any, chunks: ChunkSource, top_k: int | None,
                       lambda_: float | None, options: Mapping[str, Any]) -> Flow:
        """`flow`, with the planned request told to the observation (its span's facts, `observe.py`)."""
        planned = plan(self._setup, query, chunks, self._call_options(top_k, lambda_, options))
        seen.planned(planned.request, model_of(self._backend))
        return flow(planned)

    def plan(self, query: str, chunks: ChunkSource, top_k: int | None = None, lambda_: float | None = None,
             **options: Any) -> CostPlan:
        """What `rerank` with these arguments would do and cost, without any request (`cost.py`):
        calls, round trips, re-ask bound, estimated tokens, the cost from `prices=`, and which
        limits of `budget=` it would cross (`exceeded`; `rerank` would refuse it)."""
        return cost_plan(plan(self._setup, query, chunks, self._call_options(top_k, lambda_, options),
                              enforce=False))

    def prompt(self, query: str, chunks: ChunkSource, top_k: int | None = None, lambda_: float | None = None,
               **options: Any) -> str:
        """The prompt an LLM backend would be sent for this request, byte for byte: checked, long
        chunks shown as their evidence, metadata embedded (what `rag-rerank render` prints). A request
        split into windows (`window_size`) has a prompt per window, so it is an `InputError` here."""
        planned = plan(self._setup, query, chunks, self._call_options(top_k, lambda_, options), enforce=False)
        if planned.window_size is not None:
            msg = "a request in windows has one prompt per window, not one prompt"
            raise InputError([Violation(path="window_size", value=planned.window_size, message=msg)])
        return planned.prompt

    # --- many requests -----------------------------------------------------------------------

    def plan_many(self, requests: Iterable[Mapping[str, Any] | Exception], *, concurrency: int = 4,
                  budget: Any = None, prices: Any = None,
                  on_invalid: Callable[[int, Exception], Any] | None = None) -> CostPlan:
        """What `rerank_many` of these requests would do and cost, summed, without any request;
        `exceeded` names each limit of the batch's `budget` it would cross, and `round_trips`
        counts the waves of `concurrency` requests (`cost.waves`). A request that is not valid is
        left out (it would fail without a call); `on_invalid(index, error)` is told of each one,
        with the error the run would report for it."""
        prices = as_prices(prices if prices is not None else self._defaults.prices)
        budget = as_budget(budget, prices)
        plans = []
        for index, item in enumerate(requests):
            if isinstance(item, Exception):
                if on_invalid is not None:
                    on_invalid(index, item)
                continue
            try:
                args, options = request_call(item, self._given)
                plans.append(self.plan(*args, **{"concurrency": concurrency, "prices": prices, **options}))
            except RerankError as exc:  # an invalid request: the run reports it as that request's error
                if on_invalid is not None:
                    on_invalid(index, exc)
        return summed(plans, budget, self.backend_name, model_of(self._setup.backend),
                      concurrency=concurrency)

    async def arerank_many(self, requests: Iterable[Mapping[str, Any] | Exception], *, concurrency: int = 4,
                           progress: Callable[[int, int], None] | None = None,
                           on_done: Callable[[int, Result], Any] | None = None,
                           budget: Any = None, prices: Any = None) -> list[Result]:
        """Rerank every `{query, chunks, top_k?, lambda?, ...}` mapping with at most `concurrency`
        requests planned and sent, and as many backend calls, in flight (a request's windows share
        the bound); a request whose calls are done hands its slot on before its post-pass, and at
        most `concurrency` finish at once (`concurrency.RequestSlots`).

        Returns one entry per request, in input order: a `RerankResult`, or the exception that
        request raised (an `Exception` item is passed through as its own failure). A request may
        set its own request options (`options.request_call`). `progress(done, total)` and
        `on_done(index, result)` are called as each finishes.

        `budget` (a `Budget` or a mapping of its fields) bounds the whole batch: a batch whose plan
        (`plan_many`) exceeds it raises `BudgetError` before any request, and while it runs no
        re-ask or retry crosses it. `prices` (per million tokens) defaults to the session's."""
        items = list(requests)
        check_concurrency(concurrency)
        meter = None
        if budget is not None:
            total = self.plan_many(items, concurrency=concurrency, budget=budget, prices=prices)
            refuse(total, "the batch")
            assert total.budget is not None
            meter = Spending(total.budget, total.prices)
        results: list[Result | None] = [None] * len(items)
        slots = RequestSlots(concurrency)
        # The same bound on backend calls: a request with window_size makes several (concurrency.py).
        token = CALL_LIMIT.set(asyncio.Semaphore(concurrency))
        spending = BATCH_SPENDING.set(meter)
        done = 0

        async def one(index: int, item: Mapping[str, Any] | Exception) -> None:
            nonlocal done
            outcome: Result
            if isinstance(item, Exception):
                outcome = item
            else:
                async with slots.held():
                    try:
                        args, options = request_call(item, self._given)
                        outcome = await self.arerank(*args, **options)
                    except Exception as exc:  # recorded per request; one bad request never stops the rest
                        outcome = exc
            results[index] = outcome
            done += 1
            if progress is not None:
                progress(done, len(items))
            if on_done is not None:
                res = on_done(index, outcome)
                if asyncio.iscoroutine(res):
                    await res

        try:
            await asyncio.gather(*(one(i, it) for i, it in enumerate(items)))
        finally:
            CALL_LIMIT.reset(token)
            BATCH_SPENDING.reset(spending)
        return [r for r in results if r is not None]

    def rerank_many(self, requests: Iterable[Mapping[str, Any]], *, concurrency: int = 4,
                    progress: Callable[[int, int], None] | None = None, budget: Any = None,
                    prices: Any = None) -> list[Result]:
        """`arerank_many` from synchronous code (its own event loop, closed afterwards)."""

        async def run() -> list[Result]:
            try:
                return await self.arerank_many(requests, concurrency=concurrency, progress=progress,
                                               budget=budget, prices=prices)
            finally:  # this loop's async clients, closed on it; the session stays usable
                await self.release_loop()

        return run_coroutine(run())

    # --- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close what this session built from names (HTTP clients); objects passed in stay open."""
        for obj in self._owned:
            lifecycle.close(obj)

    async def aclose(self) -> None:
        """`close` from async code: a backend's async client is closed on the loop it belongs to."""
        for obj in self._owned:
            await lifecycle.aclose(obj)

    async def release_loop(self) -> None:
        """Close the async clients made on the running loop, one about to end (`asyncio.run`): the
        session goes on, and a later loop gets clients of its own."""
        for obj in self._owned:
            await lifecycle.release_loop(obj)



class SessionCache:
    """A `Reranker` built on first use from a set of options and kept while its session options stay
    the same: what a framework component (whose fields may be reassigned) and the MCP server hold.
    Thread-safe. A copy or a pickle starts without one: it opens its own connections."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: dict[str, Any] | None = None
        self._session: Reranker | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (SessionCache, ())

    def get(self, options: Mapping[str, Any]) -> tuple[Reranker, dict[str, Any]]:
        """The session for `options` and the request options to pass on each call."""
        session, request = split_options(options)
        with self._lock:
            if self._session is None or self._key != session:
                self._session, self._key = Reranker(**session), session
            return self._session, request



# --------------------------------------------------------------------------- the two drivers


def _call(call: Call) -> Outcome | Exception:
    """One call: from the response cache when it holds the answer, else through the retry loop
    (and the new answer stored), with the time it took."""
    started = time.perf_counter()
    try:
        if call.cache is not None and call.key is not None:
            hit = recall(call.cache, call.key, call.ask, call.ask.top_k, call.limits, call.label)
            if hit is not None:
                return _timed(hit, started)
        outcome = call_with_retries(call.backend, call.ask, call.prompt, guard_top_k=call.ask.top_k,
                                    policy=call.policy, limits=call.limits, repair=call.repair,
                                    spending=call.spending, started=started)
        if call.cache is not None and call.key is not None:
            remember(call.cache, call.key, outcome)
        return outcome
    except Exception as exc:  # the engine decides what a failure means
        return exc


def _timed(outcome: Outcome, started: float) -> Outcome:
    """`outcome` with the time since `started` (`time.perf_counter()`) as its latency."""
    return outcome.with_latency((time.perf_counter() - started) * 1000.0)


def _calls(step: Calls) -> list[Outcome | Exception]:
    """The calls of a step, on a thread pool when several may run at once; the progress callback
    (a windowed request's) is told as each finishes."""
    progress = WINDOW_PROGRESS.get() if step.progress is not None else None
    offset, total = step.progress or (0, 0)
    if step.workers <= 1 or len(step.calls) <= 1:
        out = []
        for done, call in enumerate(step.calls, start=1):
            out.append(_call(call))
            if progress is not None:
                progress(offset + done, total)
        return out
    with ThreadPoolExecutor(max_workers=min(step.workers, len(step.calls)),
                            thread_name_prefix="rag-rerank-window") as pool:
        # Each call in a copy of the caller's context: a request id or a tracing span held in a
        # ContextVar (structlog, OpenTelemetry) stays on the call's logs and HTTP requests, as it
        # does for `arerank`'s tasks. (One copy per call: a context cannot be entered twice at once.)
        futures = [pool.submit(contextvars.copy_context().run, _call, call) for call in step.calls]
        if progress is not None:
            for done, _ in enumerate(as_completed(futures), start=1):
                progress(offset + done, total)
        return [future.result() for future in futures]


@dataclass(frozen=True)
class _Done:
    result: RerankResult


def _advance(steps: Flow, send: Any, error: BaseException | None) -> Step | _Done:
    """The flow's next step, after sending it the last step's result (or throwing its error)."""
    try:
        return steps.throw(error) if error is not None else steps.send(send)
    except StopIteration as finished:
        return _Done(finished.value)


def _run(steps: Flow) -> RerankResult:
    """Run a flow in this thread: calls on threads, work inline."""
    send: Any = None
    error: BaseException | None = None
    while not isinstance(step := _advance(steps, send, error), _Done):
        send, error = None, None
        if isinstance(step, Calls):
            send = _calls(step)
        elif isinstance(step, Work):
            try:
                send = step.run()
            except Exception as exc:  # thrown back: the flow decides (the fallback of the post-pass)
                error = exc
        elif isinstance(step, Progress):
            report = WINDOW_PROGRESS.get()
            if report is not None:
                report(step.done, step.total)
    return step.result


async def _acall(call: Call, limit: asyncio.Semaphore | None) -> Outcome | Exception:
    """`_call` on the event loop; the cache's SQLite file is read and written in a worker thread.
    The latency counts from the moment the call has its slot (not the wait for one)."""
    try:
        if call.cache is not None and call.key is not None:
            started = time.perf_counter()
            hit = await asyncio.to_thread(recall, call.cache, call.key, call.ask, call.ask.top_k, call.limits,
                                          call.label)
            if hit is not None:
                return _timed(hit, started)
        async with call_slot(limit):  # inside a batch, the batch's bound on calls in flight
            started = time.perf_counter()
            outcome = await acall_with_retries(call.backend, call.ask, call.prompt,
                                               guard_top_k=call.ask.top_k, policy=call.policy,
                                               limits=call.limits, repair=call.repair,
                                               spending=call.spending, started=started)
        if call.cache is not None and call.key is not None:
            await asyncio.to_thread(remember, call.cache, call.key, outcome)
        return outcome
    except Exception as exc:  # the engine decides what a failure means
        return exc


# Planning a request of this many characters or more (or one whose chunks may be cut to
# `max_tokens_per_chunk`) goes to a worker thread in `arerank`: checking text costs about 0.1 ms per
# 10,000 characters on the loop, a thread hop about as much, and choosing a long chunk's evidence
# milliseconds. 32,000 characters keeps a list of 50 ordinary passages (about 18,000) on the loop.
OFF_LOOP_CHARS = 32_000


def _heavy_plan(chunks: Any, options: Mapping[str, Any], defaults: Options) -> bool:
    """Whether planning this request may be heavy CPU work (see `OFF_LOOP_CHARS`); a source whose
    size is not known without reading it (a file, an iterator) counts as heavy."""
    if options.get("max_tokens_per_chunk", defaults.max_tokens_per_chunk) is not None:
        return True
    if isinstance(chunks, (str, bytes)):
        return len(chunks) >= OFF_LOOP_CHARS
    if not isinstance(chunks, (list, tuple)):
        return True
    size = 0
    for chunk in chunks:
        # A plain dict (a batch line's chunk) without the Mapping ABC's isinstance check.
        if type(chunk) is dict or isinstance(chunk, Mapping):
            text = chunk.get("text")
        else:
            text = getattr(chunk, "text", None)
        if isinstance(text, str):
            size += len(text)
    return size >= OFF_LOOP_CHARS


async def off_loop(work: Callable[..., Any], *args: Any) -> Any:
    """`work(*args)` in a worker thread of the loop's default executor (in the caller's context), so
    CPU-bound work does not stop the event loop. A thread cannot be stopped: when the awaiting task is
    cancelled, the cancellation waits for the work's end before it is raised, so whoever awaits the
    task (a server holding an in-flight slot for it) knows when the work has really stopped."""
    loop = asyncio.get_running_loop()
    done = loop.run_in_executor(None, contextvars.copy_context().run, work, *args)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        await asyncio.wait([done])
        if not done.cancelled():
            done.exception()  # retrieved: the caller gave up on the work, its error is not news
        raise


async def _arun(steps: Flow) -> RerankResult:
    """Run a flow on the running event loop: calls awaited together, heavy work in a thread."""
    send: Any = None
    error: BaseException | None = None
    limit: asyncio.Semaphore | None = None  # one per request, shared by its windows and final pass
    # Whether a call went to a server: only then does the post-pass overlap the next request's
    # call (a local scorer's call is CPU work on this process, as the post-pass is).
    remote = False
    while not isinstance(step := _advance(steps, send, error), _Done):
        send, error = None, None
        if isinstance(step, Calls):
            if step.limit is not None and limit is None:
                limit = asyncio.Semaphore(step.limit)
            remote = remote or any(capabilities(c.backend).makes_requests for c in step.calls)
            if len(step.calls) == 1:  # awaited here: a task of its own would cost a turn of the loop
                send = [await _acall(step.calls[0], limit if step.limit else None)]
            else:
                send = list(await asyncio.gather(*(_acall(c, limit if step.limit else None)
                                                   for c in step.calls)))
        elif isinstance(step, Work):
            if remote:  # in a batch, the next request waits on its server during this work
                await hand_on_request_slot()
            try:
                send = await off_loop(step.run) if step.heavy else step.run()
            except Exception as exc:
                error = exc
    return step.result


__all__ = ["Reranker", "Result", "SessionCache", "off_loop"]
