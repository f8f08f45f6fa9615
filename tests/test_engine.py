"""The engine's promise (`rag_rerank/engine.py`): every option, layout included, is checked before
the first request. The LLM side is the real `openai` SDK against tests/support/fake_llm.py on
127.0.0.1, which counts what it is sent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rag_rerank import InputError, Reranker, arerank, rerank
from tests.support.corpus import graded_chunks
from tests.support.fake_llm import FakeLLM, auto_ranker

QUERY = "What is the capital city of France?"
KEY = "sk-engine-0123456789abcdef"

# An option value that is wrong whatever the request, and the path its violation names.
BAD = [({"layout": "mmrr"}, "layout"),
       ({"layout": "mmr", "window_size": 10, "duplicate_threshold": 2}, "duplicate_threshold"),
       ({"layout": "lost_in_the_middle ", "window_size": 10}, "layout"),
       ({"fallback": "local", "layout": 3}, "layout")]


@pytest.mark.parametrize(("options", "path"), BAD)
def test_a_bad_option_is_refused_before_any_request(options: dict[str, Any], path: str) -> None:
    """`layout="mmrr"` sent one billed request, then raised `InputError` from the post-pass."""
    with FakeLLM(handler=auto_ranker()) as srv:
        common = {"backend": "openai", "model": "fake-gpt", "base_url": srv.openai_url, "api_key": KEY}
        chunks = graded_chunks(25)
        with pytest.raises(InputError) as raised:
            rerank(QUERY, chunks, 5, **common, **options)
        assert path in {v.path for v in raised.value.violations}
        with pytest.raises(InputError):
            asyncio.run(arerank(QUERY, chunks, 5, **common, **options))
        with Reranker(**common) as session, pytest.raises(InputError):
            session.rerank(QUERY, chunks, 5, **options)
        assert srv.requests == []
