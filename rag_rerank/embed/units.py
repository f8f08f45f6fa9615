"""Matching units for text the English-centred signals would mis-split: CJK, Thai, Cyrillic, Arabic...

Why this module exists. The default scorer's lexical signals were built for space-separated Latin
text, and two things went wrong elsewhere:

* `\\w+` treats a whole Chinese or Japanese sentence (no spaces) as one word, so BM25 never
  matched anything in it; and it splits a Devanagari or vowelled Arabic word at every combining
  mark, and an NFD "café" into "cafe" plus a stray accent;
* the static MiniLM table is an English WordPiece vocabulary: a Russian, Arabic, Hebrew, Korean or
  kana word falls apart into single letters, whose averaged vectors make every text in that
  script look alike (cosine ~0.9), so an off-topic chunk scored as high as the answer.

The rule here is the one search engines use (Lucene's CJK bigram filter, for one): in scripts
written without spaces (Han, kana, Hangul, Thai, Lao, Khmer, Myanmar, Tibetan) every character
and every pair of adjacent characters is a unit; in other non-Latin scripts the whole word is a
unit. Latin (and Greek, used as symbols in English technical text) is left to the existing paths,
so English text gets exactly the units it had before: the fitted weights stay valid for it.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from ..text import is_latin1

# Scripts written without spaces between words: character unigrams and bigrams.
_UNSPACED_PREFIXES = ("CJK ", "HIRAGANA", "KATAKANA", "HANGUL", "HALFWIDTH KATAKANA", "HALFWIDTH HANGUL",
                      "IDEOGRAPHIC", "THAI", "LAO ", "KHMER", "MYANMAR", "TIBETAN")
# Scripts with spaces that the static table only knows as single letters: whole words.
_WORD_SCRIPTS = frozenset({
    "ARABIC", "HEBREW", "CYRILLIC", "ARMENIAN", "GEORGIAN", "DEVANAGARI", "BENGALI", "GURMUKHI",
    "GUJARATI", "ORIYA", "TAMIL", "TELUGU", "KANNADA", "MALAYALAM", "SINHALA", "ETHIOPIC", "SYRIAC",
    "THAANA", "MONGOLIAN", "NKO"})
UNSPACED, WORDED = "unspaced", "worded"


def _bmp_class(categories: frozenset[str]) -> str:
    """A regex character class body for every BMP code point in `categories` (built once, ~10 ms)."""
    ranges: list[tuple[int, int]] = []
    for cp in range(0x10000):
        if unicodedata.category(chr(cp)) in categories:
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1] = (ranges[-1][0], cp)
            else:
                ranges.append((cp, cp))
    return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}"
                   for a, b in ranges)


_FORMAT = _bmp_class(frozenset({"Cf"}))
# A word: word characters plus combining marks (a Devanagari vowel sign, an Arabic vowel, an NFD
# accent) and invisible format characters (zero-width space / joiners, soft hyphen), which belong
# inside the word they sit in. For ASCII text this is exactly `\w+`.
WORD = re.compile(rf"[\w{_bmp_class(frozenset({'Mn', 'Mc', 'Me'}))}{_FORMAT}]+")
_FORMAT_RUN = re.compile(f"[{_FORMAT}]+")
_CONTROL = re.compile("[\\x00-\\x08\\x0e-\\x1f\\x7f-\\x9f]+")


class _Kinds(dict[str, str]):
    """Each character's kind, filled on first sight: UNSPACED, WORDED, or '' (Latin, digits, ...)."""

    def __missing__(self, ch: str) -> str:
        kind = ""
        if ch.isalpha() or unicodedata.category(ch).startswith("M"):
            name = unicodedata.name(ch, "")
            if name.startswith(_UNSPACED_PREFIXES):
                kind = UNSPACED
            elif name.split(" ", 1)[0] in _WORD_SCRIPTS:
                kind = WORDED
        self[ch] = kind
        return kind


_KIND = _Kinds()


class _LetterKinds(dict[int, str | None]):
    """For `str.translate`: a letter to "f" (a script of `kind`) or "l" (any other), the rest deleted.
    A character of an unspaced script counts three times: a Chinese word is one to two characters,
    an English one about five letters, so "Docker 容器重启" is mostly Chinese."""

    def __missing__(self, cp: int) -> str | None:
        ch = chr(cp)
        k = _KIND[ch]
        out = ("fff" if k == UNSPACED else "f" if k else "l") if ch.isalpha() else None
        self[cp] = out
        return out


