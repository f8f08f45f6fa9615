"""`rag-rerank check`: judge a raw LLM output against the contract (exit 1 if invalid).

Without `--repair` a wrapped answer (a code fence, prose, a `<think>` block) is invalid, but that
is rarely its only fault: the answer inside is judged too, and each of its violations is reported
as well, marked with what `--repair` would remove to reach it. One run shows every fault.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace

from ..guard import parse_chunks
from ..guard.output import judge
from ..guard.repair import repair_output
from ..textio import read_text
from .common import EXIT_INVALID_OUTPUT, EXIT_OK, UsageError, add_flags, err, one_prompt, print_violations


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("check", "judge a raw LLM output against the contract (exit 1 if invalid)")
    p.add_argument("--chunks", "-c", required=True, metavar="FILE|-",
                   help="the JSONL chunks the output refers to")
    add_flags(p, "check", "top_k", required=("--top-k",))
    p.add_argument("--repair", action="store_true", help="first strip fences / prose / <think> (reported)")
    p.add_argument("--query", "-q", default=None,
                   help="the query the output answers: a reason may quote it as well as its chunk")
    p.add_argument("output", nargs="?", default="-", metavar="OUTPUT_FILE|-",
                   help="the raw LLM answer to judge, or - for stdin (the default)")
    p.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    if args.top_k < 1:
        raise UsageError(f"--top-k must be a positive integer, got {args.top_k}")
    if args.chunks == "-" and args.output == "-":
        raise UsageError("--chunks and OUTPUT_FILE cannot both be read from stdin ('-')")
    with one_prompt("check"):
        chunks = parse_chunks(read_text(args.chunks))
    raw = read_text(args.output, what="OUTPUT_FILE")
    if args.repair:
        fixed = repair_output(raw)
        for r in fixed.repairs:
            err(f"repair: {r}")
        raw = fixed.text
    obj, violations = judge(raw, chunks, args.top_k, query=args.query)
    if obj is None and not args.repair and (unwrapped := repair_output(raw)).repairs:
        _, inside = judge(unwrapped.text, chunks, args.top_k, query=args.query)
        where = f" (in the answer inside: {'; '.join(unwrapped.repairs)})"
        violations += [replace(v, message=v.message + where) for v in inside]
    if violations:
        print_violations(violations, prefix="invalid")
        return EXIT_INVALID_OUTPUT
    print("valid")
    return EXIT_OK
