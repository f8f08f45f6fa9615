"""Post-pass benchmark: MMR correctness and speed, the 50-chunk post-pass cost, and AMBIENT diversity.

1. Same embeddings, three implementations: `rag_rerank.postpass.select` (the
   pipeline's MMR, de-duplication off), a plain float64 reference
   (recomputes max-similarity to the selected set from scratch at every step) and LangChain's
   `maximal_marginal_relevance` when `langchain_core` is importable (it is NOT a dependency; the
   bench skips it otherwise and when one call would take minutes). Random unit vectors (d=384),
   relevance = cosine to a random query, lambda 0.7; prints whether the selections are equal and
   the median time of each for n in {10, 50, 200, 1000}, k in {5, 20, n}.
2. The whole post-pass for 50 real chunks (TREC DL19 BM25 top-50 passages of each query) with
   the lexical embedder, embedding included.
3. AMBIENT (44 ambiguous queries, 100 results each, subtopic judgments): candidates = the top 50
   results in the collection's given order (its search-engine rank), relevance = that order
   mapped linearly to [1.0, 0.216] (rank 1 -> 1.0, rank 50 -> 0.216, all above the 0.2 floor);
   top 5 by plain relevance order vs the post-pass at lambda 1.0 / 0.7 / 0.5 (and Haystack-style
   `diversity` layout): subtopic recall@5, alpha-nDCG@5 (alpha 0.5), share of the top 5 that
   covers any subtopic, and the average pairwise cosine distance of the top 5 (measured with the
   same embedder), with its change against relevance order. Near-duplicates are decided as
   `rerank()` decides them by default whatever embedder drives MMR (`duplicates_by="text"`: lexical
   cosine at or above 0.49). (Before 2026-11-25 the MiniLM rows passed MiniLM's own threshold,
   0.84, which text-based duplicate detection applies to lexical cosines: in effect no
   de-duplication, a configuration no caller gets by default.)

    python bench/postpass.py                              # all three parts, lexical + MiniLM
    python bench/postpass.py --parts ambient --embedders lexical

A call that raises stops the run with a `FAILED: ...` line on stdout and exit code 1.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from failures import TALLY, run_bench  # noqa: E402

from rag_rerank.embed import embed_texts, get_embedder  # noqa: E402
from rag_rerank.errors import MissingDependencyError  # noqa: E402
from rag_rerank.guard import validate_request  # noqa: E402
from rag_rerank.models import Ranked  # noqa: E402
from rag_rerank.postpass import postpass, select  # noqa: E402
from tests.support.shared_data import data_dir  # noqa: E402

DATA = data_dir()


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """(median milliseconds, last result)."""
    ms, out = timed_all(fn, repeat)
    return statistics.median(ms), out


def timed_all(fn: Callable[[], Any], repeat: int) -> tuple[list[float], Any]:
    """(every run's milliseconds, last result)."""
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1000)
        TALLY.count()
    return times, out


# --------------------------------------------------------------------------- 1. correctness and speed


def reference_mmr(rel: np.ndarray, emb: np.ndarray, k: int, lam: float) -> list[int]:
    """Plain float64 MMR: every step recomputes max similarity to the selected set from scratch."""
    sim = emb @ emb.T
    sim = (sim + sim.T) * 0.5
    picked = [int(np.argmax(rel))]
    while len(picked) < min(k, len(rel)):
        max_sim = sim[:, picked].max(axis=1)
        score = lam * rel - (1.0 - lam) * max_sim
        score[picked] = -np.inf
        picked.append(int(np.argmax(score)))
    return picked


def ours(rel: np.ndarray, emb: np.ndarray, k: int, lam: float) -> list[int]:
    sim = emb @ emb.T  # the similarity matrix is part of the timed work, as in LangChain
    sim = (sim + sim.T) * 0.5
    no_dedup = select(rel, sim, k, lambda_=lam, lengths=np.zeros(len(rel)), threshold=math.inf)
    return list(no_dedup.picked)


SpeedRow = tuple[int, int, str, str, float, float, str]


