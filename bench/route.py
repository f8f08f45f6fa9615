"""Routing quality: the threshold from cross-validation on the card's examples, figures on held-out data.

    python bench/route.py                                  # lexical embedder (default)
    python bench/route.py --embedder sentence-transformers
    python bench/route.py --errors                         # misrouted development utterances
    python bench/route.py --write                          # also print the THRESHOLDS entry
    (first line: the router's build time and its time per utterance)

Two data sets, never mixed:
  development  skills/rag-chunk-reranker/routing-examples.jsonl, the labelled requests the router
               learns from (each with the `source` it was written in). The threshold is chosen on
               out-of-fold scores: for each source, a router fitted without it scores its
               utterances; the pooled scores pick the threshold that maximises recall - 2 * FPR
               (a false route costs two misses), the middle of the widest optimal interval.
  held-out     golden/router/heldout.jsonl, written by authors who never saw the router, the
               card's examples or the development set. The shipped router (fitted on all the
               development data) is measured on it once; only aggregates are printed unless
               --errors-heldout is given, which spends it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Iterable
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from failures import run_bench

from rag_rerank.paths import golden_dir
from rag_rerank.router import Router, training_examples
from rag_rerank.skill import SkillCard, load_skill

HELD_OUT = golden_dir() / "router" / "heldout.jsonl"


@dataclasses.dataclass(frozen=True)
class Scored:
    """One utterance, its label, and the router's best score (None when a precondition refused)."""

    split: str
    utterance: str
    n_chunks: int | None
    positive: bool
    category: str
    score: float | None


def load_heldout(path: Path = HELD_OUT) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def score_rows(router: Router, rows: Iterable[dict], split_key: str = "split") -> list[Scored]:
    """Scores with the threshold disabled, so any threshold can be applied afterwards."""
    saved, router.threshold = router.threshold, float("-inf")
    try:
        out = []
        for r in rows:
            d = router.decide(r["utterance"], r.get("n_chunks"))
            out.append(
                Scored(
                    r[split_key],
                    r["utterance"],
                    r.get("n_chunks"),
                    r["expect"] is not None,
                    r.get("category", ""),
                    d.score if d.skill is not None else None,
                )
            )
        return out
    finally:
        router.threshold = saved


def out_of_fold(card: SkillCard, embedder: str) -> list[Scored]:
    """Each development source scored by a router fitted on the card without that source."""
    sources = list(dict.fromkeys(e.source for e in card.routing_examples))
    out: list[Scored] = []
    for source in sources:
        fold = dataclasses.replace(
            card, routing_examples=tuple(e for e in card.routing_examples if e.source != source)
        )
        rows = [
            {
                "split": e.source,
                "utterance": e.utterance,
                "n_chunks": e.n_chunks,
                "expect": card.name if e.route else None,
                "category": e.category,
            }
            for e in card.routing_examples
            if e.source == source
        ]
        out += score_rows(Router([fold], embedder), rows)
    return out


def metrics(scored: list[Scored], threshold: float) -> dict:
    tp = sum(1 for s in scored if s.positive and s.score is not None and s.score >= threshold)
    fp = sum(1 for s in scored if not s.positive and s.score is not None and s.score >= threshold)
    pos = sum(1 for s in scored if s.positive)
    neg = len(scored) - pos
    fn, tn = pos - tp, neg - fp
    return {
        "n": len(scored),
        "positives": pos,
        "negatives": neg,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "precision": tp / (tp + fp) if tp + fp else 1.0,
        "recall": tp / pos if pos else 1.0,
        "fpr": fp / neg if neg else 0.0,
    }


# A false route runs the reranker on a request that is not for it (the agent acts on a wrong tool
# call); a miss only sends the request to the agent's general handler. So a false route is
# weighed as two misses when the threshold is chosen.
FALSE_ROUTE_COST = 2.0


