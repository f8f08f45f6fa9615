"""The single owner of retries: every failure is classified first, then handled by its own rule.

  transient  (429, 5xx but 501 and 505, 529 overloaded, timeouts, a connection reset or dropped)
             -> exponential backoff with jitter; a server's Retry-After / retry-after-ms wins
  invalid    (the output guard rejected the answer)
             -> re-ask, at most `max_reasks` times, quoting every violation to the model; never for
                a scored backend (`scored = True`: local, cross-encoder, rerank API), whose answers
                pass the guard by construction: a refusal there is an `InternalError`, a bug
  truncated  (finish_reason "length" / stop_reason "max_tokens" and not a valid answer)
             -> one retry with a larger output budget; not a re-ask, the model did nothing wrong
  fatal      (auth, bad request, not found, refusal; nothing to connect to: a refused connection
             or a host name that does not resolve, `UnreachableFailure`)
             -> fail fast

Everything is bounded three ways: attempts in total, attempts per kind, and a wall-clock
deadline: a wait that would cross the deadline is not started, and a call that is still running
when it comes is cut (async: cancelled; sync: the backend is given what is left of the deadline
as its request timeout, for backends whose `complete` takes `timeout`). tenacity drives the loop; the SDKs
run with max_retries=0 so no hidden second retry layer multiplies the attempts. Every attempt is
recorded as an `Attempt`, returned in `Outcome` or carried by the final `BackendError`;
`Attempt.wait_s` is the wait taken *after* that attempt, before the next one (0 for the last).
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception_type

from .backends.base import Backend, Completion
from .backends.factory import capabilities, model_of, name_of
from .cost import Spending, usage_tokens
from .errors import (
    Attempt,
    BackendError,
    BackendFailure,
    InputError,
    InternalError,
    TransientFailure,
    Violation,
)
from .frozen import direct_init
from .guard.limits import Limits
from .guard.output import judge, output_violations, parse_output
from .guard.repair import repair_output
from .models import RerankRequest, add_usage
from .tokens import answer_budget, answer_tokens, estimate_tokens
from .wording import counted

log = logging.getLogger("rag_rerank.retry")


def _default_uniform(a: float, b: float) -> float:
    return random.uniform(a, b)


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. The defaults suit a hosted API; tests inject `sleep` to observe waits.

    `max_tokens=None` estimates the output budget from the request (ids, top_k, chunk count).
    """

    max_attempts: int = 6
    max_reasks: int = 2
    max_truncation_retries: int = 1
    deadline_s: float = 120.0
    initial_wait_s: float = 0.5
    multiplier: float = 2.0
    max_wait_s: float = 20.0
    jitter_s: float = 0.25
    max_tokens: int | None = None
    max_tokens_cap: int = 8192
    truncation_factor: float = 2.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    asleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    uniform: Callable[[float, float], float] = field(default=_default_uniform, repr=False)

    def __post_init__(self) -> None:
        bad: list[Violation] = []

        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                bad.append(Violation(path=f"policy.{name}", message=rule, value=getattr(self, name)))

        need(isinstance(self.max_attempts, int) and self.max_attempts >= 1, "max_attempts",
             "must be an int >= 1")
        need(isinstance(self.max_reasks, int) and 0 <= self.max_reasks <= 5, "max_reasks",
             "must be an int in [0, 5]")
        need(isinstance(self.max_truncation_retries, int) and 0 <= self.max_truncation_retries <= 3,
             "max_truncation_retries", "must be an int in [0, 3]")
        need(self.deadline_s > 0, "deadline_s", "must be > 0 seconds")
        need(self.initial_wait_s >= 0, "initial_wait_s", "must be >= 0")
        need(self.multiplier >= 1, "multiplier", "must be >= 1")
        need(self.max_wait_s >= self.initial_wait_s, "max_wait_s", "must be >= initial_wait_s")
        need(self.jitter_s >= 0, "jitter_s", "must be >= 0")
        need(self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 16),
             "max_tokens", "must be None or an int >= 16")
        need(isinstance(self.max_tokens_cap, int) and self.max_tokens_cap >= 16, "max_tokens_cap",
             "must be an int >= 16")
        need(self.truncation_factor > 1, "truncation_factor", "must be > 1")
        if bad:
            raise InputError(bad, headline="invalid retry policy")

    def backoff(self, n: int) -> float:
        """Wait before the retry following the n-th transient failure (n >= 1), jitter included."""
        base = min(self.max_wait_s, self.initial_wait_s * self.multiplier ** (n - 1))
        return base + (self.uniform(0.0, self.jitter_s) if self.jitter_s else 0.0)

    def output_budget(self, request: RerankRequest, guard_top_k: int) -> int:
        """max_tokens for the first attempt: room for every chunk's entry plus slack."""
        if self.max_tokens is not None:
            return min(self.max_tokens, self.max_tokens_cap)
        return answer_budget(len(request.chunks), guard_top_k, request.ids, self.max_tokens_cap)


