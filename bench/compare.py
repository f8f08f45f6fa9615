"""How long `rag-rerank compare` takes on two 1,000-query runs (goal: under 2 s with 10,000 resamples).

Two TREC run files of 1,000 queries x 100 documents and graded qrels (20 judged documents per
query) are generated with a fixed seed (B is A with each query's top 20 lightly shuffled, so the
metrics differ a little query by query), written to a temporary folder, and compared as the CLI
does: both runs read, the qrels read, nDCG@10 / Recall@10 / MRR@10 per query (ir-measures), then
the bootstrap interval and randomisation test per metric and a gate. Timings are the median of
`--repeat` runs, printed with the load average: this machine is shared, so they are noisy.

    python bench/compare.py                  # 1,000 queries, 10,000 resamples
    python bench/compare.py --queries 5000 --resamples 20000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rag_rerank.compare import compare_runs
from rag_rerank.judgments import read_qrels
from rag_rerank.runfiles import read_run
from rag_rerank.significance import bootstrap_interval, sign_flip_pvalue


def write_collection(folder: Path, queries: int, depth: int, seed: int) -> tuple[Path, Path, Path]:
    """Qrels and two TREC runs (A, and B = A with each top 20 lightly shuffled)."""
    rng = np.random.default_rng(seed)
    qrels, run_a, run_b = [], [], []
    for q in range(queries):
        qid = f"q{q}"
        docs = [f"d{q}_{i}" for i in range(depth)]
        judged = rng.choice(depth, size=20, replace=False)
        for i in judged:
            qrels.append(f"{qid} 0 {docs[i]} {int(rng.choice([0, 0, 1, 2, 3]))}\n")
        order_a = list(rng.permutation(depth))
        top = order_a[:20]
        swaps = rng.integers(0, 20, size=(4, 2))
        order_b = list(order_a)
        for i, j in swaps:
            order_b[i], order_b[j] = top[j], top[i]
            top = order_b[:20]
        for rows, order in ((run_a, order_a), (run_b, order_b)):
            rows.extend(f"{qid} Q0 {docs[d]} {r + 1} {depth - r} bench\n" for r, d in enumerate(order))
    paths = folder / "qrels.txt", folder / "a.run", folder / "b.run"
    for path, rows in zip(paths, (qrels, run_a, run_b), strict=True):
        path.write_text("".join(rows), encoding="utf-8")
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        qrels_path, a_path, b_path = write_collection(Path(tmp), args.queries, args.depth, args.seed)
        totals, reads, stats_only = [], [], []
        for _ in range(args.repeat):
            start = time.perf_counter()
            a, b = read_run(a_path), read_run(b_path)
            qrels = read_qrels(qrels_path)
            read_done = time.perf_counter()
            comparison = compare_runs(a, b, qrels, gates=["nDCG@10:0.01"], n_resamples=args.resamples)
            totals.append(time.perf_counter() - start)
            reads.append(read_done - start)
            d = np.column_stack([m.diffs for m in comparison.metrics])
            start = time.perf_counter()
            bootstrap_interval(d, n_resamples=args.resamples)
            sign_flip_pvalue(d, n_resamples=args.resamples)
            stats_only.append(time.perf_counter() - start)
    print(
        f"{args.queries} queries x {args.depth} documents per run, {args.resamples} resamples, "
        f"{len(comparison.metrics)} metrics + 1 gate; median of {args.repeat} runs; "
        f"load average {tuple(round(x, 2) for x in os.getloadavg())} on {os.cpu_count()} cores"
    )
    print(f"{'step':<52}{'seconds':>9}")
    print(f"{'read both runs and the qrels':<52}{statistics.median(reads):>9.3f}")
    print(
        f"{'compare_runs (metrics per query, intervals, tests)':<52}"
        f"{statistics.median(totals) - statistics.median(reads):>9.3f}"
    )
    print(f"{'  of which: bootstrap + randomisation, all metrics':<52}{statistics.median(stats_only):>9.3f}")
    print(f"{'total (goal: under 2 s)':<52}{statistics.median(totals):>9.3f}")
    for m in comparison.metrics:
        print(
            f"  {m.name}: A {m.mean_a:.4f}, B {m.mean_b:.4f}, B-A {m.diff:+.4f} "
            f"[{m.ci[0]:+.4f}, {m.ci[1]:+.4f}], p {m.p_value:.4f}"
        )


if __name__ == "__main__":
    main()
