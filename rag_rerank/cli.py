"""`rag-rerank`: argument parsing, input reading and exit codes; the work happens elsewhere.

Exit codes: 0 ok · 1 invalid LLM output (`check`) · 2 bad input or usage · 3 backend failure.
Errors go to stderr, one line each, naming the line / id / field / limit at fault; a long list is
cut after `MAX_SHOWN_VIOLATIONS` lines plus one line with the total.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .errors import (
    BackendError,
    InputError,
    MissingDependencyError,
    OutputError,
    RerankError,
    Violation,
)
from .textio import UsageError, read_text, violation_lines

if TYPE_CHECKING:
    from .guard.limits import Limits

EXIT_OK, EXIT_INVALID_OUTPUT, EXIT_BAD_INPUT, EXIT_BACKEND = 0, 1, 2, 3


def _err(line: str) -> None:
    """One line on stderr, whatever the message holds (newlines, unencodable characters)."""
    flat = " ".join(str(line).splitlines()).encode("utf-8", "backslashreplace").decode("utf-8")
    print(f"rag-rerank: {flat}", file=sys.stderr)


def _print_violations(violations: Sequence[Violation], prefix: str = "error") -> None:
    for line in violation_lines(violations):
        _err(f"{prefix}: {line}")


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


def _add_request_args(p: argparse.ArgumentParser, top_k_required: bool = False) -> None:
    p.add_argument("--query", "-q", required=True, help="the query to rank against")
    p.add_argument("--chunks", "-c", required=True, metavar="FILE|-",
                   help="JSONL chunks file, or - for stdin")
    p.add_argument("--top-k", "-k", type=whole_number, default=None, required=top_k_required,
                   help="how many to keep (5)")
    p.add_argument("--lambda", dest="lambda_", type=float, default=None,
                   help="MMR trade-off in [0, 1] (0.7)")


def _add_backend_args(p: argparse.ArgumentParser) -> None:
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


def _add_window_args(p: argparse.ArgumentParser, concurrency: bool = False) -> None:
    p.add_argument("--window-size", type=int, default=None, metavar="N",
                   help="more candidates than one prompt takes (up to 1000): score windows of N chunks "
                   "concurrently, then one final pass over the best N (N at most 50)")
    if concurrency:
        p.add_argument("--concurrency", type=int, default=4,
                       help="with --window-size: window calls in flight at most (default 4)")


def _add_pipeline_args(p: argparse.ArgumentParser) -> None:
    """Options of `rerank` / `batch` only (engineer C): the post-pass layout and strict parsing."""
    p.add_argument("--layout", default="mmr", choices=["mmr", "diversity", "lost_in_the_middle"],
                   help="order of the kept chunks (default: mmr)")
    p.add_argument("--strict", action="store_true",
                   help="no formatting repair: a fenced or prose-wrapped answer is re-asked, not salvaged")


def _add_meta_args(p: argparse.ArgumentParser) -> None:
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


_META_FLAGS = ("meta_weight", "meta_ranking_mode", "meta_sort_order", "missing_meta", "meta_value_type")


def _meta_options(args: argparse.Namespace) -> dict[str, Any]:
    """The metadata options given on the command line (unset ones keep the library's defaults)."""
    opts = {key: getattr(args, key) for key in (*_META_FLAGS, "meta_field", "embed_meta_fields")
            if getattr(args, key, None) is not None}
    given = [f"--{key.replace('_', '-')}" for key in _META_FLAGS if key in opts]
    if given and "meta_field" not in opts:
        verb = "needs" if len(given) == 1 else "need"
        raise UsageError(f"{', '.join(given)} {verb} --meta-field KEY (the field to fuse with)")
    return opts


@contextlib.contextmanager
def _one_prompt(command: str) -> Iterator[None]:
    """Within it, the advice over max_chunks suits a command that takes one prompt's chunks (no
    --window-size), not the default that sends the user to that flag."""
    from .guard.input import MAX_CHUNKS_ADVICE

    def advice(_limits: Limits) -> str:
        return (f"{command} takes the chunks of one prompt: split the set or pre-filter it "
                "(--window-size is a flag of rerank, batch and eval)")

    token = MAX_CHUNKS_ADVICE.set(advice)
    try:
        yield
    finally:
        MAX_CHUNKS_ADVICE.reset(token)


def cmd_render(args: argparse.Namespace) -> int:
    from .guard import validate_request
    from .render import render

    with _one_prompt("render"):
        request = validate_request(args.query, read_text(args.chunks), args.top_k, args.lambda_)
    sys.stdout.write(render(request))  # already ends with a newline: byte for byte the prompt
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    from .guard import parse_chunks
    from .guard.output import judge
    from .guard.repair import repair_output

    if args.top_k < 1:
        raise UsageError(f"--top-k must be a positive integer, got {args.top_k}")
    if args.chunks == "-" and args.output == "-":
        raise UsageError("--chunks and OUTPUT_FILE cannot both be read from stdin ('-')")
    with _one_prompt("check"):
        chunks = parse_chunks(read_text(args.chunks))
    raw = read_text(args.output, what="OUTPUT_FILE")
    if args.repair:
        fixed = repair_output(raw)
        for r in fixed.repairs:
            _err(f"repair: {r}")
        raw = fixed.text
    _, violations = judge(raw, chunks, args.top_k, query=args.query)
    if violations:
        _print_violations(violations, prefix="invalid")
        return EXIT_INVALID_OUTPUT
    print("valid")
    return EXIT_OK


def cmd_golden(args: argparse.Namespace) -> int:
    from .golden import run_golden

    return run_golden(Path(args.dir) if args.dir else None, verbose=args.verbose)


def _embedder_option(args: argparse.Namespace) -> Any:
    """The `--embedder` spec, or an `openai` embedder bound to `--embed-base-url`.

    Without `--embed-base-url`, `rerank()` decides (an openai backend's `--base-url` is followed,
    see `rerank.resolve_embedder`). A URL for an embedder that makes no HTTP calls would be
    silently ignored, so it is a usage error instead.
    """
    from .backends.factory import base_url_problem
    from .embed import get_embedder, parse_embedder_spec

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


def _backend_options(args: argparse.Namespace) -> dict[str, Any]:
    from .backends.factory import base_url_problem

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
    knobs = {key: getattr(args, key, None) for key in _CE_FLAGS}
    knobs = {key: value for key, value in knobs.items() if value is not None}
    if knobs and args.backend != "cross-encoder":
        flags = ", ".join(f"--{key.replace('_', '-')}" for key in knobs)
        verb = "applies" if len(knobs) == 1 else "apply"
        raise UsageError(f"{flags} {verb} to --backend cross-encoder only")
    return {"backend": args.backend, "model": args.model, "base_url": args.base_url,
            "embedder": _embedder_option(args), "fallback": args.fallback, "policy": _policy(args),
            "backend_options": knobs or None, "window_size": getattr(args, "window_size", None)}


_CE_FLAGS = ("device", "batch_size", "max_length", "calibration_factor")


def _policy(args: argparse.Namespace) -> Any:
    """A RetryPolicy carrying `--deadline` and `--max-tokens`, or None for the default policy."""
    deadline = getattr(args, "deadline", None)
    max_tokens = getattr(args, "max_tokens", None)
    if deadline is None and max_tokens is None:
        return None
    if deadline is not None and (not math.isfinite(deadline) or deadline <= 0):
        raise UsageError(f"--deadline must be a positive number of seconds, got {deadline:g}")
    if max_tokens is not None and max_tokens < 16:
        raise UsageError(f"--max-tokens must be at least 16, got {max_tokens}")
    from .retry import RetryPolicy

    kwargs: dict[str, Any] = {"max_tokens": max_tokens}
    if deadline is not None:
        kwargs["deadline_s"] = deadline
    if max_tokens is not None:
        # The cap bounds the truncation retry (budget x2), not the first ask: keep room for one.
        kwargs["max_tokens_cap"] = max(RetryPolicy.max_tokens_cap, 2 * max_tokens)
    return RetryPolicy(**kwargs)


def cmd_rerank(args: argparse.Namespace) -> int:
    from .rerank import rerank

    if args.concurrency < 1:
        raise UsageError(f"--concurrency must be at least 1, got {args.concurrency}")
    bar = _window_bar() if getattr(args, "window_size", None) else None
    from .windows import WINDOW_PROGRESS

    token = WINDOW_PROGRESS.set(bar.update if bar is not None else None)
    try:
        result = rerank(args.query, read_text(args.chunks), args.top_k, args.lambda_, layout=args.layout,
                        strict=args.strict, concurrency=args.concurrency, **_backend_options(args),
                        **_meta_options(args))
    finally:
        WINDOW_PROGRESS.reset(token)
        if bar is not None:
            bar.close()
    print(result.to_json(indent=args.indent))
    if args.meta:
        print(json.dumps(result.meta.to_dict(), ensure_ascii=False), file=sys.stderr)
    elif (notice := result.meta.fallback_notice("--fallback local")) is not None:
        # Exit 0 and a schema object on stdout look exactly like the backend's own ranking, so
        # without `--meta` the failure would go unseen. (With `--meta` stderr stays one JSON
        # object, whose `fallback` / `embedder_fallback` fields say it.)
        _err(f"warning: {notice}")
    return EXIT_OK


class _WindowBar:
    """A tqdm bar over the window calls of one `rerank --window-size` (created on the first report,
    when the number of calls is known), cleared when the result is printed."""

    def __init__(self, tqdm: Any) -> None:
        self.tqdm, self.bar = tqdm, None

    def update(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = self.tqdm(total=total, unit="call", desc="windows", file=sys.stderr, leave=False)
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _window_bar() -> _WindowBar | None:
    """A progress bar when stderr is a terminal and tqdm is installed (as in `batch`), else None."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return _WindowBar(tqdm)


def cmd_batch(args: argparse.Namespace) -> int:
    from .batch import run_batch_cli

    if args.engine == "local" and (args.workers is not None or args.ray_address is not None):
        raise UsageError("--workers and --ray-address need --engine ray")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    return run_batch_cli(args, backend_options={**_backend_options(args), "layout": args.layout,
                                                "strict": args.strict, **_meta_options(args)})


def cmd_route(args: argparse.Namespace) -> int:
    from .router import route

    decision = route(args.utterance, n_chunks=args.n_chunks, embedder=args.embedder)
    print(json.dumps(decision, ensure_ascii=False))
    return EXIT_OK


def cmd_mcp(args: argparse.Namespace) -> int:
    from .mcp_server import serve

    serve()
    return EXIT_OK


def cmd_eval(args: argparse.Namespace) -> int:
    from .evaluate import run_eval_cli

    return run_eval_cli(args, backend_options={**_backend_options(args), **_meta_options(args)})


DESCRIPTION = """\
Rerank retrieved chunks for a query with an LLM (or the offline local scorer): the best top-k
with a score and a concrete reason each, MMR-diverse, ids kept byte for byte, and every chunk
left out listed in `dropped` with its reason."""

EPILOG = """\
examples:
  rag-rerank rerank -q "When should I prefer IVF over HNSW?" -c chunks.jsonl -k 3
  rag-rerank rerank -q "..." -c chunks.jsonl --backend openai --base-url http://127.0.0.1:8000/v1
  rag-rerank check -c chunks.jsonl -k 3 answer.json

exit codes: 0 ok, 1 invalid LLM output (check) or a golden regression, 2 bad input or usage,
3 backend failure, 4 internal error (RAG_RERANK_DEBUG=1 shows the traceback), 130 interrupted.
Run `rag-rerank COMMAND --help` for a command's options."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (and exit 2) instead of a usage block."""

    def error(self, message: str) -> NoReturn:
        hint = ""
        if re.search(r"(?:^|\s)--api[-_]?key\b", message.partition("unrecognized arguments:")[2]):
            # `--api-key KEY` is what every SDK user tries first. Keys come from the environment
            # only (on the command line a key is visible in `ps` and kept in the shell history);
            # the key itself is not echoed back.
            message = _KEY_FLAG.sub(r"\1\2***", message)
            hint = ("; the CLI takes no API key flag: set OPENAI_API_KEY, ANTHROPIC_API_KEY or "
                    "RERANK_API_KEY (a server on 127.0.0.1 / localhost needs none)")
        _err(f"{self.prog.removeprefix('rag-rerank').strip() or 'usage'}: error: {message} "
             f"(see {self.prog} --help){hint}")
        raise SystemExit(EXIT_BAD_INPUT)


_KEY_FLAG = re.compile(r"((?:^|\s)--api[-_]?key)([=\s])\S+")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog="rag-rerank", description=DESCRIPTION, epilog=EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def command(name: str, summary: str, description: str | None = None) -> argparse.ArgumentParser:
        # The summary is the line in `rag-rerank --help`; `rag-rerank NAME --help` shows it too.
        # A description is laid out as written (so a pip command is never broken across lines).
        if description is not None:
            return sub.add_parser(name, help=summary, description=description,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        return sub.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".")

    p = command("rerank", "rerank chunks for a query and print the result object")
    _add_request_args(p)
    _add_backend_args(p)
    p.add_argument("--meta", action="store_true",
                   help="print run metadata (attempts, usage, latency) to stderr")
    p.add_argument("--indent", type=indent_width, default=None,
                   help="pretty-print the JSON (N spaces, N >= 0)")
    _add_pipeline_args(p)
    _add_meta_args(p)
    _add_window_args(p, concurrency=True)
    p.set_defaults(func=cmd_rerank)

    p = command("render", "print the XML prompt that would be sent to an LLM")
    _add_request_args(p)
    p.set_defaults(func=cmd_render)

    p = command("check", "judge a raw LLM output against the contract (exit 1 if invalid)")
    p.add_argument("--chunks", "-c", required=True, metavar="FILE|-",
                   help="the JSONL chunks the output refers to")
    p.add_argument("--top-k", "-k", type=whole_number, required=True,
                   help="the top_k the output was asked for")
    p.add_argument("--repair", action="store_true", help="first strip fences / prose / <think> (reported)")
    p.add_argument("--query", "-q", default=None,
                   help="the query the output answers: a reason may quote it as well as its chunk")
    p.add_argument("output", nargs="?", default="-", metavar="OUTPUT_FILE|-",
                   help="the raw LLM answer to judge, or - for stdin (the default)")
    p.set_defaults(func=cmd_check)

    p = command("route", "decide whether an utterance should route to a skill")
    p.add_argument("utterance", help="what the user or agent said, e.g. \"rerank these chunks for my query\"")
    p.add_argument("--n-chunks", type=whole_number, default=None, help="how many chunks the agent holds")
    p.add_argument("--embedder", default="lexical",
                   help="lexical (default) or sentence-transformers[:MODEL] (needs rag-rerank[st])")
    p.set_defaults(func=cmd_route)

    p = command("golden", "run the golden regression cases offline")
    p.add_argument("dir", nargs="?", default=None, help="golden folder (default: the packaged one)")
    p.add_argument("--verbose", "-v", action="store_true", help="list every case, not only the failures")
    p.set_defaults(func=cmd_golden)

    p = command("batch", "rerank many queries from JSONL, resumable, results in input order")
    p.add_argument("--input", "-i", required=True, metavar="FILE",
                   help="JSONL: {query, chunks, top_k?, lambda?, query_id?}")
    p.add_argument("--output", "-o", default="-", metavar="FILE|-", help="JSONL results (default stdout)")
    p.add_argument("--concurrency", type=whole_number, default=4,
                   help="requests in flight at most (default 4)")
    p.add_argument("--resume", action="store_true",
                   help="continue --output: skip the lines already in it (written with the same settings)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing non-empty --output (without it or --resume, batch refuses to)")
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="local: one process, async (default); ray: Ray Data actors (needs rag-rerank[ray])")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray on all cores)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="Ray actors, each with --concurrency requests in flight (default: the CPUs)")
    _add_backend_args(p)
    _add_pipeline_args(p)
    _add_meta_args(p)
    _add_window_args(p)
    p.set_defaults(func=cmd_batch)

    p = command("eval", "measure nDCG@10 / Recall / MRR of input vs reranked order (needs rag-rerank[eval])")
    p.add_argument("--candidates", required=True, metavar="FILE",
                   help="JSONL {qid, query, chunks:[{id,text}]}")
    p.add_argument("--qrels", required=True, metavar="FILE", help="TREC qrels")
    p.add_argument("--k", type=whole_number, default=10,
                   help="top_k to keep and Recall@k cut-off (default 10)")
    p.add_argument("--depth", type=whole_number, default=None,
                   help="rerank the first N candidates of each query (default 50, the card's limit; with "
                   "--window-size, all of them up to 1000); the rest keep their input positions after them")
    p.add_argument("--rel-level", type=int, default=1,
                   help="lowest qrels grade that counts as relevant for Recall and MRR (default 1; DL19 "
                   "convention: 2)")
    p.add_argument("--duplicate-threshold", type=float, default=None,
                   help="post-pass near-duplicate cosine in [0, 1] (default: the embedder's own; 1.0 keeps "
                   "all but identical vectors)")
    p.add_argument("--lambda", dest="lambda_", type=float, default=None,
                   help="MMR trade-off in [0, 1] (0.7)")
    p.add_argument("--subtopics", default=None, metavar="FILE", help="subtopic judgments for alpha-nDCG")
    p.add_argument("--concurrency", type=whole_number, default=4,
                   help="queries reranked at once at most (default 4)")
    p.add_argument("--resume", default=None, metavar="FILE", help="cache of per-query results to resume from")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    _add_backend_args(p)
    _add_window_args(p)
    _add_meta_args(p)
    p.set_defaults(func=cmd_eval)

    p = command("mcp", "serve the rerank tool over MCP stdio (needs rag-rerank[mcp])",
                "Serve the rerank tool over MCP stdio: an MCP client (an agent, a desktop app)\n"
                "starts this command and calls the tool. Needs the mcp extra:\n"
                "  pip install 'rag-rerank[mcp]'")
    p.set_defaults(func=cmd_mcp)
    return parser


