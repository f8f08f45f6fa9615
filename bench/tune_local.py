"""How the local backend's profiles were chosen: small grids on a dev split, printed.

Dev = odd-numbered qids of TREC DL19 (BM25 top-50) and of SciFact (BM25 top-50); test = the even
ones. The setting with the best mean dev nDCG@10 was frozen into `rag_rerank/backends/local.py`
(PROFILES); test columns were never used to choose.

* default (MiniLM): pure relevance order (`w * calibrated cosine + (1 - w) * lexical`, no
  post-pass), scored by nDCG@10 with ir-measures.
* `--lexical`: the lexical-embedder profile with the first-stage prior (semantic weight, prior
  share a, prior constant c). Scored like `rag-rerank eval` without the post-pass: the top 10
  of the chunks above the minimum score (0.2) by relevance, then the rest in input order. Only
  settings under which the card's happy path ranks c3 first and never c5, and its adversarial
  example ranks nothing, are eligible. Prints the top of the dev table and the chosen setting.
* `--minilm-prior`: the same prior on top of the frozen MiniLM profile, to decide whether MiniLM
  should use it (only if the dev-best setting also beats no prior on both test halves).

    python bench/quality.py --only dl19 --only scifact   # builds bench/out/ and the MiniLM cache
    python bench/tune_local.py [--lexical | --minilm-prior]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import quality

from rag_rerank.backends.local import (
    Calibration,
    LocalBackend,
    Weights,
    fuse_prior,
    lexical_scores,
    profile_for,
    rank_prior,
)

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


MIN = 0.2
GRID_PRIOR_W = (0.2, 0.3, 0.4, 0.5)
GRID_PRIOR_C = (2.0, 5.0, 10.0, 30.0)
GRID_PRIOR_A = (0.5, 0.7, 0.8, 0.9, 0.95)
GRID_MINILM_A = (0.1, 0.3, 0.5, 0.7, 0.9)


def _cutoff_ndcg(rows: list[dict], qrels: list, score, part: int | None) -> float:
    """nDCG@10 of the run `rag-rerank eval` would build without the post-pass: the top 10 chunks
    scored above the minimum (3 decimals, ties by input order), then the others in input order."""
    import ir_measures
    from ir_measures import nDCG

    run, keep = [], set()
    for r in rows:
        if part is not None and int(r["qid"]) % 2 != part:
            continue
        keep.add(r["qid"])
        s = np.round(score(r), 3)
        order = sorted(range(len(s)), key=lambda i: (-s[i], i))
        top = [i for i in order if s[i] > MIN][:10]
        chosen = set(top)
        final = top + [i for i in range(len(s)) if i not in chosen]
        run += [ir_measures.ScoredDoc(r["qid"], r["ids"][i], float(len(s) - rank))
                for rank, i in enumerate(final)]
    judged = [q for q in qrels if q.query_id in keep]
    return float(ir_measures.calc_aggregate([nDCG @ 10], judged, run)[nDCG @ 10])


def _lexical_features(path: Path, depth: int = 50) -> list[dict]:
    """Per query: the lexical embedder's gated, calibrated cosine and the lexical signal."""
    backend = LocalBackend("lexical", weights=Weights(semantic=1.0, lexical=0.0))
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        chunks = row["chunks"][:depth]
        sc = backend.scores(row["query"], [c["text"] for c in chunks])
        rows.append({"qid": row["qid"], "ids": [c["id"] for c in chunks], "sem": sc.semantic,
                     "lex": sc.lexical})
    return rows


def _card_ok(w: float, c: float, a: float) -> bool:
    """The card's happy path ranks c3 first and never c5; its adversarial example ranks nothing."""
    from rag_rerank.guard import validate_request
    from rag_rerank.skill import load_skill

    card = load_skill()
    backend = LocalBackend("lexical", weights=Weights(semantic=w, lexical=1.0 - w, prior=a, prior_c=c))
    ranked = {}
    for name in ("happy-path", "adversarial"):
        ex = card.example(name)
        request = validate_request(ex.query, ex.chunks, 5, 1.0)
        ranked[name] = [r["id"] for r in backend.rank(request)["ranked"]]
    happy = ranked["happy-path"]
    return bool(happy) and happy[0] == "c3" and "c5" not in happy and ranked["adversarial"] == []


