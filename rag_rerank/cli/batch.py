"""`rag-rerank batch`: many queries from a JSONL file, results in input order, resumable.

The file formats, `--resume` and the exit code are `batchfile.py`'s; this module reads the input,
refuses an output it would destroy, runs the requests (one `Reranker` session for the run, a session
in each of `--workers` local processes (`processes.py`), or Ray actors with `--engine ray`) and
writes each record as soon as every earlier one is written.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ..backends.common import planning
from ..batchfile import (
    OrderedWriter,
    Outcome,
    check_config,
    check_resumed,
    exit_code,
    parse_input,
    read_done,
    record,
    record_config,
)
from ..errors import UsageError
from ..guard.input import PATH_HINT
from ..options import split_options
from ..processes import run_local, run_processes
from ..redaction import secrets_of
from ..session import Reranker
from ..textio import read_text
from .common import (
    add_backend_args,
    add_cost_args,
    add_flags,
    add_meta_args,
    add_pipeline_args,
    add_window_args,
    cost_options,
    meta_options,
    pipeline_options,
    print_plan,
    run_options,
)


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("batch", "rerank many queries from JSONL, resumable, results in input order")
    p.add_argument("--input", "-i", required=True, metavar="FILE",
                   help="JSONL: {query, chunks, top_k?, lambda?, query_id?}")
    p.add_argument("--output", "-o", default="-", metavar="FILE|-", help="JSONL results (default stdout)")
    add_flags(p, "batch", "concurrency")
    p.add_argument("--resume", action="store_true",
                   help="continue --output: skip the lines already in it (written with the same settings)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing non-empty --output (without it or --resume, batch refuses to)")
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    p.add_argument("--scores", action="store_true",
                   help="add every input id's score (or why it has none) to each record, beside result")
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="local: this machine, async, in this process or in --workers processes (default); "
                        "ray: Ray Data actors (needs rag-rerank[ray])")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray on all cores)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="worker processes (local engine, default 1: this process) or Ray actors (default: "
                        "the CPUs), each with --concurrency requests in flight; more than 1 spreads the "
                        "CPU work of a large batch over cores")
    add_backend_args(p, "batch")
    add_pipeline_args(p, "batch")
    add_meta_args(p, "batch")
    add_window_args(p, "batch")
    add_cost_args(p, "batch", batch=True)
    p.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    if args.engine == "local" and args.ray_address is not None:
        raise UsageError("--ray-address needs --engine ray")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    spread = args.engine == "ray" or (args.workers or 1) > 1
    if spread and not args.dry_run and any(
            getattr(args, f) is not None for f in ("budget_calls", "budget_tokens", "budget_cost")):
        raise UsageError("--budget-calls / --budget-tokens / --budget-cost need one process (--engine local "
                         "with --workers 1, the default: Ray actors and worker processes spend apart); check "
                         "the plan with --dry-run")
    cores = os.cpu_count() or 1
    if args.engine == "local" and (args.workers or 1) > cores and not args.dry_run:
        print(f"rag-rerank: batch: note: --workers {args.workers} is more than this machine's {cores} cores; "
              "the workers will compete for them (for more requests in flight, raise --concurrency)",
              file=sys.stderr)
    options = {**run_options(args), **pipeline_options(args), **meta_options(args), **cost_options(args)}
    return run_batch(args, backend_options=options)




def _dry_run(items: Sequence[Any], concurrency: int, options: Mapping[str, Any], indent: int | None) -> int:
    """`--dry-run`: the plan of every request still to do, summed, and no request."""
    options = dict(options)
    budget = options.pop("budget", None)
    session, request = split_options(options)
    with planning():  # a plan sends nothing: no API key needed
        reranker = Reranker(**session, **request)
    with reranker:
        planned = reranker.plan_many(items, concurrency=concurrency, budget=budget)
    return print_plan({**planned.to_dict(), "requests_planned": len(items)}, indent)


def _progress_bar(total: int, enabled: bool) -> Any:
    """A tqdm bar on stderr when it is a terminal and tqdm is installed; otherwise None."""
    if not enabled or total == 0 or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="query", file=sys.stderr)


def run_batch(args: Any, backend_options: Mapping[str, Any]) -> int:
    """Read, resume, run and write (see the module docstring); the exit code of the whole file."""
    if args.concurrency < 1:
        raise UsageError(f"--concurrency must be at least 1, got {args.concurrency}")
    to_stdout = args.output in (None, "-")
    overwrite = bool(getattr(args, "overwrite", False))
    if args.resume and to_stdout:
        raise UsageError("--resume needs --output FILE (it skips the lines already in that file)")
    if overwrite and to_stdout:
        raise UsageError("--overwrite needs --output FILE (it replaces that file)")
    if overwrite and args.resume:
        raise UsageError("--resume and --overwrite exclude each other: --resume continues --output, "
                         "--overwrite replaces it")
    lines = parse_input(read_text(args.input, what="input"))
    if not lines:
        raise UsageError(f"--input: {args.input} holds no requests; write one JSON object "
                         "{query, chunks, top_k?, lambda?, query_id?} per line")
    done: dict[int, dict[str, Any]] = {}
    out_path = None if to_stdout else Path(args.output)
    if out_path is not None and out_path.is_dir():
        raise UsageError(f"--output: {args.output} is a directory, not a file")
    if out_path is not None and args.input != "-" and out_path.exists() and out_path.samefile(args.input):
        # "w" would replace the requests with their results: the input is lost
        raise UsageError(f"--output: {args.output} is the --input file; write the results to another file")
    dry_run = bool(getattr(args, "dry_run", False))  # reads --output (with --resume), never writes it
    if (out_path is not None and not args.resume and not overwrite and not dry_run and out_path.is_file()
            and out_path.stat().st_size > 0):
        # "w" would truncate it: results of an earlier run (hours of LLM calls) lost to a missing flag
        raise UsageError(f"--output: {args.output} already exists and is not empty; pass --resume to "
                         "continue it or --overwrite to replace it")
    config = record_config(backend_options)
    if out_path is not None and args.resume:
        done, valid_end = read_done(out_path)
        check_resumed(done, lines, args.output)
        check_config(done, config, args.output)
        if out_path.exists() and valid_end < out_path.stat().st_size and not dry_run:
            with out_path.open("r+b") as fh:
                fh.truncate(valid_end)
    todo = [ln for ln in lines if ln.number not in done]
    if dry_run:
        return _dry_run([ln.item for ln in todo], args.concurrency, backend_options, None)
    secrets = secrets_of(backend_options.get("api_key"), urls=[backend_options.get("base_url")])
    options = {k: v for k, v in backend_options.items() if v is not None}
    bar = _progress_bar(len(todo), not getattr(args, "no_progress", False))
    stream: IO[str]
    if out_path is None:
        stream = sys.stdout
    else:
        if out_path.parent and not out_path.parent.exists():
            raise UsageError(f"--output: no such directory: {out_path.parent}")
        try:
            stream = out_path.open("a" if args.resume else "w", encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--output: cannot write {args.output}: {exc.strerror}") from None
    writer = OrderedWriter(stream, [ln.number for ln in todo])
    try:

        def on_record(index: int, rec: dict[str, Any]) -> None:
            writer.add(index, {**rec, "config": config})  # what `--resume` checks (record_config)
            if bar is not None:
                bar.update(1)

        def on_done(index: int, outcome: Outcome) -> None:
            on_record(index, record(todo[index], outcome, secrets, scores=getattr(args, "scores", False)))

        hint = PATH_HINT.set("")  # a batch line cannot hold a pathlib.Path: no Python advice
        try:
            if getattr(args, "engine", "local") == "ray":
                from ..integrations.ray import run_lines  # imports ray: only for --engine ray

                run_lines(
                    todo,
                    on_done=on_done,
                    on_record=on_record,
                    options=options,
                    concurrency=args.concurrency,
                    workers=args.workers,
                    address=args.ray_address,
                    scores=getattr(args, "scores", False),
                )
            elif (args.workers or 1) > 1:
                session, request = split_options(options)
                with Reranker(**session, **request):  # bad options fail here, before any process starts
                    pass
                run_processes(todo, workers=args.workers, concurrency=args.concurrency, options=options,
                              secrets=secrets, scores=getattr(args, "scores", False), on_record=on_record)
            else:
                asyncio.run(run_local([ln.item for ln in todo], args.concurrency, on_done, options))
        finally:
            PATH_HINT.reset(hint)
    except BrokenPipeError:
        raise  # the reader went away (`batch | head`): the CLI ends quietly
    except OSError as exc:  # only the writer does I/O here (disk full, a device that refuses writes)
        raise UsageError(f"--output: cannot write {args.output}: {exc.strerror or exc}") from None
    finally:
        if bar is not None:
            bar.close()
        if stream is not sys.stdout:
            with contextlib.suppress(OSError):  # the write error above is what gets reported
                stream.close()
    records = [*done.values(), *writer.written]
    n_err = sum(1 for r in records if "error" in r)
    skipped = f", {len(done)} already done" if done else ""
    # A fallback answer is a success (exit 0) that did not come from the backend asked for.
    metas = [r["meta"] for r in records if isinstance(r.get("meta"), dict)]
    n_fell = sum(1 for m in metas if m.get("fallback"))
    n_lexical = sum(1 for m in metas if m.get("embedder_fallback"))
    said = []
    if n_fell:
        who = options.get("backend")
        said.append(f"{n_fell} ranked by the local backend after {who} failed: --fallback local")
    if n_lexical:
        emb = options.get("embedder")
        said.append(f"{n_lexical} on lexical vectors after the {getattr(emb, 'name', emb)} embedder failed: "
                    "--fallback local")
    fell = f" ({'; '.join(said)})" if said else ""
    print(f"rag-rerank: batch: {len(records) - n_err} ok{fell}, {n_err} failed{skipped}", file=sys.stderr)
    for r in writer.written:
        if "error" in r:
            print(
                f"rag-rerank: line {r['line']}: {r['error']['kind']} error: {r['error']['message']}",
                file=sys.stderr,
            )
    return exit_code(records)