def _dispatch(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return func(args)
    except InputError as exc:
        _print_violations(exc.violations)
        return EXIT_BAD_INPUT
    except OutputError as exc:
        _print_violations(exc.violations, prefix="invalid")
        return EXIT_INVALID_OUTPUT
    except BackendError as exc:
        _err(f"backend failure: {exc}")
        return EXIT_BACKEND
    except (UsageError, MissingDependencyError) as exc:
        _err(f"error: {exc}")
        return EXIT_BAD_INPUT
    except RerankError as exc:
        _err(f"error: {exc}")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_OK
    except OSError as exc:  # the environment, not a bug: stdout on a full disk, an unreadable stdin
        if os.environ.get("RAG_RERANK_DEBUG"):
            raise
        where = f": {exc.filename}" if exc.filename else ""
        _err(f"error: I/O error: {exc.strerror or exc}{where}")
        return EXIT_BAD_INPUT
    except Exception as exc:  # never a traceback for a user; RAG_RERANK_DEBUG=1 shows it
        if os.environ.get("RAG_RERANK_DEBUG"):
            raise
        _err(f"internal error: {type(exc).__name__}: {exc} (set RAG_RERANK_DEBUG=1 for the traceback)")
        return 4


def _quiet_stdout() -> None:
    """The reader of stdout went away (`rag-rerank batch | head`): point stdout at /dev/null so
    the interpreter's final flush does not print a BrokenPipeError of its own."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout replaced by an object without a descriptor
        pass


def _utf8_stdout() -> None:
    """Results are JSON on stdout, and JSON between programs is UTF-8 (RFC 8259). A stdout whose
    encoding cannot carry every character (a pipe on Windows in cp1252, PYTHONIOENCODING=ascii)
    ended a run at the first non-ASCII id with a UnicodeEncodeError (exit 4), after the work was
    done: such a pipe or file is switched to UTF-8; a terminal keeps its encoding and shows what it
    cannot display escaped. (stderr already escapes: Python opens it with backslashreplace.)"""
    import codecs

    stream = sys.stdout
    try:
        if codecs.lookup(stream.encoding or "").name == "utf-8":
            return
    except (LookupError, AttributeError, TypeError):
        pass
    try:
        if stream.isatty():
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        else:
            stream.reconfigure(encoding="utf-8")  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):  # not a TextIOWrapper (replaced by a caller): leave it
        pass


def main(argv: Sequence[str] | None = None) -> int:
    _utf8_stdout()
    parser = build_parser()
    try:
        args, extras = parser.parse_known_args(argv)
        if extras:
            # An unknown flag is the subcommand's usage error: its name and `--help` list the flags
            # it does take (argparse leaves it to the top-level parser: "see rag-rerank --help").
            commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extras)}")
    except SystemExit as exc:  # --help (0) or a usage error (2): a return code, so main() is testable
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    from .guard.input import PATH_HINT

    # A file name piped to `-c -` gets advice for the command line, not for Python callers.
    hint = PATH_HINT.set("; the chunks must be JSONL text: pass the file itself with -c FILE")
    try:
        return _dispatch(args.func, args)
    finally:
        PATH_HINT.reset(hint)


if __name__ == "__main__":
    sys.exit(main())