def speed_rows(lam: float = 0.7, dim: int = 384) -> tuple[bool, list[SpeedRow]]:
    """(LangChain present, rows): n, k, ours = reference, ours = LangChain ("yes" / "NO" / "-"),
    ours ms, reference ms, LangChain ms (or "-" / "skipped (minutes)")."""
    try:
        from langchain_core.vectorstores.utils import maximal_marginal_relevance as lc_mmr
    except ImportError:
        lc_mmr = None
    rows = []
    rng = np.random.default_rng(0)
    for n in (10, 50, 200, 1000):
        emb = rng.normal(size=(n, dim))
        emb /= np.linalg.norm(emb, axis=1, keepdims=True)
        q = rng.normal(size=dim)
        q /= np.linalg.norm(q)
        rel = emb @ q
        for k in sorted({5, 20, n}):
            if k > n:
                continue
            repeat = 21 if n <= 200 else 5
            t_ours, got = timed(lambda rel=rel, emb=emb, k=k: ours(rel, emb, k, lam), repeat)
            t_ref, ref = timed(
                lambda rel=rel, emb=emb, k=k: reference_mmr(rel, emb, k, lam), 3 if n == 1000 else 5
            )
            same_lc, t_lc = "-", "-"
            if lc_mmr is not None and n * k * k <= 50_000_000:
                lists = emb.tolist()
                ms, lc = timed(
                    lambda q=q, lists=lists, k=k: lc_mmr(q, lists, lambda_mult=lam, k=k),
                    3 if n * k > 10_000 else 7,
                )
                same_lc, t_lc = ("yes" if lc == got else "NO"), f"{ms:.2f}"
            elif lc_mmr is not None:
                t_lc = "skipped (minutes)"
            rows.append((n, k, "yes" if got == ref else "NO", same_lc, t_ours, t_ref, t_lc))
    return lc_mmr is not None, rows


def speed_table(lam: float = 0.7, dim: int = 384) -> None:
    present, rows = speed_rows(lam, dim)
    print(
        f"\n## MMR: selections and median time (ms), d={dim}, lambda={lam}, "
        f"LangChain {'present' if present else 'not installed'}\n"
    )
    print(
        "| n | k | ours = reference | ours = LangChain | ours (ms, incl. similarity matrix) | "
        "reference (ms) | LangChain (ms) |"
    )
    print("|---:|---:|:---:|:---:|---:|---:|---:|")
    for n, k, same_ref, same_lc, t_ours, t_ref, t_lc in rows:
        print(f"| {n} | {k} | {same_ref} | {same_lc} | {t_ours:.3f} | {t_ref:.2f} | {t_lc} |")


# --------------------------------------------------------------------------- 2. the post-pass on 50 chunks


def postpass_cost() -> None:
    path = DATA / "trec-dl19" / "bm25-top100.json"
    if not path.is_file():
        print(f"\n(skipped the 50-chunk timing: {path} not found)")
        return
    queries = json.loads(path.read_text(encoding="utf-8"))
    embedder = get_embedder("lexical")
    embed_ms, total_ms, words = [], [], []
    for item in queries:
        hits = item["hits"][:50]
        chunks = [{"id": h["docid"], "text": h["content"]} for h in hits]
        request = validate_request(item["query"], chunks, 5, 0.7)
        scored = [Ranked(h["docid"], 1.0 - 0.8 * i / 50, "r") for i, h in enumerate(hits)]
        texts = [c["text"] for c in chunks]
        words.append(sum(len(t.split()) for t in texts))
        embed_ms += timed_all(lambda texts=texts: embed_texts(embedder, texts), 5)[0]
        total_ms += timed_all(
            lambda request=request, scored=scored: postpass(request, scored, embedder=embedder), 5
        )[0]
    print(
        f"\n## Post-pass for 50 chunks (TREC DL19 BM25 top-50, {len(queries)} queries, "
        f"median {statistics.median(words):.0f} words per request), lexical embedder\n"
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"(5 runs per query; load average {load:.1f} on {os.cpu_count()} cores while measuring: "
        "the minimum is the best estimate of an idle machine)\n"
    )
    print("| step | min ms | median ms | max ms |")
    print("|---|---:|---:|---:|")
    for label, values in (
        ("lexical embedding of 50 chunks", embed_ms),
        ("whole post-pass (embedding + MMR + duplicates + accounting)", total_ms),
    ):
        print(f"| {label} | {min(values):.2f} | {statistics.median(values):.2f} | {max(values):.2f} |")


