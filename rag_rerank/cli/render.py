"""`rag-rerank render`: print the XML prompt that would be sent to an LLM."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from ..guard import validate_request
from ..render import render
from ..textio import read_text
from .common import EXIT_OK, add_request_args, one_prompt


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("render", "print the XML prompt that would be sent to an LLM")
    add_request_args(p, "render")
    p.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    with one_prompt("render"):
        request = validate_request(args.query, read_text(args.chunks), args.top_k, args.lambda_)
    sys.stdout.write(render(request))  # already ends with a newline: byte for byte the prompt
    return EXIT_OK
