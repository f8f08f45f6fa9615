"""The default reranker on non-English and mixed-script RAG lists: how much of what a reader
would keep it keeps.

Reads `golden/multilingual/judged.jsonl` (German, French, Spanish, Chinese, Japanese, Korean,
Arabic, Hebrew, Russian, German/English code-mixing, emoji, and English queries over Spanish and
Chinese chunks; 5 chunks per query graded 0/1/2 with off-topic marked, written before any scorer
ran on it), runs `rag_rerank.rerank()` (top_k 3, the full pipeline with the post-pass) per query and
prints, per query and in total: answers (grade 2) ranked, off-topic chunks ranked, whether every
chunk was dropped, and nDCG@3 of the ranked list.

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

from rag_rerank import rerank  # noqa: E402

SET = ROOT / "golden" / "multilingual" / "judged.jsonl"


def ndcg(ranked: list[str], grade: dict[str, int], k: int = 3) -> float:
    dcg = sum((2 ** grade[i] - 1) / math.log2(r + 2) for r, i in enumerate(ranked[:k]))
    ideal = sorted(grade.values(), reverse=True)[:k]
    idcg = sum((2**g - 1) / math.log2(r + 2) for r, g in enumerate(ideal))
    return dcg / idcg if idcg else 1.0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--embedder", default="lexical")
    ap.add_argument("--top-k", type=int, default=3)
    args = ap.parse_args(argv)
    rows = [json.loads(line) for line in SET.read_text(encoding="utf-8").splitlines() if line.strip()]
    tot_ans = tot_kept = tot_off = tot_off_ranked = all_dropped = 0
    ndcgs = []
    print(f"{'query':<10} {'lang':<9} {'answers':>8} {'off-topic':>10} {'nDCG@3':>7}  ranked")
    for row in rows:
        grade = {c["id"]: c["grade"] for c in row["chunks"]}
        off = {c["id"] for c in row["chunks"] if c["off_topic"]}
        answers = {i for i, g in grade.items() if g == 2}
        res = rerank(row["query"], [{"id": c["id"], "text": c["text"]} for c in row["chunks"]],
                     top_k=args.top_k, embedder=args.embedder)
        ranked = [r.id for r in res.ranked]
        kept, off_ranked = len(answers & set(ranked)), len(off & set(ranked))
        tot_ans, tot_kept, tot_off, tot_off_ranked = (tot_ans + len(answers), tot_kept + kept,
                                                      tot_off + len(off), tot_off_ranked + off_ranked)
        all_dropped += not ranked
        ndcgs.append(ndcg(ranked, grade, args.top_k))
        shown = " ".join(f"{r.id.rsplit('-', 1)[1]}:{r.score:.2f}" for r in res.ranked)
        print(f"{row['query_id']:<10} {row['lang']:<9} {kept:>4}/{len(answers):<3} "
              f"{off_ranked:>6}/{len(off):<3} {ndcgs[-1]:>7.3f}  {shown or '(all dropped)'}")
    print(f"\n{args.embedder}: answers ranked {tot_kept}/{tot_ans}, "
          f"off-topic ranked {tot_off_ranked}/{tot_off}, queries with everything dropped "
          f"{all_dropped}/{len(rows)}, mean nDCG@3 {sum(ndcgs) / len(ndcgs):.3f}")


if __name__ == "__main__":
    main()
