"""The token estimates (rag_rerank/tokens.py): what a request's answer is expected to cost."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rag_rerank.tokens import ANSWER_OVERHEAD_TOKENS, answer_tokens, estimate_tokens


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.text(max_size=12), max_size=8), st.integers(1, 10))
@example(["a", "a"], 1)
@example([], 3)
def test_answer_tokens_of_an_id_tuple_from_its_memo_is_the_sum_of_its_ids(ids: list[str], top_k: int) -> None:
    """A tuple of ids (a request's `ids`) is summed once and memoised; asked twice (the second
    time from the memo) and as a list (summed id by id), the count is each id's estimate summed."""
    n = len(ids)
    entries = answer_tokens(n, top_k, []) - ANSWER_OVERHEAD_TOKENS
    expected = ANSWER_OVERHEAD_TOKENS + entries + sum(estimate_tokens(i) for i in ids)
    assert answer_tokens(n, top_k, tuple(ids)) == expected
    assert answer_tokens(n, top_k, tuple(ids)) == expected
    assert answer_tokens(n, top_k, list(ids)) == expected
