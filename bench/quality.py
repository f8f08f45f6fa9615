"""Quality benchmark: the local backend (and any OpenAI-compatible endpoint) on public collections.

Builds candidates files from ../shared/data (or RAG_RERANK_DATA) into bench/out/, runs
`rag_rerank.evaluate` on each, and prints one table per collection with the published reference
figures in the same table. Rows marked "ours" are measured by this script on this machine; rows
marked "published" are copied from the data README and were measured elsewhere.

    python bench/quality.py                       # DL19 + SciFact + AMBIENT, lexical and MiniLM
    python bench/quality.py --only dl19 --embedders lexical
    python bench/quality.py --openai-base-url http://127.0.0.1:8080/v1 --openai-model m   # + an LLM row

MiniLM embeddings are cached on disk (bench/out/emb-cache/), so a second run only pays for ranking.
A query whose rerank fails keeps its input order in its row (as `rag-rerank eval` does) and is named
on stderr; the run then ends with a `FAILED: <n> of <m> calls raised; first: ...` line on stdout and
exit code 1, so a table with failed queries never passes for a clean one.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from failures import TALLY, run_bench  # noqa: E402

from rag_rerank.embed.disk_cache import DiskCachedEmbedder  # noqa: E402
from tests.support.shared_data import data_dir  # noqa: E402

DATA = data_dir()
OUT = ROOT / "bench" / "out"
ST_SPEC = "sentence-transformers"


# --------------------------------------------------------------------------- candidates files


def _write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def build_dl19() -> tuple[Path, Path]:
    """DL19 BM25 top-100 exactly as given (order and passage text), and its qrels."""
    data = json.loads((DATA / "trec-dl19" / "bm25-top100.json").read_text(encoding="utf-8"))
    rows = []
    for item in data:
        hits = sorted(item["hits"], key=lambda h: h["rank"])
        rows.append({"qid": str(hits[0]["qid"]), "query": item["query"],
                     "chunks": [{"id": str(h["docid"]), "text": h["content"]} for h in hits]})
    return _write_jsonl(OUT / "dl19-bm25-top100.jsonl", rows), DATA / "trec-dl19" / "qrels.txt"


def build_dl19_top(depth: int) -> tuple[Path, Path]:
    """DL19 cut to the BM25 top-`depth` of each query (20 or 50 in the bias and calibration
    benches), in BM25 order, and its qrels."""
    full, qrels = build_dl19()
    rows = []
    for line in full.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        rows.append({**row, "chunks": row["chunks"][:depth]})
    return _write_jsonl(OUT / f"dl19-bm25-top{depth}.jsonl", rows), qrels


def build_scifact(depth: int = 50) -> tuple[Path, Path]:
    """BM25 (bm25s, English stopwords, no stemmer) over title + text; top-`depth` per test query."""
    import bm25s

    path = OUT / f"scifact-bm25-top{depth}.jsonl"
    qrels = DATA / "scifact" / "qrels.test.txt"
    if path.is_file():
        return path, qrels
    with gzip.open(DATA / "scifact" / "corpus.jsonl.gz", "rt", encoding="utf-8") as fh:
        docs = [json.loads(line) for line in fh if line.strip()]
    texts = [f"{d.get('title', '')} {d.get('text', '')}".strip() for d in docs]
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    lines = (DATA / "scifact" / "queries.test.tsv").read_text(encoding="utf-8").splitlines()
    queries = [line.split("\t", 1) for line in lines if line.strip()]
    idx, _ = retriever.retrieve(bm25s.tokenize([q for _, q in queries], stopwords="en", show_progress=False),
                                k=depth, show_progress=False)
    rows = [{"qid": qid, "query": q, "chunks": [{"id": docs[j]["_id"], "text": texts[j]} for j in idx[i]]}
            for i, (qid, q) in enumerate(queries)]
    return _write_jsonl(path, rows), qrels


def build_ambient() -> tuple[Path, Path, Path]:
    """Per topic its 100 results (title + snippet) in the given order; subtopic judgments as TREC
    diversity qrels (`topic subtopic result 1`) and plain qrels (a result is relevant if it covers
    any subtopic)."""
    def table(name: str) -> list[list[str]]:
        lines = (DATA / "ambient" / name).read_text(encoding="utf-8", errors="replace").splitlines()
        return [line.split("\t") for line in lines[1:] if line.strip()]

    topics = {row[0]: row[1] for row in table("topics.txt")}
    results: dict[str, list[dict[str, str]]] = {t: [] for t in topics}
    for row in table("results.txt"):
        rid = row[0]
        title = row[2] if len(row) > 2 else ""
        snippet = row[3] if len(row) > 3 else ""
        results[rid.split(".")[0]].append({"id": rid, "text": f"{title}. {snippet}".strip()})
    rows = [{"qid": t, "query": topics[t],
             "chunks": sorted(results[t], key=lambda c: int(c["id"].split(".")[1]))} for t in topics]
    div_lines, rel = [], {}
    for sub, rid in table("STRel.txt"):
        topic = sub.split(".")[0]
        div_lines.append(f"{topic} {sub} {rid} 1")
        rel[(topic, rid)] = 1
    div = OUT / "ambient-subtopics.txt"
    div.write_text("\n".join(div_lines) + "\n", encoding="utf-8")
    plain = OUT / "ambient-qrels.txt"
    plain.write_text("".join(f"{t} 0 {r} 1\n" for (t, r) in sorted(rel)), encoding="utf-8")
    return _write_jsonl(OUT / "ambient-top100.jsonl", rows), plain, div


# --------------------------------------------------------------------------- embedding cache


class CachedEmbedder(DiskCachedEmbedder):
    """The library's on-disk vector cache in bench/out/emb-cache/, so repeated bench runs (and the
    post-pass re-embedding what the backend already embedded) cost nothing."""

    def __init__(self, spec: str) -> None:
        from rag_rerank.embed import get_embedder

        super().__init__(get_embedder(spec), OUT / "emb-cache")

    def warm(self, texts: list[str], batch: int = 512) -> None:
        for i in range(0, len(texts), batch):
            self.embed(texts[i : i + batch])
        self.save()


def _all_texts(candidates: Path, depth: int | None) -> list[str]:
    out = []
    for line in candidates.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        out.append(row["query"])
        out += [c["text"] for c in row["chunks"][:depth]]
    return out


# --------------------------------------------------------------------------- runs and tables


@dataclass(frozen=True)
class Row:
    """One line of a table: who measured it, what it is, its metrics, and how long it took."""

    source: str  # "ours" (measured here) or "published"
    system: str
    metrics: dict[str, float]
    wall_s: float | None = None


def _run(label: str, candidates: Path, qrels: Path, *, k: int, lambda_: float, depth: int | None,
         embedder: Any, rel_level: int = 1, subtopics: Path | None = None, **options: Any) -> tuple[Row, Row]:
    from rag_rerank.evaluate import evaluate

    started = time.perf_counter()
    report = evaluate(candidates, qrels, k=k, lambda_=lambda_, depth=depth, subtopics=subtopics,
                      rel_level=rel_level, concurrency=2, embedder=embedder, distance_embedder="lexical",
                      **options)
    wall = time.perf_counter() - started
    if isinstance(embedder, CachedEmbedder):
        embedder.save()
    TALLY.add(report.n_queries, {f"qid {qid}": error for qid, error in report.failed.items()}, where=label)
    if report.failed:
        print(f"  ! {label}: {len(report.failed)} queries failed and kept their input order", file=sys.stderr)
    print(f"  done: {label} ({wall:.1f} s)", file=sys.stderr)
    return Row("ours", "input order", dict(report.input)), Row("ours", label, dict(report.reranked), wall)


def _table(title: str, rows: Sequence[Row], columns: Sequence[str]) -> str:
    head = f"| source | system | {' | '.join(columns)} | wall s |"
    out = [f"### {title}", "", head, "|" + "---|" * (len(columns) + 3)]
    for r in rows:
        cells = [f"{r.metrics[c]:.4f}" if c in r.metrics else "" for c in columns]
        wall = f"{r.wall_s:.1f}" if r.wall_s is not None else ""
        out.append(f"| {r.source} | {r.system} | {' | '.join(cells)} | {wall} |")
    return "\n".join(out)


def _embedders(names: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        out[name] = "lexical" if name == "lexical" else CachedEmbedder(ST_SPEC)
    return out


def _llm_options(args: argparse.Namespace) -> dict[str, Any] | None:
    if not args.openai_base_url:
        return None
    return {"backend": "openai", "base_url": args.openai_base_url, "model": args.openai_model,
            "fallback": None}


def _cosine_only(emb: Any) -> Any:
    """The ablation row: the local backend scoring by the embedder's cosine alone (semantic weight 1,
    every other weight 0, intercept 0, slope 1). The scores are then sigmoid(cosine), uncalibrated,
    so every chunk clears the minimum score: this row measures the order, not the cut-off."""
    from rag_rerank.backends.local import Fusion, LocalBackend

    return LocalBackend(emb, fusion=Fusion(intercept=0.0, slope=1.0, semantic=1.0, lexical=0.0, tokens=0.0,
                                           outlier=0.0, context=0.0, position=0.0))


def _no_prior(emb: Any) -> Any:
    """The ablation row: the local backend's own profile with the input-rank (position) weight at 0."""
    import dataclasses

    from rag_rerank.backends.local import LocalBackend

    backend = LocalBackend(emb)
    return LocalBackend(emb, fusion=dataclasses.replace(backend.fusion, position=0.0))


