"""What a rerank will cost before it is run: calls, round trips, tokens, money, and the budget it must fit.

An LLM reranker bills every call. `rag_rerank.plan(query, chunks, **options)` (CLI `--dry-run`)
answers, without any request, how many calls a rerank makes (one, or one per window plus the
final pass), in how many round trips, how many re-asks it may add at most, the estimated prompt
and completion tokens, and, from a price table the caller gives (per million input and output
tokens; no price is written in this package), the estimated cost. `budget=` (max calls, max
tokens, max cost) refuses a rerank or a batch whose plan exceeds it, before the first request,
with a `BudgetError` naming the limit; and while it runs, a re-ask or a retry that would cross a
limit is not sent (the call fails with that reason, so `fallback="local"` can still answer).

Tokens are estimated offline, without a tokenizer download: pieces of a GPT-2 style
pre-tokenizer (a word, a number, a run of punctuation), with long words and non-Latin text
counted by length. docs/cost.md gives the measured error against a real server's reported usage
(`bench/tokens.py`). Completion tokens are estimated from what the card asks the model to write
(an entry per ranked chunk with a reason, a short one per dropped chunk).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .backends.common import DATA_NOTICE
from .errors import BudgetError, InputError, Violation
from .models import RerankRequest

# One piece of a GPT-2 style pre-tokenizer: a contraction, a run of letters, of digits, of other
# symbols (each optionally after one space), or a run of white space.
_PIECE = re.compile(r"""'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+""", re.UNICODE)
# A run of letters longer than this is split by BPE into about one token per this many characters:
# the largest value (0.1 steps) at which the estimate is not below SmolLM2's tokenizer on average over
# bench/tokens.py's development requests (even DL19 queries); the other splits are only reported.
_WORD_CHARS = 5.0
_ASCII_RUN = re.compile(r"[\x00-\x7f]+|[^\x00-\x7f]+")
# Messages carry a few tokens each of chat template (role markers, separators).
MESSAGE_OVERHEAD = 4
# What the model writes per entry besides the id: `{"id": , "score": 0.93, "reason": ""},` is about
# 16 tokens, a ranked entry's reason about 24 more (the card asks for a short, concrete one); a
# dropped entry's reason is a code (`off_topic`, `redundant_with:<id>`).
RANKED_ENTRY_TOKENS = 40
DROPPED_ENTRY_TOKENS = 14
ANSWER_OVERHEAD_TOKENS = 12


def estimate_tokens(text: str) -> int:
    """Tokens a BPE tokenizer makes of `text`, estimated offline (module docstring)."""
    total = 0.0
    for match in _PIECE.finditer(text):
        piece = match.group()
        if piece.isspace():
            total += 1 if "\n" in piece or len(piece) > 1 else 0
            continue
        core = piece.lstrip(" ")
        if not core.isascii():
            total += _non_ascii_tokens(core)
        elif core[0].isalpha():
            total += max(1.0, len(core) / _WORD_CHARS)
        elif core[0].isdigit():
            total += math.ceil(len(core) / 3)
        else:
            total += max(1.0, len(core) / 2)
    return math.ceil(total)


def _non_ascii_tokens(core: str) -> float:
    """A piece holding non-ASCII characters. Byte-level BPE vocabularies learnt mostly from English
    seldom merge across a non-ASCII character: each ASCII stretch between two costs as an ASCII word
    of its length, each other letter (accented Latin, CJK, Cyrillic, Greek) about a token, and a
    combining mark (decomposed accents), a control or format character (web mojibake:
    `\u00e2\u0080\u0099`) or a symbol about a token per UTF-8 byte."""
    total = 0.0
    for run in _ASCII_RUN.findall(core):
        if run.isascii():
            total += max(1.0, len(run) / _WORD_CHARS)
        else:
            total += sum(1 if ch.isalpha() else len(ch.encode("utf-8")) for ch in run)
    return max(1.0, total)


def estimate_answer_tokens(n_chunks: int, top_k: int, ids: Sequence[str]) -> int:
    """Completion tokens of a card's answer for `n_chunks` chunks of which `top_k` are ranked."""
    ranked = min(top_k, n_chunks)
    id_tokens = sum(estimate_tokens(i) for i in ids)
    entries = ranked * RANKED_ENTRY_TOKENS + (n_chunks - ranked) * DROPPED_ENTRY_TOKENS
    return ANSWER_OVERHEAD_TOKENS + entries + id_tokens


def makes_requests(backend: Any) -> bool:
    """Whether `backend` sends billed requests: an LLM, or a scored backend that calls a server (a
    rerank API, which says what it sends); not the local scorers (local, cross-encoder)."""
    return not getattr(backend, "scored", False) or callable(getattr(backend, "cache_identity", None))


