"""How messages word a count and a near miss, so every message says "1 chunk" / "2 chunks" (never
"1 chunks" or "chunk(s)") and every misspelt name gets the same "did you mean" hint."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`1 chunk`, `2 chunks`, `0 chunks`; `plural` for a noun that does not just take an s (`queries`)."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def near_miss(key: str, known: Iterable[str]) -> str:
    """`; did you mean 'top_k'?` for a name close to a known one (`topk`), else nothing: the one
    wording of every misspelt-key message (batch lines, backend_options)."""
    near = difflib.get_close_matches(key, sorted(known), n=1)
    return f"; did you mean {near[0]!r}?" if near else ""
