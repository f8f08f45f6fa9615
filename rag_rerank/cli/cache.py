"""`rag-rerank cache stats|clear`: what the response cache holds, and emptying it.

Neither creates a cache: `stats` of a folder holding none is an error naming the folder (a
mistyped `--cache` would otherwise read as an empty cache, and used to leave an empty database
behind), and `clear` of one has nothing to remove.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from ..cache import FILE_NAME, ResponseCache
from ..errors import ConfigError
from ..paths import default_cache_dir
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
    folder = Path(args.cache).expanduser() if args.cache is not None else default_cache_dir()
    if folder is None:
        raise ConfigError("no folder for the response cache: RAG_RERANK_CACHE_DIR is off and there is no "
                          "home folder; pass --cache DIR")
    if not (folder / FILE_NAME).is_file():
        if args.action == "clear":
            print(json.dumps({"path": str(folder / FILE_NAME), "removed": 0}, ensure_ascii=False))
            return EXIT_OK
        why = "no such folder" if not folder.exists() else f"no {FILE_NAME} in it"
        raise UsageError(f"--cache: no response cache in {folder} ({why}); nothing was created "
                         "(rerank --cache DIR makes one)")
    with ResponseCache(folder) as cache:
        if args.action == "stats":
            print(json.dumps(cache.stats().to_dict(), ensure_ascii=False))
        else:
            removed = cache.clear(args.older_than)
            print(json.dumps({"path": str(cache.path), "removed": removed}, ensure_ascii=False))
    return EXIT_OK
