"""Our own cost per rerank call, without any LLM: what rag-rerank adds on top of the model's latency.

Stages timed separately, on real passages (TREC DL19 BM25 top hits: the first 10 / 50 of each query):
  input guard (validate_request) · render (XML prompt) · output guard (judge the raw answer) ·
  post-pass (lexical embedder: MMR, near-duplicates, min score, accounting)
  = "ours", the overhead an LLM call pays; then the local backend's scoring on its own, and a whole
  `rerank(..., backend="local")` end to end. The raw answer judged by the output guard is the local
  backend's own answer for that request (a realistic candidate_k-sized object).

Run:  python bench/overhead.py [--runs 200] [--data PATH]
Prints a Markdown table: median and p95 in milliseconds per call. A query whose local answer raises
or fails the output guard is left out of the timings and named in a final `FAILED: ...` line on
stdout (exit code 1); any other call that raises stops the run the same way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from failures import TALLY, run_bench  # noqa: E402

from rag_rerank import make_backend, rerank  # noqa: E402
from rag_rerank.embed import get_embedder  # noqa: E402
from rag_rerank.guard import validate_request  # noqa: E402
from rag_rerank.guard.output import judge  # noqa: E402
from rag_rerank.models import Dropped, Ranked  # noqa: E402
from rag_rerank.postpass import postpass  # noqa: E402
from rag_rerank.render import render  # noqa: E402
from rag_rerank.windows import candidate_k  # noqa: E402
from tests.support.shared_data import data_dir, need  # noqa: E402

DEFAULT_DATA = data_dir() / "trec-dl19" / "bm25-top100.json"


def load_queries(path: Path, n_chunks: int) -> list[tuple[str, list[dict[str, Any]]]]:
    data = json.loads(need(path).read_text(encoding="utf-8"))
    out = []
    for q in data:
        hits = q["hits"][:n_chunks]
        chunks = [{"id": str(h["docid"]), "text": h["content"]} for h in hits]
        out.append((q["query"], chunks))
    return out


def timed(fn: Callable[[], Any], runs: int) -> list[float]:
    fn()  # warm caches (templates, schemas, validators)
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def p95(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(0.95 * (len(s) - 1)))]


def bench(n_chunks: int, runs: int, data: Path) -> dict[str, list[float]]:
    queries = load_queries(data, n_chunks)
    embedder = get_embedder("lexical")
    local = make_backend("local", embedder=embedder)
    times: dict[str, list[float]] = {
        k: []
        for k in (
            "input guard",
            "render",
            "output guard",
            "post-pass",
            "ours (sum)",
            "local backend scoring",
            "rerank() local end to end",
        )
    }
    per_query = max(1, runs // len(queries))
    for query, chunks in queries:
        request = validate_request(query, chunks, 5, 0.7)
        ask = replace(request, top_k=candidate_k(len(request.chunks), request.top_k))
        prompt = render(ask)
        where = f"{n_chunks} chunks, query {query!r}"
        answer = TALLY.call(where, local.complete, prompt, ask, max_tokens=4096)
        if answer is None:  # counted as failed; this query is left out of the timings
            continue
        raw = answer.text
        obj, violations = judge(raw, ask.chunks, ask.top_k)
        if violations or obj is None:
            TALLY.fail(where, f"the local backend's answer failed the output guard: {violations}")
            continue
        scored = [
            Ranked(r["id"], float(r["score"]), r["reason"], r.get("diversity_note")) for r in obj["ranked"]
        ]
        dropped = [Dropped(d["id"], d["reason"]) for d in obj.get("dropped", [])]
        stages = {
            "input guard": lambda q=query, c=chunks: validate_request(q, c, 5, 0.7),
            "render": lambda a=ask: render(a),
            "output guard": lambda r=raw, a=ask: judge(r, a.chunks, a.top_k),
            "post-pass": lambda rq=request, s=scored, d=dropped: postpass(rq, s, d, embedder=embedder),
            "local backend scoring": lambda p=prompt, a=ask: local.complete(p, a, max_tokens=4096),
            "rerank() local end to end": lambda q=query, c=chunks: rerank(
                q, c, 5, 0.7, backend=local, embedder=embedder
            ),
        }
        sums = [0.0] * per_query
        for name, fn in stages.items():
            ts = timed(fn, per_query)
            times[name] += ts
            if name in ("input guard", "render", "output guard", "post-pass"):
                sums = [a + b for a, b in zip(sums, ts, strict=False)]
        times["ours (sum)"] += sums
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--runs", type=int, default=215, help="timed calls per stage and size (spread over queries)"
    )
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = ap.parse_args()
    results = {n: bench(n, args.runs, args.data) for n in (10, 50)}
    print(
        f"rag-rerank overhead per call, ms (median / p95 over {len(results[10]['render'])} calls, "
        f"{args.data.parent.name} passages, lexical embedder, top_k=5)\n"
    )
    print("| stage | 10 chunks median | 10 chunks p95 | 50 chunks median | 50 chunks p95 |")
    print("|---|---:|---:|---:|---:|")
    for name in results[10]:
        row = [f"{f(results[n][name]):.3f}" for n in (10, 50) for f in (statistics.median, p95)]
        print(f"| {name} | " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(run_bench(main))
