"""The default reranker on non-English and mixed-script RAG lists: how much of what a reader
would keep it keeps.

Reads `golden/multilingual/judged.jsonl` (German, French, Spanish, Chinese, Japanese, Korean,
Arabic, Hebrew, Russian, German/English code-mixing, emoji, and English queries over Spanish and
Chinese chunks; 5 chunks per query graded 0/1/2 with off-topic marked, written before any scorer
ran on it), runs `rag_rerank.rerank()` (top_k 3, the full pipeline with the post-pass) per query and
prints, per query and in total: answers (grade 2) ranked, off-topic chunks ranked, whether every
chunk was dropped, and nDCG@3 of the ranked list. A query whose rerank raises is printed as
ERROR, left out of the totals, and named in a final `FAILED: ...` line (exit code 1).

    python bench/multilingual.py                                   # the default (local, lexical)
    python bench/multilingual.py --embedder sentence-transformers  # the MiniLM profile
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from failures import TALLY, run_bench  # noqa: E402

from rag_rerank import rerank  # noqa: E402

SET = ROOT / "golden" / "multilingual" / "judged.jsonl"


def ndcg(ranked: list[str], grade: dict[str, int], k: int = 3) -> float:
    dcg = sum((2 ** grade[i] - 1) / math.log2(r + 2) for r, i in enumerate(ranked[:k]))
    ideal = sorted(grade.values(), reverse=True)[:k]
    idcg = sum((2**g - 1) / math.log2(r + 2) for r, g in enumerate(ideal))
    return dcg / idcg if idcg else 1.0


def load_set() -> list[dict]:
    return [json.loads(line) for line in SET.read_text(encoding="utf-8").splitlines() if line.strip()]


def judge_query(row: dict, embedder: str = "lexical", top_k: int = 3) -> dict:
    """One query through `rerank`: answers ranked / answers, off-topic ranked / off-topic, nDCG@k."""
    grade = {c["id"]: c["grade"] for c in row["chunks"]}
    off = {c["id"] for c in row["chunks"] if c["off_topic"]}
    answers = {i for i, g in grade.items() if g == 2}
    res = rerank(row["query"], [{"id": c["id"], "text": c["text"]} for c in row["chunks"]],
                 top_k=top_k, embedder=embedder)
    ranked = [r.id for r in res.ranked]
    return {"kept": len(answers & set(ranked)), "answers": len(answers),
            "off_ranked": len(off & set(ranked)), "off": len(off), "ndcg": ndcg(ranked, grade, top_k),
            "ranked": [(r.id, r.score) for r in res.ranked]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--embedder", default="lexical")
    ap.add_argument("--top-k", type=int, default=3)
    args = ap.parse_args(argv)
    rows = load_set()
    tot_ans = tot_kept = tot_off = tot_off_ranked = all_dropped = 0
    ndcgs = []
    print(f"{'query':<10} {'lang':<9} {'answers':>8} {'off-topic':>10} {'nDCG@3':>7}  ranked")
    for row in rows:
        res = TALLY.call(f"query {row['query_id']}", judge_query, row, args.embedder, args.top_k)
        if res is None:  # counted as failed: named in the FAILED line, left out of the totals
            print(f"{row['query_id']:<10} {row['lang']:<9} ERROR: {TALLY.failures[-1]}")
            continue
        tot_ans, tot_kept = tot_ans + res["answers"], tot_kept + res["kept"]
        tot_off, tot_off_ranked = tot_off + res["off"], tot_off_ranked + res["off_ranked"]
        all_dropped += not res["ranked"]
        ndcgs.append(res["ndcg"])
        shown = " ".join(f"{rid.rsplit('-', 1)[1]}:{score:.2f}" for rid, score in res["ranked"])
        print(f"{row['query_id']:<10} {row['lang']:<9} {res['kept']:>4}/{res['answers']:<3} "
              f"{res['off_ranked']:>6}/{res['off']:<3} {ndcgs[-1]:>7.3f}  {shown or '(all dropped)'}")
    print(f"\n{args.embedder}: answers ranked {tot_kept}/{tot_ans}, "
          f"off-topic ranked {tot_off_ranked}/{tot_off}, queries with everything dropped "
          f"{all_dropped}/{len(ndcgs)}, mean nDCG@3 {sum(ndcgs) / max(1, len(ndcgs)):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(run_bench(main))
