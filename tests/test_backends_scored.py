"""The shared answer builder of the score-only backends (cross-encoder, rerank API)."""

from __future__ import annotations

import json
import re

from rag_rerank.backends.scored import answer
from rag_rerank.fusion import with_embedded_meta
from rag_rerank.guard import validate_request


def test_reasons_quote_the_chunk_text_not_the_embedded_title() -> None:
    # Regression: the scorer is shown "IVF\nIVF is preferred ..." (embed_meta_fields=["title"]) and
    # the reason quoted that, title included: text that is not in the chunk.
    chunks = [{"id": "c", "text": "IVF is preferred when memory is tight.", "meta": {"title": "IVF"}},
              {"id": "d", "text": "HNSW gives the best recall, at a cost.", "meta": {"title": "HNSW"}}]
    view = with_embedded_meta(validate_request("IVF or HNSW?", chunks, 2, 0.7), ["title"])
    assert view.chunks[0].text.startswith("IVF\n")  # the scorer does see the title
    obj = answer(view, [0.9, 0.8], "test-score")
    assert [r["id"] for r in obj["ranked"]] == ["c", "d"]
    for r, chunk in zip(obj["ranked"], chunks, strict=True):
        quoted = json.loads(re.search(r'"(?:[^"\\]|\\.)*"', r["reason"]).group(0)).strip("…")
        assert quoted and quoted in chunk["text"], r["reason"]
