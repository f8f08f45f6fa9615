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
import operator
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from .backends.base import Backend
    from .cache import ResponseCache

from .backends.factory import BACKENDS
from .concurrency import DEFAULT_CONCURRENCY, check_concurrency
from .cost import Budget, Prices, as_budget, as_prices
from .errors import InputError, Violation
from .fallback_chain import as_chain
from .frozen import direct_init
from .fusion import (
    MISSING_META,
    RANKING_MODES,
    SORT_ORDERS,
    VALUE_TYPES,
    MetaFusion,
    check_embed_meta_fields,
    meta_fusion,
)
from .guard import validate_request
from .guard.input import NO_CONTEXT_BUDGET, ChunkSource, duplicate_threshold_violations
from .guard.limits import Limits, as_limits
from .models import RerankRequest
from .postpass import LAYOUTS, layout_violations
from .retry import RetryPolicy
from .shortening import check_max_tokens_per_chunk, token_counter
from .wording import near_miss

# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Flag:
    """One command-line flag of an option. `kind` says how argparse reads it: "str", "int" (a whole
    number), "float", "switch" (present or not), "append" (repeatable), "optional" (a value or
    none: `--cache` alone or `--cache DIR`). `helps` words the help for a command whose flag means
    something narrower (`--concurrency` of `batch`: requests in flight)."""

    names: tuple[str, ...]
    help: str
    kind: str = "str"
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    dest: str | None = None
    default: Any = None
    helps: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        """The long name, `--top-k`."""
        return self.names[0]

    def help_for(self, command: str) -> str:
        return self.helps.get(command, self.help)


@dataclass(frozen=True)
class Option:
    """One option of a rerank, declared once: its name and type (as `RerankOptions` states it for
    type checkers), its default, whether a session builds it once (`session`) or each request may
    set it (`request`), its check, its flags on the command line, and its line in the docs.

    `check` returns what is wrong with a value on its own (no request needed), [] when nothing is;
    `checked_with` says where the rest is checked (the request's chunks, other options, the
    session's backend). `choices` are the values a string option takes."""

    name: str
    type: str
    default: Any
    scope: str  # "session" or "request"
    doc: str
    default_doc: str | None = None  # how the docs show the default, when not repr(default)
    check: Callable[[Any], list[Violation]] | None = None
    checked_with: str = ""
    choices: tuple[str, ...] | None = None
    flags: tuple[Flag, ...] = ()
    positional: bool = False  # top_k, lambda_: also the 3rd and 4th positional arguments

    @property
    def surfaces(self) -> tuple[str, ...]:
        """Who takes it: "python" (`rerank()`, `Reranker`), "request" (a batch line, a Ray row, one
        request of `arerank_many`, a service's request body), "cli" (a flag)."""
        return ("python", *(("request",) if self.scope == "request" else ()),
                *(("cli",) if self.flags else ()))

    def violations(self, value: Any) -> list[Violation]:
        """What is wrong with `value` on its own ([] when nothing is, or when it is checked with
        the request: `checked_with`)."""
        return self.check(value) if self.check is not None else []


def _choice(name: str, allowed: Sequence[str], *, none: bool = False) -> Callable[[Any], list[Violation]]:
    def check(value: Any) -> list[Violation]:
        if (none and value is None) or (isinstance(value, str) and value in allowed):
            return []
        listed = repr(allowed[0]) if len(allowed) == 1 else f"one of {', '.join(repr(a) for a in allowed)}"
        choose = f"{'None or ' if none else ''}{listed}"
        return [Violation(path=name, value=value, message=f"{name} must be {choose}, got {value!r}")]
    return check


def _is(name: str, kind: type, what: str) -> Callable[[Any], list[Violation]]:
    def check(value: Any) -> list[Violation]:
        if value is None or isinstance(value, kind):
            return []
        return [Violation(path=name, message=f"{name} must be None or {what}, got {type(value).__name__}")]
    return check


def _bool(name: str) -> Callable[[Any], list[Violation]]:
    def check(value: Any) -> list[Violation]:
        if isinstance(value, bool):
            return []
        return [Violation(path=name, value=value, message=f"{name} must be True or False, got {value!r}")]
    return check


def _violations_of(check: Callable[[Any], Any]) -> Callable[[Any], list[Violation]]:
    """A check that raises `InputError` as the table's kind, which returns the violations: the
    owning module keeps the one rule, the table reports it with the other options' problems."""
    def violations(value: Any) -> list[Violation]:
        try:
            check(value)
        except InputError as exc:
            return list(exc.violations)
        return []

    return violations


