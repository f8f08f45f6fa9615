"""`rag-rerank`: argument parsing, input reading and exit codes; the work happens elsewhere.

Exit codes: 0 ok · 1 invalid LLM output (`check`) · 2 bad input or usage · 3 backend failure.
Errors go to stderr, one line each, naming the line / id / field / limit at fault; a long list is
cut after `MAX_SHOWN_VIOLATIONS` lines plus one line with the total.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .errors import (
    BackendError,
    InputError,
    MissingDependencyError,
    OutputError,
    RerankError,
    Violation,
)
from .textio import UsageError, read_text, violation_lines

EXIT_OK, EXIT_INVALID_OUTPUT, EXIT_BAD_INPUT, EXIT_BACKEND = 0, 1, 2, 3


def _err(line: str) -> None:
    """One line on stderr, whatever the message holds (newlines, unencodable characters)."""
    flat = " ".join(str(line).splitlines()).encode("utf-8", "backslashreplace").decode("utf-8")
    print(f"rag-rerank: {flat}", file=sys.stderr)


def _print_violations(violations: Sequence[Violation], prefix: str = "error") -> None:
    for line in violation_lines(violations):
        _err(f"{prefix}: {line}")


def _add_request_args(p: argparse.ArgumentParser, top_k_required: bool = False) -> None:
    p.add_argument("--query", "-q", required=True, help="the query to rank against")
    p.add_argument("--chunks", "-c", required=True, metavar="FILE|-",
                   help="JSONL chunks file, or - for stdin")
    p.add_argument("--top-k", "-k", type=int, default=None, required=top_k_required,
                   help="how many to keep (5)")
    p.add_argument("--lambda", dest="lambda_", type=float, default=None,
                   help="MMR trade-off in [0, 1] (0.7)")


def _add_backend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", "-b", default="local", choices=["local", "openai", "anthropic"],
                   help="who scores the chunks (default: local, offline and deterministic)")
    p.add_argument("--model", "-m", default=None, help="model name for openai / anthropic backends")
    p.add_argument("--base-url", default=None,
                   help="backend server URL, e.g. http://127.0.0.1:8000/v1 (with --backend openai, also "
                   "the openai embedder's; see --embed-base-url)")
    p.add_argument("--embedder", "-e", default="lexical",
                   help="post-pass embedder: lexical (default), sentence-transformers[:MODEL], "
                   "openai[:MODEL]")
    p.add_argument("--embed-base-url", default=None, metavar="URL",
                   help="OpenAI-compatible embeddings server for --embedder openai[:MODEL] (default: "
                   "--base-url when --backend is openai, otherwise OPENAI_BASE_URL or api.openai.com)")
    p.add_argument("--fallback", choices=["local"], default=None,
                   help="if the backend fails after all attempts, return the local ranking (flagged in meta)")


def _add_pipeline_args(p: argparse.ArgumentParser) -> None:
    """Options of `rerank` / `batch` only (engineer C): the post-pass layout and strict parsing."""
    p.add_argument("--layout", default="mmr", choices=["mmr", "diversity", "lost_in_the_middle"],
                   help="order of the kept chunks (default: mmr)")
    p.add_argument("--strict", action="store_true",
                   help="no formatting repair: a fenced or prose-wrapped answer is re-asked, not salvaged")


def cmd_render(args: argparse.Namespace) -> int:
    from .guard import validate_request
    from .render import render

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
    chunks = parse_chunks(read_text(args.chunks))
    raw = read_text(args.output, what="OUTPUT_FILE")
    if args.repair:
        fixed = repair_output(raw)
        for r in fixed.repairs:
            _err(f"repair: {r}")
        raw = fixed.text
    _, violations = judge(raw, chunks, args.top_k)
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
    from .embed import get_embedder, parse_embedder_spec
    from .rerank import base_url_problem

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
    from .rerank import base_url_problem

    if args.base_url is not None and (problem := base_url_problem(args.base_url)):
        raise UsageError(f"--base-url: {problem}")
    if args.base_url is not None and args.backend == "local":
        # The local backend calls no server; a URL given to it would be silently ignored.
        raise UsageError("--base-url names the server of --backend openai or anthropic; the local "
                         "backend calls none (for an openai embedder's server, use --embed-base-url)")
    return {"backend": args.backend, "model": args.model, "base_url": args.base_url,
            "embedder": _embedder_option(args), "fallback": args.fallback}


def cmd_rerank(args: argparse.Namespace) -> int:
    from .rerank import rerank

    result = rerank(args.query, read_text(args.chunks), args.top_k, args.lambda_, layout=args.layout,
                    strict=args.strict, **_backend_options(args))
    print(result.to_json(indent=args.indent))
    if args.meta:
        print(json.dumps(result.meta.to_dict(), ensure_ascii=False), file=sys.stderr)
    return EXIT_OK


def cmd_batch(args: argparse.Namespace) -> int:
    from .batch import run_batch_cli

    return run_batch_cli(args, backend_options={**_backend_options(args), "layout": args.layout,
                                                "strict": args.strict})


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

    return run_eval_cli(args, backend_options=_backend_options(args))


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (and exit 2) instead of a usage block."""

    def error(self, message: str) -> NoReturn:
        _err(f"{self.prog.removeprefix('rag-rerank').strip() or 'usage'}: error: {message} "
             f"(see {self.prog} --help)")
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rag-rerank", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("rerank", help="rerank chunks for a query and print the result object")
    _add_request_args(p)
    _add_backend_args(p)
    p.add_argument("--meta", action="store_true",
                   help="print run metadata (attempts, usage, latency) to stderr")
    p.add_argument("--indent", type=int, default=None, help="pretty-print the JSON")
    _add_pipeline_args(p)
    p.set_defaults(func=cmd_rerank)

    p = sub.add_parser("render", help="print the XML prompt that would be sent to an LLM")
    _add_request_args(p)
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("check", help="judge a raw LLM output against the contract (exit 1 if invalid)")
    p.add_argument("--chunks", "-c", required=True, metavar="FILE|-",
                   help="the JSONL chunks the output refers to")
    p.add_argument("--top-k", "-k", type=int, required=True, help="the top_k the output was asked for")
    p.add_argument("--repair", action="store_true", help="first strip fences / prose / <think> (reported)")
    p.add_argument("output", nargs="?", default="-", metavar="OUTPUT_FILE|-")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("route", help="decide whether an utterance should route to a skill")
    p.add_argument("utterance")
    p.add_argument("--n-chunks", type=int, default=None, help="how many chunks the agent holds")
    p.add_argument("--embedder", default="lexical", help="lexical (default) or sentence-transformers[:MODEL]")
    p.set_defaults(func=cmd_route)

    p = sub.add_parser("golden", help="run the golden regression cases offline")
    p.add_argument("dir", nargs="?", default=None, help="golden folder (default: the packaged one)")
    p.add_argument("--verbose", "-v", action="store_true")
    p.set_defaults(func=cmd_golden)

    p = sub.add_parser("batch", help="rerank many queries from JSONL, resumable, results in input order")
    p.add_argument("--input", "-i", required=True, metavar="FILE",
                   help="JSONL: {query, chunks, top_k?, lambda?, query_id?}")
    p.add_argument("--output", "-o", default="-", metavar="FILE|-", help="JSONL results (default stdout)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--resume", action="store_true", help="skip lines already present in --output")
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    _add_backend_args(p)
    _add_pipeline_args(p)
    p.set_defaults(func=cmd_batch)

    p = sub.add_parser("eval", help="measure nDCG@10 / Recall / MRR of input vs reranked order")
    p.add_argument("--candidates", required=True, metavar="FILE",
                   help="JSONL {qid, query, chunks:[{id,text}]}")
    p.add_argument("--qrels", required=True, metavar="FILE", help="TREC qrels")
    p.add_argument("--k", type=int, default=10, help="top_k to keep and Recall@k cut-off")
    p.add_argument("--depth", type=int, default=None,
                   help="rerank the first N candidates of each query (default 50, the card's limit); "
                   "the rest keep their input positions after them")
    p.add_argument("--rel-level", type=int, default=1,
                   help="lowest qrels grade that counts as relevant for Recall and MRR (DL19 convention: 2)")
    p.add_argument("--duplicate-threshold", type=float, default=None,
                   help="post-pass near-duplicate cosine (default: the embedder's own; 1.0 keeps all but "
                   "identical vectors)")
    p.add_argument("--lambda", dest="lambda_", type=float, default=None)
    p.add_argument("--subtopics", default=None, metavar="FILE", help="subtopic judgments for alpha-nDCG")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--resume", default=None, metavar="FILE", help="cache of per-query results to resume from")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--no-progress", action="store_true")
    _add_backend_args(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("mcp", help="serve the rerank tool over MCP stdio (needs rag-rerank[mcp])")
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): a return code, so main() is testable
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    return _dispatch(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
