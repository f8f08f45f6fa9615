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
        wall: dict[str, list[float]] = {"read": [], "compare": [], "stats": [], "total": []}
        cpu: dict[str, list[float]] = {"read": [], "compare": [], "stats": [], "total": []}
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            a, b = read_run(a_path), read_run(b_path)
            qrels = read_qrels(qrels_path)
            t1, c1 = time.perf_counter(), time.process_time()
            comparison = compare_runs(a, b, qrels, gates=["nDCG@10:0.01"], n_resamples=args.resamples)
            t2, c2 = time.perf_counter(), time.process_time()
            d = np.column_stack([m.diffs for m in comparison.metrics])
            bootstrap_interval(d, n_resamples=args.resamples)
            sign_flip_pvalue(d, n_resamples=args.resamples)
            t3, c3 = time.perf_counter(), time.process_time()
            for clock, (r0, r1, r2, r3) in ((wall, (t0, t1, t2, t3)), (cpu, (c0, c1, c2, c3))):
                clock["read"].append(r1 - r0)
                clock["compare"].append(r2 - r1)
                clock["stats"].append(r3 - r2)
                clock["total"].append(r2 - r0)
    print(
        f"{args.queries} queries x {args.depth} documents per run, {args.resamples} resamples, "
        f"{len(comparison.metrics)} metrics + 1 gate; median of {args.repeat} runs; "
        f"load average {tuple(round(x, 2) for x in os.getloadavg())} on {os.cpu_count()} cores "
        "(CPU seconds are this process's: less moved by other jobs than wall-clock ones)"
    )
    rows = (("read both runs and the qrels", "read"),
            ("compare_runs (metrics per query, intervals, tests)", "compare"),
            ("  of which: bootstrap + randomisation, all metrics", "stats"),
            ("total (goal: under 2 s)", "total"))
    print(f"{'step':<52}{'wall s':>9}{'CPU s':>9}")
    for label, key in rows:
        print(f"{label:<52}{statistics.median(wall[key]):>9.3f}{statistics.median(cpu[key]):>9.3f}")
    for m in comparison.metrics:
        print(
            f"  {m.name}: A {m.mean_a:.4f}, B {m.mean_b:.4f}, B-A {m.diff:+.4f} "
            f"[{m.ci[0]:+.4f}, {m.ci[1]:+.4f}], p {m.p_value:.4f}"
        )


if __name__ == "__main__":
    main()
