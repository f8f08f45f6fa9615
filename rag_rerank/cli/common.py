"""What the commands share: one-line errors on stderr, argument types, the option groups several
commands take (each flag built from the options' table, `options.OPTIONS`: `add_flags`), and the
library options those flags become.

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
from ..backends.factory import BACKEND_OPTIONS, unused_option_violations
from ..cache import ResponseCache
from ..embed import get_embedder, parse_embedder_spec
from ..errors import InputError, UsageError, Violation
from ..fallback_chain import as_chain, parse_steps
from ..guard.input import MAX_CHUNKS_ADVICE
from ..options import OPTION, OPTIONS, SCORING_OPTIONS, Flag
from ..retry import RetryPolicy
from ..textio import violation_lines

if TYPE_CHECKING:
    from ..guard.limits import Limits

# How a flag's `kind` in the options' table is read.
FLAG_TYPES: dict[str, Callable[[str], Any]] = {"str": str, "int": lambda text: whole_number(text),
                                               "float": float, "steps": lambda text: fallback_steps(text)}

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


def add_html_arg(p: argparse.ArgumentParser, shows: str) -> None:
    """`--html FILE` of the measuring commands: a self-contained page (`report.py`)."""
    p.add_argument("--html", default=None, metavar="FILE", help=f"also write a self-contained HTML report "
                   f"({shows}; needs rag-rerank[report])")


def add_flags(p: argparse.ArgumentParser | argparse._ArgumentGroup, command: str, *names: str,
              required: Sequence[str] = (), what: str = "the rerank") -> None:
    """The flags of these options (`layout`) or single flags (`--embedder`), as the options' table
    (`options.OPTIONS`) declares them: names, kind, choices, default and help (the command's own
    wording where the table gives one). `required` names flags the command cannot do without."""
    for name in names:
        option = OPTION.get(name)
        flags = (option.flags if option is not None
                 else tuple(f for o in OPTIONS for f in o.flags if f.name == name))
        if not flags:
            raise ValueError(f"no option or flag {name!r} in the options' table")
        for flag in flags:
            _add_flag(p, flag, command, flag.name in required, what)


def _add_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup, flag: Flag, command: str, required: bool,
              what: str) -> None:
    kwargs: dict[str, Any] = {"help": flag.help_for(command).replace("{what}", what)}
    if flag.kind == "switch":
        kwargs["action"] = "store_true"
    elif flag.kind == "append":
        kwargs.update(action="append", default=None)
    elif flag.kind == "optional":
        kwargs.update(nargs="?", const=True, default=flag.default)
    else:
        kwargs.update(type=FLAG_TYPES[flag.kind], default=flag.default)
    if required:
        kwargs["required"] = True
    if flag.metavar is not None:
        kwargs["metavar"] = flag.metavar
    if flag.choices is not None:
        kwargs["choices"] = list(flag.choices)
    if flag.dest is not None:
        kwargs["dest"] = flag.dest
    p.add_argument(*flag.names, **kwargs)


def add_request_args(p: argparse.ArgumentParser, command: str, top_k_required: bool = False) -> None:
    p.add_argument("--query", "-q", required=True, help="the query to rank against")
    p.add_argument("--chunks", "-c", required=True, metavar="FILE|-",
                   help="JSONL chunks file, or - for stdin")
    add_flags(p, command, "top_k", "lambda_", required=("--top-k",) if top_k_required else ())


def add_backend_args(p: argparse.ArgumentParser, command: str) -> None:
    add_flags(p, command, "backend", "model", "base_url", "backend_options", "embedder", "fallback", "policy")


def add_window_args(p: argparse.ArgumentParser, command: str, concurrency: bool = False) -> None:
    add_flags(p, command, "window_size", *(("concurrency",) if concurrency else ()))


def add_pipeline_args(p: argparse.ArgumentParser, command: str) -> None:
    """Options of `rerank` / `batch` only: the post-pass layout, strict parsing, the duplicate
    threshold and the minimum score, the calibration and consistency,
    the shortening of long chunks."""
    add_flags(p, command, "layout", "strict", "duplicate_threshold", "limits", "calibration", "consistency",
              "max_tokens_per_chunk")


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


def add_cost_args(p: argparse.ArgumentParser, command: str, batch: bool = False) -> None:
    """The response cache, the dry run, prices and the budget (`rerank`, `batch`; docs/cost.md)."""
    g = p.add_argument_group("cost", "cache answers, plan before spending, and cap the spend")
    add_flags(g, command, "cache")
    g.add_argument("--dry-run", action="store_true",
                   help="print the plan (calls, round trips, estimated tokens and cost) and make no request")
    add_flags(g, command, "prices", "budget", what="the whole batch" if batch else "the rerank")


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


def add_meta_args(p: argparse.ArgumentParser, command: str) -> None:
    """Metadata options of `rerank` / `batch` (see rag_rerank.fusion)."""
    add_flags(p, command, *SCORING_OPTIONS)


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
    # A connection option the backend would ignore (`-m gpt-4o-mini` without `--backend openai`
    # would rank with the local scorer, silently): the factory's check, worded with the flags.
    unused = unused_option_violations(args.backend, model=args.model, base_url=args.base_url,
                                      hints={"base_url": " (an openai embedder's server: --embed-base-url)"})
    if unused:
        raise with_flags(InputError(unused), {"model": "--model", "base_url": "--base-url"})
    knobs = {key: getattr(args, key, None) for key in BACKEND_FLAGS}
    knobs = {key: value for key, value in knobs.items() if value is not None}
    # A backend's own knob given to another backend, from what each backend takes (the factory's).
    foreign = [key for key in knobs if key not in BACKEND_OPTIONS.get(args.backend, ())]
    if foreign:
        by_takers: dict[str, list[str]] = {}
        for key in foreign:
            takers = " or ".join(b for b, takes in BACKEND_OPTIONS.items() if key in takes)
            by_takers.setdefault(takers, []).append(f"--{key.replace('_', '-')}")
        raise UsageError("; ".join(f"{', '.join(flags)} {'applies' if len(flags) == 1 else 'apply'} to "
                                   f"--backend {takers} only, not {args.backend}"
                                   for takers, flags in by_takers.items()))
    return {"backend": args.backend, "model": args.model, "base_url": args.base_url,
            "embedder": embedder_option(args), "fallback": args.fallback, "policy": retry_policy(args),
            "backend_options": knobs or None, "window_size": getattr(args, "window_size", None)}


# The flags of `backend_options`: each a knob of the backends that take it (`BACKEND_OPTIONS`).
BACKEND_FLAGS = tuple((f.dest or f.name.removeprefix("--").replace("-", "_"))
                      for f in OPTION["backend_options"].flags)


def fallback_steps(text: str) -> str | list[str]:
    """`--fallback local` or a chain `--fallback cross-encoder:MODEL,local,input`; a bad step is a usage
    error naming it (exit 2)."""
    steps = parse_steps(text)
    try:
        as_chain(steps)
    except InputError as exc:
        raise argparse.ArgumentTypeError("; ".join(v.message for v in exc.violations)) from None
    return steps


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