def _relevance_rows(cands: Path, qrels: Path, depths: Sequence[int], embedders: dict[str, Any],
                    args: argparse.Namespace, input_label: str, rel_level: int = 1) -> list[Row]:
    """The relevance matrix shared by DL19 and SciFact: each embedder at each depth, lambda 1.0,
    with the post-pass near-duplicate removal on (the product default) and, for MiniLM, off."""
    rows: list[Row] = []
    run: dict[str, Any] = {"k": 10, "rel_level": rel_level}
    for depth in depths:
        for name, emb in embedders.items():
            inp, row = _run(f"local + {name}, top-{depth}, lambda 1.0", cands, qrels, lambda_=1.0,
                            depth=depth, embedder=emb, **run)
            if not rows:
                rows.append(Row("ours", input_label, inp.metrics))
            rows.append(row)
            label = f"local + {name}, top-{depth}, lambda 1.0, duplicate removal off"
            rows.append(_run(label, cands, qrels, lambda_=1.0, depth=depth, embedder=emb,
                             duplicate_threshold=1.0, **run)[1])
        lex = embedders.get("lexical")
        if lex is not None and depth == 50:
            rows.append(_run("ablation: local + lexical, top-50, lambda 1.0, input-rank weight off",
                             cands, qrels, lambda_=1.0, depth=50, embedder=lex, backend=_no_prior(lex),
                             **run)[1])
            rows.append(_run("local + lexical, top-50, lambda 0.7 (the default)", cands, qrels,
                             lambda_=0.7, depth=50, embedder=lex, **run)[1])
        st = embedders.get(ST_SPEC)
        if st is not None and depth == 50:
            rows.append(_run("ablation: MiniLM cosine only (no lexical), top-50, duplicate removal off",
                             cands, qrels, lambda_=1.0, depth=50, embedder=st, backend=_cosine_only(st),
                             duplicate_threshold=1.0, **run)[1])
            rows.append(_run(f"local + {ST_SPEC}, top-50, lambda 0.7 (the default)", cands, qrels,
                             lambda_=0.7, depth=50, embedder=st, **run)[1])
        llm = _llm_options(args)
        if llm:
            rows.append(_run(f"openai {args.openai_model}, top-{depth}, lambda 1.0", cands, qrels,
                             lambda_=1.0, depth=depth, embedder="lexical", **run, **llm)[1])
    return rows