@direct_init
@dataclass(frozen=True)
class Outcome:
    """A guard-valid answer and how it was obtained."""

    obj: dict[str, Any]
    attempts: tuple[Attempt, ...]
    repairs: tuple[str, ...]
    usage: Mapping[str, int]
    model: str | None
    notes: tuple[str, ...] = ()
    text: str = ""  # the accepted raw text after repairs
    cached: bool = False  # answered by the response cache (`cache.py`): no request was made
    # How long the call took, retries and their waits included (the cache's read for a hit), as the
    # driver that made it measured it (`session.py`); `meta.windows[].latency_ms` reports it.
    latency_ms: float = 0.0
    decided: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # `Completion.decided`

    def with_latency(self, latency_ms: float) -> Outcome:
        """This outcome with its latency: what `dataclasses.replace(self, latency_ms=...)` makes,
        built field by field in order (every call's result passes here; `replace` reads the fields
        by reflection first: about 4 us a call)."""
        return Outcome(self.obj, self.attempts, self.repairs, self.usage, self.model, self.notes, self.text,
                       self.cached, latency_ms, self.decided)


# --- internal control flow -----------------------------------------------------------------

class _Retry(Exception):
    """An attempt failed in a way one of the retry rules handles."""

    def __init__(self, kind: str, retry_after: float | None = None) -> None:
        self.kind = kind
        self.retry_after = retry_after
        super().__init__(kind)


class _Fatal(Exception):
    """An attempt failed in a way no retry can fix."""


class _Refused(_Fatal):
    """The budget does not allow the next request (`cost.Spending`): it is not sent."""


