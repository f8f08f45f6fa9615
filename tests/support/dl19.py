"""TREC DL19 as the measuring commands read it, for the tests and benches that run them on it:
the candidates file (BM25 top 100 with passage text, in BM25 order) and the four commands that
write the `--html` pages, with what each page must hold."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

from tests.support.shared_data import data_dir

DL19 = data_dir() / "trec-dl19"
QRELS = DL19 / "qrels.txt"
# Sections and inline figures of each page (compare and eval: one figure per default metric).
PAGES = {"compare": (["comparison"], 3), "eval": (["eval", "comparison"], 3), "bias": (["bias"], 1),
         "calibrate": (["calibration"], 1)}


def write_candidates(path: Path, qids: Collection[str] | None = None, depth: int | None = None) -> Path:
    """`eval`'s candidates JSONL of the judged DL19 queries (or of `qids`), the first `depth` hits each."""
    rows = []
    for item in json.loads((DL19 / "bm25-top100.json").read_text(encoding="utf-8")):
        hits = sorted(item["hits"], key=lambda h: h["rank"])[:depth]
        qid = str(hits[0]["qid"])
        if qids is None or qid in qids:
            rows.append({"qid": qid, "query": item["query"],
                         "chunks": [{"id": h["docid"], "text": h["content"]} for h in hits]})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def page_commands(candidates: Path, out: Path, *, compare_b: str = "rerank:lambda=0.3",
                  bias_depth: int | None = None, resamples: int | None = None) -> dict[str, list[str]]:
    """The CLI arguments that write each page into `out` (grade >= 2 relevant, DL19's convention;
    the local backend; compare's gate on nDCG@10 at margin 0)."""
    cands, qrels = str(candidates), str(QRELS)
    judged = ["--candidates", cands, "--qrels", qrels, "--rel-level", "2"]
    return {
        "compare": ["compare", "input", compare_b, *judged, "--fail-if-worse", "nDCG@10:0",
                    *(["--resamples", str(resamples)] if resamples else [])],
        "eval": ["eval", *judged],
        "bias": ["bias", "--candidates", cands, *(["--depth", str(bias_depth)] if bias_depth else [])],
        "calibrate": ["calibrate", *judged, "-o", str(out / "calibration.json")],
    }
