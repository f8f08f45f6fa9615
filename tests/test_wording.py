"""Counted nouns and near misses in messages (`rag_rerank/wording.py`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rag_rerank.wording import counted, near_miss

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("n", "want"), [(0, "0 chunks"), (1, "1 chunk"), (2, "2 chunks")])
def test_counted_agrees_with_the_number(n: int, want: str) -> None:
    assert counted(n, "chunk") == want


def test_counted_takes_an_irregular_plural() -> None:
    assert [counted(n, "query", "queries") for n in (1, 3)] == ["1 query", "3 queries"]


def test_near_miss_names_the_closest_known_name_or_nothing() -> None:
    assert near_miss("temprature", ["timeout", "temperature"]) == "; did you mean 'temperature'?"
    assert near_miss("zzz", ["timeout", "temperature"]) == ""


def test_no_message_counts_with_a_parenthesised_plural() -> None:
    """Regression: "failed after 1 attempt(s)", "1 document(s) cut", "2 window(s) of 20": every
    counted noun in a message goes through `counted` (an `(s)` after a number is the old wording)."""
    pattern = re.compile(r"\}\s+[a-z-]+\(s\)")
    offenders = [f"{path.relative_to(ROOT)}:{no}" for path in sorted((ROOT / "rag_rerank").rglob("*.py"))
                 for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
                 if pattern.search(line)]
    assert offenders == []


def test_closest_can_ignore_case_and_returns_the_name_as_written() -> None:
    from rag_rerank.wording import closest

    assert closest("id", ["ID", "idx"]) == "idx"  # case matters by default: 'ID' shares no letter
    assert closest("id", ["ID", "idx"], ignore_case=True) == "ID"
    assert closest("text", ["txt"]) == "txt" and closest("text", ["title", "source"]) is None
