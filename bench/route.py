"""Routing quality: choose the threshold on the `tune` split, report every split.

    python bench/route.py                                  # lexical embedder (default)
    python bench/route.py --embedder sentence-transformers
    python bench/route.py --splits tune,dev2,dev3          # only these splits
    python bench/route.py --errors                         # misrouted (not of blind, heldout2, heldout3)

The evaluation set is golden/router/utterances.jsonl (one JSON object per line: utterance,
n_chunks, expect = skill name or null, category, split). The threshold is the one that maximises
recall - FPR (Youden's J) on `tune`; among equally good thresholds the middle of the widest
interval is taken, so the choice does not sit on the edge of a tune example. Nothing but `tune`
chooses a threshold.

The splits, in the order they were written (each one before the router saw it):
  tune      64  written first; the router was designed and the threshold chosen on it
  heldout   64  written with tune; its misrouted items were looked at by the first router's author
  fresh     71  written after that look; later used for development (errors looked at)
  blind     71  written last by the first author; nobody has looked at its errors
  heldout2  80  written by the second author BEFORE any change to the card or the router; only
                its aggregate figures were ever printed (never with --errors): the headline split
  dev2      70  written after the first heldout2 measurement; development set (errors looked at)
  dev3      60  written after the second; development set, used to compare scoring rules
  heldout3  80  written by the third author BEFORE the classifier router and its card additions;
                measured only at the end, aggregate figures only: the headline split
`--write` prints the THRESHOLDS line to paste into router.py. `--errors` skips blind, heldout2 and
heldout3 (`--errors-blind` would print them and spend them as held-out measurements).
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rag_rerank.paths import golden_dir
from rag_rerank.router import Router

# Splits whose misrouted items are never printed unless asked for: they stay held-out measurements.
UNTOUCHED = ("blind", "heldout2", "heldout3")


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def metrics(rows: list[dict], router: Router) -> dict:
    tp = fp = fn = tn = 0
    wrong = []
    for r in rows:
        got = router.decide(r["utterance"], r.get("n_chunks")).skill
        want = r["expect"]
        if want is not None:
            if got == want:
                tp += 1
            else:
                fn += 1
                wrong.append(("missed", r, got))
        elif got is None:
            tn += 1
        else:
            fp += 1
            wrong.append(("false route", r, got))
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    fpr = fp / (fp + tn) if fp + tn else 0.0
    return {
        "n": len(rows),
        "positives": tp + fn,
        "negatives": fp + tn,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "precision": precision,
        "recall": recall,
        "fpr": fpr,
        "wrong": wrong,
    }


def choose_threshold(rows: list[dict], router: Router) -> float:
    """Youden's J over every candidate cut between observed scores; ties -> widest interval's middle."""
    # A router decision depends on the threshold only through `pos >= threshold`; collect the
    # best trigger score of each utterance once, with the threshold disabled.
    router.threshold = float("-inf")
    scored = []
    for r in rows:
        d = router.decide(r["utterance"], r.get("n_chunks"))
        routed = d.skill is not None
        scored.append((d.score if routed else None, r["expect"] is not None, d.skill == r["expect"]))
    cuts = sorted({s for s, _, _ in scored if s is not None})
    # Below every score (route all), between neighbours, above every score (route none).
    low = min(cuts[0] - 1e-6, 0.0) if cuts else 0.0
    candidates = [low] + [(a + b) / 2 for a, b in pairwise(cuts)] + [cuts[-1] + 1e-6 if cuts else 1.0]
    best: list[tuple[float, float]] = []
    for t in candidates:
        tp = sum(1 for s, pos, ok in scored if pos and ok and s is not None and s >= t)
        fp = sum(1 for s, pos, _ in scored if not pos and s is not None and s >= t)
        npos = sum(1 for _, pos, _ in scored if pos) or 1
        nneg = sum(1 for _, pos, _ in scored if not pos) or 1
        best.append((tp / npos - fp / nneg, t))
    top = max(j for j, _ in best)
    good = [t for j, t in best if j == top]
    # The widest run of consecutive optimal cut points, and its middle.
    idx = [candidates.index(t) for t in good]
    runs: list[list[int]] = [[idx[0]]]
    for i in idx[1:]:
        if i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    run = max(runs, key=len)
    lo, hi = candidates[run[0]], candidates[run[-1]]
    return round((lo + hi) / 2, 4)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--embedder", default="lexical")
    ap.add_argument("--data", default=str(golden_dir() / "router" / "utterances.jsonl"))
    ap.add_argument(
        "--errors", action="store_true", help="list misrouted utterances (not of blind / heldout2 / heldout3)"
    )
    ap.add_argument(
        "--errors-blind", action="store_true", help="also list the untouched splits' misrouted utterances"
    )
    ap.add_argument("--write", action="store_true", help="print the THRESHOLDS entry for router.py")
    ap.add_argument("--splits", help="comma-separated splits to report (default: all)")
    args = ap.parse_args()
    rows = load(Path(args.data))
    tune = [r for r in rows if r["split"] == "tune"]
    splits = args.splits.split(",") if args.splits else list(dict.fromkeys(r["split"] for r in rows))
    router = Router(embedder=args.embedder)
    threshold = choose_threshold(tune, router)
    router.threshold = threshold
    print(f"embedder={args.embedder}  threshold chosen on tune ({len(tune)} utterances): {threshold}")
    for name in splits:
        m = metrics([r for r in rows if r["split"] == name], router)
        print(
            f"{name:8s} n={m['n']:3d} (pos {m['positives']}, neg {m['negatives']})  "
            f"precision={m['precision']:.3f}  recall={m['recall']:.3f}  FPR={m['fpr']:.3f}  "
            f"tp={m['tp']} fp={m['fp']} fn={m['fn']} tn={m['tn']}"
        )
        if args.errors and (name not in UNTOUCHED or args.errors_blind):
            for kind, r, got in m["wrong"]:
                print(
                    f"    {kind}: [{r['category']}] {r['utterance']!r} n_chunks={r.get('n_chunks')} -> {got}"
                )
    if args.write:
        print(f'THRESHOLDS["{args.embedder.split(":")[0]}"] = {threshold}')
    return 0


if __name__ == "__main__":
    sys.exit(main())
