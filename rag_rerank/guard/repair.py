"""Formatting-only salvage of an LLM answer, applied only when asked.

It may remove a leading `<think>` block, one Markdown code fence, or prose around a single JSON
object, and it reports each thing it removed. It never touches the object itself: ids and scores
are judged by the output guard exactly as the model wrote them. When the text is ambiguous (two
objects, or an object nested inside a broken one, as in a truncated answer) it does nothing and
lets the guard explain.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..wording import counted

_THINK = re.compile(r"\A<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"\A```[A-Za-z0-9_-]*[ \t]*\r?\n(.*?)\n?```\Z", re.DOTALL)  # \r\n: Windows files


@dataclass(frozen=True)
class Repaired:
    """The text to judge and what was removed to get it (empty when nothing was)."""

    text: str
    repairs: tuple[str, ...]


def _objects(text: str) -> tuple[list[tuple[int, int]], list[int]]:
    """Spans of the top-level JSON objects that decode in `text`, and where '{' failed to decode."""
    decoder = json.JSONDecoder()
    spans: list[tuple[int, int]] = []
    failed: list[int] = []
    pos = 0
    while True:
        start = text.find("{", pos)
        if start < 0:
            return spans, failed
        try:
            obj, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            failed.append(start)
            pos = start + 1
            continue
        if isinstance(obj, dict):
            spans.append((start, end))
        pos = end


def repair_output(raw: str) -> Repaired:
    """The bare JSON text and the list of repairs made (empty when nothing needed doing)."""
    if not isinstance(raw, str):
        return Repaired(text=raw, repairs=())
    repairs: list[str] = []
    text = raw.strip()
    think = _THINK.match(text)
    if think:
        text = text[think.end():].strip()
        repairs.append("removed a <think> block")
    fence = _FENCE.match(text)
    if fence:
        text = fence.group(1).strip()
        repairs.append("removed a Markdown code fence")
    spans, failed = _objects(text)
    if len(spans) != 1:
        return Repaired(text=text, repairs=tuple(repairs))  # nothing safe to do; the guard will say why
    start, end = spans[0]
    if any(f < start for f in failed):
        # A '{' before the object did not decode: the object is probably a fragment of a broken
        # (truncated) answer, and cutting it out would change the content.
        return Repaired(text=text, repairs=tuple(repairs))
    before, after = text[:start].strip(), text[end:].strip()
    if before.endswith("[") or after.startswith("]"):
        # The object is an element of a larger JSON value (e.g. wrapped in an array): unwrapping
        # it would change the structure the model returned, which is content, not formatting.
        return Repaired(text=text, repairs=tuple(repairs))
    if "```" in before or "```" in after:
        repairs.append("removed a Markdown code fence inside prose")
    if before:
        repairs.append(f"removed {counted(len(before), 'character')} of text before the JSON object")
    if after:
        repairs.append(f"removed {counted(len(after), 'character')} of text after the JSON object")
    return Repaired(text=text[start:end], repairs=tuple(repairs))
