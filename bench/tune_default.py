"""Development harness for a calibrated default scorer (issue 11): judged small RAG sets, DL19, SciFact.

Work in progress, not what the local backend ships. It computes five candidate signals per chunk
(static MiniLM-distilled cosine, BM25 coverage over the candidate set, static token-level match,
cohesion outlier, input rank), fits a logistic model on the development parts so a score would be
the estimated probability that a person judges the chunk relevant, and prints the development
figures, the shipped local backend's figures on the same data, and whether the card's two examples
still hold (happy path: c3 first with three ranked; adversarial: nothing ranked).

Development: `golden/judged/dev.jsonl` (24 small RAG cases), the odd-numbered qids of TREC DL19
(BM25 top-50) and of SciFact (BM25 top-50). Held-out: `golden/judged/heldout.jsonl` (another
author), the even-numbered qids; printed only with --heldout, which tuning never uses. Labels:
judged grade / 2; DL19 grade >= 2 is 1, grade 1 is 0.5; SciFact relevant is 1.

    python bench/tune_default.py            # fit on dev, print dev figures and the card check
    python bench/tune_default.py --shipped  # the shipped local backend (lexical) on the same dev data

"Pure relevance order": the chunks above the minimum score (0.2) by score, then the rest in input
order, no post-pass: what `eval` measures at lambda 1 without duplicate removal, up to MMR ties.
Needs the eval data (RAG_RERANK_DATA, default ../shared/data) and `bm25s` (eval extra).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from rag_rerank.backends.local import (  # noqa: E402
    FEATURES,
    LocalBackend,
    Signals,
    compute_signals,
    lexical_scores,
)
from rag_rerank.embed.static import StaticEmbedder, token_match  # noqa: E402
from rag_rerank.guard.limits import load_limits  # noqa: E402
from rag_rerank.paths import golden_dir  # noqa: E402

MIN_SCORE = load_limits().min_score


def features(sig: Signals, mask_position: bool = False) -> np.ndarray:
    """The fusion's feature matrix; `mask_position` for the judged sets, whose order is shuffled."""
    x = sig.matrix()
    if mask_position:
        x[:, FEATURES.index("position")] = sig.position.mean() if len(sig.position) else 0.0
    return x


def signals_for(embedder: object, query: str, texts: list[str]) -> Signals:
    """The library's own signals (`backends/local.py`) with `embedder` as the semantic scorer."""
    vecs = np.asarray(embedder.embed([query, *texts]), dtype=np.float64)  # type: ignore[attr-defined]
    lexical = lexical_scores(query, texts)[0]
    return compute_signals(vecs[0], vecs[1:], lexical, token_match(query, texts), texts)


@dataclass
class Query:
    collection: str
    qid: str
    part: str  # "dev" | "heldout"
    texts: list[str]
    gains: np.ndarray  # graded gain of each candidate (0 unjudged)
    labels: np.ndarray  # target probability of "judged relevant"
    ideal: np.ndarray  # all judged gains of the query (for nDCG's ideal), descending
    off_topic: np.ndarray
    query: str
    signals: Signals | None = None


def _qrels(path: Path) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for line in path.read_text(encoding="utf-8").split("\n"):
        parts = line.split()
        if len(parts) == 4:
            out.setdefault(parts[0], {})[parts[2]] = int(parts[3])
    return out


def load_judged() -> list[Query]:
    out = []
    for part in ("dev", "heldout"):
        for line in (golden_dir() / "judged" / f"{part}.jsonl").read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            grades = np.array([c["grade"] for c in row["chunks"]], dtype=float)
            out.append(Query("judged", row["query_id"], part, [c["text"] for c in row["chunks"]], grades,
                             grades / 2.0, np.sort(grades)[::-1],
                             np.array([c["off_topic"] for c in row["chunks"]]), row["query"]))
    return out