def bench_dl19(args: argparse.Namespace, embedders: dict[str, Any]) -> str:
    cands, qrels = build_dl19()
    rows = _relevance_rows(cands, qrels, (50, 20), embedders, args,
                           "BM25 top-100 as given (input order)", rel_level=2)
    rows += [Row("published", "BM25 (data README)", {"nDCG@10": 0.5058}),
             Row("published", "RankGPT gpt-4o-mini, top-100 (RankLLM, SIGIR 2025)", {"nDCG@10": 0.7345}),
             Row("published", "RankZephyr-7B, top-100 (RankLLM, SIGIR 2025)", {"nDCG@10": 0.7365}),
             Row("published", "monoT5-3B, top-100 (RankLLM, SIGIR 2025)", {"nDCG@10": 0.7173}),
             Row("published", "RankGPT gpt-3.5 (rank_llm run file)", {"nDCG@10": 0.680})]
    cols = ["nDCG@10", "novelty-nDCG@10", "Recall@10", "MRR@10", "distance@10"]
    return _table("TREC DL19 passage (43 queries; Recall/MRR count grade >= 2)", rows, cols)


def bench_scifact(args: argparse.Namespace, embedders: dict[str, Any]) -> str:
    started = time.perf_counter()
    cands, qrels = build_scifact(50)
    print(f"  scifact candidates: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    rows = _relevance_rows(cands, qrels, (50,), embedders, args,
                           "BM25 top-50, bm25s over title + text (input order)")
    rows.append(Row("published", "Anserini BM25-flat (data README)", {"nDCG@10": 0.6789}))
    cols = ["nDCG@10", "novelty-nDCG@10", "Recall@10", "MRR@10", "distance@10"]
    return _table("SciFact test (300 queries)", rows, cols)