# The fallback chain's problems (`fallback_chain.as_chain`, which every surface shares), a tokenizer
# the counter can use (`shortening.token_counter`), and the window calls in flight.
_fallback = _violations_of(as_chain)
_tokenizer = _violations_of(token_counter)
_concurrency = _violations_of(check_concurrency)


def _consistency(value: Any) -> list[Violation]:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONSISTENCY:
        return [Violation(path="consistency", value=repr(value),
                          message=f"consistency must be a whole number from 1 to {MAX_CONSISTENCY} "
                          f"(passes over shuffled orders), got {value!r}")]
    return []


MAX_CONSISTENCY = 20
_WITH_REQUEST = "with the request (`guard.validate_request`)"
_WITH_META = "with the other metadata options (`fusion.meta_fusion`)"
_WITH_SESSION = "when the session is built (`backends.factory`)"

OPTIONS: tuple[Option, ...] = (
    Option("top_k", "int | None", None, "request", "how many to keep; also the 3rd positional argument",
           "`5`", checked_with=_WITH_REQUEST, positional=True,
           flags=(Flag(("--top-k", "-k"), "how many to keep (5)", "int",
                       helps={"check": "the top_k the output was asked for",
                              "bias": "how many the backend is asked to rank (default: all of them)",
                              "calibrate": "how many the backend is asked to rank (default: all of "
                                           "them)"}),)),
    Option("lambda_", "float | None", None, "request",
           "the MMR trade-off in [0, 1] (1 = relevance only); also the 4th positional argument",
           "`0.7`", checked_with=_WITH_REQUEST, positional=True,
           flags=(Flag(("--lambda",), "MMR trade-off in [0, 1] (0.7)", "float", dest="lambda_"),)),
    Option("backend", "str | Backend", "local", "session",
           "`\"local\"` (offline, deterministic), `\"openai\"` (any OpenAI-compatible server via "
           "`base_url`), "
           "`\"anthropic\"`, `\"cross-encoder\"`, `\"rerank-api\"` ([Scorers](scorers.md)), or a backend "
           "instance "
           "from `make_backend(...)` (build once, reuse its connection pool; close it when done: "
           "[In a service](production.md#connections))", checked_with=_WITH_SESSION, choices=BACKENDS,
           flags=(Flag(("--backend", "-b"), "who scores the chunks (default: local, offline and "
                                            "deterministic; "
                       "cross-encoder needs "
                       "rag-rerank[cross-encoder])", choices=BACKENDS, default="local"),)),
    Option("model", "str | None", None, "session",
           "the model of `openai` / `anthropic` / `rerank-api`, the folder or hub name for `cross-encoder`; "
           "given to a backend that would ignore it (the default `local`) it is an `InputError` naming both",
           checked_with=_WITH_SESSION,
           flags=(Flag(("--model", "-m"), "model name (openai, anthropic, rerank-api) or folder / hub name "
                       "(cross-encoder)"),)),
    Option("base_url", "str | None", None, "session",
           "the server of `openai` / `anthropic` / `rerank-api`; refused for a backend that calls none",
           checked_with=_WITH_SESSION,
           flags=(Flag(("--base-url",), "backend server URL, e.g. http://127.0.0.1:8000/v1 (with --backend "
                       "openai, also the openai embedder's; see --embed-base-url); rerank-api posts to "
                       "URL/rerank"),)),
    Option("api_key", "str | None", None, "session",
           "the key of `openai` / `anthropic` / `rerank-api`; defaults to `OPENAI_API_KEY` / "
           "`ANTHROPIC_API_KEY` / `RERANK_API_KEY` (a local server needs none; a plan needs none)",
           checked_with=_WITH_SESSION),
    Option("embedder", "Any", "lexical", "session",
           "the post-pass vectors for MMR: `\"lexical\"`, `\"static\"`, "
           "`\"sentence-transformers[:MODEL]\"`, `\"openai[:MODEL]\"` or an `Embedder`; chunks that all "
           "carry an `embedding` use those instead (`meta.embedder == \"caller\"`). With the `local` "
           "backend it also picks the scorer: `\"lexical\"` scores with the static MiniLM-distilled "
           "table (`meta.model == \"local-fusion:static\"`), `\"sentence-transformers\"` with MiniLM "
           "itself (`local-fusion:sentence-transformers:all-MiniLM-L6-v2`), better and slower "
           "([Quality](quality.md))", checked_with=_WITH_SESSION,
           flags=(Flag(("--embedder", "-e"), "post-pass embedder: lexical (default), "
                       "sentence-transformers[:MODEL] (needs rag-rerank[st]), "
                       "openai[:MODEL]", default="lexical",
                       helps={"route": "lexical (default) or sentence-transformers[:MODEL] (needs "
                              "rag-rerank[st])"}),
                  Flag(("--embed-base-url",), "OpenAI-compatible embeddings server for --embedder "
                       "openai[:MODEL] (default: --base-url when --backend is openai, otherwise "
                       "OPENAI_BASE_URL or api.openai.com)", metavar="URL"))),
    Option("backend_options", "Mapping[str, Any] | None", None, "session",
           "a dict of the named backend's own knobs: `local` fusion (a `backends.local.Fusion`: your "
           "own weights) and bm25 (a `Bm25`); `openai` timeout, temperature, response_format, "
           "scoring ([below](#log-probability-scoring)); `anthropic` timeout, temperature; "
           "`cross-encoder` batch_size, device, max_length, calibration_factor; `rerank-api` "
           "timeout, max_chars, score_mapping ([Scorers](scorers.md), [Backends](backends.md)). Any "
           "other key is an `InputError` listing them, with a did-you-mean for a near miss "
           "(`'temprature'; did you mean 'temperature'?`)", checked_with=_WITH_SESSION,
           flags=(Flag(("--device",), "cross-encoder: torch device (default cpu)"),
                  Flag(("--batch-size",), "cross-encoder: pairs per forward pass (32)", "int"),
                  Flag(("--max-length",), "cross-encoder: tokens per (query, chunk) pair, longer ones are "
                       "truncated", "int"),
                  Flag(("--calibration-factor",), "cross-encoder: score = sigmoid(logit * factor) (1.0)",
                       "float"),
                  Flag(("--scoring",), "openai: listwise (default: the card's task in one prompt), logprobs "
                       "(one yes/no question per chunk, score = p(yes); needs a server returning token "
                       "logprobs: llama.cpp, vLLM) or auto (logprobs when the server returns them)",
                       choices=("listwise", "logprobs", "auto")),
                  Flag(("--http",), "openai / anthropic: the async client's HTTP transport: httpx (default) "
                       "or aiohttp (less CPU a call with many in flight, as in batch; needs "
                       "rag-rerank[aiohttp])", choices=("httpx", "aiohttp")))),
    Option("cache", "bool | str | os.PathLike[str] | ResponseCache | None", None, "session",
           "keep the backend's guard-valid answers on disk and answer an identical call from them with no "
           "request: `True` (the default folder), a folder, a `ResponseCache` (shared; `replay=True` pins a "
           "pipeline), `False` off ([Cost](cost.md#the-response-cache))",
           "`None`: `RAG_RERANK_CACHE` decides",
           checked_with=_WITH_SESSION,
           flags=(Flag(("--cache",), "keep the backend's valid answers and answer identical calls from them "
                       "(default folder: ~/.cache/rag-rerank; also RAG_RERANK_CACHE=1 or =DIR)", "optional",
                       metavar="DIR"),
                  Flag(("--no-cache",), "no response cache, whatever RAG_RERANK_CACHE says", "switch"),
                  Flag(("--replay",), "answer only from the cache (--cache DIR), failing on a call it "
                       "does not hold (exit 3)", "switch"))),
    Option("fallback", "str | Sequence[str | Backend] | None", None, "request",
           "if the backend fails after every attempt, the scorers tried in order, per window: "
           "`\"local\"`, `\"cross-encoder:MODEL\"`, a backend instance, and `\"input\"` (the "
           "first-stage order, last); `meta.status` / `meta.fallback_reason` / `meta.fallback_steps` say "
           "what answered ([Observability](observability.md)), `meta.notes` holds the error summary (keys "
           "redacted), and `meta.attempts` / `meta.usage` count the failed calls too. If "
           "an `openai` embedder fails, lexical vectors take its place and `meta.embedder_fallback "
           "== \"lexical\"` ([Post-pass](postpass.md#when-the-openai-embedder-fails)); "
           "`meta.fallback_notice()` says what was replaced in one line",
           check=_fallback,
           flags=(Flag(("--fallback",), "if the backend fails after all attempts, the scorers to try in "
                       "order, per window: local, cross-encoder:MODEL, input (the first-stage order; last); "
                       "meta.status says so", "steps", metavar="STEP[,STEP...]"),)),
    Option("policy", "RetryPolicy | None", None, "request",
           "attempts, re-asks, deadline, waits, output budget (see "
           "[Backends](backends.md))", "`RetryPolicy()`",
           check=_is("policy", RetryPolicy, "a RetryPolicy"),
           flags=(Flag(("--deadline",), "wall-clock bound on one rerank's backend calls and retries, a call "
                       "still running is cut (default 120)", "float", metavar="SECONDS"),
                  Flag(("--max-tokens",), "the LLM's output budget for the first attempt (default: estimated "
                       "from the request, at least 512); a reasoning model needs room to think before it "
                       "answers", "int", metavar="N"))),
    Option("limits", "Limits | Mapping[str, Any] | None", None, "request",
           "a `Limits`, or a dict overriding some of its fields (`{\"max_chunks\": 100}`): max chunks, min "
           "score, budgets", "`guard/limits.json`", checked_with="by `guard.limits.as_limits`",
           flags=(Flag(("--min-score",), "a chunk scored at or below it is dropped as below_min_score "
                       "(default 0.2)", "float", metavar="SCORE"),)),
    Option("layout", "str", "mmr", "request", "the order of the kept chunks", check=layout_violations,
           choices=LAYOUTS,
           flags=(Flag(("--layout",), "order of the kept chunks (default: mmr)", choices=LAYOUTS,
                       default="mmr"),)),
    Option("duplicate_threshold", "float | None", None, "request",
           "unset, near-duplicates are judged by what the texts say ([Post-pass](postpass.md)), or on "
           "the caller's vectors when every chunk carries one (cosine at or above 0.95); given, a "
           "cosine in [0, 1] at or above which two chunks' lexical vectors make them near-duplicates "
           "(1.0 keeps all but identical copies)",
           check=duplicate_threshold_violations,
           flags=(Flag(("--duplicate-threshold",), "near-duplicate similarity in [0, 1] at or above "
                                                   "which two "
                       "chunks may be redundant (default: the embedder's own; 1.0 keeps all but "
                       "identical ones)",
                       "float", metavar="COSINE"),)),
    Option("strict", "bool", False, "request",
           "`True` turns off the formatting-only repair, so a fenced or prose-wrapped answer is re-asked, "
           "and refuses a request over `max_context_tokens` instead of shortening its longest chunks "
           "([Long chunks](long-chunks.md))",
           check=_bool("strict"),
           flags=(Flag(("--strict",), "no formatting repair: a fenced or prose-wrapped answer is "
                                      "re-asked, not "
                       "salvaged", "switch"),)),
    Option("window_size", "int | None", None, "request",
           "over 50 chunks (up to `max_total_chunks`, 1,000): score windows of this many, then one final "
           "pass "
           "over the best; between `top_k` and 50 ([Windows](windows.md))", checked_with=_WITH_REQUEST,
           flags=(Flag(("--window-size",), "more candidates than one prompt takes (up to 1000): score "
                                           "windows "
                       "of N chunks concurrently, then one final pass over the best N (N at most 50)", "int",
                       metavar="N"),)),
    Option("concurrency", "int", DEFAULT_CONCURRENCY, "request",
           "with `window_size`, window calls in flight at most ([Windows](windows.md#concurrency))",
           check=_concurrency,
           flags=(Flag(("--concurrency",), "with --window-size: window calls in flight at most (default 4)",
                       "int", default=DEFAULT_CONCURRENCY,
                       helps={"batch": "requests in flight at most (default 4)",
                              "eval": "queries reranked at once at most (default 4)",
                              "bias": "reranks in flight at most (default 4)",
                              "compare": "reranks in flight at most (default 4)",
                              "calibrate": "reranks in flight at most (default 4)"}),)),
    Option("meta_field", "str | None", None, "request",
           "fuse the scorer's order with this key of each chunk's `meta` (a date, a rating) before MMR "
           "([Scorers](scorers.md#metadata-fusion-meta_field))", checked_with=_WITH_META,
           flags=(Flag(("--meta-field",), "fuse the scorer's order with this meta field (a date, a rating) "
                       "before MMR", metavar="KEY"),)),
    Option("meta_weight", "float", 1.0, "request", "in [0, 1]: 0 off, 1 the metadata order only",
           checked_with=_WITH_META,
           flags=(Flag(("--meta-weight",), "0 off ... 1 metadata order only (1.0)", "float"),)),
    Option("meta_ranking_mode", "str", "reciprocal_rank_fusion", "request", "how the two orders are fused",
           checked_with=_WITH_META, choices=RANKING_MODES,
           flags=(Flag(("--meta-ranking-mode",), "how the two orders are fused (reciprocal_rank_fusion)",
                       choices=RANKING_MODES),)),
    Option("meta_sort_order", "str", "descending", "request", "`\"descending\"`: the largest / newest value "
           "is best", checked_with=_WITH_META, choices=SORT_ORDERS,
           flags=(Flag(("--meta-sort-order",), "descending (default): the largest / newest value is best",
                       choices=SORT_ORDERS),)),
    Option("missing_meta", "str", "bottom", "request", "where chunks without the field go (`\"drop\"` lists "
           "them in `dropped`)", checked_with=_WITH_META, choices=MISSING_META,
           flags=(Flag(("--missing-meta",), "where chunks without the field go (bottom); drop lists them in "
                       "dropped", choices=MISSING_META),)),
    Option("meta_value_type", "str", "float", "request", "how values are read (`\"date\"`: ISO 8601)",
           checked_with=_WITH_META, choices=VALUE_TYPES,
           flags=(Flag(("--meta-value-type",), "how values are read (float); date is ISO 8601",
                       choices=VALUE_TYPES),)),
    Option("embed_meta_fields", "Sequence[str] | None", None, "request",
           "meta keys whose values go on lines before each chunk's text, for every scorer and the post-pass "
           "embedder ([Scorers](scorers.md#embed_meta_fields))", checked_with="by "
                                                                              "`fusion.check_embed_meta_fields`",
           flags=(Flag(("--embed-meta-field",), "put this meta field's value before each chunk's text "
                                                "for the "
                       "scorers (repeatable)", "append", metavar="KEY", dest="embed_meta_fields"),)),
    Option("budget", "Budget | Mapping[str, Any] | None", None, "request",
           "a `Budget(max_calls, max_tokens, max_cost)` or a mapping of it: a rerank whose plan exceeds it "
           "raises `BudgetError` before any request, and no re-ask or retry crosses it "
           "([Cost](cost.md#budgets))", checked_with="with `prices` (`cost.as_budget`)",
           flags=(Flag(("--budget-calls",), "most backend requests {what} may make (retries and re-asks "
                       "included)", "int", metavar="N"),
                  Flag(("--budget-tokens",), "most tokens (prompt + completion) {what} may use", "int",
                       metavar="N"),
                  Flag(("--budget-cost",), "most {what} may cost (needs --price-input and --price-output)",
                       "float", metavar="AMOUNT"))),
    Option("prices", "Prices | Mapping[str, float] | None", None, "request",
           "`{\"input\": X, \"output\": Y}` per million tokens (or `Prices`): prices the plan and "
           "`budget.max_cost`; none is built in", checked_with="by `cost.as_prices`",
           flags=(Flag(("--price-input",), "price per million input tokens, for the plan's cost and "
                       "--budget-cost", "float", metavar="PRICE",
                       helps={"compare": "price per million input tokens, for the cost per query of runs "
                              "with usage"}),
                  Flag(("--price-output",), "price per million output tokens", "float", metavar="PRICE"))),
    Option("consistency", "int", 1, "request",
           "k from 1 to 20: rank k times, the first pass in the given order and each other over a "
           "seeded shuffle of the chunks (windows per window), and combine each chunk's scores over "
           "the passes; k times the calls (in the plan and under budgets); `meta.consistency` "
           "reports the passes' agreement ([below](#consistency-over-shuffled-orders))", check=_consistency,
           flags=(Flag(("--consistency",), "rank K times over seeded shuffles of the chunks and combine the "
                       "scores (K times the calls; meta.consistency reports the passes' agreement)", "int",
                       metavar="K"),)),
    Option("calibration", "Any", None, "request",
           "a calibration file's path (from `rag-rerank calibrate`) or a loaded `Calibration`: maps "
           "the backend's scores to probabilities before the minimum score and MMR; "
           "`meta.calibration` names it; a missing or bad file is a `ConfigError` naming it "
           "([below](#calibration))", checked_with="when the request is planned (`calibration_map.resolve`)",
           flags=(Flag(("--calibration",), "map the backend's scores to probabilities with a file from "
                       "rag-rerank calibrate (before --min-score and MMR; meta.calibration names it)",
                       metavar="FILE"),)),
    Option("max_tokens_per_chunk", "int | None", None, "request",
           "a whole number >= 16: a chunk over it is shown to the model as its most query-relevant "
           "passages, in document order, cut text marked `[…]`; `meta.evidence` lists each shortened chunk "
           "(tokens before / after, the kept passages as character offsets into your text). Without it, "
           "only chunks that would overflow `max_context_tokens` are shortened, the longest first; with "
           "`strict=True` such a request is refused as before ([Long chunks](long-chunks.md))",
           check=check_max_tokens_per_chunk,
           flags=(Flag(("--max-tokens-per-chunk",), "show a chunk over N tokens as its most query-relevant "
                       "passages (in document order, cut text marked [...]; meta.evidence has the kept "
                       "offsets); without it only chunks that would overflow the context budget are "
                       "shortened (none with --strict)", "int", metavar="N"),)),
    Option("tokenizer", "Any", None, "request",
           "how chunk tokens are counted for `max_tokens_per_chunk` and the context budget: a callable "
           "text -> count or an object with `encode` (a Hugging Face or tiktoken tokenizer); unset, the "
           "package's estimate", "the estimate (`tokens.estimate_tokens`)", check=_tokenizer),
)
OPTION = {o.name: o for o in OPTIONS}

