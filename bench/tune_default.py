"""Fit and measure the calibrated default scorer (issue 11): judged small RAG sets, DL19, SciFact.

It computes the local backend's six signals per chunk (static MiniLM-distilled cosine, BM25
coverage over the candidate set, static token-level match, cohesion outlier, context outlier, input
rank), fits a logistic model on the development parts so a score is the estimated probability that
a person judges the chunk relevant, and prints the development figures and whether the card's two
examples hold (happy path: c3 first with three ranked; adversarial: nothing ranked).

Development: four judged small-RAG sets by four authors, `golden/judged/dev.jsonl`, `dev2.jsonl`,
`dev3.jsonl` and `heldout.jsonl` (the first two held-out sets, each spent by its measurement, so
now development data), plus the odd-numbered qids of TREC DL19 and of SciFact (BM25 top-50).
Held-out: `golden/judged/reserve.jsonl` (a fifth author who saw neither the scorer nor the other
sets) and the even-numbered qids, printed only with --heldout, which tuning never uses.
`reserve2.jsonl` (a sixth author) is read by nothing here: the held-out set of the next refit.
Labels: judged grade / 2; DL19 grade >= 2 is 1, grade 1 is 0.5; SciFact relevant is 1.

    python bench/tune_default.py            # fit on dev, print dev figures and the card check
    python bench/tune_default.py --cv       # leave one judged dev set out: how signals were chosen
    python bench/tune_default.py --shipped  # the shipped local backend (lexical) on the same dev data

"Pure relevance order": the chunks above the minimum score (0.2) by score, then the rest in input
order, no post-pass: what `eval` measures at lambda 1 without duplicate removal, up to MMR ties.
Needs the eval data (RAG_RERANK_DATA, default ../shared/data) and `bm25s` (eval extra). A query
whose scoring raises stops the run with a `FAILED: ...` line on stdout and exit code 1 (a fit or a
figure without it would not be the one documented).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from failures import TALLY, run_bench  # noqa: E402

from rag_rerank.backends.local import (  # noqa: E402
    FEATURES,
    LocalBackend,
    Signals,
    compute_signals,
    lexical_scores,
)
from rag_rerank.embed.static import StaticEmbedder, embed_and_match  # noqa: E402
from rag_rerank.guard.limits import load_limits  # noqa: E402
from rag_rerank.paths import golden_dir  # noqa: E402

MIN_SCORE = load_limits().min_score


WITHOUT: set[str] = set()  # signals left out (--without), to measure what each one is worth


def features(sig: Signals, mask_position: bool = False) -> np.ndarray:
    """The fusion's feature matrix; `mask_position` for the judged sets, whose order is shuffled."""
    x = sig.matrix()
    for name in WITHOUT:
        x[:, FEATURES.index(name)] = 0.0
    if mask_position:
        x[:, FEATURES.index("position")] = sig.position.mean() if len(sig.position) else 0.0
    return x


def signals_for(embedder: object, query: str, texts: list[str]) -> Signals:
    """The library's own signals (`backends/local.py`) with `embedder` as the semantic scorer."""
    vecs = np.asarray(embedder.embed([query, *texts]), dtype=np.float64)  # type: ignore[attr-defined]
    lexical = lexical_scores(query, texts)[0]
    _, tokens, context = embed_and_match(query, texts)  # one tokenisation for both static signals
    return compute_signals(vecs[0], vecs[1:], lexical, tokens, texts, context=context)


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
    source: str = ""  # the judged file a judged query comes from
    signals: Signals | None = None


def _qrels(path: Path) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for line in path.read_text(encoding="utf-8").split("\n"):
        parts = line.split()
        if len(parts) == 4:
            out.setdefault(parts[0], {})[parts[2]] = int(parts[3])
    return out


JUDGED_DEV = ("dev", "dev2", "dev3", "heldout")  # one file per author
JUDGED_HELDOUT = "reserve"  # the fifth author's set: reported with --heldout, never tuned on


