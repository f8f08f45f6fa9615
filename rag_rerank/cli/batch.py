"""`rag-rerank batch`: many queries from a JSONL file, results in input order, resumable.

The file formats, `--resume` and the exit code are `batchfile.py`'s; this module reads the input,
refuses an output it would destroy, runs the requests (one `Reranker` session for the run, a session
in each of `--workers` local processes (`processes.py`), or Ray actors with `--engine ray`) and
writes each record as soon as every earlier one is written.

What it promises beside the records: `--dry-run` names each line that would fail (exit 2, as the
run would) and counts the round trips in waves of `--concurrency`; a run refused before its first
record (its budget, a bad option) leaves `--output` as it was, since the file is opened at the
first record; an interrupted run says how many lines are saved and that `--resume` goes on; a
chunks file given as `--input` is named as one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ..backends.common import planning
from ..batchfile import (
    EXIT_BAD_INPUT,
    Line,
    OrderedWriter,
    Outcome,
    check_config,
    check_resumed,
    error_record,
    exit_code,
    looks_like_chunks,
    parse_input,
    read_done,
    record,
    record_config,
)
from ..errors import UsageError
from ..guard.input import PATH_HINT
from ..models import STATUSES
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


EXIT_INTERRUPTED = 130  # as the CLI answers Ctrl-C anywhere (cli/__init__.py)


def _dry_run(todo: Sequence[Line], concurrency: int, options: Mapping[str, Any], indent: int | None,
             secrets: Sequence[str | None]) -> int:
    """`--dry-run`: the plan of every request still to do, summed, and no request. Each line the
    run would fail without a call is named on stderr as the run names it, and the exit code is
    the run's for bad input (2)."""
    options = dict(options)
    budget = options.pop("budget", None)
    session, request = split_options(options)
    invalid: list[tuple[int, Exception]] = []
    with planning():  # a plan sends nothing: no API key needed
        reranker = Reranker(**session, **request)
    with reranker:
        planned = reranker.plan_many([ln.item for ln in todo], concurrency=concurrency, budget=budget,
                                     on_invalid=lambda i, exc: invalid.append((todo[i].number, exc)))
    for number, exc in invalid:
        rec = error_record(exc, secrets)
        print(f"rag-rerank: line {number}: {rec['kind']} error: {rec['message']}", file=sys.stderr)
    code = print_plan({**planned.to_dict(), "requests_planned": len(todo) - len(invalid),
                       "invalid_lines": [number for number, _ in invalid]}, indent)
    return max(code, EXIT_BAD_INPUT if invalid else 0)


class _OutputFile:
    """`--output`, opened (truncated, or appended to with `--resume`) at the first record: a run
    refused before any (over its budget, a bad option) leaves no file, and an old one intact."""

    def __init__(self, path: Path, mode: str) -> None:
        self.path, self.mode = path, mode
        self.file: IO[str] | None = None

    def write(self, text: str) -> None:
        if self.file is None:
            self.file = self.path.open(self.mode, encoding="utf-8")
        self.file.write(text)

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


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
    text = read_text(args.input, what="input")
    lines = parse_input(text)
    if not lines:
        raise UsageError(f"--input: {args.input} holds no requests; write one JSON object "
                         "{query, chunks, top_k?, lambda?, query_id?} per line")
    if all(isinstance(ln.item, Exception) for ln in lines) and looks_like_chunks(text):
        raise UsageError(f"--input: {args.input} looks like a chunks file ({{id, text}} per line), not "
                         f"batch requests: rank it with `rag-rerank rerank -q QUERY -c {args.input}`, or "
                         "give batch one {query, chunks, top_k?, ...} object per line")
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
    secrets = secrets_of(backend_options.get("api_key"), urls=[backend_options.get("base_url")])
    if dry_run:
        return _dry_run(todo, args.concurrency, backend_options, None, secrets)
    options = {k: v for k, v in backend_options.items() if v is not None}
    stream: IO[str] | _OutputFile
    if out_path is None:
        stream = sys.stdout
    else:
        if out_path.parent and not out_path.parent.exists():
            raise UsageError(f"--output: no such directory: {out_path.parent}")
        if not os.access(out_path if out_path.exists() else out_path.parent, os.W_OK):
            raise UsageError(f"--output: cannot write {args.output}: permission denied")
        stream = _OutputFile(out_path, "a" if args.resume else "w")
    bar = _progress_bar(len(todo), not getattr(args, "no_progress", False))
    writer = OrderedWriter(stream, [ln.number for ln in todo])  # type: ignore[arg-type]
    interrupted = False
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
    except KeyboardInterrupt:
        interrupted = True
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
    if interrupted:
        _say_interrupted(args.output if out_path is not None else None, len(done) + len(writer.written),
                         len(lines))
        return EXIT_INTERRUPTED
    records = [*done.values(), *writer.written]
    n_err = sum(1 for r in records if "error" in r)
    skipped = f", {len(done)} already done" if done else ""
    # A fallback answer is a success (exit 0) that did not come from the backend asked for: the
    # summary counts every status but ok (meta.status), and says who answered instead.
    metas = [r["meta"] for r in records if isinstance(r.get("meta"), dict)]
    counts = Counter(str(m.get("status") or "ok") for m in metas)
    said = [f"{counts[s]} {s}" for s in STATUSES if s != "ok" and counts[s]]
    why = []
    scorers = sorted({str(m["fallback"]) for m in metas if m.get("fallback")})
    if scorers:
        why.append(f"ranked by {' / '.join(scorers)} after {options.get('backend')} failed")
    if any(m.get("embedder_fallback") for m in metas):
        emb = options.get("embedder")
        why.append(f"lexical vectors after the {getattr(emb, 'name', emb)} embedder failed")
    fell = f" ({', '.join(said)}{': ' + '; '.join(why) if why else ''})" if said else ""
    print(f"rag-rerank: batch: {len(records) - n_err} ok{fell}, {n_err} failed{skipped}", file=sys.stderr)
    for r in writer.written:
        if "error" in r:
            print(
                f"rag-rerank: line {r['line']}: {r['error']['kind']} error: {r['error']['message']}",
                file=sys.stderr,
            )
    return exit_code(records)


def _say_interrupted(output: str | None, saved: int, total: int) -> None:
    """Ctrl-C: how many lines are saved, and how to go on (one line on stderr)."""
    if output is None:
        print(f"rag-rerank: batch: interrupted: {saved} of {total} lines were written to stdout; to be able "
              "to stop and go on, write to --output FILE (then --resume continues it)", file=sys.stderr)
    else:
        print(f"rag-rerank: batch: interrupted: {saved} of {total} lines are saved in {output}; run the same "
              "command with --resume to continue with the rest", file=sys.stderr)