# Built once per session: the backend (and its HTTP clients), the embedder (and its model) and the
# response cache (its SQLite connections).
SESSION_OPTIONS = tuple(o.name for o in OPTIONS if o.scope == "session")

# The metadata options: they decide which chunks rank first, so a batch line may set its own.
SCORING_OPTIONS = ("meta_field", "meta_weight", "meta_ranking_mode", "meta_sort_order", "missing_meta",
                   "meta_value_type", "embed_meta_fields")


def request_options() -> tuple[Option, ...]:
    """The options one request may set (a batch line, a service's request body), each with its
    type, default, check and doc: what a new surface lists, validates and documents."""
    return tuple(o for o in OPTIONS if o.scope == "request")


@dataclass(frozen=True)
class Options:
    """Everything one request may set besides its query and chunks; a session holds its defaults.

    Values are kept as given and checked when a request is planned (`engine.plan`), so every
    problem with the request and its options is reported at once, in one `InputError`."""

    top_k: Any = None  # None: the card's default (5)
    lambda_: Any = None  # None: the card's default (0.7)
    fallback: Any = None  # None, "local", or a chain of steps (fallback_chain.py)
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
    consistency: Any = 1  # passes over seeded shuffled orders, scores combined (consistency.aggregate)
    calibration: Any = None  # a calibration.Calibration, its file's path, or None
    max_tokens_per_chunk: Any = None  # None, or a chunk over it is shown as its evidence (shortening.py)
    tokenizer: Any = None  # None (the offline estimate), a callable text -> count, or an object with encode

    def merged(self, overrides: Mapping[str, Any]) -> Options:
        """These options with `overrides` (request option names) in place; an unknown name is an
        `InputError` naming it, with a did-you-mean."""
        check_names(overrides, REQUEST_OPTIONS)
        if not overrides:
            return self
        # What `dataclasses.replace` makes, without its pass over every field through `__init__`
        # (15 us, on every request): the names are checked above and are exactly the fields
        # (tests/test_options.py pins it), and `Options` has no `__post_init__` to run.
        out = object.__new__(type(self))
        # The instance dict set whole: filled key by key, CPython 3.11 keeps its keys shared with the
        # class's and each later read of an option misses the specialised attribute load (as in
        # `RerankRequest.with_top_k`); a call reads its options a dozen times.
        object.__setattr__(out, "__dict__", {**self.__dict__, **overrides})
        return out

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
    fallback: str | Sequence[str | Backend] | None
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


