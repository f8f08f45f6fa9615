"""What a long-running service sees: import time, memory over many calls, open files and sockets.

Three measurements, printed as Markdown:

* **import** -- `python -X importtime -c "import rag_rerank"` in fresh processes: the package's
  cumulative import time (median of `--imports` runs), and which heavy modules the import pulled
  in (none of torch, sentence-transformers, the frameworks, ray, the LLM SDKs may be: they load
  on first use).
* **memory** -- `tracemalloc` over `--calls` `rerank()` calls (local backend, lexical embedder) on
  real passages (TREC DL19 BM25 hits, `--chunks` per call, queries cycled): traced memory after a
  warm-up and at each quarter. The growth is the per-process caches filling (tokeniser and
  stemmer `lru_cache`s, bounded): their sizes are printed beside it, so a plateau and a leak can be
  told apart.
* **descriptors** -- open file descriptors before and after the calls, and after 200 calls of the
  openai backend (named per call, so built and closed per call) against a local test server.

Run:  python bench/production.py [--calls 2000] [--chunks 20] [--imports 5] [--data PATH]
A call that raises stops the run with a `FAILED: ...` line on stdout and exit code 1.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from failures import TALLY, run_bench  # noqa: E402

from tests.support.shared_data import data_dir, need  # noqa: E402

DEFAULT_DATA = data_dir() / "trec-dl19" / "bm25-top100.json"
HEAVY = ("torch", "sentence_transformers", "transformers", "langchain_core", "llama_index", "haystack", "ray",
         "mcp", "openai", "anthropic", "httpx", "model2vec", "sklearn", "scipy")


def import_times(runs: int) -> tuple[list[float], list[str]]:
    """Cumulative import time of `rag_rerank` in ms per fresh process, and the heavy modules loaded."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    times = []
    probe = f"import rag_rerank, sys; print([m for m in {HEAVY!r} if m in sys.modules])"
    loaded: list[str] = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-X", "importtime", "-c", probe], capture_output=True,
                             text=True, env=env, cwd=ROOT, check=True)
        line = next(ln for ln in out.stderr.splitlines() if re.search(r"\|\s*rag_rerank$", ln))
        times.append(int(line.split("|")[1]) / 1000.0)
        loaded = json.loads(out.stdout.strip().replace("'", '"'))
    return times, loaded


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd")) if Path("/proc/self/fd").is_dir() else -1


def cache_sizes() -> dict[str, str]:
    """Fill of the module-level caches a call touches: `currsize / maxsize`."""
    from rag_rerank.backends import local
    from rag_rerank.embed import static

    caches = {"static._split_punct": static._split_punct_cached, "static._word_pieces": static._word_pieces,
              "static._chunk_ids": static._chunk_ids_cached, "local.stem": local.stem}
    return {name: f"{c.cache_info().currsize}/{c.cache_info().maxsize}" for name, c in caches.items()}


Queries = list[tuple[str, list[dict[str, Any]]]]


def memory(queries: Queries, calls: int) -> list[tuple[int, float, dict[str, str]]]:
    from rag_rerank import rerank

    for query, chunks in queries[:20]:  # warm-up: templates, schemas, the static table
        rerank(query, chunks, top_k=5)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    rows = []
    for i in range(calls):
        query, chunks = queries[i % len(queries)]
        # Each call a new query text: a service rarely sees the same query twice.
        rerank(f"{query} ({i})", chunks, top_k=5)
        TALLY.count()
        if (i + 1) % max(1, calls // 4) == 0:
            gc.collect()
            rows.append((i + 1, (tracemalloc.get_traced_memory()[0] - base) / 2**20, cache_sizes()))
    tracemalloc.stop()
    return rows


def openai_descriptors(calls: int) -> tuple[int, int]:
    from rag_rerank import rerank
    from tests.support.fake_llm import FakeLLM
    from tests.support.quoting_ranker import quoting_ranker

    chunks = [{"id": f"c{i}", "text": f"IVF partitions vectors to save memory, note {i}"} for i in range(10)]
    with FakeLLM(handler=quoting_ranker()) as srv:
        before = open_fds()
        for _ in range(calls):
            rerank("When does IVF save memory?", chunks, top_k=3, backend="openai", base_url=srv.openai_url,
                   api_key="sk-bench", model="m")
            TALLY.count()
        gc.collect()
        return before, open_fds()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--imports", type=int, default=5)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    data = json.loads(need(args.data).read_text(encoding="utf-8"))
    queries = [(q["query"], [{"id": str(h["docid"]), "text": h["content"]} for h in q["hits"][:args.chunks]])
               for q in data]

    times, loaded = import_times(args.imports)
    print(f"## import rag_rerank ({args.imports} fresh processes)\n")
    print(f"median {statistics.median(times):.0f} ms (min {min(times):.0f}, max {max(times):.0f}); "
          f"heavy modules loaded: {', '.join(loaded) or 'none'}\n")

    fds = open_fds()
    rows = memory(queries, args.calls)
    print(f"## memory over {args.calls} rerank() calls ({args.chunks} chunks each, local backend)\n")
    print("| calls | traced growth (MiB) | " + " | ".join(rows[0][2]) + " |")
    print("|---:|---:|" + "---:|" * len(rows[0][2]))
    for n, mib, sizes in rows:
        print(f"| {n} | {mib:.1f} | " + " | ".join(sizes.values()) + " |")
    print(f"\nopen file descriptors: {fds} before, {open_fds()} after\n")
    before, after = openai_descriptors(200)
    print(f"## 200 rerank(backend='openai') calls against a local server\n\nopen file descriptors: {before} "
          f"before, {after} after")
    return 0


if __name__ == "__main__":
    sys.exit(run_bench(main))
