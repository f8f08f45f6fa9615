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

It also holds the package's word lists and stemmers (one job each, see below), so the scorer,
the guard, the embedders and the router read words from one place.

This module is a leaf: it imports nothing from the package.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
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
    if text.isascii() and not text.encode("ascii").translate(None, _PRINTABLE_ASCII):
        return _one_space(text)  # printable ASCII: nothing to clean (NFKC keeps ASCII as it is)
    cleaned = latin1_translate(text, _latin1_clean())  # accents, mojibake with C1 controls
    if cleaned is not None:
        return _one_space(unicodedata.normalize("NFKC", cleaned))
    return " ".join(unicodedata.normalize("NFKC", text.translate(_CLEAN)).split())  # a look-up a character


# Printable ASCII, deleted from a text's bytes to show it holds nothing else: one pass in C, where
# `str.isprintable` looks each character's category up.
_PRINTABLE_ASCII = bytes(range(0x20, 0x7F))


def _one_space(text: str) -> str:
    """`" ".join(text.split())` of a text whose only white space character is " " (printable ASCII;
    Latin-1 with its controls made spaces, then NFKC): `text` itself when it holds no two spaces
    together and none at either end, as most text does, without splitting and joining it (a string
    made for every word)."""
    if "  " not in text and text[:1] != " " and text[-1:] != " ":
        return text
    return " ".join(text.split())


Latin1Table = tuple[bytes, bytes]  # (a byte for each of the 256 Latin-1 characters, the bytes deleted)


def latin1_table(rule: Callable[[str], str]) -> Latin1Table:
    """`rule` (one character to at most one) for every Latin-1 character, as `latin1_translate`
    reads it: built once per rule, from the rule itself, so the two cannot drift apart."""
    table, deleted = bytearray(range(256)), bytearray()
    for c in range(256):
        out = rule(chr(c))
        if out:
            table[c] = ord(out)  # more than one character is refused here (a TypeError)
        else:
            deleted.append(c)
    return bytes(table), bytes(deleted)


def latin1_translate(text: str, table: Latin1Table) -> str | None:
    """`text` through `table` (`latin1_table`) when every character of it is Latin-1, else None
    (the caller applies its rule the slow way). Latin-1 is most text (ASCII, accents, web mojibake
    such as "\u00e2\u0080\u0099"), and one bytes translation is a pass in C, where `str.translate`
    or a regex looks every character up on its own."""
    try:
        raw = text.encode("latin-1")
    except UnicodeEncodeError:
        return None
    return raw.translate(*table).decode("latin-1")


def is_latin1(text: str) -> bool:
    """Whether every character of `text` is below U+0100 (the fast paths above, and the ones that
    only ask: the text is stored one byte a character, so the encoding is a copy; a wider one stops
    at its first character outside)."""
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


@lru_cache(maxsize=1)
def _latin1_clean() -> Latin1Table:
    """`_CLEAN` for Latin-1 text: each character to itself, a space or nothing."""
    return latin1_table(lambda ch: ch.translate(_CLEAN))


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


# --------------------------------------------------------------------------- words and stems
#
# Each list and stemmer below has one job. Where fitted weights depend on one (the local backend's
# scorer, fitted by bench/tune_default.py; the router's classifier, fitted on the skill card's
# phrases), it is kept exactly as it was fitted; the others share one list.

STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being
below between both but by can could did do does doing down during each either few for from further
had has have having he her here hers herself him himself his how i if in into is it its itself just
me more most my myself no nor not now of off on once one only or other our ours out over own per
same she should so some such than that the their theirs them then there these they this those
through to too two under until up use used using very via was we were what when where which while
who whom why will with would you your yours
""".split())  # noqa: SIM905 (a word list reads better as text)
"""English function words: not evidence in a quotation (the output guard) and, with
`stopword_weight` < 1, damped by the lexical embedder."""

SCORER_STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being
below between both but by can could did do does doing down during each either few for from further
had has have having he her here hers him his how i if in into is it its itself just me more most my
no nor not now of off on once one only or other our out over own per s same she should so some such
t than that the their them then there these they this those through to too two under until up very
via was we were what when where which while who whom why will with would you your yours
""".split())  # noqa: SIM905 (a word list reads better as text)
"""The local backend's function words (a query term among them counts `Bm25.stopword_weight`): as
its weights were fitted with them."""

INTENT_STOPWORDS = frozenset("""
a about above all also am an and any are as at be been being below but by can could did do does
don't done each every for from had has have he here how i i'd i'm i've if in into is isn't it
it's its just less let's may me might more most must my no not of on one ones only onto or our
out over own please pls same shall she should so some than that that's the their them then there
these they this those to up us very was we were what what's when where whether which who whom
why will with would you your
""".split())  # noqa: SIM905 (a word list reads better as text)
"""The router's function words: they carry no intent (its classifier was fitted without them)."""

NEGATIONS = frozenset("not no never nor none neither cannot without t".split())  # noqa: SIM905  (t: don't)
"""Words that turn a claim around: a quotation may not add or drop one."""

_SCORER_SUFFIXES = ("ations", "ation", "ings", "ing", "edly", "ies", "ied", "ed", "es", "ly", "s")
_INFLECTIONS = ("ingly", "edly", "ings", "ing", "ies", "ied", "est", "es", "ed", "er", "ly", "s", "e", "y")
_INTENT_SUFFIXES = ("ations", "ation", "ances", "ance", "ences", "ence", "ants", "ant", "ents", "ent", "ings",
                    "ing", "ers", "er", "ies", "es", "ed", "s", "ly", "e")


@lru_cache(maxsize=65536)
def scorer_stem(word: str) -> str:
    """The local backend's stemmer (as fitted): strip one common suffix, keep at least 3 letters,
    then cut to 6 characters so 'preferred' / 'prefer' / 'preference' meet. Non-Latin words pass
    unchanged. Crude on purpose: it only has to make surface variants of a query term match."""
    w = word.lower()
    if not w.isascii():
        return w
    for suf in _SCORER_SUFFIXES:
        if w.endswith(suf) and len(w) - len(suf) >= 3:
            w = w[: -len(suf)]
            break
    return w[:6]


@lru_cache(maxsize=65536)
def inflection_key(word: str) -> str:
    """A word with its English inflection folded, for comparing a quotation with its source:
    "exceeds", "exceeding" and "exceeded" alike; a number or a negation stays as it is. Memoised:
    the guard and the redundancy judgement fold the same vocabulary over and over."""
    if any(ch.isdigit() for ch in word) or word in NEGATIONS:
        return word
    for suffix in _INFLECTIONS:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    if len(word) >= 4 and word[-1] == word[-2] and word[-1] not in "aeiou":  # running -> runn -> run
        word = word[:-1]
    return word


@lru_cache(maxsize=65536)
def intent_stem(word: str) -> str:
    """The router's deliberately crude suffix stripper (both sides of every comparison go through it)."""
    for suffix in _INTENT_SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


__all__ = ["INTENT_STOPWORDS", "NEGATIONS", "SCORER_STOPWORDS", "STOPWORDS", "Latin1Table", "comparable",
           "inflection_key", "intent_stem", "is_latin1", "latin1_table", "latin1_translate", "quote",
           "readable", "scorer_stem"]