REQUEST_OPTIONS: tuple[str, ...] = tuple(o.name for o in OPTIONS if o.scope == "request")
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
_OWN_KEYS = frozenset({*SCORING_OPTIONS, "window_size", "max_tokens_per_chunk"})
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
    if not extra:  # the usual request: nothing to name, so no message parts built (about 13 us)
        return
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


# The request options with a check of their own, and their defaults (valid: tests/test_options.py).
_CHECKED = tuple((o.name, o.check, o.default) for o in OPTIONS
                 if o.scope == "request" and o.check is not None)


def option_violations(options: Options) -> list[Violation]:
    """What is wrong with each request option on its own, by its check in the table (`OPTIONS`);
    a value that is the default itself is not checked again (it runs on every request)."""
    out: list[Violation] = []
    for name, check, default in _CHECKED:
        value = getattr(options, name)
        if value is not default:
            out.extend(check(value))
    return out


def check_options(options: Options) -> None:
    """The options that are wrong whatever the request, in one `InputError` (a session checks its
    defaults when built; a request's options are checked with the request, `check_request_options`)."""
    problems = option_violations(options)
    if problems:
        raise InputError(problems)


@dataclass(frozen=True)
class Settings:
    """The request options the flow follows, as typed values: read once from checked `Options`
    (`settings_of`), before any request, so no step of a rerank reads an option as given again."""

    fallback: str | Sequence[Any] | None = None
    policy: RetryPolicy = dataclasses.field(default_factory=RetryPolicy)
    layout: str = "mmr"
    duplicate_threshold: float | None = None
    strict: bool = False
    concurrency: int = DEFAULT_CONCURRENCY
    consistency: int = 1
    # `fallback`'s steps in order (`fallback_chain.as_chain`), () without one: checked once here,
    # where the settings are made, rather than each time the flow asks who answers a failure.
    chain: tuple[Any, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "chain", as_chain(self.fallback))