class _Run:
    """Mutable state of one call_with_retries invocation (never shared between calls)."""

    def __init__(self, backend: Backend, request: RerankRequest, prompt: str, guard_top_k: int,
                 policy: RetryPolicy, limits: Limits | None, repair: bool, spending: Spending | None = None
                 ) -> None:
        self.backend, self.request, self.prompt = backend, request, prompt
        self.spending = spending
        self.reserved: tuple[int, int] | None = None  # the estimate `admit` holds in `spending`
        self.guard_top_k, self.policy, self.limits, self.repair = guard_top_k, policy, limits, repair
        self.attempts: list[Attempt] = []
        self.counts = {"transient": 0, "invalid_output": 0, "truncated": 0}
        self.feedback: tuple[Violation, ...] = ()
        self.previous: str | None = None
        self.max_tokens = policy.output_budget(request, guard_top_k)
        self.truncated_at: list[int] = []  # the max_tokens of each truncated attempt, in order
        self.reasoned = False  # a truncated answer came after the model's reasoning
        self.usage: dict[str, int] = {}
        self.notes: list[str] = []
        self.model: str | None = model_of(backend)
        self.started = policy.clock()
        # Declared by the backend (`Capabilities`): its calls take what is left of the deadline.
        self.bounded = capabilities(backend).timeout
        self.stop_reason = ""
        # The accepted answer (object, repairs, text, the passages that decided scores): `success`
        # makes the Outcome of it, once.
        self.accepted: tuple[dict[str, Any], tuple[str, ...], str, Mapping[str, Any]] | None = None
        self.began = time.time_ns()  # when the current attempt started (its span's start)
        self.answered: dict[str, Any] = {}  # what the current attempt's completion said (usage, model)

    @property
    def name(self) -> str:
        return name_of(self.backend)

    def elapsed(self) -> float:
        return self.policy.clock() - self.started

    def remaining(self) -> float:
        return self.policy.deadline_s - self.elapsed()

    def call_kwargs(self, sync: bool = True) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"max_tokens": self.max_tokens, "feedback": self.feedback,
                                  "previous": self.previous}
        if sync and self.bounded:
            # A blocking call cannot be cancelled from outside: the HTTP client itself must give up
            # when the deadline comes, not after its own (60 s) timeout.
            kwargs["timeout"] = max(self.remaining(), 0.001)
        return kwargs

    def record(self, kind: str, detail: str, violations: tuple[Violation, ...] = (), *,
               status: int | None = None, retry_after: float | None = None) -> None:
        self.attempts.append(Attempt(number=len(self.attempts) + 1, kind=kind, detail=detail,
                                     violations=violations, start_ns=self.began, end_ns=time.time_ns(),
                                     status=status, retry_after=retry_after, **self.answered))
        self.answered = {}
        if kind != "ok":  # the kind and class only: a detail may quote the answer, and so the chunks
            log.info("%s attempt %d %s%s", self.name, len(self.attempts), kind,
                     f" ({self.attempts[-1].error_type})" if self.attempts[-1].error_type else "")

    def estimate(self) -> tuple[int, int]:
        """(prompt, completion) tokens of the next attempt, estimated (`cost.py`): the prompt, and on
        a re-ask the rejected answer and the violations quoted back."""
        prompt = estimate_tokens(self.prompt) + (estimate_tokens(self.previous) if self.previous else 0)
        prompt += 30 * len(self.feedback)
        return prompt, answer_tokens(len(self.request.chunks), self.guard_top_k, self.request.ids)

    def admit(self) -> None:
        """Before each request: raise `_Refused` when it would cross the budget (a batch's budget is
        shared, so even a call's first request may find it spent)."""
        self.began = time.time_ns()
        if self.spending is None:
            return
        self.reserved = self.estimate()
        refusal = self.spending.reserve(self.reserved)
        if refusal is not None:
            self.reserved = None
            last = self.attempts[-1].kind if self.attempts else None
            what = {None: "request", "invalid_output": "re-ask",
                    "truncated": "retry with a larger budget"}.get(last, "retry")
            self.stop_reason = f"{refusal}: no {what} sent"
            raise _Refused(self.stop_reason)

    def spent(self, usage: Mapping[str, int] | None) -> None:
        """One request made, for the budget: its reported tokens (none for a failed request)."""
        if self.spending is not None:
            tokens = usage_tokens(usage or {})
            self.spending.record(tokens if any(tokens) or usage is None else self.estimate(), self.reserved)
            self.reserved = None

    def failed(self, exc: BaseException) -> None:
        """Classify a backend exception; always raises."""
        self.spent(None)
        # `error.type` of its span: the HTTP status when there was one (low-cardinality, as the
        # conventions ask), else the failure's class.
        status = getattr(exc, "status", None)
        self.answered = {"error_type": str(status) if status else type(exc).__name__}
        if isinstance(exc, TransientFailure):
            self.counts["transient"] += 1
            detail = str(exc)
            if self.remaining() <= 0 and "deadline" not in detail:
                detail += f" (cut when the deadline of {self.policy.deadline_s:g}s was crossed)"
            self.record("transient", detail, status=exc.status, retry_after=exc.retry_after)
            raise _Retry("transient", exc.retry_after)
        if isinstance(exc, BackendFailure):
            self.record("fatal", str(exc), status=exc.status)
            raise _Fatal(str(exc))
        raise exc

    def judge(self, completion: Completion) -> None:
        """Accept a completion (sets self.accepted) or raise _Retry for a re-ask / larger budget."""
        self.spent(completion.usage)
        self.answered = {"usage": dict(completion.usage), "model": completion.model,
                         "finish_reason": completion.finish_reason}
        self.usage = add_usage(self.usage, completion.usage)
        if completion.notes:  # seldom (a negotiation's downgrade): no generator made for none
            self.notes.extend(n for n in completion.notes if n not in self.notes)
        if completion.model:
            self.model = completion.model
        raw = completion.text
        repairs: tuple[str, ...] = ()
        text = raw
        parsed, problems = parse_output(raw) if self.repair else (None, [])
        if parsed is not None and not problems:
            # One bare JSON object, nothing around it (nearly every answer): the repair would find
            # that object and return the stripped text unchanged, after decoding it once more.
            text = raw.strip()
            obj, violations = parsed, output_violations(parsed, self.request.chunks, self.guard_top_k,
                                                        limits=self.limits, query=self.request.query)
        else:
            if self.repair:
                fixed = repair_output(raw)
                text, repairs = fixed.text, fixed.repairs
            obj, violations = judge(text, self.request.chunks, self.guard_top_k, limits=self.limits,
                                    query=self.request.query)
        if obj is not None and not violations:
            detail = f"valid answer (finish_reason {completion.finish_reason}, max_tokens {self.max_tokens})"
            if repairs:
                detail += f"; repaired: {'; '.join(repairs)}"
            self.record("ok", detail)
            self.accepted = (obj, repairs, text, completion.decided)
            return
        if completion.finish_reason == "length":
            self.counts["truncated"] += 1
            self.truncated_at.append(self.max_tokens)
            thought = (f", after {counted(completion.reasoning_chars, 'character')} of reasoning"
                       if completion.reasoning_chars else "")
            self.record("truncated", f"output cut off at max_tokens={self.max_tokens} "
                                     f"({counted(len(raw), 'character')} received{thought})",
                        tuple(violations))
            self.reasoned = self.reasoned or bool(completion.reasoning_chars)
            bigger = int(self.max_tokens * self.policy.truncation_factor)
            self.max_tokens = min(self.policy.max_tokens_cap, max(self.max_tokens + 1, bigger))
            raise _Retry("truncated")
        if capabilities(self.backend).scored:  # read now: openai's scoring="auto" decides on a call
            # A scored backend's answer passes the guard by construction (backends/scored.py), and
            # a re-ask of a deterministic scorer could only repeat it: a refusal here is our bug.
            raise InternalError(f"{self.name} wrote an answer its own output guard refuses", violations)
        self.counts["invalid_output"] += 1
        first = str(violations[0]) if violations else "no JSON object"
        detail = f"{counted(len(violations), 'violation')}, first: {first}"[:300]
        self.record("invalid_output", detail, tuple(violations))
        self.feedback = tuple(violations)
        self.previous = raw
        raise _Retry("invalid_output")

    # --- tenacity hooks ------------------------------------------------------------------
    def wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if not isinstance(exc, _Retry) or exc.kind != "transient":
            return 0.0
        if exc.retry_after is not None:
            return float(exc.retry_after)
        return self.policy.backoff(self.counts["transient"])

    def stop(self, state: RetryCallState) -> bool:
        exc = state.outcome.exception() if state.outcome else None
        kind = exc.kind if isinstance(exc, _Retry) else "transient"
        p = self.policy
        upcoming = float(state.upcoming_sleep or 0.0)
        reason = ""
        if kind == "invalid_output" and self.counts["invalid_output"] > p.max_reasks:
            reason = f"the output was still invalid after {counted(p.max_reasks, 're-ask')}"
        elif kind == "truncated" and self.counts["truncated"] > p.max_truncation_retries:
            used = ", ".join(str(n) for n in dict.fromkeys(self.truncated_at))
            reason = f"the output was still truncated at max_tokens={used}"
            if self.reasoned:
                # A reasoning model spends the budget thinking before it writes the answer.
                reason += ("; the model's reasoning used the budget: give it more with "
                           "RetryPolicy(max_tokens=N) (CLI --max-tokens N)")
        elif len(self.attempts) >= p.max_attempts:
            reason = f"max_attempts={p.max_attempts} reached"
        elif self.elapsed() >= p.deadline_s:
            reason = f"the deadline of {p.deadline_s:g}s was crossed (elapsed {self.elapsed():.2f}s)"
        elif self.elapsed() + upcoming > p.deadline_s:
            reason = (f"the deadline of {p.deadline_s:g}s would be crossed by the next wait "
                      f"(elapsed {self.elapsed():.2f}s, next wait {upcoming:.2f}s)")
        if reason:
            self.stop_reason = reason
            return True
        last = self.attempts[-1]
        self.attempts[-1] = replace(last, wait_s=upcoming)
        if upcoming:
            log.info("%s: waiting %.2fs before attempt %d", self.name, upcoming, len(self.attempts) + 1)
        return False

    def retrying_kwargs(self) -> dict[str, Any]:
        return {"retry": retry_if_exception_type(_Retry), "wait": self.wait, "stop": self.stop,
                "reraise": True}

    # --- results -------------------------------------------------------------------------
    def success(self, started: float | None) -> Outcome:
        """The accepted answer's Outcome, its latency counted from `started` (the driver's
        `time.perf_counter()` when the call began; 0.0 without), so it is made once."""
        assert self.accepted is not None
        obj, repairs, text, decided = self.accepted
        latency_ms = 0.0 if started is None else (time.perf_counter() - started) * 1000.0
        return Outcome(obj=obj, attempts=tuple(self.attempts), repairs=repairs, usage=dict(self.usage),
                       model=self.model, notes=tuple(self.notes), text=text, latency_ms=latency_ms,
                       decided=decided)

    def failure(self, exc: BaseException) -> BackendError:
        if isinstance(exc, _Refused):
            why = self.stop_reason
        elif isinstance(exc, _Fatal):
            why = "fatal error, not retried"
        else:
            why = self.stop_reason or "retries exhausted"
        n = len(self.attempts)
        return BackendError(f"{self.name}: no valid answer after {n} attempt{'s' if n != 1 else ''} ({why})",
                            self.attempts, usage=self.usage, refused=isinstance(exc, _Refused))


