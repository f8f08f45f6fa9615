"""A batch spread over local worker processes (`rag-rerank batch --workers N`).

Why: one event loop runs a batch's every request on one core, and each query costs that core
milliseconds of CPU (the SDK's request and response, the guards, the post-pass); with a fast or
highly concurrent server the core, not the server, sets the pace (docs/speed.md measures it, the
bare SDK included). Worker processes each run their own session and event loop, so that CPU work
runs on as many cores as there are workers, without Ray.

What stays as in one process: every line gets exactly one record, in input order (the caller's
writer orders them), written as soon as it is ready; each worker keeps `concurrency` requests in
flight, as a Ray actor does. What differs: each worker has its own connection pool, caches and
embedder, so a model loads once per worker. A worker that dies (killed, out of memory) does not
lose lines silently: each line it had not answered gets an "internal" error record naming the
worker's exit code, and the batch exits non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import wait
from typing import Any

from .batchfile import Line, Outcome, record
from .guard.input import PATH_HINT
from .options import split_options
from .session import Reranker

# How long the parent waits on its workers' pipes at a time (a record, or the end-of-file of an exit).
_POLL_S = 0.2
# How long a worker may take to close its session once its last record is in.
_CLOSE_S = 30.0


async def run_local(items: Sequence[Any], concurrency: int, on_done: Callable[[int, Outcome], None],
                    options: Mapping[str, Any]) -> None:
    """One session (one backend, one connection pool, one embedder) for `items`, at most
    `concurrency` in flight; `options["budget"]` bounds them all."""
    options = dict(options)
    budget = options.pop("budget", None)
    session, request = split_options(options)
    async with Reranker(**session, **request) as reranker:
        await reranker.arerank_many(items, concurrency=concurrency, on_done=on_done, budget=budget)


def _context(start_method: str | None = None) -> Any:
    """How to start workers. fork where it is safe: on Linux, from a process with no other thread
    (a worker then starts in milliseconds with the imports done); a fork while another thread holds
    a lock can deadlock the child, so a threaded caller gets forkserver (one clean server process
    forks the workers), and macOS and Windows spawn (fork is unsafe or absent there). With
    forkserver and spawn the options travel pickled, as to a Ray actor. `start_method` overrides
    the choice."""
    methods = multiprocessing.get_all_start_methods()
    if start_method is not None:
        if start_method not in methods:
            raise ValueError(f"start_method {start_method!r} is not available here (only "
                             f"{', '.join(methods)})")
        return multiprocessing.get_context(start_method)
    if "fork" in methods and sys.platform.startswith("linux") and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["rag_rerank"])
        return ctx
    return multiprocessing.get_context("spawn")


def _exit_with_parent(alive: Any, keep_alive: Any) -> None:
    """End this worker at once when the parent is gone. A forked worker inherits the read ends of
    the parent's pipes, so a parent killed by SIGTERM or SIGKILL (a supervisor, the OOM killer)
    would leave it blocked for ever on a full pipe, holding its memory. `alive` is the read end of
    a pipe whose write end only the parent keeps (`keep_alive`, this process's inherited copy, is
    closed here): it reads end-of-file exactly when the parent has exited."""
    keep_alive.close()

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            alive.recv()
        os._exit(1)  # nobody is left to read our records

    threading.Thread(target=watch, name="rag-rerank-parent-watch", daemon=True).start()


def _worker(lines: list[tuple[int, Line]], concurrency: int, options: Mapping[str, Any],
            secrets: Sequence[str | None], scores: bool, hint: str, results: tuple[Any, Any],
            alive: Any, keep_alive: Any) -> None:
    """A worker's whole life: its lines through `run_local`, each record sent on its own pipe
    (`results`: the parent's read end, closed here, and this worker's write end) as ("record",
    index, record) when its request finishes; if the worker itself fails, one ("failed", why) and
    exit code 1 (no traceback: the parent records why per line). `hint` is the batch's
    `PATH_HINT`, which a context variable does not carry into a spawned process."""
    _exit_with_parent(alive, keep_alive)
    reader, writer = results
    reader.close()
    PATH_HINT.set(hint)

    def on_done(k: int, outcome: Outcome) -> None:
        index, line = lines[k]
        writer.send(("record", index, record(line, outcome, secrets, scores=scores)))

    try:
        asyncio.run(run_local([line.item for _, line in lines], concurrency, on_done, options))
    except BaseException as exc:
        with contextlib.suppress(OSError):
            writer.send(("failed", None, f"{type(exc).__name__}: {exc}"))
        sys.exit(1)
    finally:
        writer.close()


def _ended(code: int | None) -> str:
    """How a worker ended, in words: "exited with code 1", "was killed by signal 9 (SIGKILL)"."""
    if code is not None and code < 0:
        try:
            name = f" ({signal.Signals(-code).name})"
        except ValueError:
            name = ""
        return f"was killed by signal {-code}{name}"
    return f"exited with code {code}"


def run_processes(lines: Sequence[Line], *, workers: int, concurrency: int, options: Mapping[str, Any],
                  secrets: Sequence[str | None], scores: bool,
                  on_record: Callable[[int, dict[str, Any]], None], start_method: str | None = None) -> None:
    """Every line of `lines` through `workers` processes (lines dealt round-robin, so the ordered
    output advances evenly), `concurrency` requests in flight in each; `on_record(index, record)`
    is called in this process for each line, in the order they finish. A line whose request is
    already an input error (`Line.item` is an exception) is recorded here, without a worker.
    `start_method` ("fork", "forkserver", "spawn") overrides how workers start (`_context`)."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if options.get("budget") is not None:
        raise ValueError("a budget needs one process (workers would spend apart)")
    ctx = _context(start_method)
    shares: list[list[tuple[int, Line]]] = [[] for _ in range(workers)]
    dealt = 0
    for index, line in enumerate(lines):
        if isinstance(line.item, Exception):
            on_record(index, record(line, line.item, secrets, scores=scores))
        else:
            shares[dealt % workers].append((index, line))
            dealt += 1
    shares = [s for s in shares if s]
    if not shares:
        return
    alive, keep_alive = ctx.Pipe(duplex=False)  # the workers' read end; the write end stays here
    owner = {index: w for w, share in enumerate(shares) for index, _ in share}
    said: dict[int, str] = {}  # why a worker failed, when it said (its one "failed" message)
    procs: list[Any] = []
    readers: dict[Any, int] = {}  # a worker's read end -> the worker
    try:
        gc.freeze()  # a forked worker's collector then leaves the inherited objects' pages shared
        try:
            for w, share in enumerate(shares):
                # One pipe per worker: a worker killed in the middle of a message ends only its own
                # pipe (end-of-file here), and no worker waits on a lock another one died holding.
                reader, writer = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_worker, name=f"rag-rerank-worker-{w}",
                                   args=(share, concurrency, dict(options), list(secrets), scores,
                                         PATH_HINT.get(), (reader, writer), alive, keep_alive))
                proc.start()
                writer.close()  # the worker's alone now: its exit is end-of-file on `reader`
                procs.append(proc)
                readers[reader] = w
        finally:
            gc.unfreeze()
        while owner and readers:
            for reader in wait(list(readers), timeout=_POLL_S):
                try:
                    kind, index, rec = reader.recv()
                except (EOFError, OSError):  # the worker exited (or died in the middle of a message)
                    reader.close()
                    del readers[reader]
                    continue
                if kind == "failed":
                    said[readers[reader]] = rec
                elif owner.pop(index, None) is not None:
                    on_record(index, rec)
        for index in sorted(owner):  # lines a failed or killed worker never answered
            w = owner[index]
            procs[w].join(timeout=_CLOSE_S)
            why = f" ({said[w]})" if w in said else ""
            lost = RuntimeError(f"worker process {w} (pid {procs[w].pid}) {_ended(procs[w].exitcode)} "
                                f"before answering this line{why}; to retry it, delete this record from the "
                                "output and run the batch again with --resume")
            on_record(index, record(lines[index], lost, secrets, scores=scores))
        for p in procs:  # each closes its session (its connections, its cache) and exits by itself
            p.join(timeout=_CLOSE_S)
    finally:
        for p in procs:  # interrupted, or a worker that does not exit
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        for reader in readers:
            reader.close()
        alive.close()
        keep_alive.close()
