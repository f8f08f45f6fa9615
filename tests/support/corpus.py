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
