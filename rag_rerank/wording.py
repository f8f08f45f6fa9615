"""How messages word a count and a near miss, so every message says "1 chunk" / "2 chunks" (never
"1 chunks" or "chunk(s)") and every misspelt name gets the same "did you mean" hint."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`1 chunk`, `2 chunks`, `0 chunks`; `plural` for a noun that does not just take an s (`queries`)."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def either(names: Iterable[str]) -> str:
    """Names as a message lists alternatives: "a", "a or b", "a, b or c"."""
    items = list(names)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def near_miss(key: str, known: Iterable[str]) -> str:
    """`; did you mean 'top_k'?` for a name close to a known one (`topk`), else nothing: the one
    wording of every misspelt-key message (batch lines, backend_options)."""
    near = closest(key, known)
    return f"; did you mean {near!r}?" if near else ""


def closest(key: str, candidates: Iterable[str], *, ignore_case: bool = False) -> str | None:
    """The candidate most like `key` when one is close enough to be a misspelling of it, else
    None; with `ignore_case`, `Text` and `TEXT` count as `text`. The measure of every near miss."""
    names = sorted(candidates)
    if not ignore_case:
        near = difflib.get_close_matches(key, names, n=1)
        return near[0] if near else None
    folded: dict[str, str] = {}
    for name in names:
        folded.setdefault(name.lower(), name)
    near = difflib.get_close_matches(key.lower(), list(folded), n=1)
    return folded[near[0]] if near else None


def scorer_words(step: str | None) -> str:
    """A fallback step as a note says who ranked instead: "the local backend", "the first-stage
    order" (the `"input"` step, `fallback_chain.py`)."""
    if step == "input":
        return "the first-stage order"
    return f"the {step or 'local'} backend"
