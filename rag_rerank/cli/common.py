"""What the commands share: one-line errors on stderr, argument types, the option groups several
commands take, and the library options those flags become.

Exit codes: 0 ok · 1 invalid LLM output (`check`) · 2 bad input or usage · 3 backend failure ·
4 internal error. Errors go to stderr, one line each, naming the line / id / field / limit at fault;
a long list is cut after `textio.MAX_SHOWN_VIOLATIONS` lines plus one line with the total.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..backends.common import base_url_problem
from ..cache import ResponseCache
from ..embed import get_embedder, parse_embedder_spec
from ..errors import InputError, UsageError, Violation
from ..guard.input import MAX_CHUNKS_ADVICE
from ..retry import RetryPolicy
from ..textio import violation_lines

if TYPE_CHECKING:
    from ..guard.limits import Limits

EXIT_OK, EXIT_INVALID_OUTPUT, EXIT_BAD_INPUT, EXIT_BACKEND, EXIT_INTERNAL = 0, 1, 2, 3, 4


def err(line: str) -> None:
    """One line on stderr, whatever the message holds (newlines, unencodable characters)."""
    flat = " ".join(str(line).splitlines()).encode("utf-8", "backslashreplace").decode("utf-8")
    print(f"rag-rerank: {flat}", file=sys.stderr)


def print_violations(violations: Sequence[Violation], prefix: str = "error") -> None:
    for line in violation_lines(violations):
        err(f"{prefix}: {line}")


def indent_width(text: str) -> int:
    """An argparse type for `--indent`: 0 or more spaces (json.dumps would quietly read a negative
    width as 0, so `--indent -5` is a usage error instead)."""
    value = whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more spaces, got {text!r}")
    return value


def whole_number(text: str) -> int:
    """An argparse type for counts: `3` and `3.0` (what the library and the tools accept) are 3;
    `3.5` or `three` are a usage error, reported by argparse as one line."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(value)


