"""The post-pass's similarity product three ways, on the lexical rows of real lists: CPU per product.

`postpass._gram` must keep every BLAS call on the calling thread (OpenBLAS's bounds: m * n * k for
a product, (n + 1) * n * k for a symmetric `x @ x.T`), so one `v @ v.T` of 20 rows of 4096 columns
is not an option it may take. Within the bounds there are two ways to cut the product:

* `blocks`: square blocks of rows, each block on the diagonal a symmetric product and each one above
  it mirrored below (what `_gram` did for every list until 2026-11-28);
* `slices`: slices of columns, each slice's `x @ x.T` one symmetric product of all the rows, summed
  (the slice is the widest the symmetric bound allows for that many rows);

and `one`, the single product, shown for scale (above the bounds: a BLAS may use its threads for it,
so it is measured, never used). `_gram` is what the library does now (slices while a slice is at
least `_MIN_SLICE` columns wide, blocks beyond). The rows are the lexical embedder's (float64) of
the first `n` BM25 passages of each TREC DL19 query; the figure is the process's CPU time (all
threads) per product, the best of `--repeat` passes over the 43 lists.

Run:  python bench/gram.py [--sizes 10 20 30 40 50 60 80 100] [--repeat 7]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import peers  # noqa: E402

from rag_rerank import postpass  # noqa: E402
from rag_rerank.embed import embed_texts  # noqa: E402
from rag_rerank.embed.lexical import LexicalEmbedder  # noqa: E402


def blocks(v: np.ndarray) -> np.ndarray:
    return postpass._row_blocks(v)


def slices(v: np.ndarray) -> np.ndarray:
    return postpass._column_slices(v, max(1, postpass.SINGLE_THREAD_SYRK // (len(v) * (len(v) + 1))))


def one(v: np.ndarray) -> np.ndarray:
    return v @ v.T


def cpu_per_call(fn: Callable[[np.ndarray], np.ndarray], mats: list[np.ndarray], repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        t0 = time.process_time()
        for v in mats:
            fn(v)
        best = min(best, time.process_time() - t0)
    return best / len(mats) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 20, 30, 40, 50, 60, 80, 100])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--data", type=Path, default=peers.DEFAULT_DATA)
    args = ap.parse_args()
    ways = {"_gram (now)": postpass._gram, "blocks": blocks, "slices": slices, "one (not allowed)": one}
    print(f"CPU µs per similarity product (process time, all threads), lexical rows of TREC DL19 lists, "
          f"best of {args.repeat}; load average {os.getloadavg()[0]:.2f}\n")
    print("| rows | slice width | " + " | ".join(ways) + " |")
    print("|---:|---:|" + "---:|" * len(ways))
    emb = LexicalEmbedder()
    for n in args.sizes:
        work = peers.load(args.data, n)
        mats = [embed_texts(emb, [c["text"] for c in chunks]).astype(np.float64) for _, chunks in work]
        for v in mats:  # the ways agree (another summation order: within rounding)
            ref = one(v)
            for fn in ways.values():
                if not np.allclose(fn(v), ref, rtol=0, atol=1e-12):
                    print(f"FAILED: {fn.__name__} differs from v @ v.T at {n} rows")
                    return 1
        width = postpass.SINGLE_THREAD_SYRK // (n * (n + 1))
        cells = " | ".join(f"{cpu_per_call(fn, mats, args.repeat):.0f}" for fn in ways.values())
        print(f"| {n} | {width} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
