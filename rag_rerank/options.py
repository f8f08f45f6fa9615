"""The options of a rerank, named once: which configure a session (`Reranker`) and which one request
may set, with their defaults.

What one request of a batch may set (`request_call`): any request option the run does not set
itself (its own `window_size` and metadata options win over the run's); what is built once per run
(the session options) cannot differ per request.

Why one module. Batch lines, Ray rows, the framework components, the MCP tool and the CLI all
pass options through to a rerank; each once learned which names were allowed by inspecting
`arerank`'s signature, so a new option reached some surfaces and not others. Here the two lists are
data: `SESSION_OPTIONS` are built into the session once (a backend, its connection pool, an
embedder's model), `REQUEST_OPTIONS` may differ from one request to the next, and a session's own
values of them are its defaults.
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from .backends.base import Backend
    from .cache import ResponseCache

from .concurrency import DEFAULT_CONCURRENCY, check_concurrency
from .cost import Budget, Prices, as_budget, as_prices
from .errors import InputError, Violation
from .fusion import MetaFusion, check_embed_meta_fields, meta_fusion
from .guard import validate_request
from .guard.input import ChunkSource, duplicate_threshold_violations
from .guard.limits import Limits, as_limits
from .models import RerankRequest
from .retry import RetryPolicy
from .shortening import check_max_tokens_per_chunk, token_counter
from .wording import near_miss

MAX_CONSISTENCY = 20

# Built once per session: the backend (and its HTTP clients), the embedder (and its model) and the
# response cache (its SQLite connections).
SESSION_OPTIONS = ("backend", "model", "base_url", "api_key", "embedder", "backend_options", "cache")

# The metadata options: they decide which chunks rank first, so a batch line may set its own.
SCORING_OPTIONS = ("meta_field", "meta_weight", "meta_ranking_mode", "meta_sort_order", "missing_meta",
                   "meta_value_type", "embed_meta_fields")


@dataclass(frozen=True)
class Options:
    """Everything one request may set besides its query and chunks; a session holds its defaults.

    Values are kept as given and checked when a request is planned (`engine.plan`), so every
    problem with the request and its options is reported at once, in one `InputError`."""

    top_k: Any = None  # None: the card's default (5)
    lambda_: Any = None  # None: the card's default (0.7)
    fallback: Any = None  # None or "local"
    policy: Any = None  # a RetryPolicy, or None for the defaults
    limits: Any = None  # a Limits, a mapping overriding some of its fields, or None
    layout: Any = "mmr"
    duplicate_threshold: Any = None
    strict: Any = False
    window_size: Any = None
    concurrency: Any = DEFAULT_CONCURRENCY
    meta_field: Any = None
    meta_weight: Any = 1.0
    meta_ranking_mode: Any = "reciprocal_rank_fusion"
    meta_sort_order: Any = "descending"
    missing_meta: Any = "bottom"
    meta_value_type: Any = "float"
    embed_meta_fields: Any = None
    budget: Any = None  # a cost.Budget, a mapping of its fields, or None
    prices: Any = None  # a cost.Prices, {"input": X, "output": Y} per million tokens, or None
    consistency: Any = 1  # passes over seeded shuffled orders, scores combined (engine.aggregate)
    calibration: Any = None  # a calibration.Calibration, its file's path, or None
    max_tokens_per_chunk: Any = None  # None, or a chunk over it is shown as its evidence (shortening.py)
    tokenizer: Any = None  # None (the offline estimate), a callable text -> count, or an object with encode

    def merged(self, overrides: Mapping[str, Any]) -> Options:
        """These options with `overrides` (request option names) in place; an unknown name is an
        `InputError` naming it, with a did-you-mean."""
        check_names(overrides, REQUEST_OPTIONS)
        return dataclasses.replace(self, **overrides) if overrides else self

    def scoring(self) -> dict[str, Any]:
        """The metadata options, by name (for `fusion.meta_fusion` and `check_embed_meta_fields`)."""
        return {name: getattr(self, name) for name in SCORING_OPTIONS}


class RerankOptions(TypedDict, total=False):
    """The keyword options of `rerank()` / `arerank()` and `Reranker(...)`, for type checkers
    (`**options: Unpack[RerankOptions]`); `tests/test_options.py` pins that they are exactly
    `SESSION_OPTIONS` and the fields of `Options` (but top_k and lambda_, which are positional)."""

    backend: str | Backend
    model: str | None
    base_url: str | None
    api_key: str | None
    embedder: Any
    backend_options: Mapping[str, Any] | None
    cache: bool | str | os.PathLike[str] | ResponseCache | None
    fallback: str | None
    policy: RetryPolicy | None
    limits: Limits | Mapping[str, Any] | None
    layout: str
    duplicate_threshold: float | None
    strict: bool
    window_size: int | None
    concurrency: int
    meta_field: str | None
    meta_weight: float
    meta_ranking_mode: str
    meta_sort_order: str
    missing_meta: str
    meta_value_type: str
    embed_meta_fields: Sequence[str] | None
    budget: Budget | Mapping[str, Any] | None
    prices: Prices | Mapping[str, float] | None
    consistency: int
    calibration: Any
    max_tokens_per_chunk: int | None
    tokenizer: Any


REQUEST_OPTIONS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Options))
ALL_OPTIONS: tuple[str, ...] = (*SESSION_OPTIONS, *REQUEST_OPTIONS)


def check_names(options: Mapping[str, Any], allowed: Sequence[str], *, what: str = "option") -> None:
    """One `InputError` naming every key of `options` that is not in `allowed`."""
    bad = [Violation(path=str(key), message=f"unknown {what} {key!r}{near_miss(str(key), allowed)} "
                     f"(known: {', '.join(allowed)})")
           for key in options if key not in allowed]
    if bad:
        raise InputError(bad)


# The keys of a request that are not options: its query and chunks, its count, its name.
_REQUEST_KEYS = frozenset({"query", "chunks", "top_k", "lambda", "lambda_", "query_id", "qid"})
# A request's own value of these wins over the run's (a batch line may set them whatever the run does).
_OWN_KEYS = frozenset({*SCORING_OPTIONS, "window_size"})
# What a request may set besides its basics, unless the run sets it: every request option but the
# two that are basics of the request itself.
_PER_REQUEST = tuple(k for k in REQUEST_OPTIONS if k not in ("top_k", "lambda_"))

# Added to an unknown request key's message; rerank_dataset sets it to name passthrough_columns, the
# way to keep a dataset column that is not a rerank option.
UNKNOWN_KEY_HINT: contextvars.ContextVar[str] = contextvars.ContextVar("UNKNOWN_KEY_HINT", default="")


def request_call(item: Any, run_sets: frozenset[str] = frozenset()) -> tuple[tuple[Any, Any, Any, Any],
                                                                             dict[str, Any]]:
    """`((query, chunks, top_k, lambda), options)` for one request of a batch whose run sets the
    request options `run_sets`; an `InputError` naming every key at fault (a missing query or
    chunks, an unknown key, one only the run may set)."""
    if not isinstance(item, Mapping):
        msg = f"a request must be a mapping {{query, chunks, top_k?, lambda?}}, got {type(item).__name__}"
        raise InputError([Violation(path="request", message=msg)])
    # An absent key is named as missing, as a batch file's line is (not "got null": the caller
    # wrote no null; a Ray row's null column reaches here as an absent key too).
    missing = [Violation(path=key, message=f"missing required field '{key}'")
               for key in ("query", "chunks") if key not in item]
    if missing:
        raise InputError(missing)
    lam = item.get("lambda", item.get("lambda_"))
    args = (item.get("query"), item.get("chunks"), item.get("top_k"), lam)
    own = {k: v for k, v in item.items() if k in _OWN_KEYS}
    extra = {k: v for k, v in item.items() if k not in _REQUEST_KEYS and k not in _OWN_KEYS}
    _check_extra(extra, run_sets)
    return args, {**extra, **own}


def _check_extra(extra: Mapping[str, Any], run_sets: frozenset[str]) -> None:
    """A key that is no option at all is a typo, named as such ('topk' -> 'top_k'); an option only
    the run may set "cannot be set per request"."""
    takes = sorted({"query", "chunks", "top_k", "lambda", "query_id",
                    *(k for k in _PER_REQUEST if k not in run_sets or k in _OWN_KEYS)})
    allowed = ", ".join(takes)
    per_run = set(SESSION_OPTIONS) | (set(run_sets) - _OWN_KEYS)
    known = set(SESSION_OPTIONS) | set(REQUEST_OPTIONS)

    def message(k: Any) -> str:
        if k not in known:
            return (f"unknown key {k!r}{near_miss(str(k), takes)} (a request takes: {allowed})"
                    f"{UNKNOWN_KEY_HINT.get()}")
        return (f"{k!r} cannot be set per request (a request takes: {allowed}"
                + (f"; {k!r} is set for the whole run" if k in per_run else "") + ")")

    bad = [Violation(path=str(k), message=message(k)) for k in extra if k not in known or k in per_run]
    if bad:
        raise InputError(bad)


# --------------------------------------------------------------------------- checks


def check_options(options: Options) -> None:
    """The options that are wrong whatever the request: each an `InputError` of its own, before
    the request is read (as `rerank()` always reported them)."""
    if options.fallback not in (None, "local"):
        raise InputError([Violation(path="fallback", value=options.fallback,
                                    message=f"fallback must be None or 'local', got {options.fallback!r}")])
    if options.policy is not None and not isinstance(options.policy, RetryPolicy):
        msg = f"policy must be None or a RetryPolicy, got {type(options.policy).__name__}"
        raise InputError([Violation(path="policy", message=msg)])
    check_concurrency(options.concurrency)
    k = options.consistency
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_CONSISTENCY:
        raise InputError([Violation(path="consistency", value=repr(k),
                                    message=f"consistency must be a whole number from 1 to {MAX_CONSISTENCY} "
                                    f"(passes over shuffled orders), got {k!r}")])


@dataclass(frozen=True)
class Checked:
    """A request and the options that need it read, as typed values: the guarded request, the
    fields embedded into each text (`embed_meta_fields`), the metadata fusion, prices and budget."""

    request: RerankRequest
    embed_fields: tuple[str, ...]
    fusion: MetaFusion | None
    prices: Prices | None
    budget: Budget | None


def check_request_options(query: Any, chunks: ChunkSource, options: Options, limits: Limits) -> Checked:
    """The request and the options (embedded meta fields, metadata fusion, prices, budget), every
    problem with any of them in one `InputError`."""
    opts = options.scoring()
    problems: list[Violation] = duplicate_threshold_violations(options.duplicate_threshold)
    prices: Prices | None = None
    budget: Budget | None = None
    try:
        prices = as_prices(options.prices)
    except InputError as exc:
        problems.extend(exc.violations)
        prices = Prices(0.0, 0.0)  # given, if wrong: a cost limit is not also reported as without prices
    try:
        budget = as_budget(options.budget, prices)
    except InputError as exc:
        problems.extend(exc.violations)
    fields: tuple[str, ...] = ()
    fusion: MetaFusion | None = None
    try:
        fields = check_embed_meta_fields(opts.pop("embed_meta_fields", None))
    except InputError as exc:
        problems.extend(exc.violations)
    try:
        fusion = meta_fusion(**opts)
    except InputError as exc:
        problems.extend(exc.violations)
    problems.extend(check_max_tokens_per_chunk(options.max_tokens_per_chunk))
    try:
        token_counter(options.tokenizer)
    except InputError as exc:
        problems.extend(exc.violations)
    # Over the context budget is not refused here when the chunks may be shortened to fit
    # (`shortening.shorten`, after the request is read): it checks the budget itself.
    guarded = replace(limits, max_context_tokens=UNBOUNDED) if shortens(options) else limits
    try:
        request = validate_request(query, chunks, options.top_k, options.lambda_, limits=guarded,
                                   window_size=options.window_size)
    except InputError as exc:
        problems.extend(exc.violations)
    if problems:
        raise InputError(problems)
    return Checked(request, fields, fusion, prices, budget)


UNBOUNDED = 2**62


def shortens(options: Options) -> bool:
    """Whether long chunks may be shown as their evidence: with `max_tokens_per_chunk`, or to meet
    the context budget unless `strict` (which refuses an over-budget request as it always did)."""
    return options.max_tokens_per_chunk is not None or not options.strict


def check_request(query: Any, chunks: ChunkSource, options: Options) -> RerankRequest:
    """The request as `engine.plan` would accept it, or the `InputError` it would raise: for a
    caller that must judge a request before anything is built (the tool call judges the calling
    model's arguments before the operator's settings)."""
    check_options(options)
    return check_request_options(query, chunks, options, as_limits(options.limits)).request


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`options` as (session options, request options); an unknown name is an `InputError`."""
    check_names(options, ALL_OPTIONS)
    session = {k: v for k, v in options.items() if k in SESSION_OPTIONS}
    request = {k: v for k, v in options.items() if k in REQUEST_OPTIONS}
    return session, request


__all__ = ["ALL_OPTIONS", "DEFAULT_CONCURRENCY", "MAX_CONSISTENCY", "REQUEST_OPTIONS", "SCORING_OPTIONS",
           "SESSION_OPTIONS", "UNKNOWN_KEY_HINT", "Checked", "Options", "RerankOptions", "check_names",
           "check_options", "check_request", "check_request_options", "request_call", "shortens",
           "split_options"]
