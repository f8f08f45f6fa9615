"""The `"input"` fallback step: the first-stage order as a guard-valid scored answer."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from rag_rerank.backends.input_order import InputOrderBackend
from rag_rerank.guard import validate_request
from rag_rerank.guard.output import judge

CHUNKS = [{"id": f"c{i}", "text": f"passage {i} about IVF partitions and HNSW graphs"} for i in range(8)]


def test_scores_fall_with_first_stage_rank_and_pass_the_guard() -> None:
    request = validate_request("IVF or HNSW?", CHUNKS, 5, 0.7)
    completion = InputOrderBackend().complete("", request, max_tokens=100)
    obj, violations = judge(completion.text, request.chunks, 5, query=request.query)
    assert obj is not None and not violations
    assert [r["id"] for r in obj["ranked"]] == ["c0", "c1", "c2", "c3", "c4"]
    scores = [r["score"] for r in obj["ranked"]]
    assert scores == sorted(scores, reverse=True) and scores[0] == 1.0 and scores[-1] > 0.2
    assert all("first-stage rank" in r["reason"] for r in obj["ranked"])
    assert [d["id"] for d in obj["dropped"]] == ["c5", "c6", "c7"]


def test_a_window_sees_its_chunks_true_ranks() -> None:
    request = validate_request("IVF or HNSW?", CHUNKS[:3], 3, 0.7)
    from dataclasses import replace

    later = replace(request, ranks=(40, 41, 42))
    obj = json.loads(InputOrderBackend().complete("", later, max_tokens=100).text)
    assert [r["id"] for r in obj["ranked"]] == ["c0", "c1", "c2"]
    assert "first-stage rank 41" in obj["ranked"][0]["reason"]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=12))
def test_any_unicode_gives_a_guard_valid_answer(texts: list[str]) -> None:
    chunks = [{"id": f"x{i}", "text": t} for i, t in enumerate(texts)]
    request = validate_request("q", chunks, 3, 0.7)
    obj, violations = judge(InputOrderBackend().complete("", request, max_tokens=100).text, request.chunks, 3,
                            query="q")
    assert obj is not None and not violations
    ids = [r["id"] for r in obj["ranked"]] + [d["id"] for d in obj["dropped"]]
    assert sorted(ids) == sorted(c["id"] for c in chunks)
