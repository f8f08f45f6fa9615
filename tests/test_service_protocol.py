"""Cohere's request and response shapes as data (`rag_rerank.service.protocol`), without a server."""

from __future__ import annotations

import pytest

from rag_rerank import Reranker
from rag_rerank.errors import Attempt, BackendError, InputError, Violation
from rag_rerank.service.config import Limits
from rag_rerank.service.protocol import (
    call_options,
    client_violation,
    input_failure,
    library_limits,
    parse_request,
    response,
    truncation,
    upstream_failure,
)

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

LIMITS = Limits()


@settings(derandomize=True, max_examples=60, deadline=None)
@given(
    query=st.text(min_size=1, max_size=40),
    docs=st.lists(st.text(min_size=1, max_size=60), min_size=1, max_size=8),
)
@example(query="é\u0301 ½ \U0001f600", docs=["\x00", "\u200b", "a"])
def test_any_unicode_request_is_a_result_or_a_400_naming_the_field(query: str, docs: list[str]) -> None:
    """Valid input never raises; invalid input is an InputError naming the field or document."""
    try:
        call = parse_request({"model": "local", "query": query, "documents": docs, "top_n": 3}, 2, LIMITS)
    except InputError as exc:
        assert all(v.path == "query" or v.path.startswith("documents[") for v in exc.violations)
        return
    with Reranker(window_size=50) as reranker:
        try:
            result = reranker.rerank(call.query, call.chunks(), **call_options(call)[0])
        except InputError as exc:  # the library's own input guard (e.g. a document of only spaces)
            assert exc.violations
            return
    body = response(call, result)
    indexes = [r["index"] for r in body["results"]] + [d["index"] for d in body["rag_rerank"]["dropped"]]
    assert sorted(indexes) == list(range(len(docs)))  # every document accounted for, once
    assert all(0.0 <= r["relevance_score"] <= 1.0 for r in body["results"])


def test_v1_rank_fields_and_unknown_fields() -> None:
    body = {
        "query": "q",
        "documents": [{"title": "T", "body": "B"}],
        "rank_fields": ["title", "body"],
        "return_documents": True,
        "max_chunks_per_doc": 3,
        "some_future_field": 1,
    }
    call = parse_request(body, 1, LIMITS)
    assert (
        call.texts == ("title: T\nbody: B",)
        and call.model is None
        and call.ignored == ("max_chunks_per_doc",)
    )
    with pytest.raises(InputError) as info:
        parse_request({"query": "q", "documents": [{"title": "T"}], "rank_fields": ["body"]}, 1, LIMITS)
    assert info.value.violations[0].path == "documents[0]"
    with pytest.raises(InputError) as info:  # v2 takes strings only and needs a model
        parse_request({"query": "q", "documents": [{"text": "T"}]}, 2, LIMITS)
    assert [v.path for v in info.value.violations] == ["model", "documents[0]"]


def test_truncation_maps_to_the_library_option_only_when_it_has_one() -> None:
    assert truncation(None) == ({}, None)
    options, note = truncation(128, accepted=("top_k", "max_tokens_per_chunk"))
    assert options == {"max_tokens_per_chunk": 128} and note is not None and note["applied"] is True
    options, note = truncation(128, accepted=("top_k",))
    assert (
        options == {}
        and note is not None
        and note["applied"] is False
        and "max_tokens_per_chunk" in note["reason"]
    )


def test_upstream_failure_statuses() -> None:
    busy = BackendError("x", [Attempt(1, "transient", "HTTP 429", status=429, retry_after=2.4)])
    failure = upstream_failure(busy)
    assert failure.status == 503 and failure.headers == {"Retry-After": "2"}
    silent = upstream_failure(BackendError("x", [Attempt(1, "transient", "timed out")]))
    assert silent.status == 504 and silent.headers is None
    wrong = upstream_failure(BackendError("x", [Attempt(1, "invalid_output", "not JSON")]))
    assert wrong.status == 502 and "invalid output" in wrong.message


def test_top_n_over_the_documents_means_all_of_them() -> None:
    call = parse_request({"model": "m", "query": "q", "documents": ["a", "b"], "top_n": 1000}, 2, LIMITS)
    assert call_options(call)[0] == {"top_k": 2}


def test_the_library_rules_are_read_in_the_client_words() -> None:
    """The query, top_n and max_tokens_per_doc are judged by the library's own rules (its input
    guard and options table) while the request is read, named as the client named them."""
    with pytest.raises(InputError) as info:
        parse_request({"query": " ", "documents": ["a"], "top_n": 0, "max_tokens_per_doc": 8}, 2, LIMITS)
    assert [v.path for v in info.value.violations] == ["model", "query", "top_n", "max_tokens_per_doc"]
    assert "at least 16" in info.value.violations[-1].message
    assert all("top_k" not in v.message and "per_chunk" not in v.message for v in info.value.violations)
    call = parse_request({"model": "m", "query": "q", "documents": ["a"], "top_n": 2.0}, 2, LIMITS)
    assert call.top_n == 2 and isinstance(call.top_n, int)


def test_library_errors_name_documents_and_the_service_limits() -> None:
    limits = library_limits(Limits(max_documents=7, max_query_chars=99), {"min_score": 0.5})
    assert (limits.max_total_chunks, limits.max_query_chars, limits.min_score) == (7, 99, 0.5)
    with Reranker(window_size=50) as reranker, pytest.raises(InputError) as info:
        reranker.rerank("q", [{"id": str(i), "text": "t"} for i in range(8)], limits=limits)
    failure = input_failure(info.value)
    assert failure.status == 400
    message = "8 documents is over the limit of 7 (max_documents), even in windows; pre-filter the set"
    assert failure.details == {"errors": [{"path": "documents", "message": message}]}
    said = "chunks[3].text: top_k is over max_total_chunks"
    moved = client_violation(Violation(path="chunks[3].text", message=said))
    assert (moved.path, moved.message) == ("documents[3]", "documents[3]: top_n is over max_documents")
