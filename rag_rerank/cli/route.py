"""`rag-rerank route`: decide whether an utterance should route to the skill."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from ..router import route
from .common import EXIT_OK, add_flags, whole_number


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("route", "decide whether an utterance should route to a skill")
    p.add_argument("utterance", help="what the user or agent said, e.g. \"rerank these chunks for my query\"")
    p.add_argument("--n-chunks", type=whole_number, default=None, help="how many chunks the agent holds")
    add_flags(p, "route", "--embedder")
    p.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    decision = route(args.utterance, n_chunks=args.n_chunks, embedder=args.embedder)
    print(json.dumps(decision, ensure_ascii=False))
    return EXIT_OK