def load_trec(name: str, depth: int = 50) -> list[Query]:
    import quality

    cands, qrels_path = quality.build_dl19() if name == "dl19" else quality.build_scifact()
    qrels = _qrels(qrels_path)
    out = []
    for line in cands.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        qid = row["qid"]
        if qid not in qrels:
            continue
        judged = qrels[qid]
        chunks = row["chunks"][:depth]
        gains = np.array([max(judged.get(c["id"], 0), 0) for c in chunks], dtype=float)
        if name == "dl19":
            labels = np.where(gains >= 2, 1.0, np.where(gains == 1, 0.5, 0.0))
        else:
            labels = (gains > 0).astype(float)
        ideal = np.sort(np.array([max(g, 0) for g in judged.values()], dtype=float))[::-1]
        part = "dev" if int(qid) % 2 == 1 else "heldout"
        out.append(Query(name, qid, part, [c["text"] for c in chunks], gains, labels, ideal,
                         np.zeros(len(chunks), dtype=bool), row["query"]))
    return out


def attach_signals(queries: Sequence[Query], embedder: object) -> None:
    for q in queries:
        q.signals = signals_for(embedder, q.query, q.texts)


def ndcg(gains_in_order: np.ndarray, ideal: np.ndarray, k: int) -> float:
    disc = 1.0 / np.log2(np.arange(2, k + 2))
    dcg = float((gains_in_order[:k] * disc[: len(gains_in_order[:k])]).sum())
    idcg = float((ideal[:k] * disc[: len(ideal[:k])]).sum())
    return dcg / idcg if idcg > 0 else 0.0


def relevance_order(scores: np.ndarray, k: int) -> np.ndarray:
    """Above-minimum chunks by score (ties by input order), at most k, then the rest in input order."""
    r = np.round(scores, 3)
    above = [i for i in sorted(range(len(r)), key=lambda i: (-r[i], i)) if r[i] > MIN_SCORE][:k]
    rest = [i for i in range(len(r)) if i not in set(above)]
    return np.array(above + rest, dtype=int)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def fit_logistic(x: np.ndarray, y: np.ndarray, w: np.ndarray, l2: float = 1e-2) -> np.ndarray:
    """Weighted logistic regression with soft labels by Newton's method; returns [bias, coefs...]."""
    xb = np.column_stack([np.ones(len(x)), x])
    beta = np.zeros(xb.shape[1])
    reg = np.full(xb.shape[1], l2)
    reg[0] = 0.0
    for _ in range(50):
        p = sigmoid(xb @ beta)
        grad = xb.T @ (w * (p - y)) + reg * beta
        hess = (xb * (w * p * (1 - p))[:, None]).T @ xb + np.diag(reg)
        step = np.linalg.solve(hess, grad)
        beta -= step
        if np.abs(step).max() < 1e-8:
            break
    return beta


def negative_sets(queries: Sequence[Query], per_set: int = 6, seed: int = 7) -> list[tuple[str, list[str]]]:
    """Cross-domain negatives: each development query with chunks drawn from other queries' lists
    (the card's adversarial case: a retriever that found nothing on the subject). Label 0."""
    rng = random.Random(seed)
    out = []
    for q in queries:
        others = [o for o in queries if o.qid != q.qid]
        out.append((q.query, [rng.choice(o.texts) for o in rng.sample(others, per_set)]))
    return out


