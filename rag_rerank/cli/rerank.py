"""`rag-rerank rerank`: rerank chunks for a query and print the card's result object."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from ..api import plan, rerank
from ..textio import read_text
from ..windows import WINDOW_PROGRESS
from .common import (
    EXIT_OK,
    UsageError,
    add_backend_args,
    add_cost_args,
    add_meta_args,
    add_pipeline_args,
    add_request_args,
    add_window_args,
    cost_options,
    err,
    indent_width,
    meta_options,
    pipeline_options,
    print_plan,
    run_options,
)


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("rerank", "rerank chunks for a query and print the result object")
    add_request_args(p, "rerank")
    add_backend_args(p, "rerank")
    p.add_argument("--scores", action="store_true",
                   help="add a \"scores\" object beside ranked and dropped: every input id with its "
                   "score, or why it has none")
    p.add_argument("--meta", action="store_true",
                   help="print run metadata (attempts, usage, latency) to stderr")
    p.add_argument("--indent", type=indent_width, default=None,
                   help="pretty-print the JSON (N spaces, N >= 0)")
    add_pipeline_args(p, "rerank")
    add_meta_args(p, "rerank")
    add_window_args(p, "rerank", concurrency=True)
    add_cost_args(p, "rerank")
    p.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    if args.concurrency < 1:
        raise UsageError(f"--concurrency must be at least 1, got {args.concurrency}")
    options = {"concurrency": args.concurrency, **pipeline_options(args), **run_options(args),
               **meta_options(args), **cost_options(args)}
    if args.dry_run:
        planned = plan(args.query, read_text(args.chunks), args.top_k, args.lambda_, **options)
        return print_plan(planned.to_dict(), args.indent)
    bar = _window_bar() if getattr(args, "window_size", None) else None
    token = WINDOW_PROGRESS.set(bar.update if bar is not None else None)
    try:
        result = rerank(args.query, read_text(args.chunks), args.top_k, args.lambda_, **options)
    finally:
        WINDOW_PROGRESS.reset(token)
        if bar is not None:
            bar.close()
    print(result.to_json(indent=args.indent, scores=args.scores))
    if args.meta:
        print(json.dumps(result.meta.to_dict(), ensure_ascii=False), file=sys.stderr)
    elif (notice := result.meta.status_notice(f"--fallback {_flag(args.fallback)}")) is not None:
        # Exit 0 and a schema object on stdout look exactly like the backend's own ranking, so
        # without `--meta` a fallback, a re-ask or a repair would go unseen: one line for any
        # meta.status but ok. (With `--meta` stderr stays one JSON object, whose `status` says it.)
        err(f"warning: {notice}")
    return EXIT_OK


def _flag(fallback: object) -> str:
    """The --fallback value as the user wrote it (`local`, `cross-encoder,local,input`)."""
    if isinstance(fallback, (list, tuple)):
        return ",".join(str(s) for s in fallback)
    return str(fallback or "local")


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