# The policy of a request that sets none: one value (frozen) for all of them; building it checks
# every field again (8 us a request).
_DEFAULT_POLICY = RetryPolicy()


def settings_of(options: Options) -> Settings:
    """`options` (checked: `option_violations` found nothing) as the flow's typed `Settings`."""
    threshold = options.duplicate_threshold
    return Settings(fallback=options.fallback, policy=options.policy or _DEFAULT_POLICY,
                    layout=options.layout,
                    duplicate_threshold=None if threshold is None else float(threshold),
                    strict=bool(options.strict), concurrency=int(options.concurrency),
                    consistency=int(options.consistency))


@direct_init
@dataclass(frozen=True)
class Checked:
    """A request and its options as typed values: the guarded request, the fields embedded into
    each text (`embed_meta_fields`), the metadata fusion, prices, budget and the flow's settings."""

    request: RerankRequest
    embed_fields: tuple[str, ...]
    fusion: MetaFusion | None
    prices: Prices | None
    budget: Budget | None
    settings: Settings


@direct_init
@dataclass(frozen=True)
class _OptionsRead:
    """What the options alone decide, read and checked (the request's own part is the input guard's)."""

    embed_fields: tuple[str, ...]
    fusion: MetaFusion | None
    prices: Prices | None
    budget: Budget | None
    settings: Settings


