"""`rag-rerank golden`: run the golden regression cases offline."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from ..golden import run_golden


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("golden", "run the golden regression cases offline")
    p.add_argument("dir", nargs="?", default=None, help="golden folder (default: the packaged one)")
    p.add_argument("--verbose", "-v", action="store_true", help="list every case, not only the failures")
    p.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    return run_golden(Path(args.dir) if args.dir else None, verbose=args.verbose)