def load_judged() -> list[Query]:
    out = []
    for name in (*JUDGED_DEV, JUDGED_HELDOUT):
        part = "heldout" if name == JUDGED_HELDOUT else "dev"
        for line in (golden_dir() / "judged" / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            grades = np.array([c["grade"] for c in row["chunks"]], dtype=float)
            out.append(Query("judged", row["query_id"], part, [c["text"] for c in row["chunks"]], grades,
                             grades / 2.0, np.sort(grades)[::-1],
                             np.array([c["off_topic"] for c in row["chunks"]]), row["query"], name))
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
        TALLY.count()


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


def negative_sets(queries: Sequence[Query], per_set: int = 6, seed: int = 7,
                  rounds: int = 4) -> list[tuple[str, list[str]]]:
    """Cross-domain negatives: each development query with chunks drawn from other queries' lists
    (the card's adversarial case: a retriever that found nothing on the subject). Label 0."""
    rng = random.Random(seed)
    out = []
    # Several draws per query: one draw's luck moved the calibration (and the off-topic rate) visibly.
    for q in [q for _ in range(rounds) for q in queries]:
        # Other queries of the same author: each author's queries span distinct domains.
        others = [o for o in queries if o.qid != q.qid and o.source == q.source]
        out.append((q.query, [rng.choice(o.texts) for o in rng.sample(others, per_set)]))
    return out


def fit_joint(queries: Sequence[Query], negatives: Sequence[Signals], position: float,
              negative_weight: float, l2: float = 1e-3) -> np.ndarray:
    """[intercept, *text weights, position]: one objective, fitted on development data.

    * Listwise (softmax within each query) over every collection, so its very different base rate
      (answers ~40% of a judged list, ~2% of a SciFact list) does not leak into the order: each
      collection weighs the same and teaches which chunk beats which. The position weight is fixed;
      the judged sets' order is shuffled, so they carry no position term.
    * Pointwise (logistic) on the judged chunks and the cross-domain negative sets (weighing
      `negative_weight` of the judged chunks): the intercept and the scale of the weights, so a score
      is the estimated probability that a person judges the chunk relevant, and a chunk's evidence of
      being off the subject counts as such, not only relative to its neighbours.

    An earlier two-stage fit (listwise weights, then a 2-parameter Platt scaling) let the judged
    sets move only the intercept and slope; in leave-one-set-out cross-validation the joint
    objective kept more answers for the same off-topic rate (docs/quality.md)."""
    from scipy.optimize import minimize

    per: dict[str, int] = {}
    useful = [q for q in queries if q.labels.sum() > 0]
    for q in useful:
        per[q.collection] = per.get(q.collection, 0) + 1
    lists = []
    for q in useful:
        assert q.signals is not None
        offset = 0.0 if q.collection == "judged" else position * q.signals.position
        target = q.labels / q.labels.sum()
        lists.append((features(q.signals)[:, :-1], offset, target, 1.0 / per[q.collection]))
    judged = [q for q in queries if q.collection == "judged"]
    n_judged = sum(len(q.texts) for q in judged)
    n_neg = sum(len(sig.semantic) for sig in negatives)
    px = np.concatenate([features(q.signals, mask_position=True) for q in judged]  # type: ignore[arg-type]
                        + [features(sig, mask_position=True) for sig in negatives])
    py = np.concatenate([q.labels for q in judged] + [np.zeros(len(sig.semantic)) for sig in negatives])
    pw = np.concatenate([np.ones(n_judged), np.full(n_neg, negative_weight * n_judged / max(n_neg, 1))])
    pw = pw / pw.sum()
    p_offset = position * px[:, -1]
    px = px[:, :-1]

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        a, w = theta[0], theta[1:]
        total, grad = 0.5 * l2 * float(w @ w), np.concatenate([[0.0], l2 * w])
        for x, offset, target, weight in lists:
            z = x @ w + offset
            z = z - z.max()
            p = np.exp(z) / np.exp(z).sum()
            total -= weight * float(target @ np.log(p + 1e-12))
            grad[1:] += weight * (x.T @ (p - target))
        p = sigmoid(a + px @ w + p_offset)
        total -= float((pw * (py * np.log(p + 1e-12) + (1 - py) * np.log(1 - p + 1e-12))).sum())
        r = pw * (p - py)
        grad[0] += r.sum()
        grad[1:] += px.T @ r
        return total, grad

    theta = minimize(loss, np.zeros(len(FEATURES)), jac=True, method="L-BFGS-B").x
    return np.append(theta, position)


def scores_of(q: Query, beta: np.ndarray) -> np.ndarray:
    """beta = [intercept, slope, *weights]: sigmoid(intercept + slope * weights . signals)."""
    assert q.signals is not None
    return sigmoid(beta[0] + beta[1] * (features(q.signals) @ beta[2:]))


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
                lines.append(f"{label:10s} judged  {part:8s} " + judged_figures(qs, lambda q: score(q, beta)))
                if part == "heldout":
                    n = long_list_numbers(qs, lambda q: score(q, beta))
                    lines.append(f"{label:10s} judged  {part:8s} long single-product lists ({n['lists']}): "
                                 f"answers kept {n['kept']}/{n['answers']}, an answer first in "
                                 f"{n['first']} of {n['lists']}, nDCG@3 {n['ndcg3_long']:.3f} "
                                 f"(the {n['short_lists']} short lists: {n['ndcg3_short']:.3f})")
            else:
                ours, base, cosine = trec_numbers(qs, lambda q: score(q, beta))
                # With --shipped the signals hold the shipped scores, not a cosine: no such column then.
                cos = "n/a" if identity else f"{cosine:.4f}"
                lines.append(f"{label:10s} {coll:7s} {part:8s} nDCG@10 {ours:.4f}  input order {base:.4f}  "
                             f"cosine only {cos}  (n={len(qs)})")
    return lines


def trec_numbers(qs: Sequence[Query], score: Callable[[Query], np.ndarray]) -> tuple[float, float, float]:
    """Mean nDCG@10 of the pure relevance order, of the input order, and of the order by the first
    signal (`semantic`: the embedder's cosine, when the signals are the fit's)."""
    ours = np.mean([ndcg(q.gains[relevance_order(score(q), 10)], q.ideal, 10) for q in qs])
    base = np.mean([ndcg(q.gains, q.ideal, 10) for q in qs])
    by_first = [np.argsort(-q.signals.semantic, kind="stable") for q in qs]  # type: ignore[union-attr]
    cosine = np.mean([ndcg(q.gains[order], q.ideal, 10) for q, order in zip(qs, by_first, strict=True)])
    return float(ours), float(base), float(cosine)


SHIPPED_BETA = np.array([0.0, 1.0, 1.0, 0, 0, 0, 0, 0])  # with `attach_shipped`: the score is the signal


def attach_shipped(queries: Sequence[Query], backend: object) -> None:
    """Every signal of each query holds the backend's own scores, so `report(..., identity=True)`
    and `judged_numbers` measure the shipped scorer on the same data as the fit."""
    for q in queries:
        rel = backend.scores(q.query, q.texts)  # type: ignore[attr-defined]
        rel = getattr(rel, "relevance", rel)  # earlier versions returned a Scores record
        TALLY.count()
        q.signals = Signals(*([rel] * len(FEATURES)))


def judged_numbers(qs: Sequence[Query], score: Callable[[Query], np.ndarray]) -> dict[str, float]:
    """Answers kept above the minimum score, off-topic chunks dropped, nDCG@3 against a shuffled
    input order, expected calibration error (what `judged_figures` prints; bench/figures.py reads them)."""
    rng = random.Random(13)
    kept = total = off_dropped = off_total = 0
    n3, n3_in = [], []
    probs, labs = [], []
    for q in qs:
        s = score(q)
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
    return {"kept": kept, "answers": total, "off_dropped": off_dropped, "off_topic": off_total,
            "ndcg3": float(np.mean(n3)), "ndcg3_shuffled": float(np.mean(n3_in)), "ece": ece}


LONG_LIST = 9  # chunks: the held-out set's single-product lists have 9-10 sections, the others 5-7


def long_list_numbers(qs: Sequence[Query], score: Callable[[Query], np.ndarray]) -> dict[str, float]:
    """The long single-product lists (at least LONG_LIST chunks) against the short ones: answers kept
    above the minimum score, lists whose first chunk (pure relevance order) is an answer, nDCG@3."""
    long = [q for q in qs if len(q.texts) >= LONG_LIST]
    short = [q for q in qs if len(q.texts) < LONG_LIST]
    kept = sum(int((np.round(score(q)[q.gains == 2], 3) > MIN_SCORE).sum()) for q in long)
    first = sum(int(q.gains[relevance_order(score(q), 3)[0]] == 2) for q in long)
    def mean_ndcg3(part: Sequence[Query]) -> float:
        return float(np.mean([ndcg(q.gains[relevance_order(score(q), 3)], q.ideal, 3) for q in part]))

    return {"lists": len(long), "short_lists": len(short), "kept": kept,
            "answers": int(sum((q.gains == 2).sum() for q in long)), "first": first,
            "ndcg3_long": mean_ndcg3(long), "ndcg3_short": mean_ndcg3(short)}


def judged_figures(qs: Sequence[Query], score: Callable[[Query], np.ndarray]) -> str:
    """`judged_numbers` on one line."""
    n = judged_numbers(qs, score)
    kept, total, off_dropped, off_total = n["kept"], n["answers"], n["off_dropped"], n["off_topic"]
    return (f"answers kept {kept}/{total} ({kept / total:.1%})  "
            f"off-topic dropped {off_dropped}/{off_total} ({off_dropped / off_total:.1%})  "
            f"nDCG@3 {n['ndcg3']:.4f} (shuffled input {n['ndcg3_shuffled']:.4f})  ECE {n['ece']:.3f}")


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


def fit(queries: Sequence[Query], semantic: object, position: float, negative_weight: float) -> np.ndarray:
    """[intercept, slope, *weights] fitted on `queries` (development data only); the joint fit
    needs no separate slope, so it is 1."""
    judged = [q for q in queries if q.collection == "judged"]
    negatives = [signals_for(semantic, query, texts) for query, texts in negative_sets(judged)]
    theta = fit_joint(queries, negatives, position, negative_weight)
    return np.array([theta[0], 1.0, *theta[1:]])


def cross_validate(dev: Sequence[Query], semantic: object, position: float,
                   negative_weight: float) -> list[str]:
    """Leave one judged development set (one author) out: fit on the rest of the development data,
    report the left-out set. How signals and settings were chosen without the held-out set."""
    lines = []
    for name in JUDGED_DEV:
        beta = fit([q for q in dev if q.source != name], semantic, position, negative_weight)
        left_out = [q for q in dev if q.source == name]
        lines.append(f"cv {name:6s} " + judged_figures(left_out, lambda q, b=beta: scores_of(q, b)))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", choices=["lexical", "sentence-transformers"], default="lexical")
    ap.add_argument("--position", type=float, default=-0.2, help="fixed weight of log(1 + input index)")
    ap.add_argument("--negative-weight", type=float, default=0.5)
    ap.add_argument("--shipped", action="store_true", help="measure the shipped local backend instead")
    ap.add_argument("--cv", action="store_true", help="leave-one-judged-dev-set-out cross-validation")
    ap.add_argument("--without", action="append", default=[], choices=FEATURES[:-1], metavar="SIGNAL",
                    help="fit with this signal left out (repeatable): what it is worth")
    ap.add_argument("--heldout", action="store_true",
                    help="also print the held-out parts (report only; never tune on them)")
    args = ap.parse_args()
    parts = ("dev", "heldout") if args.heldout else ("dev",)
    WITHOUT.update(args.without)
    base = load_judged() + load_trec("dl19") + load_trec("scifact")
    if args.shipped:
        embedder = "lexical" if args.profile == "lexical" else _st_embedder()
        attach_shipped(base, LocalBackend(embedder))
        _save(embedder)
        for line in report(base, SHIPPED_BETA, "shipped", parts, identity=True):
            print(line)
        return
    semantic = StaticEmbedder() if args.profile == "lexical" else _st_embedder()
    attach_signals(base, semantic)
    _save(semantic)
    dev = [q for q in base if q.part == "dev"]
    if args.cv:
        for line in cross_validate(dev, semantic, args.position, args.negative_weight):
            print(line)
    beta = fit(dev, semantic, args.position, args.negative_weight)
    print(f"{args.profile}: intercept={beta[0]:+.4f} slope={beta[1]:+.4f} "
          + " ".join(f"{n}={v:+.4f}" for n, v in zip(FEATURES, beta[2:], strict=True)))
    for line in report(base, beta, args.profile, parts):
        print(line)
    print("card examples: " + card_check(semantic, beta))


def _save(embedder: object) -> None:
    """Keep MiniLM's vectors in bench/out/emb-cache/ for the next run (a no-op for other embedders)."""
    save = getattr(embedder, "save", None)
    if callable(save):
        save()


def _st_embedder() -> object:
    import quality

    return quality.CachedEmbedder(quality.ST_SPEC)


if __name__ == "__main__":
    sys.exit(run_bench(main))
