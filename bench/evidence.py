"""Evidence for long chunks (`rag_rerank.evidence`): is the answer still in what the model is shown?

SciFact training pairs (`../shared/data/scifact/rationales-train.json`): a claim, the abstract that
supports or contradicts it, and the abstract's rationale sentences. A pair is *served* at a budget
when the text shown for the abstract holds one complete rationale (every one of its sentences
whole inside one kept passage). Compared at budgets of 64 / 96 / 128 / 192 tokens (characters / 4,
as the issue measured them):

* `head`: the abstract cut to its first N tokens (what peers' `max_tokens_per_doc` does);
* `naive`: the abstract's sentences sharing the most idf-weighted claim words, best first while they fit;
* `ours`: `evidence.select` with the offline default (lexical embedder: the static table) and,
  with `--minilm`, the sentence-transformers profile (all-MiniLM-L6-v2, offline).

The pairs are split by claim id: even ids tune (`--tune` sweeps the few weights on them), odd ids
are only reported. Also prints the selection time for chunks of about 1,000 tokens.

    python bench/evidence.py              # figures on both halves, offline default
    python bench/evidence.py --minilm     # and the MiniLM profile
    python bench/evidence.py --tune       # the weight sweep on the tuning half
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rag_rerank import evidence  # noqa: E402
from rag_rerank.evidence import Scorer, Weights, chars_per_token, select  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
BUDGETS = (64, 96, 128, 192)
_WORD = re.compile(r"\w+")
_STOP = frozenset("a an the of in on for to and or is are was were be by with as at from that this it its".split())


def load_pairs() -> list[dict[str, Any]]:
    pairs = json.loads((DATA / "scifact" / "rationales-train.json").read_text(encoding="utf-8"))
    for p in pairs:
        parts = [s.strip() for s in p["sentences"]]
        spans, pos = [], 0
        for s in parts:
            spans.append((pos, pos + len(s)))
            pos += len(s) + 1
        p["text"] = " ".join(parts)
        p["spans"] = spans
    return pairs


def served(pair: dict[str, Any], kept: list[tuple[int, int]]) -> bool:
    """One complete rationale inside the kept passages (each sentence inside one passage)."""
    def inside(span: tuple[int, int]) -> bool:
        return any(a <= span[0] and span[1] <= b for a, b in kept)
    return any(all(inside(pair["spans"][i]) for i in r) for r in pair["rationales"])


def head(pair: dict[str, Any], budget: int) -> list[tuple[int, int]]:
    return [(0, min(len(pair["text"]), budget * 4))]


def naive(pair: dict[str, Any], budget: int) -> list[tuple[int, int]]:
    """The abstract's sentences by the idf-weighted count of claim words they hold (idf over the
    abstract's sentences), best first while they fit with a mark between them."""
    sents = [pair["text"][a:b] for a, b in pair["spans"]]
    bags = [{w for w in _WORD.findall(s.lower()) if w not in _STOP} for s in sents]
    df = Counter(w for bag in bags for w in bag)
    q = {w for w in _WORD.findall(pair["claim"].lower()) if w not in _STOP}
    n = len(sents)
    score = [sum(math.log(1 + n / df[w]) for w in q & bag) for bag in bags]
    mark = chars_per_token(evidence.ELISION)
    kept: list[int] = []
    used = 0
    for i in sorted(range(n), key=lambda i: -score[i]):
        cost = chars_per_token(sents[i]) + (mark if kept else 0)
        if used + cost <= budget:
            kept.append(i)
            used += cost
    return [pair["spans"][i] for i in sorted(kept)]


def ours(scorer: Scorer) -> Any:
    def pick(pair: dict[str, Any], budget: int) -> list[tuple[int, int]]:
        ev = select(pair["claim"], pair["text"], budget, count=chars_per_token, scorer=scorer)
        assert ev.tokens_after <= budget, (ev.tokens_after, budget)
        return [(p.start, p.end) for p in ev.passages]
    return pick


def rates(method: Any, pairs: list[dict[str, Any]]) -> dict[int, float]:
    return {b: sum(served(p, method(p, b)) for p in pairs) / len(pairs) for b in BUDGETS}


def halves(pairs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tune = [p for p in pairs if int(p["claim_id"]) % 2 == 0]
    held = [p for p in pairs if int(p["claim_id"]) % 2 == 1]
    return tune, held


def table(rows: dict[str, tuple[dict[int, float], dict[int, float], dict[int, float]]]) -> None:
    print("complete rationale kept (share of pairs), tokens = characters / 4")
    print(f"{'method':<28}{'part':<9}" + "".join(f"{b:>8}" for b in BUDGETS))
    for name, parts in rows.items():
        for label, r in zip(("tune", "held-out", "all"), parts, strict=True):
            print(f"{name:<28}{label:<9}" + "".join(f"{r[b]:>8.3f}" for b in BUDGETS))


def timing(scorer: Scorer, pairs: list[dict[str, Any]], repeat: int = 3) -> float:
    """Median milliseconds to choose 128 tokens of a chunk of about 1,000 tokens (abstracts joined),
    first sight of each text (the memo cleared)."""
    texts = []
    pool = [p["text"] for p in pairs]
    for i in range(0, len(pool) - 4, 4):
        t = " ".join(pool[i:i + 4])
        while chars_per_token(t) < 1000:
            t += " " + pool[(i + 7) % len(pool)]
        texts.append((pairs[i]["claim"], t[: 4000]))
    times = []
    select(texts[0][0], texts[0][1], 128, scorer=scorer)  # load the table once
    for _ in range(repeat):
        evidence.clear_cache()
        for claim, t in texts:
            t0 = time.perf_counter()
            select(claim, t, 128, scorer=scorer)
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def tune(pairs: list[dict[str, Any]]) -> None:
    grid = {"lexical": (0.5, 1.0), "tokens": (0.0, 1.0, 2.0), "semantic": (0.0, 0.5, 1.0),
            "neighbours": (0.0, 0.25, 0.5)}
    results = []
    for values in itertools.product(*grid.values()):
        w = Weights(**dict(zip(grid, values, strict=True)))
        evidence.clear_cache()
        r = rates(ours(Scorer(None, w)), pairs)
        results.append((r[64] + r[128] + (r[96] + r[192]) / 2, w, r))
    results.sort(key=lambda x: -x[0])
    for total, w, r in results[:12]:
        print(f"{total:.3f} {w} " + " ".join(f"{b}:{r[b]:.3f}" for b in BUDGETS))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minilm", action="store_true", help="also the sentence-transformers (MiniLM) profile")
    ap.add_argument("--tune", action="store_true", help="sweep the weights on the tuning half")
    args = ap.parse_args()
    pairs = load_pairs()
    tune_part, held = halves(pairs)
    if args.tune:
        tune(tune_part)
        return 0
    methods: dict[str, Any] = {"head": head, "naive idf pick": naive, "ours (offline default)": ours(Scorer())}
    if args.minilm:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from rag_rerank.embed import get_embedder

        methods["ours (MiniLM profile)"] = ours(Scorer(get_embedder("sentence-transformers")))
    rows = {name: (rates(m, tune_part), rates(m, held), rates(m, pairs)) for name, m in methods.items()}
    print(f"{len(pairs)} pairs: {len(tune_part)} tuning (even claim ids), {len(held)} held out (odd)")
    table(rows)
    ms = timing(Scorer(), pairs)
    print(f"selection time, ~1,000-token chunk to 128 tokens, offline default: median {ms:.2f} ms "
          f"(load average {os.getloadavg()[0]:.1f}: other jobs share the machine)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
