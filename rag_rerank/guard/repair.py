"""Formatting-only salvage of an LLM answer, applied only when asked.

It may remove a `<think>` block, one Markdown code fence, or prose around a single JSON object,
and it reports each thing it removed. It never touches the object itself: ids and scores are
judged by the output guard exactly as the model wrote them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*[ \t]*\n(.*?)\n?```$", re.DOTALL)


@dataclass(frozen=True)
class Repaired:
    text: str
    repairs: tuple[str, ...]


def _objects(text: str) -> list[tuple[int, int]]:
    """Spans of the top-level JSON objects that decode in `text`."""
    decoder = json.JSONDecoder()
    spans: list[tuple[int, int]] = []
    pos = 0
    while True:
        start = text.find("{", pos)
        if start < 0:
            return spans
        try:
            obj, end = decoder.raw_decode(text, start)
        except ValueError:
            pos = start + 1
            continue
        if isinstance(obj, dict):
            spans.append((start, end))
        pos = end


def repair_output(raw: str) -> Repaired:
    """The bare JSON text and the list of repairs made (empty when nothing needed doing)."""
    repairs: list[str] = []
    text = raw.strip()
    if _THINK.search(text):
        text = _THINK.sub("", text).strip()
        repairs.append("removed a <think> block")
    fence = _FENCE.match(text)
    if fence:
        text = fence.group(1).strip()
        repairs.append("removed a Markdown code fence")
    spans = _objects(text)
    if len(spans) != 1:
        return Repaired(text=text, repairs=tuple(repairs))  # nothing safe to do; the guard will say why
    start, end = spans[0]
    before, after = text[:start].strip(), text[end:].strip()
    if before.endswith("```") or after.startswith("```") or "```" in before:
        repairs.append("removed a Markdown code fence inside prose")
    if before:
        repairs.append(f"removed {len(before)} characters of text before the JSON object")
    if after:
        repairs.append(f"removed {len(after)} characters of text after the JSON object")
    return Repaired(text=text[start:end], repairs=tuple(repairs))