def bench_ambient(args: argparse.Namespace, embedders: dict[str, Any]) -> str:
    from rag_rerank.guard import load_limits

    cands, qrels, subs = build_ambient()
    limits = load_limits().with_overrides(max_chunks=100)
    cols = ["St-recall@5", "alpha-nDCG@5", "distance@5", "nDCG@10"]
    rows: list[Row] = []
    for name, emb in embedders.items():
        for lam in (1.0, 0.7, 0.5):
            inp, row = _run(f"local + {name}, all 100, lambda {lam}", cands, qrels, k=5, lambda_=lam,
                            depth=100, embedder=emb, subtopics=subs, limits=limits)
            if not rows:
                rows.append(Row("ours", "search-engine order (input)", inp.metrics))
            rows.append(row)
    return _table("AMBIENT (44 ambiguous topics, 100 results each; top 5 judged for subtopic coverage)",
                  rows, cols)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["dl19", "scifact", "ambient"], action="append", default=None)
    parser.add_argument("--embedders", default=f"lexical,{ST_SPEC}",
                        help="comma-separated: lexical, sentence-transformers")
    parser.add_argument("--openai-base-url", default=None,
                        help="also rank with this OpenAI-compatible server")
    parser.add_argument("--openai-model", default=None)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.embedders.split(",") if n.strip()]
    embedders = _embedders(names)
    for name, emb in embedders.items():
        if isinstance(emb, CachedEmbedder):
            started = time.perf_counter()
            texts = []
            for build, depth in ((build_dl19, 50), (build_scifact, 50), (build_ambient, 100)):
                texts += _all_texts(build()[0], depth)
            emb.warm(texts)
            print(f"  {name}: {len(set(texts))} texts embedded or loaded from cache in "
                  f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    benches = {"dl19": bench_dl19, "scifact": bench_scifact, "ambient": bench_ambient}
    for key in args.only or list(benches):
        print(benches[key](args, embedders))
        print()
    print("ours = measured by this script on this machine; published = figures from the data README, "
          "measured elsewhere on the same candidates. wall s = reranking + metrics for the whole collection "
          "(MiniLM vectors from the on-disk cache). distance = mean pairwise cosine distance of the top k, "
          "always measured with the lexical embedder so rows compare.")
    return 0


if __name__ == "__main__":
    sys.exit(run_bench(main))
