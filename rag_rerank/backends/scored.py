"""The card's answer from a list of numeric scores: what the non-LLM scorers (cross-encoder,
rerank API) share.

A cross-encoder or a hosted reranker gives one number per chunk and nothing else. To go through
the same output guard and post-pass as an LLM, that becomes the card's JSON object here: chunks
at or below the minimum score are dropped (`below_min_score`), the best `request.top_k` of the
rest are ranked (the pipeline asks for candidate_k, so MMR has room), every other one is
`not_selected`, and each ranked chunk gets a reason that quotes its own best-matching phrase,
found by the local backend's `best_phrase` so every scorer explains itself the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .. import reasons
from ..guard.limits import load_limits
from ..guard.output import cites_chunk
from ..models import RerankRequest
from .local import _STOPWORDS, best_phrase, lexical_scores


def reason_for(query: str, texts: Sequence[str], index: int, label: str, score: float,
               weight_of: dict[str, float] | None = None) -> str:
    """A one-line reason quoting chunk `index`'s best-matching phrase, naming the scorer and its score."""
    if weight_of is None:
        weight_of = query_term_weights(query, texts)
    phrase, matched = best_phrase(texts[index], weight_of)
    matched = [m for m in matched if m.lower() not in _STOPWORDS] or matched
    quoted = json.dumps(phrase, ensure_ascii=False)
    if matched:
        return f"quotes {quoted}, sharing query terms {', '.join(matched)} ({label} {score:.3f})"
    return f"{label} {score:.3f} for {quoted}"


def query_term_weights(query: str, texts: Sequence[str]) -> dict[str, float]:
    """Per query stem, its weight over this candidate set (BM25 idf; function words count little)."""
    _, terms, term_w, _ = lexical_scores(query, texts)
    return {t: float(x) for t, x in zip(terms, term_w, strict=True) if x > 0}


def answer(request: RerankRequest, scores: Sequence[float | None], label: str,
           unscored_reason: str = "not_selected: not scored") -> dict[str, Any]:
    """The card's output object for `request` from per-chunk `scores` in [0, 1] (input order);
    a None score (a chunk the scorer did not return) is dropped with `unscored_reason`."""
    texts = [c.text for c in request.chunks]
    own = [request.own_text(c) for c in request.chunks]  # reasons quote the chunk, not an embedded title
    weight_of = query_term_weights(request.query, texts)
    min_score = load_limits().min_score
    rounded = [None if s is None else round(float(s), 3) for s in scores]
    order = sorted(range(len(texts)), key=lambda i: (rounded[i] is None, -(rounded[i] or 0.0), i))
    ranked: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    for i in order:
        cid, score = request.chunks[i].id, rounded[i]
        if score is None:
            dropped.append({"id": cid, "reason": unscored_reason})
        elif score <= min_score:
            dropped.append({"id": cid, "reason": reasons.reason(reasons.BELOW_MIN_SCORE,
                                                               reasons.score_detail(score))})
        elif len(ranked) >= request.top_k:
            dropped.append({"id": cid, "reason": reasons.reason(reasons.NOT_SELECTED,
                                                               reasons.score_detail(score))})
        else:
            reason = reason_for(request.query, own, i, label, score, weight_of)
            if cites_chunk(reason, own[i]):
                ranked.append({"id": cid, "score": score, "reason": reason})
            else:
                dropped.append({"id": cid, "reason": "no_citable_phrase: nothing concrete to quote"})
    return {"ranked": ranked, "dropped": dropped}