# --------------------------------------------------------------------------- 3. AMBIENT diversity


def load_ambient(
    folder: Path,
) -> tuple[dict[str, str], dict[str, list[tuple[str, str]]], dict[str, set[str]]]:
    """topics, topic -> [(result id, text)] in given order, result id -> subtopics it covers."""

    def rows(name: str) -> list[list[str]]:
        with (folder / name).open(encoding="utf-8", errors="replace") as fh:
            return list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]

    topics = {r[0]: r[1] for r in rows("topics.txt") if len(r) >= 2}
    results: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for r in rows("results.txt"):
        if len(r) >= 4:
            results[r[0].split(".")[0]].append((r[0], f"{r[2]}. {r[3]}"))
    for items in results.values():
        items.sort(key=lambda x: int(x[0].split(".")[1]))
    covers: dict[str, set[str]] = defaultdict(set)
    for r in rows("STRel.txt"):
        if len(r) >= 2:
            covers[r[1]].add(r[0])
    return topics, dict(results), dict(covers)


def alpha_ndcg(
    ranking: list[str], covers: dict[str, set[str]], pool: list[str], depth: int = 5, alpha: float = 0.5
) -> float:
    def gains(order: list[str]) -> list[float]:
        seen: dict[str, int] = defaultdict(int)
        out = []
        for rid in order:
            g = 0.0
            for s in covers.get(rid, ()):
                g += (1 - alpha) ** seen[s]
                seen[s] += 1
            out.append(g)
        return out

    def dcg(g: list[float]) -> float:
        return sum(x / math.log2(i + 2) for i, x in enumerate(g[:depth]))

    ideal: list[str] = []  # greedy ideal ordering (the usual approximation)
    rest = list(pool)
    seen: dict[str, int] = defaultdict(int)
    while rest and len(ideal) < depth:
        best = max(rest, key=lambda r: sum((1 - alpha) ** seen[s] for s in covers.get(r, ())))
        ideal.append(best)
        rest.remove(best)
        for s in covers.get(best, ()):
            seen[s] += 1
    denom = dcg(gains(ideal))
    return dcg(gains(ranking)) / denom if denom else 0.0


@dataclass(frozen=True)
class Precomputed:
    """An Embedder answering from vectors computed once per topic, so the five rankings compared
    for a topic share one embedding pass (the MiniLM pass dominates the bench's run time)."""

    name: str
    duplicate_threshold: float
    vectors: dict[str, np.ndarray]

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts])


@dataclass(frozen=True)
class AmbientResult:
    """One embedder's AMBIENT table: per ranking, the means of subtopic recall, alpha-nDCG, the share
    covering a subtopic, the pairwise cosine distance, and that distance's change against relevance
    order in percent."""

    name: str
    threshold: float
    topics: int
    seconds: float
    rows: dict[str, tuple[float, float, float, float, float]]