def fit_ranking(queries: Sequence[Query], position: float, l2: float = 1e-3) -> np.ndarray:
    """Listwise (softmax within each query) fit of the text weights, the position weight fixed.

    Within a query only differences count, so every collection's base rate drops out: the judged
    sets (answers ~40%), DL19 and SciFact (~2%) all teach the same thing, which chunk beats which.
    Each collection weighs the same; the judged sets' positions are shuffled, so they inform no
    position weight."""
    from scipy.optimize import minimize

    per: dict[str, int] = {}
    useful = [q for q in queries if q.labels.sum() > 0]
    for q in useful:
        per[q.collection] = per.get(q.collection, 0) + 1
    data = []
    for q in useful:
        assert q.signals is not None
        x = features(q.signals)
        offset = 0.0 if q.collection == "judged" else position * q.signals.position
        data.append((x[:, :-1], offset, q.labels / q.labels.sum(), 1.0 / per[q.collection]))

    def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
        total, grad = 0.5 * l2 * float(w @ w), l2 * w
        for x, offset, target, weight in data:
            z = x @ w + offset
            z = z - z.max()
            p = np.exp(z) / np.exp(z).sum()
            total -= weight * float(target @ np.log(p + 1e-12))
            grad = grad + weight * (x.T @ (p - target))
        return total, grad

    w = minimize(loss, np.zeros(len(FEATURES) - 1), jac=True, method="L-BFGS-B").x
    return np.append(w, position)


def fit_calibration(judged: Sequence[Query], negatives: Sequence[Signals], weights: np.ndarray,
                    negative_weight: float) -> tuple[float, float]:
    """Platt scaling of the ranking score on the judged development sets plus the negative sets
    (together weighing `negative_weight` of the judged chunks): the probability that a person
    judges a chunk relevant, for candidate lists like a RAG retriever's."""
    xs, ys, ws = [], [], []
    n_judged = sum(len(q.texts) for q in judged)
    n_neg = sum(len(s.semantic) for s in negatives)
    for q in judged:
        assert q.signals is not None
        xs.append(features(q.signals, mask_position=True) @ weights)
        ys.append(q.labels)
        ws.append(np.ones(len(q.texts)))
    for sig in negatives:
        xs.append(features(sig, mask_position=True) @ weights)
        ys.append(np.zeros(len(sig.semantic)))
        ws.append(np.full(len(sig.semantic), negative_weight * n_judged / n_neg))
    beta = fit_logistic(np.concatenate(xs)[:, None], np.concatenate(ys), np.concatenate(ws), 1e-4)
    return float(beta[0]), float(beta[1])


def scores_of(q: Query, beta: np.ndarray) -> np.ndarray:
    """beta = [intercept, slope, *weights]: sigmoid(intercept + slope * ranking score)."""
    assert q.signals is not None
    return sigmoid(beta[0] + beta[1] * (q.signals.matrix() @ beta[2:]))


def report(queries: Sequence[Query], beta: np.ndarray, label: str, parts: Sequence[str],
           identity: bool = False) -> list[str]:
    """Judged-set and TREC figures; `identity` reads the first signal as the score itself."""
    score = (lambda q, _b: q.signals.semantic) if identity else scores_of
    lines = []
    for coll in ("judged", "dl19", "scifact"):
        for part in parts:
            qs = [q for q in queries if q.collection == coll and q.part == part]
            if not qs:
                continue
            if coll == "judged":
                rng = random.Random(13)
                kept = total = off_dropped = off_total = 0
                n3, n3_in = [], []
                probs, labs = [], []
                for q in qs:
                    s = score(q, beta)
                    kept += int((np.round(s[q.gains == 2], 3) > MIN_SCORE).sum())
                    total += int((q.gains == 2).sum())
                    off_dropped += int((np.round(s[q.off_topic], 3) <= MIN_SCORE).sum())
                    off_total += int(q.off_topic.sum())
                    n3.append(ndcg(q.gains[relevance_order(s, 3)], q.ideal, 3))
                    perm = list(range(len(q.texts)))
                    rng.shuffle(perm)
                    n3_in.append(ndcg(q.gains[perm], q.ideal, 3))
                    probs.append(s)
                    labs.append(q.labels)
                ece = calibration_error(np.concatenate(probs), np.concatenate(labs))
                lines.append(f"{label:10s} judged  {part:8s} answers kept {kept}/{total} "
                             f"({kept / total:.1%})  "
                             f"off-topic dropped {off_dropped}/{off_total} ({off_dropped / off_total:.1%})  "
                             f"nDCG@3 {np.mean(n3):.4f} (shuffled input {np.mean(n3_in):.4f})  ECE {ece:.3f}")
            else:
                ours = np.mean([ndcg(q.gains[relevance_order(score(q, beta), 10)], q.ideal, 10)
                                for q in qs])
                base = np.mean([ndcg(q.gains, q.ideal, 10) for q in qs])
                cos = np.mean([ndcg(q.gains[np.argsort(-q.signals.semantic, kind="stable")], q.ideal,
                                    10) for q in qs if q.signals is not None])
                lines.append(f"{label:10s} {coll:7s} {part:8s} nDCG@10 {ours:.4f}  input order {base:.4f}  "
                             f"cosine only {cos:.4f}  (n={len(qs)})")
    return lines