def check_input_files(args: argparse.Namespace, names: Sequence[str]) -> None:
    """The measuring commands' input files (`--candidates`, `--qrels`, ...): each given one must
    exist and be a file (a pipe, `<(...)`, is read like one); `InputError` naming the flag."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and Path(value).is_dir():
            raise InputError([Violation(path=f"--{name}", message=f"{value} is a directory, not a file")])
        if value is not None and not Path(value).exists():
            raise InputError([Violation(path=f"--{name}", message=f"no such file: {value}")])


def check_concurrency_flag(args: argparse.Namespace) -> None:
    """`--concurrency` of the measuring commands: at least 1 (`InputError` naming the flag)."""
    if args.concurrency < 1:
        raise InputError([Violation(path="--concurrency", message="must be at least 1",
                                    value=args.concurrency)])


def with_flags(exc: InputError, flags: Mapping[str, str]) -> InputError:
    """`exc` with each violation's keyword path (`top_k`) written as the flag the CLI's user typed
    (`--top-k`)."""
    return InputError([replace(v, path=flags.get(v.path, v.path)) for v in exc.violations], exc.headline)


def add_request_args(p: argparse.ArgumentParser, top_k_required: bool = False) -> None:
    p.add_argument("--query", "-q", required=True, help="the query to rank against")
    p.add_argument("--chunks", "-c", required=True, metavar="FILE|-",
                   help="JSONL chunks file, or - for stdin")
    p.add_argument("--top-k", "-k", type=whole_number, default=None, required=top_k_required,
                   help="how many to keep (5)")
    p.add_argument("--lambda", dest="lambda_", type=float, default=None,
                   help="MMR trade-off in [0, 1] (0.7)")


def add_backend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", "-b", default="local",
                   choices=["local", "openai", "anthropic", "cross-encoder", "rerank-api"],
                   help="who scores the chunks (default: local, offline and deterministic; cross-encoder "
                   "needs rag-rerank[cross-encoder])")
    p.add_argument("--model", "-m", default=None,
                   help="model name (openai, anthropic, rerank-api) or folder / hub name (cross-encoder)")
    p.add_argument("--base-url", default=None,
                   help="backend server URL, e.g. http://127.0.0.1:8000/v1 (with --backend openai, also "
                   "the openai embedder's; see --embed-base-url); rerank-api posts to URL/rerank")
    p.add_argument("--device", default=None, help="cross-encoder: torch device (default cpu)")
    p.add_argument("--batch-size", type=int, default=None, help="cross-encoder: pairs per forward pass (32)")
    p.add_argument("--max-length", type=int, default=None,
                   help="cross-encoder: tokens per (query, chunk) pair, longer ones are truncated")
    p.add_argument("--calibration-factor", type=float, default=None,
                   help="cross-encoder: score = sigmoid(logit * factor) (1.0)")
    p.add_argument("--scoring", choices=["listwise", "logprobs", "auto"], default=None,
                   help="openai: listwise (default: the card's task in one prompt), logprobs (one yes/no "
                   "question per chunk, score = p(yes); needs a server returning token logprobs: llama.cpp, "
                   "vLLM) or auto (logprobs when the server returns them)")
    p.add_argument("--http", choices=["httpx", "aiohttp"], default=None,
                   help="openai / anthropic: the async client's HTTP transport: httpx (default) or aiohttp "
                   "(less CPU a call with many in flight, as in batch; needs rag-rerank[aiohttp])")
    p.add_argument("--embedder", "-e", default="lexical",
                   help="post-pass embedder: lexical (default), sentence-transformers[:MODEL] (needs "
                   "rag-rerank[st]), openai[:MODEL]")
    p.add_argument("--embed-base-url", default=None, metavar="URL",
                   help="OpenAI-compatible embeddings server for --embedder openai[:MODEL] (default: "
                   "--base-url when --backend is openai, otherwise OPENAI_BASE_URL or api.openai.com)")
    p.add_argument("--fallback", choices=["local"], default=None,
                   help="if the backend fails after all attempts, return the local ranking (flagged in meta)")
    p.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                   help="wall-clock bound on one rerank's backend calls and retries, a call still "
                   "running is cut (default 120)")
    p.add_argument("--max-tokens", type=whole_number, default=None, metavar="N",
                   help="the LLM's output budget for the first attempt (default: estimated from the "
                   "request, at least 512); a reasoning model needs room to think before it answers")


def add_window_args(p: argparse.ArgumentParser, concurrency: bool = False) -> None:
    p.add_argument("--window-size", type=int, default=None, metavar="N",
                   help="more candidates than one prompt takes (up to 1000): score windows of N chunks "
                   "concurrently, then one final pass over the best N (N at most 50)")
    if concurrency:
        p.add_argument("--concurrency", type=int, default=4,
                       help="with --window-size: window calls in flight at most (default 4)")


def add_pipeline_args(p: argparse.ArgumentParser) -> None:
    """Options of `rerank` / `batch` only: the post-pass layout, strict parsing, the duplicate
    threshold and the minimum score."""
    p.add_argument("--layout", default="mmr", choices=["mmr", "diversity", "lost_in_the_middle"],
                   help="order of the kept chunks (default: mmr)")
    p.add_argument("--strict", action="store_true",
                   help="no formatting repair: a fenced or prose-wrapped answer is re-asked, not salvaged")
    p.add_argument("--duplicate-threshold", type=float, default=None, metavar="COSINE",
                   help="near-duplicate similarity in [0, 1] at or above which two chunks may be redundant "
                   "(default: the embedder's own; 1.0 keeps all but identical ones)")
    p.add_argument("--min-score", type=float, default=None, metavar="SCORE",
                   help="a chunk scored at or below it is dropped as below_min_score (default 0.2)")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="map the backend's scores to probabilities with a file from rag-rerank calibrate "
                   "(before --min-score and MMR; meta.calibration names it)")
    p.add_argument("--consistency", type=whole_number, default=None, metavar="K",
                   help="rank K times over seeded shuffles of the chunks and combine the scores (K times "
                   "the calls; meta.consistency reports the passes' agreement)")
    p.add_argument("--max-tokens-per-chunk", type=whole_number, default=None, metavar="N",
                   help="show a chunk over N tokens as its most query-relevant passages (in document order, "
                   "cut text marked [...]; meta.evidence has the kept offsets); without it only chunks that "
                   "would overflow the context budget are shortened (none with --strict)")


def pipeline_options(args: argparse.Namespace) -> dict[str, Any]:
    """The library options of `add_pipeline_args`' flags (unset ones keep the library's defaults)."""
    opts: dict[str, Any] = {"layout": args.layout, "strict": args.strict}
    for flag, value in (("--duplicate-threshold", args.duplicate_threshold), ("--min-score", args.min_score)):
        if value is not None and not (math.isfinite(value) and 0 <= value <= 1):
            raise UsageError(f"{flag} must be a number in [0, 1], got {value:g}")
    if args.duplicate_threshold is not None:
        opts["duplicate_threshold"] = args.duplicate_threshold
    if args.min_score is not None:
        opts["limits"] = {"min_score": args.min_score}
    if getattr(args, "calibration", None) is not None:
        opts["calibration"] = args.calibration
    if getattr(args, "consistency", None) is not None:
        opts["consistency"] = args.consistency
    if getattr(args, "max_tokens_per_chunk", None) is not None:
        opts["max_tokens_per_chunk"] = args.max_tokens_per_chunk
    return opts


def add_cost_args(p: argparse.ArgumentParser, batch: bool = False) -> None:
    """The response cache, the dry run, prices and the budget (`rerank`, `batch`; docs/cost.md)."""
    g = p.add_argument_group("cost", "cache answers, plan before spending, and cap the spend")
    g.add_argument("--cache", nargs="?", const=True, default=None, metavar="DIR",
                   help="keep the backend's valid answers and answer identical calls from them (default "
                   "folder: ~/.cache/rag-rerank; also RAG_RERANK_CACHE=1 or =DIR)")
    g.add_argument("--no-cache", action="store_true",
                   help="no response cache, whatever RAG_RERANK_CACHE says")
    g.add_argument("--replay", action="store_true",
                   help="answer only from the cache (--cache DIR), failing on a call it does not hold "
                   "(exit 3)")
    g.add_argument("--dry-run", action="store_true",
                   help="print the plan (calls, round trips, estimated tokens and cost) and make no request")
    g.add_argument("--price-input", type=float, default=None, metavar="PRICE",
                   help="price per million input tokens, for the plan's cost and --budget-cost")
    g.add_argument("--price-output", type=float, default=None, metavar="PRICE",
                   help="price per million output tokens")
    what = "the whole batch" if batch else "the rerank"
    g.add_argument("--budget-calls", type=whole_number, default=None, metavar="N",
                   help=f"most backend requests {what} may make (retries and re-asks included)")
    g.add_argument("--budget-tokens", type=whole_number, default=None, metavar="N",
                   help=f"most tokens (prompt + completion) {what} may use")
    g.add_argument("--budget-cost", type=float, default=None, metavar="AMOUNT",
                   help=f"most {what} may cost (needs --price-input and --price-output)")


def cost_options(args: argparse.Namespace) -> dict[str, Any]:
    """`cache`, `prices` and `budget` from `add_cost_args`' flags (unset ones left out)."""
    opts: dict[str, Any] = {}
    if args.no_cache and (args.cache is not None or args.replay):
        raise UsageError("--no-cache excludes --cache and --replay")
    if args.replay:
        opts["cache"] = ResponseCache(None if args.cache in (None, True) else args.cache, replay=True)
    elif args.no_cache:
        opts["cache"] = False
    elif args.cache is not None:
        opts["cache"] = args.cache
    prices = (args.price_input, args.price_output)
    if any(p is not None for p in prices):
        if None in prices:
            raise UsageError("--price-input and --price-output go together (per million tokens)")
        opts["prices"] = {"input": prices[0], "output": prices[1]}
    budget = {"max_calls": args.budget_calls, "max_tokens": args.budget_tokens, "max_cost": args.budget_cost}
    budget = {k: v for k, v in budget.items() if v is not None}
    if budget:
        opts["budget"] = budget
    return opts


