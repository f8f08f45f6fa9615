"""Pathological input against every regex that reads untrusted text: does the time grow linearly?

Chunk text, meta values, queries, reasons and raw answers come from web pages, uploads and models.
A regex that backtracks (nested or adjacent quantifiers over the same characters, `\\s+$` searched
over a long run of spaces) turns one crafted chunk into seconds or minutes of CPU. For each entry
point below and each shape of input (long runs of spaces, punctuation, word characters, digits,
quotes, dots, alternations of two classes) this times the call at n and 10·n characters and prints
the ratio: about 10 is linear, about 100 is quadratic.

Run:  python bench/redos.py [--n 20000]
Prints a Markdown table: milliseconds at n and 10·n, and the ratio; the worst ratio last. A refusal
(InputError, OutputError) is an answer; any other exception is a failed call: its row shows nan and
the output ends with a `FAILED: ...` line (exit code 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from failures import TALLY, run_bench  # noqa: E402

from rag_rerank import rerank  # noqa: E402
from rag_rerank.counts import counts_before  # noqa: E402
from rag_rerank.embed import get_embedder  # noqa: E402
from rag_rerank.errors import InputError, OutputError  # noqa: E402
from rag_rerank.guard import load_limits, validate_request  # noqa: E402
from rag_rerank.guard.input import parse_chunks  # noqa: E402
from rag_rerank.guard.output import cites_chunk, judge, misquoted  # noqa: E402
from rag_rerank.guard.repair import repair_output  # noqa: E402
from rag_rerank.models import Chunk  # noqa: E402
from rag_rerank.reasons import problem  # noqa: E402
from rag_rerank.redaction import display_url, url_secrets  # noqa: E402
from rag_rerank.render import render  # noqa: E402

# Shapes that make backtracking regexes blow up: one class repeated, two classes alternating, and
# an almost-match that fails only at the very end.
SHAPES: dict[str, Callable[[int], str]] = {
    "spaces": lambda n: " " * n + "x",
    "tabs+newlines": lambda n: "\t\n" * (n // 2) + "x",
    "punctuation": lambda n: ".,;:!?" * (n // 6),
    "word chars": lambda n: "a" * n,
    "digits": lambda n: "1" * n,
    "digit groups": lambda n: "1,000" * (n // 5),
    "a.": lambda n: "a." * (n // 2),
    "quotes": lambda n: '"' * n,
    "open quote + words": lambda n: '"' + "ab " * (n // 3),
    "backslashes in quotes": lambda n: '"' + "\\" * n,
    "curly quotes": lambda n: "\u201c" * n,
    "<think> unclosed": lambda n: "<think>" + "x" * n,
    "fence unclosed": lambda n: "```json\n" + "{" * n,
    "braces": lambda n: "{" * n,
    "CJK": lambda n: "\u6f22" * n,
    "combining marks": lambda n: "a" + "\u0301" * n,
    "tag characters": lambda n: "\U000e0041" * n,
    "mixed alnum-punct": lambda n: "a-1_" * (n // 4),
    # quotations that are not verbatim but loosely faithful: each is word-aligned with the source
    "loose quotations": lambda n: '"memory is constrained here" ' * (n // 28),
}


def _chunk_jsonl(text: str) -> str:
    records = ({"id": "a", "text": text}, {"id": "b", "text": "plain words"})
    return "".join(json.dumps(r) + "\n" for r in records)


def _answer(reason: str) -> str:
    return json.dumps({"ranked": [{"id": "b", "score": 0.5, "reason": reason}]})


def entry_points() -> dict[str, Callable[[str], Any]]:
    lexical = get_embedder("lexical")
    roomy = load_limits().with_overrides(max_context_tokens=10**9)
    chunk_b = Chunk(id="b", text="plain words")
    return {
        "input guard (JSONL)": lambda s: _quiet(parse_chunks, _chunk_jsonl(s)),
        "input guard (not JSON)": lambda s: _quiet(parse_chunks, s),
        "render": lambda s: render(validate_request("q", [{"id": "a", "text": s, "meta": {"m": s}}], 1, 0.7,
                                                    limits=roomy)),
        "lexical embed": lambda s: lexical.embed([s]),
        "cites_chunk": lambda s: cites_chunk(s, s),
        "misquoted": lambda s: misquoted(s, "plain words"),
        # as long a source as the reason, its words without the quotes and the "is": a loose match
        "misquoted (long source)": lambda s: misquoted(s, s.replace('"', "").replace(" is ", " ")),
        "output guard (reason)": lambda s: judge(_answer(s), [chunk_b], 1),
        "output guard (raw)": lambda s: judge(s, [chunk_b], 1),
        "repair": repair_output,
        "dropped reason grammar": problem,
        "router counts": lambda s: list(counts_before(s[:20000])),
        "url redaction": lambda s: (url_secrets(f"http://u:{s}@h/?key={s}"), display_url(f"http://h/?{s}")),
        "rerank local end to end": lambda s: _quiet(rerank, "plain words query", _chunk_jsonl(s[:100_000])),
    }


def _quiet(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except (InputError, OutputError) as exc:  # refusals (bad JSONL, over budget) are answers too
        return exc


def _ms(fn: Callable[[str], Any], text: str, where: str) -> float:
    """The faster of two runs, in ms; NaN when the call raised (counted and reported as failed)."""
    TALLY.count()
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        try:
            fn(text)
        except Exception as exc:  # not a refusal: a crash on crafted input is a failure
            TALLY.fail(where, exc)
            return float("nan")
        best = min(best, time.perf_counter() - start)
    return best * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20_000, help="characters of the smaller input (default 20000)")
    args = ap.parse_args()
    rows = []
    for point, fn in entry_points().items():
        for shape, make in SHAPES.items():
            small = _ms(fn, make(args.n), f"{point} on {shape} (n={args.n})")
            large = _ms(fn, make(10 * args.n), f"{point} on {shape} (n={10 * args.n})")
            rows.append((point, shape, small, large, large / max(small, 1e-3)))
    print(f"| entry point | input | ms at n={args.n} | ms at 10n | ratio |")
    print("|---|---|---:|---:|---:|")
    for row in sorted(rows, key=lambda r: r[4]):
        print(f"| {row[0]} | {row[1]} | {row[2]:.2f} | {row[3]:.2f} | {row[4]:.1f} |")
    worst = max(rows, key=lambda r: r[3])
    print(f"\nslowest at 10n: {worst[0]} on {worst[1]}: {worst[3]:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(run_bench(main))
