"""The formatting-only repair step (rag_rerank/guard/repair.py): what it salvages, what it refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rag_rerank.guard import repair_output
from rag_rerank.guard.repair import MAX_FAILED_BRACES

OBJ = json.dumps({"ranked": [{"id": "c3", "score": 0.9, "reason": "IVF {memory} ```fence``` <think>"}]})


@pytest.mark.parametrize(
    ("raw", "repairs"),
    [
        (OBJ, ()),
        ("  \n" + OBJ + "\n", ()),
        ("```json\n" + OBJ + "\n```", ("removed a Markdown code fence",)),
        ("```\n" + OBJ + "```", ("removed a Markdown code fence",)),
        # Regression: a CRLF fence (a Windows file) was logged as "a fence inside prose" plus
        # 7 and 3 characters of removed text.
        ("```json\r\n" + OBJ + "\r\n```\r\n", ("removed a Markdown code fence",)),
        ("<think>plan: c3 first</think>\n" + OBJ, ("removed a <think> block",)),
        (
            "<THINK>x</THINK>```json\n" + OBJ + "\n```",
            ("removed a <think> block", "removed a Markdown code fence"),
        ),
        ("Here it is: " + OBJ, ("removed 11 characters of text before the JSON object",)),
        (OBJ + "\nDone.", ("removed 5 characters of text after the JSON object",)),
        (
            "Sure:\n```json\n" + OBJ + "\n```\nBye",
            (
                "removed a Markdown code fence inside prose",
                "removed 13 characters of text before the JSON object",
                "removed 7 characters of text after the JSON object",
            ),
        ),
    ],
)
def test_formatting_is_salvaged_and_reported(raw: str, repairs: tuple[str, ...]) -> None:
    fixed = repair_output(raw)
    assert fixed.text == OBJ  # the object itself, byte for byte
    assert fixed.repairs == repairs


@pytest.mark.parametrize(
    "raw",
    [
        OBJ + OBJ,  # two objects: which one?
        'first {"a": 1} then ' + OBJ,
        OBJ[:-5],  # truncated
        # truncated, with a whole inner object that must not be cut out
        '{"ranked": [{"id": "c3", "score": 0.9, "reason": "x"}, {"id": "c1"',
        "I cannot help with that.",
        "[" + OBJ + "]",
    ],
)
def test_ambiguous_or_broken_text_is_left_for_the_guard(raw: str) -> None:
    fixed = repair_output(raw)
    assert fixed.repairs == ()
    assert fixed.text == raw.strip()


def test_think_block_inside_a_value_is_content_and_untouched() -> None:
    raw = json.dumps({"ranked": [], "note": "<think>keep</think>"})
    assert repair_output(raw).text == raw and repair_output(raw).repairs == ()


def test_content_is_never_changed() -> None:
    raw = "```json\n" + json.dumps({"ranked": [{"id": "C3", "score": "1.5", "reason": "x"}]}) + "\n```"
    assert json.loads(repair_output(raw).text) == {"ranked": [{"id": "C3", "score": "1.5", "reason": "x"}]}


hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")
prose = st.text(
    alphabet=st.characters(blacklist_characters="{}`[]", blacklist_categories=("Cs",)), max_size=30
)
payload = st.dictionaries(
    st.text(max_size=5), st.text(max_size=10) | st.integers() | st.floats(allow_nan=False), max_size=4
)


@hypothesis.given(before=prose, after=prose, obj=payload, fence=st.booleans())
def test_property_salvage_returns_the_object_verbatim(
    before: str, after: str, obj: dict[str, object], fence: bool
) -> None:
    body = json.dumps(obj)
    inner = f"```json\n{body}\n```" if fence else body
    fixed = repair_output(before + inner + after)
    assert fixed.text == body
    removed = bool(before.strip() or after.strip() or fence)
    assert bool(fixed.repairs) == removed


@pytest.mark.parametrize("raw", [
    '{"ranked": []} ' + "{" * 5000,  # one object, then thousands of stray braces
    "{" * 5000 + ' {"ranked": []}',  # stray braces first
    "```json\n" + "{" * 5000,  # an unclosed fence of braces
])
def test_stray_braces_cost_a_bounded_number_of_decodes(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each failed decode costs O(len(text)) (json computes the error's line and column), so one
    attempt per stray '{' made a crafted answer quadratic: 500,000 braces took about 40 s. The
    repair gives up after MAX_FAILED_BRACES failures; bench/redos.py measures the time."""
    calls = []
    real = json.JSONDecoder.raw_decode

    def counting(self: json.JSONDecoder, s: str, idx: int = 0) -> Any:
        calls.append(idx)
        return real(self, s, idx)

    monkeypatch.setattr(json.JSONDecoder, "raw_decode", counting)
    out = repair_output(raw)
    assert len(calls) <= MAX_FAILED_BRACES + 2
    assert out.repairs in ((), ("removed a Markdown code fence",))  # not repaired into something else
