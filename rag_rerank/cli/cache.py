"""`rag-rerank cache stats|clear`: what the response cache holds, and emptying it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from ..cache import ResponseCache
from .common import EXIT_OK, UsageError


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("cache", "show or clear the response cache (rerank --cache)")
    p.add_argument("action", choices=["stats", "clear"],
                   help="stats: entries, size, limits as JSON; clear: delete entries")
    p.add_argument("--cache", default=None, metavar="DIR",
                   help="the cache folder (default: RAG_RERANK_CACHE_DIR, else ~/.cache/rag-rerank)")
    p.add_argument("--older-than", type=float, default=None, metavar="SECONDS",
                   help="clear: only entries stored more than SECONDS ago")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.older_than is not None and (args.action != "clear" or not args.older_than >= 0):
        raise UsageError("--older-than takes seconds >= 0 and goes with clear")
    with ResponseCache(args.cache) as cache:
        if args.action == "stats":
            print(json.dumps(cache.stats().to_dict(), ensure_ascii=False))
        else:
            removed = cache.clear(args.older_than)
            print(json.dumps({"path": str(cache.path), "removed": removed}, ensure_ascii=False))
    return EXIT_OK
