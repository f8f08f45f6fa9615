"""One normalisation of text as it is quoted and compared, for every stage that quotes or compares.

Why one module. A reason quotes its chunk; the output guard checks that the quotation is in the
chunk. When the scorer that writes the quotation and the guard that checks it normalise text in
two ways (one turned a control character into a space, the other deleted it; one composed
accents, the other compared the raw decomposed text), the pipeline refuses its own answers on
ordinary web text: mojibake such as ``"â\\x80\\x9cfairlyâ\\x80\\x9d"`` or NFD accents from PDFs and
macOS. So the rule lives here, once:

* `readable(text)`: text as a reader sees it and a reason quotes it: control characters (C0/C1,
  a NUL, a terminal escape, the bytes of a mis-decoded quotation mark) become a space; invisible
  format characters (zero-width space and joiners, soft hyphen, BOM, direction marks) go; NFKC
  (ligatures, full-width forms and composed accents as one spelling); whitespace runs one space.
* `comparable(text)`: `readable` then case-folded: what a quotation and its source are compared as.
* `quote(text, lo, hi)`: the readable form of ``text[lo:hi]`` widened to whole words (a combining
  accent after the last letter belongs to it), checked to be inside ``comparable(text)``: what the
  scored backends put between quotation marks, so the guard accepts it by construction.

This module is a leaf: it imports nothing from the package.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache


def _is_format(ch: str) -> bool:
    return unicodedata.category(ch) == "Cf"


class _Cleaner(dict[int, str | None]):
    """For `str.translate`: a control character (Cc) to a space, a format character (Cf) to
    nothing, everything else kept; filled on first sight of each code point (C speed after)."""

    def __missing__(self, cp: int) -> str | None:
        ch = chr(cp)
        category = unicodedata.category(ch)
        out: str | None = " " if category == "Cc" else None if category == "Cf" else ch
        self[cp] = out
        return out


_CLEAN = _Cleaner()


def readable(text: str) -> str:
    """`text` as a reader sees it and a reason quotes it (see the module docstring): controls a
    space, format characters gone, NFKC, whitespace runs one space, no space at either end."""
    if text.isascii() and text.isprintable():
        return " ".join(text.split())
    cleaned = text.translate(_CLEAN)
    return " ".join(unicodedata.normalize("NFKC", cleaned).split())


def comparable(text: str) -> str:
    """`readable(text)` case-folded (and NFKC again: a case fold can decompose): the one form in
    which a quotation and its source are compared."""
    folded = readable(text).casefold()
    return folded if folded.isascii() else unicodedata.normalize("NFKC", folded)


@lru_cache(maxsize=1024)
def _comparable_source(text: str) -> str:
    return comparable(text)


def _widen(text: str, lo: int, hi: int) -> tuple[int, int]:
    """Widen `text[lo:hi]` so it neither starts nor ends inside a grapheme: combining marks and
    format characters after `hi` belong to the letter before them, and a slice never starts on one."""
    n = len(text)
    while hi < n and (unicodedata.category(text[hi]).startswith("M") or _is_format(text[hi])):
        hi += 1
    while 0 < lo < n and (unicodedata.category(text[lo]).startswith("M") or _is_format(text[lo])):
        lo -= 1
    return lo, hi


def quote(text: str, lo: int, hi: int) -> str | None:
    """The readable form of ``text[lo:hi]``, widened to whole graphemes, when its comparable form
    lies inside the comparable form of `text` (so a guard comparing with `comparable` accepts it);
    None when no such quotation exists (then the caller cites without quotation marks)."""
    lo, hi = _widen(text, max(0, lo), min(len(text), hi))
    phrase = readable(text[lo:hi])
    if not phrase:
        return None
    if comparable(phrase) in _comparable_source(text):
        return phrase
    # A normalisation that composes across the slice's edge (Hangul jamo, a mark before a
    # starter): one more character on each side usually settles it.
    for extra in range(1, 4):
        wider = readable(text[max(0, lo - extra):min(len(text), hi + extra)])
        if wider and comparable(wider) in _comparable_source(text):
            return wider
    return None


__all__ = ["comparable", "quote", "readable"]