def calibration_error(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error over equal-width probability bins (weighted by bin size)."""
    edges = np.linspace(0, 1, bins + 1)
    idx = np.clip(np.digitize(p, edges) - 1, 0, bins - 1)
    err = 0.0
    for b in range(bins):
        sel = idx == b
        if sel.any():
            err += sel.mean() * abs(p[sel].mean() - y[sel].mean())
    return float(err)


def card_check(embedder: object, beta: np.ndarray) -> str:
    """The card's two examples under the fitted model: what the default would rank."""
    from rag_rerank.guard import parse_chunks
    from rag_rerank.skill import load_skill

    card = load_skill()
    out = []
    for name in ("happy-path", "adversarial"):
        ex = card.example(name)
        chunks = parse_chunks(ex.chunks)
        sig = signals_for(embedder, ex.query, [c.text for c in chunks])
        p = sigmoid(beta[0] + beta[1] * (sig.matrix() @ beta[2:]))
        kept = [(chunks[i].id, round(float(p[i]), 3)) for i in np.argsort(-p, kind="stable")
                if round(float(p[i]), 3) > MIN_SCORE]
        out.append(f"{name}: ranked {kept}")
    return "; ".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", choices=["lexical", "sentence-transformers"], default="lexical")
    ap.add_argument("--position", type=float, default=-0.2, help="fixed weight of log(1 + input index)")
    ap.add_argument("--negative-weight", type=float, default=0.5)
    ap.add_argument("--shipped", action="store_true", help="measure the shipped local backend instead")
    ap.add_argument("--heldout", action="store_true",
                    help="also print the held-out parts (report only; never tune on them)")
    args = ap.parse_args()
    parts = ("dev", "heldout") if args.heldout else ("dev",)
    base = load_judged() + load_trec("dl19") + load_trec("scifact")
    if args.shipped:
        backend = LocalBackend("lexical" if args.profile == "lexical" else _st_embedder())
        for q in base:
            rel = backend.scores(q.query, q.texts)
            rel = getattr(rel, "relevance", rel)  # earlier versions returned a Scores record
            q.signals = Signals(*([rel] * len(FEATURES)))
        for line in report(base, np.array([0.0, 1.0, 1.0, 0, 0, 0, 0]), "shipped", parts, identity=True):
            print(line)
        return
    semantic = StaticEmbedder() if args.profile == "lexical" else _st_embedder()
    attach_signals(base, semantic)
    dev = [q for q in base if q.part == "dev"]
    judged = [q for q in dev if q.collection == "judged"]
    negatives = [signals_for(semantic, query, texts) for query, texts in negative_sets(judged)]
    weights = fit_ranking(dev, args.position)
    intercept, slope = fit_calibration(judged, negatives, weights, args.negative_weight)
    beta = np.array([intercept, slope, *weights])
    print(f"{args.profile}: intercept={intercept:+.4f} slope={slope:+.4f} "
          + " ".join(f"{n}={v:+.4f}" for n, v in zip(FEATURES, weights, strict=True)))
    for line in report(base, beta, args.profile, parts):
        print(line)
    print("card examples: " + card_check(semantic, beta))


def _st_embedder() -> object:
    import quality

    return quality.CachedEmbedder(quality.ST_SPEC)


if __name__ == "__main__":
    main()