def _sets(features) -> dict[str, tuple[list[dict], list]]:
    import ir_measures

    return {name: (features(cands), list(ir_measures.read_trec_qrels(str(qrels))))
            for name, (cands, qrels) in {"dl19": quality.build_dl19(),
                                         "scifact": quality.build_scifact(50)}.items()}


def _report(label: str, sets: dict, score) -> None:
    vals = [_cutoff_ndcg(rows, qrels, score, part) for rows, qrels in sets.values() for part in (1, 0, None)]
    print(f"| {label} | {vals[0]:.4f} | {vals[1]:.4f} | {vals[2]:.4f} | {vals[3]:.4f} | {vals[4]:.4f} "
          f"| {vals[5]:.4f} |")


def main_lexical() -> int:
    sets = _sets(_lexical_features)
    results = []
    for w in GRID_PRIOR_W:
        for c in GRID_PRIOR_C:
            for a in GRID_PRIOR_A:
                def score(r, w=w, c=c, a=a):
                    topical = w * r["sem"] + (1 - w) * r["lex"]
                    return fuse_prior(topical, rank_prior(len(topical), c), a, MIN)

                dev = [_cutoff_ndcg(rows, qrels, score, 1) for rows, qrels in sets.values()]
                results.append((float(np.mean(dev)), w, c, a, dev, score))
    results.sort(key=lambda t: -t[0])
    print("| w_sem | c | a | DL19 dev | SciFact dev | dev mean | card examples ok |")
    print("|---|---|---|---|---|---|---|")
    chosen = None
    for mean, w, c, a, dev, score in results[:15]:
        ok = _card_ok(w, c, a)
        print(f"| {w} | {c:g} | {a} | {dev[0]:.4f} | {dev[1]:.4f} | {mean:.4f} | {ok} |")
        if ok and chosen is None:
            chosen = (w, c, a, score)
    assert chosen is not None
    w, c, a, score = chosen
    print(f"\nchosen: w_sem {w}, c {c:g}, a {a} (best dev mean among settings passing the card examples)\n")
    print("| system | DL19 dev | DL19 test | DL19 all | SciFact dev | SciFact test | SciFact all |")
    print("|---|---|---|---|---|---|---|")
    _report("input order (BM25)", sets, lambda r: -np.arange(len(r["ids"]), dtype=float))
    _report("before: w_sem 0.5, no prior", sets, lambda r: 0.5 * r["sem"] + 0.5 * r["lex"])
    _report(f"chosen: w_sem {w}, no prior", sets, lambda r: w * r["sem"] + (1 - w) * r["lex"])
    _report(f"chosen: w_sem {w}, c {c:g}, a {a}", sets, score)
    return 0


def main_minilm_prior() -> int:
    emb = quality.CachedEmbedder(quality.ST_SPEC)
    prof = profile_for(emb.name)

    def features(path: Path) -> list[dict]:
        rows = _features(path, emb)
        ws, wl = prof.weights.semantic, prof.weights.lexical
        for r in rows:
            r["topical"] = (ws * prof.calibration.apply(r["cos"]) + wl * r["lex"]) / (ws + wl)
        return rows

    sets = _sets(features)
    emb.save()
    results = []
    for c in GRID_PRIOR_C:
        for a in GRID_MINILM_A:
            def score(r, c=c, a=a):
                return fuse_prior(r["topical"], rank_prior(len(r["topical"]), c), a, MIN)

            dev = [_cutoff_ndcg(rows, qrels, score, 1) for rows, qrels in sets.values()]
            results.append((float(np.mean(dev)), c, a, score))
    results.sort(key=lambda t: -t[0])
    mean, c, a, score = results[0]
    print(f"MiniLM + prior, best on dev: c {c:g}, a {a} (dev mean {mean:.4f})\n")
    print("| system | DL19 dev | DL19 test | DL19 all | SciFact dev | SciFact test | SciFact all |")
    print("|---|---|---|---|---|---|---|")
    _report("input order (BM25)", sets, lambda r: -np.arange(len(r["ids"]), dtype=float))
    _report("MiniLM profile, no prior", sets, lambda r: r["topical"])
    _report(f"MiniLM profile + prior c {c:g}, a {a}", sets, score)
    return 0


def main() -> int:
    if "--lexical" in sys.argv[1:]:
        return main_lexical()
    if "--minilm-prior" in sys.argv[1:]:
        return main_minilm_prior()
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