def print_plan(planned: dict[str, Any], indent: int | None) -> int:
    """A dry run's plan as JSON on stdout; exit 2 (with the limits on stderr) when it exceeds the
    budget, as the run itself would be refused."""
    print(json.dumps(planned, ensure_ascii=False, indent=indent))
    if planned["exceeded"]:
        err(f"error: the plan exceeds its budget: {'; '.join(planned['exceeded'])}")
        return EXIT_BAD_INPUT
    return EXIT_OK


def add_meta_args(p: argparse.ArgumentParser) -> None:
    """Metadata options of `rerank` / `batch` (see rag_rerank.fusion)."""
    p.add_argument("--meta-field", default=None, metavar="KEY",
                   help="fuse the scorer's order with this meta field (a date, a rating) before MMR")
    p.add_argument("--meta-weight", type=float, default=None, help="0 off ... 1 metadata order only (1.0)")
    p.add_argument("--meta-ranking-mode", choices=["reciprocal_rank_fusion", "linear_score"], default=None,
                   help="how the two orders are fused (reciprocal_rank_fusion)")
    p.add_argument("--meta-sort-order", choices=["descending", "ascending"], default=None,
                   help="descending (default): the largest / newest value is best")
    p.add_argument("--missing-meta", choices=["bottom", "top", "drop"], default=None,
                   help="where chunks without the field go (bottom); drop lists them in dropped")
    p.add_argument("--meta-value-type", choices=["float", "int", "date"], default=None,
                   help="how values are read (float); date is ISO 8601")
    p.add_argument("--embed-meta-field", action="append", default=None, metavar="KEY",
                   dest="embed_meta_fields",
                   help="put this meta field's value before each chunk's text for the scorers (repeatable)")


