"""`window_size` measured: speed against a sequential sliding window, and quality on TREC DL19.

Speed. The server is tests/support/fake_llm.py in its own process on 127.0.0.1, answering every
task with a contract-valid ranking (tests/support/quoting_ranker.py) after `--latency` seconds
(default 0.5 s). For 100 and 200 DL19 passages, wall time and call count of
  * ours: `rerank(..., window_size=W)` with the openai backend (the real SDK over HTTP), windows
    in parallel up to `concurrency`, then one final pass;
  * the baseline: a RankGPT / rank_llm style sliding window, 20 wide with stride 10, from the
    bottom of the list to the top, one call after the other. It exists only here, built from the
    same parts (render, the real SDK, the output guard), so the two differ only in the strategy.

Quality. TREC DL19 (43 queries, BM25 top-100, graded qrels; Recall/MRR count grade >= 2) with the
local backend, both embedders (lexical and sentence-transformers MiniLM), through `evaluate()`:
depth 100 in windows of 20 (and of 50) against one pass over the top 50, at lambda 1.0 with no
duplicate removal, and at the defaults (lambda 0.7, duplicate removal on).

    python bench/windows.py                         # both parts
    python bench/windows.py --only speed --latency 0.5
    python bench/windows.py --only quality --embedders lexical

Prints Markdown tables. A query that fails (it keeps its input order in the quality table) or a
speed run that raises ends the output with a `FAILED: ...` line and exit code 1. Re-run the quality
part after the local backend changes; MiniLM vectors are cached on disk (bench/out/emb-cache/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from batch import fake_server  # noqa: E402  (fake_llm in its own process, shared with bench/batch.py)
from failures import TALLY, run_bench  # noqa: E402

from tests.support.shared_data import data_dir  # noqa: E402

DATA = data_dir()


def dl19_candidates(n: int) -> tuple[str, list[dict[str, str]]]:
    """The first DL19 query and `n` passages: its BM25 top-100, then the next queries' (ids prefixed
    so they stay unique) when `n` is over 100."""
    data = json.loads((DATA / "trec-dl19" / "bm25-top100.json").read_text(encoding="utf-8"))
    chunks: list[dict[str, str]] = []
    for q, item in enumerate(data):
        for h in sorted(item["hits"], key=lambda h: h["rank"]):
            chunks.append({"id": f"{q}-{h['docid']}", "text": h["content"]})
        if len(chunks) >= n:
            break
    return data[0]["query"], chunks[:n]


# --------------------------------------------------------------------------- the baseline


def sliding_window(query: str, chunks: Sequence[dict[str, str]], backend: Any, *, width: int = 20,
                   stride: int = 10) -> tuple[list[str], int]:
    """RankGPT's sliding window: rank [n-width, n), move up by `stride`, ..., down to position 0,
    each call reordering its window in place. Returns the final order and the number of calls."""
    from rag_rerank.guard import validate_request
    from rag_rerank.render import render
    from rag_rerank.retry import call_with_retries

    order = list(chunks)
    calls = 0
    end = len(order)
    while True:
        start = max(0, end - width)
        part = order[start:end]
        request = validate_request(query, part, top_k=len(part), lambda_=1.0)
        outcome = call_with_retries(backend, request, render(request), guard_top_k=len(part))
        calls += 1
        first = [r["id"] for r in outcome.obj["ranked"]]
        rest = [c["id"] for c in part if c["id"] not in set(first)]
        by_id = {c["id"]: c for c in part}
        order[start:end] = [by_id[i] for i in first + rest]
        if start == 0:
            break
        end -= stride
    return [c["id"] for c in order], calls


# --------------------------------------------------------------------------- speed


def _fastest(run: Callable[[], int], repeat: int) -> tuple[int, float]:
    """(calls, the fastest of `repeat` runs): the machine is shared, the minimum is the cost."""
    times, calls = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        calls = run()
        times.append(time.perf_counter() - started)
        TALLY.count()
    return calls, min(times)


def _speed_rows(n: int, backend: Any, repeat: int) -> list[tuple[int, str, int, int, float]]:
    from rag_rerank import arerank, rerank

    query, chunks = dl19_candidates(n)

    def ours(size: int, conc: int) -> int:
        return rerank(query, chunks, top_k=10, window_size=size, concurrency=conc, backend=backend).meta.calls

    def ours_async() -> int:
        coro = arerank(query, chunks, top_k=10, window_size=20, concurrency=16, backend=backend)
        return asyncio.run(coro).meta.calls

    def waves(size: int, conc: int) -> int:
        """Round trips: the windows in waves of `conc`, then the final pass."""
        return math.ceil(math.ceil(n / size) / conc) + 1

    calls, wall = _fastest(lambda: sliding_window(query, chunks, backend)[1], repeat)
    rows = [(n, "sliding window 20/10, sequential (baseline)", calls, calls, wall)]
    for size, conc in ((20, 4), (20, 16), (50, 4)):
        calls, wall = _fastest(lambda s=size, c=conc: ours(s, c), repeat)
        rows.append((n, f"ours: window_size {size}, concurrency {conc} (sync rerank)", calls,
                     waves(size, conc), wall))
    calls, wall = _fastest(ours_async, repeat)
    rows.append((n, "ours: window_size 20, concurrency 16 (arerank)", calls, waves(20, 16), wall))
    return rows


def bench_speed(args: argparse.Namespace) -> str:
    from rag_rerank import make_backend, rerank

    os.environ.setdefault("OPENAI_API_KEY", "sk-bench-not-a-real-key")
    rows = []
    with fake_server(args.latency) as url:
        backend = make_backend("openai", base_url=url, model="fake-gpt")
        query, warm = dl19_candidates(20)
        rerank(query, warm, backend=backend)  # imports, connection pool: not timed
        for n in args.sizes:
            rows += _speed_rows(n, backend, args.repeat)
    out = [f"### Speed: openai backend -> fake_llm (own process, 127.0.0.1), {args.latency * 1000:.0f} ms "
           "per call", "", "| candidates | strategy | calls | round trips | wall s | ideal s |",
           "|---:|---|---:|---:|---:|---:|"]
    for n, label, calls, trips, wall in rows:
        out.append(f"| {n} | {label} | {calls} | {trips} | {wall:.2f} | {trips * args.latency:.1f} |")
    out.append("")
    out.append(f"wall s = the fastest of {args.repeat} runs; round trips = calls one after the other (the "
               "windows go in waves of `concurrency`, then the final pass); ideal s = round trips x latency. "
               "top_k 10. On a shared, loaded machine wall s carries some CPU wait on top of the ideal.")
    return "\n".join(out)


# --------------------------------------------------------------------------- quality


def bench_quality(args: argparse.Namespace) -> str:
    from quality import ST_SPEC, Row, _embedders, _run, _table, build_dl19

    cands, qrels = build_dl19()
    embedders = _embedders([e.strip() for e in args.embedders.split(",") if e.strip()])
    for emb in embedders.values():
        if hasattr(emb, "warm"):
            from quality import _all_texts

            emb.warm(_all_texts(cands, 100))
    run = {"k": 10, "rel_level": 2}
    rows: list[Row] = []
    for name, emb in embedders.items():
        label = "MiniLM" if name == ST_SPEC else name
        settings = (("lambda 1.0, no duplicate removal", {"lambda_": 1.0, "duplicate_threshold": 1.0}),
                    ("defaults (lambda 0.7, duplicate removal on)", {"lambda_": 0.7}))
        for what, opts in settings:
            inp, one = _run(f"local + {label}, one pass over the top 50, {what}", cands, qrels, depth=50,
                            embedder=emb, **opts, **run)
            if not rows:
                rows.append(replace(inp, system="BM25 top-100 as given (input order)"))
            rows.append(one)
            for size in args.window_sizes:
                windows = -(-100 // size)
                name_ = f"local + {label}, depth 100 in windows of {size} ({windows + 1} calls), {what}"
                rows.append(_run(name_, cands, qrels, depth=100, embedder=emb, window_size=size, **opts,
                                 **run)[1])
    cols = ["nDCG@10", "novelty-nDCG@10", "Recall@10", "MRR@10", "distance@10"]
    title = "Quality: TREC DL19 passage (43 queries; Recall/MRR count grade >= 2), top_k 10"
    return _table(title, rows, cols)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["speed", "quality"], action="append", default=None)
    ap.add_argument("--latency", type=float, default=0.5, help="seconds the fake server waits per call")
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 200], help="candidate counts (speed)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per speed row; the fastest is shown")
    ap.add_argument("--embedders", default="lexical,sentence-transformers",
                    help="comma-separated: lexical, sentence-transformers (quality)")
    ap.add_argument("--window-sizes", type=int, nargs="+", default=[20, 50], help="(quality)")
    args = ap.parse_args(argv)
    parts = {"speed": bench_speed, "quality": bench_quality}
    for key in args.only or list(parts):
        print(parts[key](args))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(run_bench(main))