_LETTER_KIND = _LetterKinds()


def kind(ch: str) -> str:
    """UNSPACED, WORDED or '' for one character."""
    return _KIND[ch]


def reads_foreign(text: str) -> bool:
    """True when most of the letters of `text` are in scripts that need these units (CJK, Cyrillic,
    Arabic, ...): the text's dominant script picks its analyser, as a search engine picks one per
    document language. Latin-dominant text (English quoting "東京タワー") keeps the plain word split,
    so adding a foreign name to an English chunk does not change how its English is read."""
    if is_latin1(text):  # no Latin-1 character is in such a script (tests/test_embed_units.py)
        return False
    letters = text.translate(_LETTER_KIND)  # one C-level pass: "f" per foreign letter, "l" per other
    return letters.count("f") > letters.count("l")


def visible(text: str) -> str:
    """`text` as a reader sees it, for quoting a chunk back in a reason: control characters (a NUL,
    a terminal escape) become a space, invisible format characters (zero-width space, joiners, soft
    hyphen, direction marks) go."""
    return _FORMAT_RUN.sub("", _CONTROL.sub(" ", text))


def clean_word(word: str) -> str:
    """NFC, format characters out, lower case: one spelling per word whatever the input's form."""
    return unicodedata.normalize("NFC", _FORMAT_RUN.sub("", word)).lower()


def grams(run: str, base: int = 0) -> list[tuple[str, int]]:
    """Unigrams and bigrams of an unspaced run, in reading order, each with its offset (+ `base`)."""
    n = len(run)
    if n == 0:
        return []
    out: list[tuple[str, int]] = [("", 0)] * (2 * n - 1)
    out[0::2] = list(zip(run, range(base, base + n), strict=True))
    out[1::2] = list(zip([run[i : i + 2] for i in range(n - 1)], range(base, base + n - 1), strict=True))
    return out


class _UnspacedMarks(dict[int, str]):
    """For `str.translate`: "u" for a character of an unspaced script, "o" for any other."""

    def __missing__(self, cp: int) -> str:
        out = "u" if _KIND[chr(cp)] == UNSPACED else "o"
        self[cp] = out
        return out


_UNSPACED_MARKS = _UnspacedMarks()
_UNSPACED_RUN = re.compile("u+")


def split_word(word: str) -> tuple[tuple[str, int], ...]:
    """The matching units of one cleaned word with their offsets: unspaced runs as unigrams and
    bigrams, everything else (Latin, digits, a Cyrillic word) as one unit per stretch between them.
    Memoised for words of ordinary length (a Chinese paragraph is one long "word")."""
    return _split_word_cached(word) if len(word) <= _CACHED_WORD_CHARS else _split_word(word)


def _split_word(word: str) -> tuple[tuple[str, int], ...]:
    if word.isascii():
        return ((word, 0),)
    units: list[tuple[str, int]] = []
    start = 0
    for m in _UNSPACED_RUN.finditer(word.translate(_UNSPACED_MARKS)):  # runs found at C speed
        i, j = m.span()
        if start < i:
            units.append((word[start:i], start))
        units += grams(word[i:j], i)
        start = j
    if start < len(word):
        units.append((word[start:], start))
    return tuple(units)


_CACHED_WORD_CHARS = 64
_split_word_cached = lru_cache(maxsize=65536)(_split_word)


def units_with_spans(text: str) -> list[tuple[str, int, int]]:
    """Every matching unit of `text` with the span of text it came from (approximate inside a word
    whose cleaning changed its length). ASCII words come out as `\\w+` would give them, lowered."""
    out: list[tuple[str, int, int]] = []
    for m in WORD.finditer(text):
        raw = m.group()
        s0, end = m.span()
        if raw.isascii():
            out.append((raw.lower(), s0, end))
            continue
        word = clean_word(raw)
        if not word:
            continue
        parts = split_word(word)
        if len(word) == len(raw):  # cleaning kept every offset: exact spans
            out += [(unit, s0 + off, s0 + off + len(unit)) for unit, off in parts]
            continue
        for k, (unit, off) in enumerate(parts):
            lo = min(s0 + off, end - 1)
            hi = end if k == len(parts) - 1 else min(lo + len(unit), end)  # the last unit ends the word
            out.append((unit, lo, hi))
    return out


def units(text: str) -> list[str]:
    """The matching units of `text` (see `units_with_spans`)."""
    return [u for u, _, _ in units_with_spans(text)]