META_FLAGS = ("meta_weight", "meta_ranking_mode", "meta_sort_order", "missing_meta", "meta_value_type")


def meta_options(args: argparse.Namespace) -> dict[str, Any]:
    """The metadata options given on the command line (unset ones keep the library's defaults)."""
    opts = {key: getattr(args, key) for key in (*META_FLAGS, "meta_field", "embed_meta_fields")
            if getattr(args, key, None) is not None}
    given = [f"--{key.replace('_', '-')}" for key in META_FLAGS if key in opts]
    if given and "meta_field" not in opts:
        verb = "needs" if len(given) == 1 else "need"
        raise UsageError(f"{', '.join(given)} {verb} --meta-field KEY (the field to fuse with)")
    return opts


@contextlib.contextmanager
def one_prompt(command: str) -> Iterator[None]:
    """Within it, the advice over max_chunks suits a command that takes one prompt's chunks (no
    --window-size), not the default that sends the user to that flag."""
    def advice(_limits: Limits) -> str:
        return (f"{command} takes the chunks of one prompt: split the set or pre-filter it "
                "(--window-size is a flag of rerank, batch and eval)")

    token = MAX_CHUNKS_ADVICE.set(advice)
    try:
        yield
    finally:
        MAX_CHUNKS_ADVICE.reset(token)