def request_tokens(backend: Any, prompt: str, ask: RerankRequest) -> tuple[int, int]:
    """(prompt, completion) tokens of one request of `backend` for `ask`, estimated: an LLM reads
    the data notice and the prompt and writes the card's answer; a rerank API reads the query
    with each document and writes no tokens."""
    if getattr(backend, "scored", False):
        query = estimate_tokens(ask.query)
        return sum(query + estimate_tokens(c.text) for c in ask.chunks), 0
    prompt_tokens = 2 * MESSAGE_OVERHEAD + estimate_tokens(DATA_NOTICE) + estimate_tokens(prompt)
    return prompt_tokens, estimate_answer_tokens(len(ask.chunks), ask.top_k, ask.ids)


# --------------------------------------------------------------------------- prices and budgets


@dataclass(frozen=True)
class Prices:
    """What a provider charges, per million input (prompt) and output (completion) tokens, in the
    caller's currency. Give your provider's current prices: none are written in this package."""

    input_per_million: float
    output_per_million: float

    def cost(self, prompt_tokens: float, completion_tokens: float) -> float:
        return (prompt_tokens * self.input_per_million + completion_tokens * self.output_per_million) / 1e6


@dataclass(frozen=True)
class Budget:
    """The most a rerank (or a batch) may spend: backend requests (`max_calls`: first attempts,
    re-asks and retries), tokens (`max_tokens`: prompt plus completion) and money (`max_cost`, in
    the currency of `prices`). None: no limit."""

    max_calls: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.max_calls, self.max_tokens, self.max_cost))


def as_prices(value: Any, path: str = "prices") -> Prices | None:
    """The `prices=` option: a `Prices`, a mapping `{"input": X, "output": Y}` (per million tokens)
    or None; anything else an `InputError` naming it."""
    if value is None or isinstance(value, Prices):
        return value
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in ("input", "output")]
        got = {k: value.get(k) for k in ("input", "output")}
        bad = [Violation(path=f"{path}.{k}", value=v, message="must be a number >= 0 (per million tokens)")
               for k, v in got.items() if not _amount(v)]
        bad += [Violation(path=f"{path}.{k}", message=f"unknown key {k!r} (a price table has input, output)")
                for k in unknown]
        if bad:
            raise InputError(bad)
        return Prices(float(got["input"]), float(got["output"]))  # type: ignore[arg-type]
    raise InputError([Violation(path=path, value=repr(value)[:80],
                                message="prices must be a Prices or {'input': X, 'output': Y} per million "
                                "tokens")])


