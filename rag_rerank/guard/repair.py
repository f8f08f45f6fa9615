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


# More '{' that fail to decode than this and the text is not a formatting slip around one object.
# The bound matters: json builds each decode error's line and column by scanning the text up to
# the failure, so an answer of n stray braces cost O(n**2) (50,000 braces: 0.4 s; 500,000: 40 s).
MAX_FAILED_BRACES = 32
# A plain decoder holds no state between calls: one for every answer (making one costs 3 us).
_DECODER = json.JSONDecoder()


def _objects(text: str) -> list[tuple[int, int]] | None:
    """Spans of the top-level JSON objects that decode in `text`; None when the text is not worth
    repairing: a '{' before the first object did not decode (the object is probably a fragment of
    a broken, truncated answer, and cutting it out would change the content), or more than
    `MAX_FAILED_BRACES` did not. Stops at a second object (two objects are never repaired)."""
    decoder = _DECODER
    spans: list[tuple[int, int]] = []
    failures = 0
    pos = 0
    while len(spans) < 2:
        start = text.find("{", pos)
        if start < 0:
            break
        try:
            obj, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            failures += 1
            if not spans or failures > MAX_FAILED_BRACES:
                return None
            pos = start + 1
            continue
        if isinstance(obj, dict):
            spans.append((start, end))
        pos = end
    return spans


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
    spans = _objects(text)
    if spans is None or len(spans) != 1:
        return Repaired(text=text, repairs=tuple(repairs))  # nothing safe to do; the guard will say why
    start, end = spans[0]
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
