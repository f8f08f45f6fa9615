"""Counts people write in a request: "rerank these 1,000 hits", "ninety passages", "a few hundred".

The router's size precondition (never route more than a card's `max_chunks`) is only as good as
its reading of the number, and users write numbers every way: digits with thousands separators
("1,000", "1 000", "1_000"), a k suffix ("2k"), English words ("ninety", "five hundred and
twelve", "a thousand") and vague quantities ("a few hundred", "hundreds of", "thousands of").
A vague quantity becomes the smallest value it can mean (a few hundred -> 200), which is all a
"more than N?" check needs. Nothing here knows about chunks; `counts_before` pairs each number
with the words that follow it and the caller decides which nouns count.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from decimal import Decimal

_UNIT_WORDS = """zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen
    fifteen sixteen seventeen eighteen nineteen"""
_TEN_WORDS = "twenty thirty forty fifty sixty seventy eighty ninety"
_UNITS = {w: i for i, w in enumerate(_UNIT_WORDS.split())}
_TENS = {w: 10 * (i + 2) for i, w in enumerate(_TEN_WORDS.split())}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000, "dozen": 12}
# "hundreds of", "thousands of", "dozens of": at least two of the unit.
_PLURAL_SCALES = {"hundreds": 200, "thousands": 2000, "millions": 2_000_000, "dozens": 24}
# Words that make the next scale vague but at least this many of it ("a few hundred" >= 200).
_VAGUE = {"few": 2, "couple": 2, "several": 3, "many": 2}
_ONE = {"a", "an", "one"}
# Larger counts are read as this: for a "more than N?" check they are all the same, and the cap
# keeps "1e999", a 5,000-digit number or "hundred hundred ... hundred" from overflowing a float,
# passing Python's int-to-text digit limit or filling a message with a thousand digits.
MAX_COUNT = 10**30

# A token is a number in digits, a word, or a comparison sign. Digits may be grouped in threes
# by ",", "_", "." or a space ("1,000", "1 000"); a space group followed by a hyphen is two
# numbers ("40 200-token chunks"). A k suffix multiplies by a thousand ("2k", "1.5k"); "1e3" is
# a thousand too.
_TOKEN = re.compile(
    r"\d{1,3}(?:[,_.]\d{3})+(?![\d.,])"
    r"|\d{1,3}(?: \d{3})+(?![\d-])"
    r"|\d+(?:\.\d+)?k(?![a-z])"
    r"|\d+(?:\.\d+)?e\d{1,3}(?![a-z])"
    r"|\d+(?:\.\d+)?"
    r"|[a-z]+|[<>]"
)


def _digit_value(token: str) -> int:
    """Exact (Decimal, not float: 23 nines stay 23 nines), capped at `MAX_COUNT`."""
    if re.fullmatch(r"\d{1,3}(?:[,_. ]\d{3})+", token):
        token = re.sub(r"[,_. ]", "", token)
    if token.isdigit():
        # Compared by length first: int() of over 4,300 digits is an error in Python.
        digits = token.lstrip("0") or "0"
        return MAX_COUNT if len(digits) > len(str(MAX_COUNT)) else min(int(digits), MAX_COUNT)
    if "e" in token:  # 1e3
        return round(min(Decimal(token), Decimal(MAX_COUNT)))
    if token.endswith("k"):
        return round(min(Decimal(token[:-1]) * 1000, Decimal(MAX_COUNT)))
    return int(min(Decimal(token), Decimal(MAX_COUNT)))  # a decimal: its whole part ("0.7" -> 0)


def tokenize(text: str) -> list[str]:
    """Lower-cased words, numbers in digits ("1,000", "1 000", "2k") and comparison signs, in order."""
    return _TOKEN.findall(text.lower())


def _word_number(tokens: list[str], i: int) -> tuple[int, int] | None:
    """(value, tokens consumed) of an English number starting at `tokens[i]`, or None."""
    total = current = 0
    j = i
    seen = False
    while j < len(tokens):
        t = tokens[j]
        nxt = tokens[j + 1] if j + 1 < len(tokens) else ""
        if t in _UNITS:
            current += _UNITS[t]
        elif t in _TENS:
            current += _TENS[t]
        elif t in _SCALES and (seen or t == "dozen"):
            scale = _SCALES[t]
            if scale == 100:
                current = max(current, 1) * 100
            else:
                total += max(current, 1) * scale
                current = 0
        elif t in _ONE and nxt in _SCALES and not seen:
            current = 1
        elif t in _VAGUE and not seen:
            # "a few hundred", "a couple of hundred": only with a scale after it.
            scale_at = j + 2 if nxt == "of" else j + 1
            if scale_at >= len(tokens) or tokens[scale_at] not in _SCALES:
                break
            current = _VAGUE[t]
            j = scale_at - 1
        elif t == "and" and seen and (nxt in _UNITS or nxt in _TENS):
            j += 1
            continue
        elif t in _PLURAL_SCALES and not seen:
            return _PLURAL_SCALES[t], j - i + 1
        else:
            break
        seen = True
        j += 1
    if not seen:
        return None
    return total + current, j - i


def counts_before(text: str, window: int = 3) -> Iterator[tuple[int, list[str], str]]:
    """Each number in `text` with up to `window` following words and the two words before it.

    For "more than 50 chunks" yields (50, ["chunks"], "more than"). Numbers written in words are
    read whole ("five hundred and twelve" is one number, 512), and a number's own words are not
    offered as the words that follow it.
    """
    toks = tokenize(text)
    i = 0
    while i < len(toks):
        tok = toks[i]
        value: int | None
        used = 1
        if tok[0].isdigit():
            value = _digit_value(tok)
            # "5 dozen", "2 thousand", "1.5 thousand": digits times a scale word.
            if i + 1 < len(toks) and toks[i + 1] in _SCALES and re.fullmatch(r"\d+(?:\.\d+)?", tok):
                value = round(min(Decimal(tok) * _SCALES[toks[i + 1]], Decimal(MAX_COUNT)))
                used = 2
        else:
            parsed = _word_number(toks, i)
            value, used = parsed if parsed else (None, 1)
        if value is not None:
            value = min(value, MAX_COUNT)
            after = toks[i + used : i + used + window]
            before = " ".join(toks[max(0, i - 2) : i])
            yield value, after, before
        i += used


def shown(count: int) -> str:
    """A count for a message: digits up to a billion, then short scientific notation, and the cap
    as "1e30 or more", so "1e999 chunks" does not come back as a 31-digit number."""
    if count >= MAX_COUNT:
        return f"{_sci(MAX_COUNT)} or more"
    return str(count) if count < 10**9 else f"about {_sci(count)}"


def _sci(value: int) -> str:
    mantissa, exponent = f"{value:.3g}".split("e+")
    return f"{mantissa}e{int(exponent)}"