def as_budget(value: Any, prices: Prices | None, path: str = "budget") -> Budget | None:
    """The `budget=` option: a `Budget`, a mapping of its fields, or None. A cost limit needs prices."""
    if value is None:
        return None
    bad = []
    if isinstance(value, Mapping):
        fields = ("max_calls", "max_tokens", "max_cost")
        bad += [Violation(path=f"{path}.{k}", message=f"unknown key {k!r} (a budget has max_calls, "
                          "max_tokens, max_cost)") for k in value if k not in fields]
        value = Budget(**{k: v for k, v in value.items() if k in fields})
    if not isinstance(value, Budget):
        raise InputError([Violation(path=path, value=repr(value)[:80],
                                    message="budget must be a Budget or {max_calls?, max_tokens?, "
                                    "max_cost?}")])
    for name in ("max_calls", "max_tokens"):
        v = getattr(value, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            bad.append(Violation(path=f"{path}.{name}", value=v, message="must be None or an int >= 0"))
    if value.max_cost is not None and not _amount(value.max_cost):
        bad.append(Violation(path=f"{path}.max_cost", value=value.max_cost,
                             message="must be None or a number >= 0"))
    if value.max_cost is not None and prices is None:
        bad.append(Violation(path=f"{path}.max_cost", message="a cost limit needs prices= (per million input "
                             "and output tokens; CLI --price-input / --price-output)"))
    if bad:
        raise InputError(bad)
    return value


def _amount(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class CallEstimate:
    """One planned call: a window, the final pass, or the only call."""

    stage: str  # "call", "window" or "final"
    chunks: int
    prompt_tokens: int
    completion_tokens: int
    max_tokens: int  # the output budget of its first attempt
    cached: bool = False  # the response cache holds its answer now (known before any call)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class CostPlan:
    """What a rerank will do and cost, before any request (module docstring).

    `calls` is what `meta.calls` will say (windows plus the final pass, or 1); `requests` the calls
    that reach a server (not the local scorers, not cache hits known now); `round_trips` the
    sequential waves (windows in flight `concurrency` at a time, then the final pass); `max_reasks`
    the most re-asks the retry policy allows (scored backends are never re-asked); `max_requests`
    the most requests with every retry. Tokens are estimates (`estimate_tokens`) and count only
    requests; `cost` is None without `prices`. `exceeded` names each budget limit the plan crosses.
    A windowed plan counts the final pass with as many chunks as a window: the survivors are at
    most that many (fewer, and no final call at all when no chunk scores above the minimum)."""

    backend: str
    model: str | None
    calls: int
    requests: int
    round_trips: int
    max_reasks: int
    max_requests: int
    prompt_tokens: int
    completion_tokens: int
    max_completion_tokens: int
    cost: float | None = None
    prices: Prices | None = None
    budget: Budget | None = None
    exceeded: tuple[str, ...] = ()
    estimates: tuple[CallEstimate, ...] = field(default=(), repr=False)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def within_budget(self) -> bool:
        return not self.exceeded

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "model": self.model, "calls": self.calls, "requests": self.requests,
            "cached": sum(e.cached for e in self.estimates), "round_trips": self.round_trips,
            "max_reasks": self.max_reasks, "max_requests": self.max_requests,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens, "max_completion_tokens": self.max_completion_tokens,
            "cost": None if self.cost is None else round(self.cost, 6),
            "prices": None if self.prices is None else dict(self.prices.__dict__),
            "budget": None if self.budget is None else dict(self.budget.__dict__),
            "exceeded": list(self.exceeded),
            "calls_planned": [e.to_dict() for e in self.estimates],
        }


def over_budget(budget: Budget | None, calls: int, tokens: int, cost: float | None) -> tuple[str, ...]:
    """Each limit of `budget` that `calls` requests, `tokens` tokens and `cost` would cross, in words."""
    if not budget:
        return ()
    out = []
    if budget.max_calls is not None and calls > budget.max_calls:
        out.append(f"max_calls={budget.max_calls}: the plan makes {calls} requests")
    if budget.max_tokens is not None and tokens > budget.max_tokens:
        out.append(f"max_tokens={budget.max_tokens}: the plan uses about {tokens} tokens")
    if budget.max_cost is not None and cost is not None and cost > budget.max_cost:
        out.append(f"max_cost={budget.max_cost:g}: the plan costs about {cost:.6g}")
    return tuple(out)


@dataclass(frozen=True)
class PlannedCall:
    """One call a rerank will make, as the engine lists it: its stage ("call", "window" or
    "final"), what it asks, the prompt, and whether the response cache holds its answer now."""

    stage: str
    ask: RerankRequest
    prompt: str
    cached: bool = False


def estimate_plan(passes: Sequence[Sequence[PlannedCall]], *, backend: Any, backend_name: str,
                  concurrency: int, max_attempts: int, max_reasks: int,
                  output_budget: Callable[[RerankRequest, int], int], prices: Prices | None,
                  budget: Budget | None) -> CostPlan:
    """The `CostPlan` of the calls of each pass (one pass, or k with `consistency=k`), run one pass
    after another: a pass's windows go in waves of `concurrency`, then its final pass. A scored
    backend is never re-asked and writes no answer of its own; a local scorer sends nothing."""
    scored = bool(getattr(backend, "scored", False))
    remote = makes_requests(backend)
    estimates: list[CallEstimate] = []
    round_trips = 0
    for calls in passes:
        for call in calls:
            tokens = request_tokens(backend, call.prompt, call.ask) if remote else (0, 0)
            max_tokens = output_budget(call.ask, call.ask.top_k) if remote and not scored else 0
            estimates.append(CallEstimate(call.stage, len(call.ask.chunks), tokens[0], tokens[1], max_tokens,
                                          call.cached))
        windows = sum(1 for call in calls if call.stage == "window")
        round_trips += (-(-windows // concurrency) + 1) if windows else 1
    billed = [e for e in estimates if remote and not e.cached]
    prompt_tokens = sum(e.prompt_tokens for e in billed)
    completion_tokens = sum(e.completion_tokens for e in billed)
    cost = prices.cost(prompt_tokens, completion_tokens) if prices is not None else None
    requests = len(billed)
    return CostPlan(
        backend=backend_name, model=getattr(backend, "model", None), calls=len(estimates),
        requests=requests, round_trips=round_trips if remote else 0,
        max_reasks=0 if scored else requests * max_reasks,
        max_requests=requests * (1 if scored else max_attempts), prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens, max_completion_tokens=sum(e.max_tokens for e in billed),
        cost=cost, prices=prices, budget=budget,
        exceeded=over_budget(budget, requests, prompt_tokens + completion_tokens, cost),
        estimates=tuple(estimates))


def summed(plans: Sequence[CostPlan], budget: Budget | None, backend: str = "",
           model: str | None = None) -> CostPlan:
    """Many requests' plans as one (a batch): counts and tokens added, the budget judged on the sum;
    `backend` and `model` name the plan of no request (a batch with nothing left to do)."""
    first = plans[0] if plans else None
    prices = first.prices if first else None
    prompt = sum(p.prompt_tokens for p in plans)
    completion = sum(p.completion_tokens for p in plans)
    requests = sum(p.requests for p in plans)
    cost = prices.cost(prompt, completion) if prices is not None else None
    return CostPlan(
        backend=first.backend if first else backend, model=first.model if first else model,
        calls=sum(p.calls for p in plans), requests=requests,
        round_trips=max((p.round_trips for p in plans), default=0),
        max_reasks=sum(p.max_reasks for p in plans),
        max_requests=sum(p.max_requests for p in plans), prompt_tokens=prompt, completion_tokens=completion,
        max_completion_tokens=sum(p.max_completion_tokens for p in plans), cost=cost, prices=prices,
        budget=budget, exceeded=over_budget(budget, requests, prompt + completion, cost))


def refuse(plan: CostPlan, what: str = "the rerank") -> None:
    """Raise `BudgetError` when `plan` crosses its budget (before any request)."""
    if plan.exceeded:
        why = "; ".join(plan.exceeded)
        raise BudgetError(f"{what} would exceed its budget, so no request was made: {why}",
                          limits=plan.exceeded, plan=plan.to_dict())


# --------------------------------------------------------------------------- spending while running


class Spending:
    """What a rerank (or a batch) has spent, shared by its calls' retry loops (thread-safe).

    Before each request a loop `reserve`s its estimate: refused when it would cross the budget,
    else held until `record` replaces it with what the request used. Holding it closes the gap
    between the check and the spending: eight calls of a batch checking at once cannot all pass a
    limit that leaves room for one."""

    def __init__(self, budget: Budget, prices: Prices | None) -> None:
        self.budget, self.prices = budget, prices
        self._lock = threading.Lock()
        self.requests = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self._held = [0, 0, 0]  # requests, prompt and completion tokens reserved and not yet recorded

    def reserve(self, estimate: tuple[int, int]) -> str | None:
        """Why one more request of about `estimate` (prompt, completion) tokens may not be sent, or
        None, and then the estimate is held until `record`."""
        b = self.budget
        with self._lock:
            held_requests, held_prompt, held_completion = self._held
            requests = self.requests + held_requests + 1
            prompt = self.prompt_tokens + held_prompt + estimate[0]
            completion = self.completion_tokens + held_completion + estimate[1]
            cost = self.prices.cost(prompt, completion) if self.prices is not None else None
            if b.max_calls is not None and requests > b.max_calls:
                return (f"the budget's max_calls={b.max_calls} is reached "
                        f"({requests - 1} requests made or in flight)")
            if b.max_tokens is not None and prompt + completion > b.max_tokens:
                return (f"the budget's max_tokens={b.max_tokens} would be crossed "
                        f"({prompt + completion - sum(estimate)} tokens spent or in flight)")
            if b.max_cost is not None and cost is not None and cost > b.max_cost:
                return f"the budget's max_cost={b.max_cost:g} would be crossed"
            self._held = [held_requests + 1, held_prompt + estimate[0], held_completion + estimate[1]]
            return None

    def record(self, tokens: tuple[int, int], reserved: tuple[int, int] | None = None) -> None:
        """One request made, with the (prompt, completion) tokens it used; `reserved` is the estimate
        `reserve` held for it, released now."""
        prompt, completion = tokens
        with self._lock:
            if reserved is not None:
                self._held = [max(0, self._held[0] - 1), max(0, self._held[1] - reserved[0]),
                              max(0, self._held[2] - reserved[1])]
            self.requests += 1
            self.prompt_tokens += prompt
            self.completion_tokens += completion


def usage_tokens(usage: Mapping[str, int]) -> tuple[int, int]:
    """(prompt, completion) tokens of a reported usage, whichever names the server used."""
    prompt = int(usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0)
    completion = int(usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0)
    if prompt == 0 and completion == 0:
        prompt = int(usage.get("total_tokens", 0) or 0)
    return prompt, completion


__all__ = ["Budget", "CallEstimate", "CostPlan", "PlannedCall", "Prices", "Spending", "as_budget",
           "as_prices", "estimate_answer_tokens", "estimate_plan", "estimate_tokens", "makes_requests",
           "over_budget", "refuse", "request_tokens", "summed", "usage_tokens"]
