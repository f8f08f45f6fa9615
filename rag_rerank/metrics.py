"""What `rag-rerank eval` measures on two orders of the same candidates: nDCG@10, Recall@k and MRR
(trec_eval definitions, through ir-measures), novelty-aware nDCG, pairwise distance, and subtopic
recall / alpha-nDCG with subtopic judgments (the `evaluate` module docstring says why each)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .embed.lexical import LexicalEmbedder
from .errors import MissingDependencyError
from .judgments import ir_measures_module


def reranked_order(input_ids: Sequence[str], ranked_ids: Sequence[str]) -> list[str]:
    """The ranked ids, then every other input id in input order (see the module docstring)."""
    chosen = set(ranked_ids)
    return [*ranked_ids, *(i for i in input_ids if i not in chosen)]


def scored_run(orders: Mapping[str, Sequence[str]]) -> list[Any]:
    """Strictly decreasing scores by position, so no metric library re-sorts ties by docid."""
    irm = ir_measures_module()
    return [irm.ScoredDoc(qid, doc, float(len(ids) - pos)) for qid, ids in orders.items()
            for pos, doc in enumerate(ids)]


def measure(qrels: Sequence[Any], orders: Mapping[str, Sequence[str]], *, k: int = 10, rel_level: int = 1,
            subtopics: Sequence[Any] | None = None) -> dict[str, float]:
    """nDCG@10, Recall@k and MRR@10 (trec_eval definitions via ir-measures), averaged over the
    queries that have judgments; plus subtopic recall and alpha-nDCG at k with subtopics."""
    irm = ir_measures_module()
    from ir_measures import RR, R, StRecall, alpha_nDCG, nDCG

    judged = {q.query_id for q in qrels}
    orders = {q: ids for q, ids in orders.items() if q in judged}
    # Judgments of queries that were not run would count as zeros in ir-measures' mean.
    qrels = [q for q in qrels if q.query_id in orders]
    if subtopics:
        subtopics = [q for q in subtopics if q.query_id in orders]
    recall = R(rel=rel_level) @ k if rel_level != 1 else R @ k
    rr = RR(rel=rel_level) @ 10 if rel_level != 1 else RR @ 10
    agg = irm.calc_aggregate([nDCG @ 10, recall, rr], qrels, scored_run(orders))
    out = {"nDCG@10": agg[nDCG @ 10], f"Recall@{k}": agg[recall], "MRR@10": agg[rr]}
    if subtopics:
        sub_judged = {q.query_id for q in subtopics}
        sub_orders = {q: ids for q, ids in orders.items() if q in sub_judged}
        try:
            agg = irm.calc_aggregate([StRecall @ k, alpha_nDCG @ k], subtopics, scored_run(sub_orders))
        except ValueError as exc:  # the pyndeval provider is missing
            raise MissingDependencyError("subtopic metrics (alpha-nDCG)", "eval", "pyndeval") from exc
        out[f"St-recall@{k}"] = agg[StRecall @ k]
        out[f"alpha-nDCG@{k}"] = agg[alpha_nDCG @ k]
    return {name: float(v) for name, v in out.items()}


def _judged_gains(qrels: Sequence[Any]) -> dict[str, dict[str, float]]:
    gains: dict[str, dict[str, float]] = {}
    for j in qrels:
        gains.setdefault(str(j.query_id), {})[str(j.doc_id)] = float(max(j.relevance, 0))
    return gains


def novelty_ndcg(qrels: Sequence[Any], orders: Mapping[str, Sequence[str]],
                 texts: Mapping[str, Mapping[str, str]], k: int = 10, lexical: Any = None) -> float:
    """Mean novelty-aware nDCG@k over the judged queries of `orders` (see the module docstring).

    `texts[qid][docid]` is each candidate's text; the near-duplicate test is the lexical
    embedder's cosine at or above its threshold, the same for every system compared. `lexical`
    may be a memoised `LexicalEmbedder`, so that scoring several orders of the same candidates
    embeds each text once."""

    lexical = lexical or LexicalEmbedder()
    judged = _judged_gains(qrels)
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    values = []
    for qid, order in orders.items():
        gains = judged.get(str(qid))
        if not gains:
            continue
        text_of = texts.get(qid, {})
        pool = list(dict.fromkeys([*order[:k], *sorted(text_of, key=lambda d: -gains.get(d, 0.0))]))
        with_text = [d for d in pool if d in text_of]
        vecs = lexical.embed([text_of[d] for d in with_text]) if with_text else np.zeros((0, 1))
        row = {d: i for i, d in enumerate(with_text)}
        sim = vecs @ vecs.T

        seen: list[int] = []
        got = []
        for d in order[:k]:  # a copy of a document listed above gains nothing
            r = row.get(d)
            copy = r is not None and any(sim[r, s] >= lexical.duplicate_threshold for s in seen)
            got.append(0.0 if copy else gains.get(d, 0.0))
            if r is not None:
                seen.append(r)
        dcg = float(np.dot(got, discount[: len(got)]))
        # Ideal: the judged candidates best first, each copy of a picked one skipped, then the
        # judged documents that are not among the candidates (no text: distinct by assumption).
        picked: list[str] = []
        for d in sorted((d for d in with_text if gains.get(d, 0.0) > 0), key=lambda d: -gains[d]):
            if all(sim[row[d], row[p]] < lexical.duplicate_threshold for p in picked):
                picked.append(d)
        ideal = sorted([gains[d] for d in picked]
                       + [g for d, g in gains.items() if g > 0 and d not in text_of], reverse=True)[:k]
        idcg = float(np.dot(ideal, discount[: len(ideal)]))
        values.append(dcg / idcg if idcg > 0 else 0.0)
    return float(np.mean(values)) if values else float("nan")


def pairwise_distance(embedder: Any, texts_by_query: Sequence[Sequence[str]]) -> float:
    """Mean over queries of the average pairwise cosine distance of each query's selected texts."""
    values = []
    for texts in texts_by_query:
        if len(texts) < 2:
            continue
        vecs = np.asarray(embedder.embed(list(texts)), dtype=np.float64)
        sim = vecs @ vecs.T
        n = len(texts)
        values.append(float((n * n - sim.sum() - (n - np.trace(sim))) / (n * (n - 1))))
    return float(np.mean(values)) if values else 0.0


__all__ = ["measure", "novelty_ndcg", "pairwise_distance", "reranked_order", "scored_run"]
