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
    python bench/evidence.py --fit        # the fitted weights (pairwise logistic, tuning half)
    python bench/evidence.py --dl19 [--weights later=1.0]   # TREC DL19 padded (position check)
"""

from __future__ import annotations

import argparse
import dataclasses
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
from rag_rerank.text import STOPWORDS as _STOP  # noqa: E402
from tests.support.shared_data import data_dir  # noqa: E402

DATA = data_dir()
BUDGETS = (64, 96, 128, 192)
_WORD = re.compile(r"\w+")



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
    score = [sum(math.log(1 + n / df[w]) for w in sorted(q & bag)) for bag in bags]
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


def timing(scorer: Scorer, pairs: list[dict[str, Any]], repeat: int = 3) -> tuple[float, float]:
    """Median CPU milliseconds to choose 128 tokens of a chunk of about 1,000 tokens (abstracts joined),
    first sight of each text (the memo cleared): over all repeats, and over the first alone (the
    tokeniser's and BM25's caches hold what ran before in this process: after the quality tables,
    the abstracts' words and sentences)."""
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
            t0 = time.process_time()  # CPU time: the machine is shared, wall time swings with its load
            select(claim, t, 128, scorer=scorer)
            times.append((time.process_time() - t0) * 1000)
    return statistics.median(times), statistics.median(times[:len(texts)])


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


def fit(pairs: list[dict[str, Any]], names: tuple[str, ...], c: float = 0.01) -> dict[str, float]:
    """The weights of `names` by a pairwise logistic model on `pairs` (the tuning half): one example
    per (rationale sentence, other sentence) pair of the same abstract, their signals' difference,
    no intercept, each signal scaled by the spread of its differences; returned scaled so that
    `tokens` weighs 2 (only the order of a chunk's units matters). Units are our splitter's
    sentences; a unit is a rationale when it overlaps a rationale sentence."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    scorer = Scorer()
    rows, labels = [], []
    for p in pairs:
        spans = evidence.sentences(p["text"])
        found = scorer.signals(p["claim"], [p["text"][a:b] for a, b in spans], sections=True)
        x = np.column_stack([found[n] for n in names])
        wanted = {i for r in p["rationales"] for i in r}
        y = [any(a < p["spans"][i][1] and p["spans"][i][0] < b for i in wanted) for a, b in spans]
        for i in (k for k, v in enumerate(y) if v):
            for j in (k for k, v in enumerate(y) if not v):
                rows += [x[i] - x[j], x[j] - x[i]]
                labels += [1, 0]
    data = np.array(rows)
    spread = data.std(axis=0) + 1e-9
    model = LogisticRegression(C=c, fit_intercept=False, max_iter=5000).fit(data / spread, labels)
    coef = model.coef_[0] / spread
    weights = dict(zip(names, coef.tolist(), strict=True))
    scale = 2.0 / weights["tokens"]
    return {n: round(v * scale, 2) for n, v in weights.items()}


def precision_at_one(pairs: list[dict[str, Any]], scorer: Scorer) -> float:
    """Share of pairs whose best-scored unit (our splitter's sentences) overlaps a rationale sentence."""
    hits = 0
    for p in pairs:
        spans = evidence.sentences(p["text"])
        best = spans[int(scorer(p["claim"], [p["text"][a:b] for a, b in spans]).argmax())]
        wanted = {i for r in p["rationales"] for i in r}
        hits += any(best[0] < p["spans"][i][1] and p["spans"][i][0] < best[1] for i in wanted)
    return hits / len(pairs)


def refit(tune_part: list[dict[str, Any]]) -> None:
    """Fit the shipped signals (and, for comparison, with the position prior) on the tuning half."""
    for names in (("lexical", "tokens"), ("lexical", "tokens", "asks", "unknown", "digits"),
                  ("lexical", "tokens", "asks", "unknown", "digits", "later"),
                  ("lexical", "tokens", "asks", "unknown", "digits", "findings", "setup")):
        weights = fit(tune_part, names)
        zeroed = {n: 0.0 for n in ("asks", "unknown", "digits", "later", "findings", "setup", "neighbours")
                  if n not in weights}
        p1 = precision_at_one(tune_part, Scorer(None, Weights(**weights, **zeroed)))
        print(f"tuning half, precision at one {p1:.3f} (no neighbour share): {weights}")


# --------------------------------------------------------------------------- TREC DL19, padded


def dl19_ndcg(order: list[str], grades: dict[str, int], k: int = 10) -> float:
    """nDCG@k, trec_eval style: linear gain, log2 discount, the ideal from every judged passage."""
    dcg = sum(grades.get(d, 0) / math.log2(r + 2) for r, d in enumerate(order[:k]))
    ideal = sorted(grades.values(), reverse=True)[:k]
    best = sum(g / math.log2(r + 2) for r, g in enumerate(ideal))
    return dcg / best if best > 0 else 0.0


def padded(queries: list[dict[str, Any]], depth: int, tokens: int,
           seed: int = 19) -> list[list[dict[str, str]]]:
    """Each query's top-`depth` candidates, each placed at a random position inside unrelated text
    (passages of other queries' candidates) until the chunk holds about `tokens` tokens."""
    import random

    rng = random.Random(seed)
    out = []
    for qi, q in enumerate(queries):
        others = [h["content"] for qj, o in enumerate(queries) if qj != qi for h in o["hits"]]
        chunks = []
        for h in q["hits"][:depth]:
            filler: list[str] = []
            while chars_per_token(" ".join(filler)) + chars_per_token(h["content"]) < tokens:
                filler.append(rng.choice(others))
            filler.insert(rng.randrange(len(filler) + 1), h["content"])
            chunks.append({"id": h["docid"], "text": " ".join(filler)})
        out.append(chunks)
    return out


def head_cut(chunks: list[dict[str, str]], budget: int) -> list[dict[str, str]]:
    """Each chunk cut to its first `budget` tokens (the package's estimate), at a word boundary."""
    from rag_rerank.cost import estimate_tokens

    out = []
    for c in chunks:
        words = c["text"].split(" ")
        lo, hi = 0, len(words)
        while lo < hi:  # the most words whose estimate fits
            mid = (lo + hi + 1) // 2
            if estimate_tokens(" ".join(words[:mid])) <= budget:
                lo = mid
            else:
                hi = mid - 1
        out.append({"id": c["id"], "text": " ".join(words[:lo])})
    return out


def bench_dl19(depth: int = 50, tokens: int = 1000, budgets: tuple[int, ...] = (128, 256)) -> None:
    from rag_rerank import rerank
    from rag_rerank.cost import estimate_tokens

    queries = json.loads((DATA / "trec-dl19" / "bm25-top100.json").read_text(encoding="utf-8"))
    grades: dict[str, dict[str, int]] = {}
    for line in (DATA / "trec-dl19" / "qrels.txt").read_text(encoding="utf-8").splitlines():
        qid, _, doc, grade = line.split()
        grades.setdefault(qid, {})[doc] = int(grade)
    long = padded(queries, depth, tokens)

    def ndcg_of(chunks_of: Any, **options: Any) -> tuple[float, float]:
        scores, shown = [], []
        for q, chunks in zip(queries, chunks_of, strict=True):
            result = rerank(q["query"], chunks, top_k=10, lambda_=1.0, **options)
            order = [r.id for r in result.ranked]
            rest = sorted((c["id"] for c in chunks if c["id"] not in order),
                          key=lambda i: -(result.scores[i] if isinstance(result.scores[i], float) else -1.0))
            scores.append(dl19_ndcg(order + rest, grades[str(q["hits"][0]["qid"])]))
            ev = result.meta.evidence or {}
            shown.append(sum(ev[c["id"]]["tokens_after"] if c["id"] in ev else estimate_tokens(c["text"])
                             for c in chunks))
        return statistics.mean(scores), statistics.mean(shown)

    unpadded = [[{"id": h["docid"], "text": h["content"]} for h in q["hits"][:depth]] for q in queries]
    full = statistics.mean(sum(estimate_tokens(c["text"]) for c in chunks) for chunks in long)
    print(f"TREC DL19, {len(queries)} queries, BM25 top {depth}, local backend (offline default), nDCG@10;"
          f" padded chunks ~{tokens} tokens ({full:,.0f} chunk tokens per query)")
    base, base_tokens = ndcg_of(unpadded)
    print(f"  unpadded passages                          {base:.4f}  chunk tokens shown {base_tokens:,.0f}")
    fit, fit_tokens = ndcg_of(long)
    print(f"  padded, evidence to fit max_context_tokens {fit:.4f}  chunk tokens shown {fit_tokens:,.0f}")
    for b in budgets:
        ours_, ours_tokens = ndcg_of(long, max_tokens_per_chunk=b)
        head_, head_tokens = ndcg_of([head_cut(chunks, b) for chunks in long])
        print(f"  padded, evidence, {b} tokens per chunk      {ours_:.4f}  chunk tokens shown "
              f"{ours_tokens:,.0f}"
              f" (saved {full - ours_tokens:,.0f})")
        print(f"  padded, head truncation, {b} tokens         {head_:.4f}  chunk tokens shown "
              f"{head_tokens:,.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minilm", action="store_true", help="also the sentence-transformers (MiniLM) profile")
    ap.add_argument("--tune", action="store_true", help="sweep the weights on the tuning half")
    ap.add_argument("--fit", action="store_true", help="fit the weights on the tuning half (scikit-learn)")
    ap.add_argument("--dl19", action="store_true", help="only TREC DL19 with padded candidates")
    ap.add_argument("--weights", default="", metavar="NAME=VALUE,...",
                    help="change the default weights for this run (e.g. later=1.0: the position prior), "
                         "also for the engine's selection in --dl19")
    args = ap.parse_args()
    if args.weights:
        changes = {k.strip(): float(v) for k, v in (item.split("=") for item in args.weights.split(","))}
        evidence.DEFAULT_WEIGHTS = dataclasses.replace(evidence.DEFAULT_WEIGHTS, **changes)
        print(f"weights: {evidence.DEFAULT_WEIGHTS}")
    if args.dl19:
        bench_dl19()
        return 0
    pairs = load_pairs()
    tune_part, held = halves(pairs)
    if args.tune:
        tune(tune_part)
        return 0
    if args.fit:
        refit(tune_part)
        return 0
    methods: dict[str, Any] = {"head": head, "naive idf pick": naive,
                               "ours (offline default)": ours(Scorer())}
    if args.minilm:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from rag_rerank.embed import get_embedder

        methods["ours (MiniLM profile)"] = ours(Scorer(get_embedder("sentence-transformers")))
    rows = {name: (rates(m, tune_part), rates(m, held), rates(m, pairs)) for name, m in methods.items()}
    print(f"{len(pairs)} pairs: {len(tune_part)} tuning (even claim ids), {len(held)} held out (odd)")
    table(rows)
    ms, cold = timing(Scorer(), pairs)
    print(f"selection time, ~1,000-token chunk to 128 tokens, offline default: median {ms:.2f} ms CPU "
          f"(first round alone: {cold:.2f} ms; load average {os.getloadavg()[0]:.1f}: "
          "other jobs share the machine)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