def call_with_retries(
    backend: Backend,
    request: RerankRequest,
    prompt: str,
    *,
    guard_top_k: int,
    policy: RetryPolicy | None = None,
    limits: Limits | None = None,
    repair: bool = True,
    spending: Spending | None = None,
    started: float | None = None,
) -> Outcome:
    """A guard-valid answer from `backend`, or BackendError carrying every attempt.

    `guard_top_k` is how many ranked items the output guard allows (the pipeline may ask the model
    for more candidates than the caller's top_k and let the post-pass choose). `started` is the
    driver's `time.perf_counter()` when the call began: the Outcome's `latency_ms` counts from it
    (0.0 without one), set as the Outcome is made rather than by a copy afterwards.
    """
    run = _Run(backend, request, prompt, guard_top_k, policy or RetryPolicy(), limits, repair, spending)

    def attempt_once() -> None:
        run.admit()
        try:
            completion = backend.complete(prompt, request, **run.call_kwargs())
        except BackendFailure as exc:
            run.failed(exc)
        run.judge(completion)

    try:
        try:
            # Nearly every call's first attempt is accepted: it is made before tenacity's loop, which
            # costs about 70 µs to build (a tenth of our own work in a call) and is built only after
            # a failure. That failure is then raised again as the loop's first attempt, so tenacity
            # waits, stops or tries again exactly as if it had made the attempt itself (its `wait`
            # and `stop` read only the exception and `_Run`'s own counts and clock).
            attempt_once()
            return run.success(started)
        except _Retry as exc:
            first: _Retry | None = exc
        for attempt in Retrying(sleep=run.policy.sleep, **run.retrying_kwargs()):
            with attempt:
                if first is not None:
                    failed, first = first, None
                    raise failed
                attempt_once()
    except (_Retry, _Fatal) as exc:
        raise run.failure(exc) from None
    return run.success(started)


