"""`rag-rerank render`: print the XML prompt that would be sent to an LLM."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from ..session import Reranker
from ..textio import read_text
from .common import EXIT_OK, add_flags, add_request_args, one_prompt


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("render", "print the XML prompt that would be sent to an LLM")
    add_request_args(p, "render")
    add_flags(p, "render", "max_tokens_per_chunk")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The prompt `rerank` would send with the same flags: long chunks shown as their evidence,
    as `rerank` shows them (a request over the context budget is shortened, not refused)."""
    options = {} if args.max_tokens_per_chunk is None else {"max_tokens_per_chunk": args.max_tokens_per_chunk}
    with one_prompt("render"), Reranker() as session:
        prompt = session.prompt(args.query, read_text(args.chunks), args.top_k, args.lambda_, **options)
    sys.stdout.write(prompt)  # already ends with a newline: byte for byte the prompt
    return EXIT_OK
