"""`meta.py`: what a result's meta says about how the rerank went."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rag_rerank import Reranker
from rag_rerank.engine import plan
from rag_rerank.meta import embedder_name


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.booleans(), min_size=1, max_size=8), st.text(min_size=1, max_size=12))
@example([True], "x").via("one chunk, with a vector")
@example([False, True, True], "é").via("the first without one")
@example([True, True, False], "q").via("the last without one")
def test_the_caller_vectors_are_named_only_when_every_chunk_has_one(carries: list[bool], text: str) -> None:
    """'caller' exactly when every chunk carries an embedding, else the plan's embedder's name,
    wherever the chunk without one stands in the list."""
    chunks = [{"id": f"c{i}", "text": f"{text} {i}", **({"embedding": [1.0, float(i)]} if has else {})}
              for i, has in enumerate(carries)]
    with Reranker("local") as session:
        planned = plan(session._setup, "query", chunks, session.options(top_k=1))
    expected = "caller" if all(carries) else str(getattr(planned.embedder, "name", planned.embedder))
    assert embedder_name(planned) == expected
    assert (expected == "caller") == all(carries)
