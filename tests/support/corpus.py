"""A small retrieval corpus shared by the framework integration tests.

Six passages about capitals, one off-topic, each with metadata a JSON encoder would choke on (a
datetime, a set) and a marker string that must never reach the reranker's prompt, since only id
and text are meant to go there.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

QUERY = "What is the capital city of France?"

# A metadata value that must not appear in any prompt the reranker sends.
MARKER = "meta-marker-7f3a"

PASSAGES: list[tuple[str, str]] = [
    ("paris", "Paris is the capital city of France and its largest city."),
    ("eiffel", "The Eiffel Tower in Paris was finished in 1889 for a world fair."),
    ("berlin", "Berlin on the Spree has been the seat of the German government since 1999."),
    ("borders", "France borders Spain, Italy, Germany, Belgium and Switzerland."),
    ("louvre", "The capital of France, Paris, hosts the Louvre museum."),
    ("leaves", "Photosynthesis turns sunlight into chemical energy in green leaves."),
]


def metadata(i: int, key: str) -> dict[str, Any]:
    """Per-passage metadata with non-JSON values that must come back as the very same objects."""
    return {
        "source": f"doc-{key}",
        "seen": dt.datetime(2024, 5, 1 + i, 12, 0, tzinfo=dt.timezone.utc),
        "tags": {"geo", key},
        "note": MARKER,
    }


def openai_options(url: str) -> dict[str, Any]:
    """The rerank() options that point the openai backend at the test server."""
    return {"backend": "openai", "model": "fake-gpt", "base_url": url, "api_key": "sk-test-0000"}


def openai_calls_sync_then_async(requests: list[Any], expected: int) -> list[Any]:
    """The test server's openai calls after a component ran once sync, then once async: `expected`
    calls, the first through the sync client, the second awaited on the async one (no thread), and
    no metadata value in any prompt (only id and text go to the model). Returns the calls."""
    calls = [r for r in requests if r.api == "openai"]
    assert len(calls) == expected
    assert calls[0].headers.get("x-stainless-async") == "false"
    assert calls[1].headers.get("x-stainless-async", "").startswith("async")
    assert all(MARKER not in r.prompt and "doc-paris" not in r.prompt for r in calls)
    return calls


def graded_chunks(n: int, tag: str = "") -> list[dict[str, str]]:
    """`n` chunks matching QUERY by 0 to 3 of its words (the test server's `auto_ranker` scores by
    such overlap), so windows, their survivors and the final pass all differ."""
    words = ("capital", "city", "France")
    about = [" and ".join(words[:(i * 7) % 4]) or "rivers" for i in range(n)]
    return [{"id": f"{tag}c{i}", "text": f"Fact {i} {tag} about {about[i]}."} for i in range(n)]