# Types whose value cannot change while the object stays the same (our frozen option values included):
# only options made of these are remembered, so a caller's list or dict changed between calls is read again.
_FIXED = frozenset({type(None), bool, int, float, str, Limits, RetryPolicy, Budget, Prices})
# The last (option values, what they read as): a session's calls share its default objects, and a
# call's options are the session's copied with its own `top_k` (`Options.merged`), so every call
# checked the same options again and built the same values (41 K instructions a call). Keyed by
# identity, as `_without_context_budget`: equal values written differently (1 and True, 1 and 1.0)
# are not taken for each other, and messages and settings keep the values as written. The key is
# every field's value, `top_k` and `lambda_` too (read from the instance dict in one C call: a
# getter of the other names alone cost twice as much); a call's `top_k` is the same int object
# each time, so it seldom makes a read again.
_READ_OF: list[tuple[tuple[Any, ...], _OptionsRead] | None] = [None]  # one slot, read and written whole


def _options_read(options: Options, problems: list[Violation]) -> _OptionsRead | None:
    """The options read as typed values, or None with every problem added to `problems` (each option
    by its check in the table, then the embedded meta fields, metadata fusion, prices, budget)."""
    given = tuple(vars(options).values())
    last = _READ_OF[0]
    if last is not None and len(last[0]) == len(given) and all(map(operator.is_, last[0], given)):
        return last[1]
    opts = options.scoring()
    found = option_violations(options)
    prices: Prices | None = None
    budget: Budget | None = None
    try:
        prices = as_prices(options.prices)
    except InputError as exc:
        found.extend(exc.violations)
        prices = Prices(0.0, 0.0)  # given, if wrong: a cost limit is not also reported as without prices
    try:
        budget = as_budget(options.budget, prices)
    except InputError as exc:
        found.extend(exc.violations)
    fields: tuple[str, ...] = ()
    fusion: MetaFusion | None = None
    try:
        fields = check_embed_meta_fields(opts.pop("embed_meta_fields", None))
    except InputError as exc:
        found.extend(exc.violations)
    try:
        fusion = meta_fusion(**opts)
    except InputError as exc:
        found.extend(exc.violations)
    if found:
        problems.extend(found)
        return None
    read = _OptionsRead(fields, fusion, prices, budget, settings_of(options))
    if all(type(value) in _FIXED for value in given):
        _READ_OF[0] = (given, read)
    return read