def ambient_result(spec: str, pool_size: int = 50, depth: int = 5) -> AmbientResult:
    """The AMBIENT diversity table for one embedder (MissingDependencyError when it is not installed)."""
    topics, results, covers = load_ambient(DATA / "ambient")
    embedder = get_embedder(spec)
    embedder.embed(["warm up"])
    runs: dict[str, list[tuple[float, float, float, float]]] = defaultdict(list)
    t0 = time.perf_counter()
    thr = get_embedder("lexical").duplicate_threshold  # duplicates_by="text": lexical, whatever ranks
    for tid, query in topics.items():
        items = results.get(tid, [])[:pool_size]
        if not items:
            continue
        ids = [rid for rid, _ in items]
        all_subtopics = set().union(*(covers.get(r, set()) for r in ids))
        if not all_subtopics:
            continue
        vectors32 = embed_texts(embedder, [t for _, t in items])
        vectors = vectors32.astype(np.float64)
        by_text = {t: v for (_, t), v in zip(items, vectors32, strict=True)}
        fixed = Precomputed(embedder.name, embedder.duplicate_threshold, by_text)
        chunks = [{"id": rid, "text": text} for rid, text in items]
        request_for = {lam: validate_request(query, chunks, depth, lam) for lam in (1.0, 0.7, 0.5)}
        scored = [Ranked(rid, 1.0 - 0.8 * i / pool_size, "r") for i, rid in enumerate(ids)]
        row = {rid: i for i, rid in enumerate(ids)}
        rankings = {"relevance order (given rank)": ids[:depth]}
        for lam in (1.0, 0.7, 0.5):
            res = postpass(request_for[lam], scored, embedder=fixed)
            rankings[f"post-pass MMR lambda={lam}"] = res.ids
        fixed.vectors[query] = embed_texts(embedder, [query])[0]
        res = postpass(
            request_for[0.7], scored, embedder=fixed, layout="diversity"
        )
        rankings["post-pass layout=diversity (Haystack order)"] = res.ids
        TALLY.count(4)
        for name, ranking in rankings.items():
            covered = set().union(*(covers.get(r, set()) for r in ranking)) if ranking else set()
            idx = [row[r] for r in ranking]
            pair = [1.0 - float(vectors[a] @ vectors[b]) for x, a in enumerate(idx) for b in idx[x + 1 :]]
            runs[name].append(
                (
                    len(covered) / len(all_subtopics),
                    alpha_ndcg(ranking, covers, ids, depth),
                    sum(bool(covers.get(r)) for r in ranking) / depth,
                    float(np.mean(pair)) if pair else 0.0,
                )
            )
    seconds = time.perf_counter() - t0
    base = np.mean([r[3] for r in runs["relevance order (given rank)"]])
    means = {}
    for name, values in runs.items():
        m = np.mean(np.array(values), axis=0)
        means[name] = (float(m[0]), float(m[1]), float(m[2]), float(m[3]), float((m[3] / base - 1) * 100))
    n_topics = len(next(iter(runs.values())))
    return AmbientResult(embedder.name, thr, n_topics, seconds, means)


def ambient_table(specs: list[str], pool_size: int = 50, depth: int = 5) -> None:
    folder = DATA / "ambient"
    if not folder.is_dir():
        print(f"\n(skipped AMBIENT: {folder} not found)")
        return
    for spec in specs:
        try:
            result = ambient_result(spec, pool_size, depth)
        except MissingDependencyError as exc:
            print(f"\n(skipped {spec}: {exc})")
            continue
        print(
            f"\n## AMBIENT diversity, embedder {result.name} ({result.topics} topics, top {pool_size} "
            f"candidates in given order, top {depth} kept, near-duplicates: lexical cosine >= "
            f"{result.threshold}; "
            f"{result.seconds:.0f} s)\n"
        )
        print(
            f"| ranking | subtopic recall@{depth} | alpha-nDCG@{depth} | covers a subtopic @{depth} | "
            f"avg pairwise cosine distance | vs relevance order |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for name, m in result.rows.items():
            print(f"| {name} | {m[0]:.3f} | {m[1]:.3f} | {m[2]:.3f} | {m[3]:.3f} | {m[4]:+.1f}% |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--parts", nargs="+", default=["speed", "cost", "ambient"], choices=["speed", "cost", "ambient"]
    )
    ap.add_argument("--embedders", nargs="+", default=["lexical", "sentence-transformers"])
    args = ap.parse_args(argv)
    if "speed" in args.parts:
        speed_table()
    if "cost" in args.parts:
        postpass_cost()
    if "ambient" in args.parts:
        ambient_table(args.embedders)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_bench(main))
