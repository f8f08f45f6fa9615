"""What a module-level call costs against a session built once, on an HTTP backend.

`rerank(query, chunks, backend="openai", base_url=...)` is a one-shot `Reranker`: it builds the
backend and its SDK client, makes the call, closes them. `Reranker(...).rerank(...)` pays the
building once. Both talk to the same local OpenAI-compatible server (`tests/support/fake_llm.py`,
answering at once with a guard-valid object), on TREC DL19 passages (the first 20 / 50 of each
query), so the figure is our client-side cost, not a model's.

Run:  python bench/session.py [--rounds 5] [--calls 40] [--data PATH]
Prints, per size, the median milliseconds per call of each and their ratio (median over rounds).
Exits 1 (saying so on stdout) if any call failed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rag_rerank import Reranker, rerank  # noqa: E402
from tests.support.fake_llm import FakeLLM  # noqa: E402
from tests.support.quoting_ranker import quoting_ranker  # noqa: E402
from tests.support.shared_data import data_dir, need  # noqa: E402

DEFAULT_DATA = data_dir() / "trec-dl19" / "bm25-top100.json"


def queries(path: Path, n_chunks: int) -> list[tuple[str, list[dict[str, Any]]]]:
    data = json.loads(need(path).read_text(encoding="utf-8"))
    return [(q["query"], [{"id": str(h["docid"]), "text": h["content"]} for h in q["hits"][:n_chunks]])
            for q in data]


def per_call(fn: Any, work: list[tuple[str, list[dict[str, Any]]]], calls: int) -> float:
    """Median milliseconds of `calls` calls of `fn(query, chunks)`, cycling through `work`."""
    fn(*work[0])  # warm: imports, templates, the SDK
    out = []
    for i in range(calls):
        query, chunks = work[i % len(work)]
        t0 = time.perf_counter()
        fn(query, chunks)
        out.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    failures = 0
    print("| passages | session built once (ms/call) | `rerank(backend=..., base_url=...)` (ms/call) "
          "| ratio |")
    print("|---:|---:|---:|---:|")
    with FakeLLM(handler=quoting_ranker()) as srv:
        options = {"backend": "openai", "model": "bench", "base_url": srv.openai_url, "api_key": "sk-bench"}
        for n in (20, 50):
            work = queries(args.data, n)
            once, oneshot, ratios = [], [], []
            with Reranker(**options) as session:
                for _ in range(args.rounds):
                    try:
                        a = per_call(lambda q, c, s=session: s.rerank(q, c, 10), work, args.calls)
                        b = per_call(lambda q, c: rerank(q, c, 10, **options), work, args.calls)
                    except Exception as exc:  # a failed call fails the bench, on stdout
                        failures += 1
                        print(f"FAILED: {type(exc).__name__}: {exc}")
                        continue
                    once.append(a)
                    oneshot.append(b)
                    ratios.append(b / a)
            if ratios:
                print(f"| {n} | {statistics.median(once):.2f} | {statistics.median(oneshot):.2f} | "
                      f"{statistics.median(ratios):.2f} |")
    if failures:
        print(f"FAILED: {failures} round(s) raised")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