def check_request_options(query: Any, chunks: ChunkSource, options: Options, limits: Limits) -> Checked:
    """The request and the options (each option by its check in the table, then the embedded meta
    fields, metadata fusion, prices, budget), every problem with any of them in one `InputError`,
    before any request is made."""
    problems: list[Violation] = []
    read = _options_read(options, problems)
    # Over the context budget is not refused here when the chunks may be shortened to fit
    # (`shortening.shorten`, after the request is read): it checks the budget itself.
    # Otherwise (strict, no cap) the guard counts as `shorten` would, with the caller's tokenizer.
    short = shortens(options)
    guarded = _without_context_budget(limits) if short else limits
    try:
        request = validate_request(query, chunks, options.top_k, options.lambda_, limits=guarded,
                                   window_size=options.window_size,
                                   tokenizer=None if short else options.tokenizer)
    except InputError as exc:
        problems.extend(exc.violations)
    if problems:
        raise InputError(problems)
    assert read is not None
    return Checked(request, read.embed_fields, read.fusion, read.prices, read.budget, read.settings)


# The last (limits, the same without a context budget): a session's requests share one `Limits`
# object, and `dataclasses.replace` costs 7 us a request. Keyed by identity, not equality: limits
# equal as numbers may be written differently (1 and 1.0), and messages quote them as written.
_UNBOUNDED_OF: list[tuple[Limits, Limits] | None] = [None]  # one slot, read and written whole