if sys.version_info >= (3, 11):

    async def _within(call: Awaitable[Completion], timeout: float) -> Completion:
        """`call`, cancelled and `TimeoutError` raised when `timeout` seconds pass: as
        `asyncio.wait_for`, without the task it wraps the call in (about 25 us a call)."""
        async with asyncio.timeout(timeout):
            return await call
else:  # Python 3.10 has no asyncio.timeout
    _within = asyncio.wait_for


async def acall_with_retries(
    backend: Backend,
    request: RerankRequest,
    prompt: str,
    *,
    guard_top_k: int,
    policy: RetryPolicy | None = None,
    limits: Limits | None = None,
    repair: bool = True,
    spending: Spending | None = None,
    started: float | None = None,
) -> Outcome:
    """The asyncio variant; here the deadline also cuts a call that is still running."""
    run = _Run(backend, request, prompt, guard_top_k, policy or RetryPolicy(), limits, repair, spending)

    async def attempt_once() -> None:
        run.admit()
        remaining = run.policy.deadline_s - run.elapsed()
        try:
            completion = await _within(backend.acomplete(prompt, request, **run.call_kwargs(sync=False)),
                                       max(remaining, 0.001))
        except asyncio.TimeoutError:
            run.failed(TransientFailure(f"{run.name}: call still running when the deadline "
                                        f"of {run.policy.deadline_s:g}s was crossed"))
        except BackendFailure as exc:
            run.failed(exc)
        run.judge(completion)

    try:
        try:
            await attempt_once()  # as in call_with_retries: the loop only after a failure
            return run.success(started)
        except _Retry as exc:
            first: _Retry | None = exc
        async for attempt in AsyncRetrying(sleep=run.policy.asleep, **run.retrying_kwargs()):
            with attempt:
                if first is not None:
                    failed, first = first, None
                    raise failed
                await attempt_once()
    except (_Retry, _Fatal) as exc:
        raise run.failure(exc) from None
    return run.success(started)


__all__ = ["Outcome", "RetryPolicy", "acall_with_retries", "call_with_retries"]
