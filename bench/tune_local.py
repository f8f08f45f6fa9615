"""How the local backend's MiniLM profile was chosen: a small grid on a dev split, printed.

Dev = odd-numbered qids of TREC DL19 (BM25 top-50) and of SciFact (BM25 top-50); test = the even
ones. Each setting ranks by pure relevance (`w * calibrated cosine + (1 - w) * lexical`, no
post-pass), scored by nDCG@10 with ir-measures. The setting with the best mean dev nDCG@10 was
frozen into `rag_rerank/backends/local.py` (PROFILES); its test columns were never used to choose.

    python bench/quality.py --only dl19 --only scifact   # builds bench/out/ and the MiniLM cache
    python bench/tune_local.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import quality

from rag_rerank.backends.local import Calibration, lexical_scores, profile_for

GRID_CAL = (Calibration(0.15, 0.75), Calibration(0.1, 0.6), Calibration(0.2, 0.7),
            Calibration(0.15, 0.9), Calibration(0.2, 0.9), Calibration(0.1, 0.9))
GRID_W = (0.5, 0.6, 0.7, 0.8, 0.9)


def _features(path: Path, emb: quality.CachedEmbedder, depth: int = 50) -> list[dict]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        chunks = row["chunks"][:depth]
        texts = [c["text"] for c in chunks]
        vecs = emb.embed([row["query"], *texts])
        lex = lexical_scores(row["query"], texts, profile_for(emb.name).weights)[0]
        ids = [c["id"] for c in chunks]
        rows.append({"qid": row["qid"], "ids": ids, "cos": vecs[1:] @ vecs[0], "lex": lex})
    return rows


def _ndcg(rows: list[dict], qrels: list, score, part: int) -> float:
    import ir_measures
    from ir_measures import nDCG

    run, keep = [], set()
    for r in rows:
        if int(r["qid"]) % 2 != part:
            continue
        keep.add(r["qid"])
        s = score(r)
        order = sorted(range(len(s)), key=lambda i: (-s[i], i))
        run += [ir_measures.ScoredDoc(r["qid"], r["ids"][i], float(len(s) - rank))
                for rank, i in enumerate(order)]
    judged = [q for q in qrels if q.query_id in keep]
    return float(ir_measures.calc_aggregate([nDCG @ 10], judged, run)[nDCG @ 10])


def main() -> int:
    import ir_measures

    emb = quality.CachedEmbedder(quality.ST_SPEC)
    sets = {}
    for name, (cands, qrels) in {"dl19": quality.build_dl19(), "scifact": quality.build_scifact(50)}.items():
        sets[name] = (_features(cands, emb), list(ir_measures.read_trec_qrels(str(qrels))))
    emb.save()
    print("| calibration | w | DL19 dev | DL19 test | SciFact dev | SciFact test | dev mean |")
    print("|---|---|---|---|---|---|---|")
    best = None
    for cal in GRID_CAL:
        for w in GRID_W:
            def score(r, cal=cal, w=w):
                return w * cal.apply(r["cos"]) + (1 - w) * r["lex"]

            vals = [_ndcg(rows, qrels, score, part) for rows, qrels in sets.values() for part in (1, 0)]
            dev = float(np.mean([vals[0], vals[2]]))
            print(f"| {cal.lo}-{cal.hi} | {w} | {vals[0]:.4f} | {vals[1]:.4f} | {vals[2]:.4f} "
                  f"| {vals[3]:.4f} | {dev:.4f} |")
            if best is None or dev > best[0]:
                best = (dev, cal, w, vals)
    assert best is not None
    print(f"best on dev: calibration {best[1].lo}-{best[1].hi}, w {best[2]} (dev mean {best[0]:.4f}); "
          f"test halves: DL19 {best[3][1]:.4f}, SciFact {best[3][3]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
