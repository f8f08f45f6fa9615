"""How much of a warm call's own time is the machine's caches: the same work timed hot, after a pause,
and after the caches were flushed.

A real call runs our own stages right after the SDK's round trip to the server, a millisecond or
more in which this thread waits (and, on a shared host, other tenants use the caches). This bench
times the warm post-pass (the default local session's, lexical embedder, on DL19 lists it has seen
before, so every per-text cache hits) and three primitives that are not ours (an add of two numpy
arrays of 20 floats, `max` of a Python list of 20 ints, `np.zeros` of the 20 × 4,096 float64 block
the post-pass's similarity product reads) under three conditions:

* **hot**: back to back, as a micro-benchmark times them;
* **after a pause**: after `--sleep-ms` milliseconds asleep, as after waiting on a server;
* **after a flush**: after touching every cache line of `--flush-mb` megabytes (more than the
  last-level cache), which leaves nothing of the work's code or data cached.

Medians of `--rounds` rounds over the 43 queries. When the last two rows are several times the
first, the milliseconds of bench/call_stages.py measure the machine's caches as much as our code,
and instruction counts (bench/instructions.py) are the figure to compare code by.

Run:  python bench/cache_state.py [--passages 20] [--rounds 3] [--sleep-ms 2] [--flush-mb 64] [--data PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
import peers  # noqa: E402

import rag_rerank.engine as engine  # noqa: E402
import rag_rerank.fallback as fallback  # noqa: E402
from rag_rerank import Reranker  # noqa: E402
from rag_rerank.embed.lexical import LexicalEmbedder  # noqa: E402
from tests.support.quoting_ranker import answer_for  # noqa: E402


def median_us(work: Callable[[], object], before: Callable[[], None], times: int) -> float:
    """The median of `times` timings of `work`, each right after `before` (not timed), in µs."""
    spent = []
    for _ in range(times):
        before()
        t0 = time.perf_counter()
        work()
        spent.append(time.perf_counter() - t0)
    return statistics.median(spent) * 1e6


def in_turn(plans: list[Any], answers: list[Any]) -> Callable[[], None]:
    """A post-pass of the next list at each call, the lists in turn."""
    lists = itertools.cycle(list(zip(plans, answers, strict=True)))

    def one() -> None:
        plan, answer = next(lists)
        fallback.run_postpass(plan, answer, plan.view)

    return one


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passages", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sleep-ms", type=float, default=2.0, help="the pause before each timing")
    ap.add_argument("--flush-mb", type=int, default=64, help="megabytes touched before each timing")
    ap.add_argument("--data", type=Path, default=peers.DEFAULT_DATA)
    args = ap.parse_args()
    work = peers.load(args.data, args.passages)
    session = Reranker("local")
    options = session.options(top_k=peers.TOP)
    plans = [engine.plan(session._setup, query, chunks, options) for query, chunks in work]
    answers = [json.loads(json.dumps(answer_for(plan.prompt))) for plan in plans]
    for plan, answer in zip(plans, answers, strict=True):  # every per-text cache filled
        fallback.run_postpass(plan, answer, plan.view)

    flushed = np.zeros(args.flush_mb * 2**20, dtype=np.uint8)

    def flush() -> None:
        flushed[::64] += 1  # one write per 64-byte cache line

    conditions: list[tuple[str, Callable[[], None]]] = [
        ("hot (back to back)", lambda: None),
        (f"after {args.sleep_ms:g} ms asleep", lambda: time.sleep(args.sleep_ms / 1000)),
        (f"after {args.flush_mb} MB touched", flush),
    ]
    small, ints = np.arange(20.0), list(range(20))
    block = (args.passages, LexicalEmbedder().dim)  # the default embedder's rows
    print(f"Warm post-pass on {len(work)} DL19 lists of {args.passages} passages (local session, lexical "
          f"embedder, every per-text cache filled) and three primitives; median of {args.rounds} rounds\n")
    print(f"| condition | warm post-pass (ms) | numpy add, 20 floats (µs) | Python max, 20 ints (µs) | "
          f"np.zeros {block[0]} × {block[1]} (µs) |")
    print("|---|---:|---:|---:|---:|")
    for label, before in conditions:
        post = median_us(in_turn(plans, answers), before, args.rounds * len(plans)) / 1000
        times = args.rounds * 100
        add = median_us(lambda: small + small, before, times)
        largest = median_us(lambda: max(ints), before, times)
        zeros = median_us(lambda: np.zeros(block), before, times)
        print(f"| {label} | {post:.3f} | {add:.1f} | {largest:.1f} | {zeros:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
