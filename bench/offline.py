"""The offline default, end to end: `rerank(query, chunks)` with no options, over TREC DL19.

Every DL19 query (43) with its first 20 / 50 BM25 passages; each call is the one-shot function
exactly as a caller writes it (the local backend, the lexical embedder, a `Reranker` made and
closed inside). Round 1 is each list's first sight in this process (the per-text caches empty for
it); later rounds repeat the same lists (the per-text caches warm: a service reranking passages it
has seen before). A warm-up call on an unrelated list loads the static table and the templates
first, so neither round pays the one-time loading.

Run:  python bench/offline.py [--rounds 5] [--sizes 20 50] [--data PATH]
Prints the median and p95 ms per call of the first round and of the later rounds, and a SHA-256 over
every result's JSON (the card's object with `scores`, and the meta fields that do not measure
time), the same on any checkout whose results are byte-identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rag_rerank import rerank  # noqa: E402
from tests.support.shared_data import data_dir, need  # noqa: E402

DEFAULT_DATA = data_dir() / "trec-dl19" / "bm25-top100.json"


def load(path: Path, n: int) -> list[tuple[str, list[dict[str, Any]]]]:
    data = json.loads(need(path).read_text(encoding="utf-8"))
    return [(q["query"], [{"id": str(h["docid"]), "text": h["content"]} for h in q["hits"][:n]])
            for q in data]


def fingerprint(result: Any) -> str:
    meta = {k: v for k, v in result.meta.to_dict().items() if k != "latency_ms"}
    return result.to_json(scores=True) + json.dumps(meta, sort_keys=True)


def p95(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(0.95 * (len(s) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 50])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = ap.parse_args()
    rerank("warm up", [{"id": "a", "text": "one unrelated text"}, {"id": "b", "text": "and another"}])
    digest = hashlib.sha256()
    print(f"`rerank(query, chunks)` (the offline default), ms per call over {args.data.parent.name}")
    print("\n| passages | calls | first sight median | first sight p95 | repeated median | repeated p95 |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in args.sizes:
        work = load(args.data, n)
        first: list[float] = []
        again: list[float] = []
        for r in range(args.rounds):
            for query, chunks in work:
                t0 = time.perf_counter()
                result = rerank(query, chunks)
                (first if r == 0 else again).append((time.perf_counter() - t0) * 1000.0)
                if r == 0:
                    digest.update(fingerprint(result).encode())
        rep = (f"{statistics.median(again):.2f} | {p95(again):.2f}" if again else "- | -")
        print(f"| {n} | {len(work)} | {statistics.median(first):.2f} | {p95(first):.2f} | {rep} |")
    print(f"\nresults sha256: {digest.hexdigest()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
