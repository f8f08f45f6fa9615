"""The shared answer builder of the score-only backends (cross-encoder, rerank API)."""

from __future__ import annotations

import json
import re

from rag_rerank.backends.scored import SCORE_DECIMALS, answer, labelled
from rag_rerank.fusion import with_embedded_meta
from rag_rerank.guard import validate_request


def test_reasons_quote_the_chunk_text_not_the_embedded_title() -> None:
    # Regression: the scorer is shown "IVF\nIVF is preferred ..." (embed_meta_fields=["title"]) and
    # the reason quoted that, title included: text that is not in the chunk.
    chunks = [{"id": "c", "text": "IVF is preferred when memory is tight.", "meta": {"title": "IVF"}},
              {"id": "d", "text": "HNSW gives the best recall, at a cost.", "meta": {"title": "HNSW"}}]
    view = with_embedded_meta(validate_request("IVF or HNSW?", chunks, 2, 0.7), ["title"])
    assert view.chunks[0].text.startswith("IVF\n")  # the scorer does see the title
    obj = answer(view, [0.9, 0.8], labelled("test-score"))
    assert [r["id"] for r in obj["ranked"]] == ["c", "d"]
    for r, chunk in zip(obj["ranked"], chunks, strict=True):
        quoted = json.loads(re.search(r'"(?:[^"\\]|\\.)*"', r["reason"]).group(0)).strip("…")
        assert quoted and quoted in chunk["text"], r["reason"]


def test_order_follows_the_full_precision_score_not_the_written_rounding() -> None:
    # Regression: scores that round alike at three decimals kept the input order instead of the
    # scorer's; the post-pass sees only the written scores, so they carry enough decimals too.
    chunks = [{"id": "first", "text": "IVF partitions vectors into clusters."},
              {"id": "second", "text": "IVF probes a few clusters per query."}]
    request = validate_request("how does IVF search work", chunks, 2, 1.0)
    obj = answer(request, [0.50012, 0.50037], labelled("test-score"), decimals=SCORE_DECIMALS)
    assert [r["id"] for r in obj["ranked"]] == ["second", "first"]
    assert [r["score"] for r in obj["ranked"]] == [0.50037, 0.50012]
    three = answer(request, [0.50012, 0.50037], labelled("test-score"))
    assert [r["id"] for r in three["ranked"]] == ["second", "first"]  # ordered before rounding


def test_the_minimum_score_in_force_is_the_requests_own() -> None:
    # Regression: limits={"min_score": 0.5} made the scorers rank a 0.469 that their own guard then
    # refused; the scorer now drops what the request's minimum does not let through.
    chunks = [{"id": "a", "text": "IVF partitions vectors into clusters."},
              {"id": "b", "text": "IVF probes a few clusters per query."}]
    request = validate_request("how does IVF search work", chunks, 2, 1.0, limits={"min_score": 0.5})
    obj = answer(request, [0.469, 0.7], labelled("test-score"))
    assert [r["id"] for r in obj["ranked"]] == ["b"]
    assert obj["dropped"] == [{"id": "a", "reason": "below_min_score: 0.469"}]
