"""How long the contract layer takes for a full 50-chunk request: input guard, render, output guard.

Run by hand: `python bench/contract_speed.py [--repeat N]`. Prints microseconds per call (median and
p95 of N timed calls after a warm-up); no assertions, the numbers go in docs/speed.md. A call that
raises stops the run with a `FAILED: ...` line on stdout and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from failures import TALLY, run_bench

from rag_rerank.guard import parse_chunks, validate_request
from rag_rerank.guard.output import judge
from rag_rerank.guard.repair import repair_output
from rag_rerank.render import render

WORDS = [
    "index",
    "memory",
    "recall",
    "latency",
    "vector",
    "graph",
    "partition",
    "cluster",
    "probe",
    "shard",
    "disk",
    "cache",
    "quantise",
    "embedding",
    "cosine",
    "search",
    "corpus",
    "HNSW",
    "IVF",
    "FAISS",
    "Voronoi",
    "nprobe",
    "efSearch",
]


def chunks(n: int = 50, words: int = 60) -> str:
    rows = []
    for i in range(n):
        text = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(words))
        rows.append(json.dumps({"id": f"doc-{i:02d}", "text": f"Chunk {i}: {text}.", "score": 1.0 / (i + 1)}))
    return "\n".join(rows) + "\n"


def answer(jsonl: str, top_k: int = 10) -> str:
    recs = [json.loads(line) for line in jsonl.splitlines()]
    ranked = [
        {
            "id": r["id"],
            "score": 0.9 - i * 0.05,
            "reason": f"mentions {r['text'].split()[3]}",
            "diversity_note": "covers another facet",
        }
        for i, r in enumerate(recs[:top_k])
    ]
    dropped = [{"id": r["id"], "reason": "below_min_score"} for r in recs[top_k:]]
    return json.dumps({"ranked": ranked, "dropped": dropped})


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    for _ in range(max(3, repeat // 10)):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
        TALLY.count()
    samples.sort()
    return statistics.median(samples), samples[int(0.95 * (len(samples) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=300)
    args = ap.parse_args()
    jsonl = chunks()
    query = "When should I prefer IVF over HNSW for vector search?"
    request = validate_request(query, jsonl, 10, 0.7)
    parsed = parse_chunks(jsonl)
    raw = answer(jsonl)
    fenced = "Here you go:\n```json\n" + raw + "\n```"
    if violations := judge(raw, parsed, 10)[1]:
        raise AssertionError(f"the bench's own answer fails the output guard: {violations}")
    rows = [
        ("input guard (validate_request, 50 chunks)", lambda: validate_request(query, jsonl, 10, 0.7)),
        ("render (XML task, 50 chunks)", lambda: render(request)),
        ("output guard (judge, 10 ranked + 40 dropped)", lambda: judge(raw, parsed, 10)),
        ("repair (prose + fence around the answer)", lambda: repair_output(fenced)),
    ]
    print(f"{'stage':<48} {'median µs':>10} {'p95 µs':>10}   ({args.repeat} calls each)")
    total = 0.0
    for name, fn in rows:
        med, p95 = timed(fn, args.repeat)
        total += med
        print(f"{name:<48} {med:>10.0f} {p95:>10.0f}")
    print(f"{'sum of medians':<48} {total:>10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(run_bench(main))