def _without_context_budget(limits: Limits) -> Limits:
    """`limits` with no context budget (`shortening.shorten` checks it itself), memoised by identity."""
    last = _UNBOUNDED_OF[0]
    if last is not None and last[0] is limits:
        return last[1]
    unbounded = replace(limits, max_context_tokens=NO_CONTEXT_BUDGET)
    _UNBOUNDED_OF[0] = (limits, unbounded)
    return unbounded


def shortens(options: Options) -> bool:
    """Whether long chunks may be shown as their evidence: with `max_tokens_per_chunk`, or to meet
    the context budget unless `strict` (which refuses an over-budget request as it always did)."""
    return options.max_tokens_per_chunk is not None or not options.strict


def check_request(query: Any, chunks: ChunkSource, options: Options) -> RerankRequest:
    """The request as `engine.plan` would accept it, or the `InputError` it would raise: for a
    caller that must judge a request before anything is built (the tool call judges the calling
    model's arguments before the operator's settings)."""
    return check_request_options(query, chunks, options, as_limits(options.limits)).request


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`options` as (session options, request options); an unknown name is an `InputError`."""
    check_names(options, ALL_OPTIONS)
    session = {k: v for k, v in options.items() if k in SESSION_OPTIONS}
    request = {k: v for k, v in options.items() if k in REQUEST_OPTIONS}
    return session, request


__all__ = [
    "ALL_OPTIONS",
    "DEFAULT_CONCURRENCY",
    "MAX_CONSISTENCY",
    "OPTION",
    "OPTIONS",
    "REQUEST_OPTIONS",
    "SCORING_OPTIONS",
    "SESSION_OPTIONS",
    "UNKNOWN_KEY_HINT",
    "Checked",
    "Flag",
    "Option",
    "Options",
    "RerankOptions",
    "Settings",
    "check_names",
    "check_options",
    "check_request",
    "check_request_options",
    "option_violations",
    "request_call",
    "request_options",
    "settings_of",
    "shortens",
    "split_options",
]