def choose_threshold(scored: list[Scored], fp_cost: float = FALSE_ROUTE_COST) -> float:
    """Maximise recall - fp_cost * FPR over every cut between observed scores; among equally good
    cuts take the middle of the widest run, so the choice does not sit on one utterance's score."""
    cuts = sorted({s.score for s in scored if s.score is not None})
    if not cuts:
        return 0.5
    candidates = [min(cuts[0] - 1e-6, 0.0)] + [(a + b) / 2 for a, b in pairwise(cuts)] + [cuts[-1] + 1e-6]
    js = []
    for t in candidates:
        m = metrics(scored, t)
        js.append(m["recall"] - fp_cost * m["fpr"])
    top = max(js)
    idx = [i for i, j in enumerate(js) if j == top]
    runs: list[list[int]] = [[idx[0]]]
    for i in idx[1:]:
        if i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    run = max(runs, key=len)
    return round((candidates[run[0]] + candidates[run[-1]]) / 2, 4)


def line(name: str, m: dict) -> str:
    return (
        f"{name:18s} n={m['n']:4d} (pos {m['positives']}, neg {m['negatives']})  "
        f"precision={m['precision']:.3f}  recall={m['recall']:.3f}  FPR={m['fpr']:.3f}  "
        f"tp={m['tp']} fp={m['fp']} fn={m['fn']} tn={m['tn']}"
    )


def print_errors(scored: list[Scored], threshold: float) -> None:
    for s in scored:
        routed = s.score is not None and s.score >= threshold
        if routed != s.positive:
            kind = "missed" if s.positive else "false route"
            shown = "refused" if s.score is None else f"{s.score:.2f}"
            print(f"    {kind}: {s.split} [{s.category}] {s.utterance!r} n_chunks={s.n_chunks} score={shown}")


def timing(card: SkillCard, embedder: str) -> str:
    """What docs/agents.md quotes for speed: building the router (the classifier's fit, and with a
    semantic embedder the example vectors, from the on-disk cache when it holds them) and one
    `decide` per development utterance."""
    t0 = time.perf_counter()
    router = Router([card], embedder)
    built = time.perf_counter() - t0
    pos, neg = training_examples(card)
    utterances = [ex.utterance for ex in card.routing_examples]
    t1 = time.perf_counter()
    for text in utterances:
        router.decide(text)
    per = (time.perf_counter() - t1) / len(utterances) * 1000
    return (f"router ({embedder}): built in {built:.2f} s on {len(pos) + len(neg)} training examples; "
            f"{per:.2f} ms per utterance (mean over {len(utterances)} development utterances)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--embedder", default="lexical")
    ap.add_argument("--errors", action="store_true", help="list misrouted development utterances")
    ap.add_argument("--errors-heldout", action="store_true", help="list held-out errors (spends the set)")
    ap.add_argument("--no-heldout", action="store_true", help="development figures only")
    ap.add_argument("--write", action="store_true", help="print the THRESHOLDS entry for router.py")
    args = ap.parse_args()
    card = load_skill()
    print(timing(card, args.embedder))
    t0 = time.perf_counter()
    oof = out_of_fold(card, args.embedder)
    threshold = choose_threshold(oof)
    sources = list(dict.fromkeys(s.split for s in oof))
    print(
        f"embedder={args.embedder}  threshold {threshold} chosen on out-of-fold scores of "
        f"{len(oof)} development utterances ({len(sources)} sources, {time.perf_counter() - t0:.1f} s)"
    )
    print(line("development (CV)", metrics(oof, threshold)))
    for source in sources:
        print("  " + line(source, metrics([s for s in oof if s.split == source], threshold)))
    if args.errors:
        print_errors(oof, threshold)
    if not args.no_heldout:
        router = Router([card], args.embedder, threshold=threshold)
        held = score_rows(router, load_heldout())
        print(line("HELD-OUT", metrics(held, threshold)))
        for split in dict.fromkeys(s.split for s in held):
            print("  " + line(split, metrics([s for s in held if s.split == split], threshold)))
        if args.errors_heldout:
            print_errors(held, threshold)
    if args.write:
        print(f'THRESHOLDS["{args.embedder.split(":")[0]}"] = {threshold}')
    return 0


if __name__ == "__main__":
    sys.exit(run_bench(main))