def embedder_option(args: argparse.Namespace) -> Any:
    """The `--embedder` spec, or an `openai` embedder bound to `--embed-base-url`.

    Without `--embed-base-url`, `rerank()` decides (an openai backend's `--base-url` is followed,
    see `backends.factory.resolve_embedder`). A URL for an embedder that makes no HTTP calls would be
    silently ignored, so it is a usage error instead.
    """
    spec: str = args.embedder
    url: str | None = args.embed_base_url
    if url is not None and (problem := base_url_problem(url)):
        raise UsageError(f"--embed-base-url: {problem}")
    if parse_embedder_spec(spec)[0] != "openai":
        if url is not None:
            raise UsageError(f"--embed-base-url applies only to --embedder openai[:MODEL], not {spec!r}")
        return spec
    if url is None:
        return spec  # resolved with the backend's options by rerank.resolve_embedder
    return get_embedder(spec, base_url=url)


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    if args.base_url is not None and (problem := base_url_problem(args.base_url)):
        raise UsageError(f"--base-url: {problem}")
    if args.base_url is not None and args.backend in ("local", "cross-encoder"):
        # These backends call no server; a URL given to them would be silently ignored.
        raise UsageError(f"--base-url names the server of --backend openai, anthropic or rerank-api; the "
                         f"{args.backend} backend calls none (for an openai embedder's server, use "
                         "--embed-base-url)")
    if args.model is not None and args.backend == "local":
        # `-m gpt-4o-mini` without `--backend openai` would rank with the local scorer, silently.
        raise UsageError(f"--model {args.model} names the model of --backend openai, anthropic, rerank-api "
                         "or cross-encoder; the local backend takes none (its scorer follows --embedder)")
    knobs = {key: getattr(args, key, None) for key in CE_FLAGS}
    knobs = {key: value for key, value in knobs.items() if value is not None}
    if knobs and args.backend != "cross-encoder":
        flags = ", ".join(f"--{key.replace('_', '-')}" for key in knobs)
        verb = "applies" if len(knobs) == 1 else "apply"
        raise UsageError(f"{flags} {verb} to --backend cross-encoder only")
    if getattr(args, "scoring", None) is not None:
        if args.backend != "openai":
            raise UsageError(f"--scoring applies to --backend openai only, not {args.backend}")
        knobs["scoring"] = args.scoring
    if getattr(args, "http", None) is not None:
        if args.backend not in ("openai", "anthropic"):
            raise UsageError(f"--http applies to --backend openai or anthropic only, not {args.backend}")
        knobs["http"] = args.http
    return {"backend": args.backend, "model": args.model, "base_url": args.base_url,
            "embedder": embedder_option(args), "fallback": args.fallback, "policy": retry_policy(args),
            "backend_options": knobs or None, "window_size": getattr(args, "window_size", None)}


CE_FLAGS = ("device", "batch_size", "max_length", "calibration_factor")


def retry_policy(args: argparse.Namespace) -> Any:
    """A RetryPolicy carrying `--deadline` and `--max-tokens`, or None for the default policy."""
    deadline = getattr(args, "deadline", None)
    max_tokens = getattr(args, "max_tokens", None)
    if deadline is None and max_tokens is None:
        return None
    if deadline is not None and (not math.isfinite(deadline) or deadline <= 0):
        raise UsageError(f"--deadline must be a positive number of seconds, got {deadline:g}")
    if max_tokens is not None and max_tokens < 16:
        raise UsageError(f"--max-tokens must be at least 16, got {max_tokens}")
    kwargs: dict[str, Any] = {"max_tokens": max_tokens}
    if deadline is not None:
        kwargs["deadline_s"] = deadline
    if max_tokens is not None:
        # The cap bounds the truncation retry (budget x2), not the first ask: keep room for one.
        kwargs["max_tokens_cap"] = max(RetryPolicy.max_tokens_cap, 2 * max_tokens)
    return RetryPolicy(**kwargs)


def progress_bar(enabled: bool, unit: str = "query") -> tuple[Callable[[int, int], None] | None, Any]:
    """A tqdm bar on stderr for `progress(done, total)` callbacks, and the bar to close; (None,
    None) when not wanted, stderr is not a terminal, or tqdm is not installed."""
    if not enabled or not sys.stderr.isatty():
        return None, None
    try:
        from tqdm import tqdm
    except ImportError:
        return None, None
    bar = tqdm(unit=unit, file=sys.stderr, leave=False)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return update, bar
