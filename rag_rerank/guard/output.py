"""The output guard: judges a raw LLM answer against the card's contract.

It is strict on purpose: exactly one JSON object and nothing else, schema-conformant, ids
verbatim, no id twice, at most top_k ranked, scores in [0, 1] and above the minimum, reasons that
cite the chunk. It reports every violation with a JSON path so a re-ask can quote them all; it
never edits content. Formatting salvage is a separate, explicit step (`repair.py`).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from functools import lru_cache
from operator import itemgetter
from typing import Any

from jsonschema import Draft202012Validator

from .. import reasons
from ..errors import InputError, OutputError, Violation
from ..evidence import ELISION
from ..models import Chunk
from ..text import NEGATIONS, STOPWORDS, comparable, inflection_key, is_latin1, latin1_table, latin1_translate
from .input import ChunkSource, normal_top_k, parse_chunks, top_k_violations
from .limits import Limits, as_limits, load_schema

# What a chunk's text (and the query) are compared as, memoised: a chunk is cited and quoted, and it
# recurs (call after call, window after window).
_comparable = lru_cache(maxsize=2048)(comparable)
_WORD = re.compile(r"\w+", re.UNICODE)
# `_WORD` as a bytes table for Latin-1 text: each character it does not match a space.
_WORD_SEPARATORS = latin1_table(lambda ch: ch if _WORD.fullmatch(ch) else " ")


def _word_list(text: str) -> list[str]:
    """`_WORD.findall(text)`: Latin-1 text (ASCII, accents, mojibake: most text) by one bytes
    translation and a split, several times cheaper than the regex per character (a property test
    holds them equal)."""
    spaced = latin1_translate(text, _WORD_SEPARATORS)
    return _WORD.findall(text) if spaced is None else spaced.split()


# Words that say a chunk is relevant without saying why; they do not count as a citation.
_GENERIC = frozenset(
    """relevant relevance highly high query question chunk chunks passage passages document documents text
    matches match matching information info content topic topics related relates discusses discussed mentions
    mentioned useful answer answers good directly direct addresses address contains contain provides provide
    describes describe explains explain talks score scored relevantly pertinent important covers cover
    helpful best strong strongly context user users request asks asked""".split()  # noqa: SIM905
)


def _stems(text: str) -> frozenset[str]:
    """The stems (first five letters) a citation is looked for in: of the words of
    `comparable(text)` outside the stop and generic words, those of 3+ letters or with a digit."""
    return _stems_of(text, _folded(text))


def _stems_of(text: str, folded: str | None) -> frozenset[str]:
    """`_stems(text)`, given `_folded(text)`. Most texts (every one `_folded` reads in one bytes
    translation) are done in C: the words' set less the ignored words, their stems' set less the
    short stems without a digit (`_SHORT_STEMS`; a word shorter than three letters is its own
    stem, and a longer word's stem has three letters or more). A property test holds both paths
    to the rule as written (`_ruled_tokens` is it, for any text)."""
    if folded is None:
        return _ruled_tokens(text)
    return frozenset(map(_STEM, frozenset(folded.split()).difference(_IGNORED))).difference(_SHORT_STEMS)


# `_stems`, memoised per text (a chunk is cited again each time it recurs): for the texts `_spaced_words`
# cannot read (`_shares_stem`).
_content_tokens = lru_cache(maxsize=4096)(_stems)


def _ruled_tokens(text: str) -> frozenset[str]:
    """`_stems` as its rule reads, for any text: each distinct word looked at once (a text repeats
    most of its words)."""
    words = set(_word_list(_comparable(text))).difference(_IGNORED)
    return frozenset({w[:5] for w in words if len(w) >= 3 or any(ch.isdigit() for ch in w)})


_IGNORED = STOPWORDS | _GENERIC
_STEM = itemgetter(slice(5))


def _folded_char(ch: str) -> str | None:
    """What one Latin-1 character is among `comparable`'s words: its own comparable form (controls
    a space, format characters gone, NFKC, case folded) with each non-word character a space (a
    run of them one), or None when that is wider than Latin-1 (\u00b5 -> \u03bc)."""
    folded = "".join(c if _WORD.fullmatch(c) else " " for c in comparable(f"x{ch}x")[1:-1])
    if not folded.strip():
        return " " if folded else ""
    return folded if max(folded) <= "\xff" else None


def _word_rule(ch: str) -> str:
    out = _folded_char(ch)
    # NUL (itself a control: a space) marks a character `_folded` cannot map or replaces first
    return out if out is not None and len(out) <= 1 else "\x00"


# `_folded_char` of every Latin-1 character that folds to at most one, as a bytes table.
_FOLDED_WORDS = latin1_table(_word_rule)
# The table for a text without a soft hyphen, the one Latin-1 character it deletes (the one format
# character below U+0100; a test pins it).
_FOLDED_KEPT = (_FOLDED_WORDS[0], b"")
# The Latin-1 characters that fold to more than one (\u00df -> ss, \u00bd -> "1 2"), with what.
# (Its code point: `int in bytes` is a byte search, where `bytes in bytes` first tries the operand as
# an int, and raises and formats an error to find out.)
_FOLDED_LONGER = tuple((cp, bytes([cp]), out.encode("latin-1")) for cp in range(256)
                       if (out := _folded_char(chr(cp))) is not None and len(out) > 1)


def _folded(text: str) -> str | None:
    """`comparable(text)` with each non-word character a space, by one bytes translation, for a
    Latin-1 text (ASCII, accents, web mojibake: most text) but for one holding \u00b5 (which
    folds to a Greek letter); else None. Its words (runs of characters other than the space) are
    `_word_list(comparable(text))`: `comparable` maps such a text character by character (no
    Latin-1 character composes with a neighbour under NFKC; the accents NFKC splits off come after
    a space), and its white space only separates words."""
    try:
        raw = text.encode("latin-1")
    except UnicodeEncodeError:
        return None
    if not text.isascii():  # the characters that fold to more than one are not ASCII
        for cp, char, longer in _FOLDED_LONGER:
            if cp in raw:
                raw = raw.replace(char, longer)
    # without a soft hyphen, bytes.translate's faster loop (no deletions)
    spaced = raw.translate(*(_FOLDED_WORDS if 0xAD in raw else _FOLDED_KEPT)).decode("latin-1")
    return None if "\x00" in spaced else spaced


@lru_cache(maxsize=4096)
def _spaced_words(text: str) -> str | None:
    """A chunk's `_folded` form between two spaces (None when there is none), memoised per text: a
    word of it is found whole as " word " and by its start as " stem" (`_shares_stem`)."""
    spaced = _folded(text)
    return None if spaced is None else f" {spaced} "


# The stems of the ignored words that have five letters or more: a chunk word starting with one of
# them may be an ignored word, which does not count (`_shares_stem`).
_IGNORED_STEMS = frozenset(w[:5] for w in _IGNORED if len(w) >= 5)


@lru_cache(maxsize=4096)
def _reason_words(reason: str) -> tuple[str, ...] | None:
    """A reason's `_folded` words, last first (None when `_folded` cannot read it), memoised per
    reason: a reason names its evidence after its verb ("opens with "...", "gives the 1998
    figure"), and `_shares_stem` stops at the first stem it finds. The order changes only the
    cost, never the answer."""
    folded = _folded(reason)
    return None if folded is None else tuple(reversed(folded.split()))


def _shares_stem(reason: str, text: str) -> bool:
    """Whether the reason's stems and the chunk's meet (`_stems(reason)` and `_stems(text)` not
    disjoint), settled by searching the chunk's `_spaced_words` for the reason's stems one word at
    a time, stopping at the first found: neither text's stems are built (their words hashed,
    filtered and sliced: most of what a chunk and a new reason cost). A stem of fewer than five
    letters is its own word (" word "), met only by that word; a five-letter one (" stem") is met
    by a word it starts that is not ignored (five letters or more: not a short word), which can
    happen only when the stem is an ignored word's (`_starts_content_word`). A word seen twice is
    looked for twice (a reason's words are few). The stems' sets for a chunk the spaced form
    cannot hold. A property test holds this to the sets' intersection."""
    spaced = _spaced_words(text)
    if spaced is None:
        return not _content_tokens(reason).isdisjoint(_content_tokens(text))
    words, ignored = _reason_words(reason), _IGNORED
    if words is None:  # the reason's stems by the rule's code: each is its own stem, and none is left out
        words, ignored = tuple(_content_tokens(reason)), frozenset()
    for word in words:
        if word in ignored or word in _SHORT_STEMS:
            continue
        if len(word) < 5:
            if f" {word} " in spaced:
                return True
        elif (stem := word[:5]) in _IGNORED_STEMS:
            if _starts_content_word(spaced, stem):
                return True
        elif f" {stem}" in spaced:
            return True
    return False


def _starts_content_word(spaced: str, stem: str) -> bool:
    """Whether a word of `spaced` (`_spaced_words`) that starts with `stem` is not an ignored one."""
    at = spaced.find(" " + stem)
    while at >= 0:
        end = spaced.index(" ", at + 1)
        if spaced[at + 1:end] not in _IGNORED:
            return True
        at = spaced.find(" " + stem, end)
    return False


def _short_words() -> frozenset[str]:
    """Every word of one or two characters without a digit that `_folded` can give: the words
    `_stems` leaves out."""
    table = _FOLDED_WORDS[0]
    letters = sorted({chr(b) for b in table if _WORD.fullmatch(chr(b)) and not chr(b).isdigit()})
    return frozenset([*letters, *(a + b for a in letters for b in letters)])


_SHORT_STEMS = _short_words()


def _non_ascii_runs(text: str) -> set[str]:
    """Bigrams of non-Latin word characters (CJK and the like have no spaces to split on)."""
    runs = re.findall(r"[^\x00-\u024f\s\W]{2,}", text)
    return {r[i : i + 2] for r in runs for i in range(len(r) - 1)}


def cites_chunk(reason: str, chunk_text: str) -> bool:
    """True when the reason names something concrete (a word, entity, number) from the chunk; both
    compared in the one `text.comparable` form, so an NFD accent or a control character in the
    chunk does not hide a word the reason names."""
    return _shares_stem(reason, chunk_text) or _shares_run(reason, chunk_text)


def _shares_run(reason: str, chunk_text: str) -> bool:
    """`cites_chunk`'s second test: a bigram of non-Latin word characters of the reason in the chunk."""
    grams = _non_ascii_runs(comparable(reason))
    return bool(grams) and any(g in _comparable(chunk_text) for g in grams)


# A quotation in a reason: straight double quotes (a JSON-escaped \" inside allowed, as the scored
# backends write them), curly quotes, guillemets and CJK corner brackets, on one line. Single quotes
# are left alone: they are apostrophes as often as quotation marks.
_CLOSING = {'"': '"', "\u201c": "\u201d", "\u00ab": "\u00bb", "\u300c": "\u300d"}
_OPENING = re.compile("[" + "".join(_CLOSING) + "]")
_ELLIPSIS = re.compile(r"\.\.\.|\u2026|\[\.\.\.\]")
# Punctuation a quotation may end or start with that the chunk need not have at that spot.
_EDGE = " \t.,;:!?-\u2013\u2014()[]{}'`\u2018\u2019"


def _quotations(reason: str) -> list[str]:
    """The quoted passages of a reason, JSON escapes (\\" \\u00e9) read back. One pass with
    str.find, linear in the reason's length whatever it holds (a regex with a bounded repeat
    after each of n opening quotes was O(n * bound))."""
    plain = reason.isascii()  # then only a straight quote can open one: str.find, not the regex
    if plain and "\\" not in reason and "\n" not in reason:
        # No escape and no line break: the quotations are what lies between the 1st and 2nd
        # quote, the 3rd and 4th, ...; a last quote left unclosed opens none.
        return reason.split('"')[1:-1:2]
    out = []
    pos = 0
    while True:
        if plain:
            if (start := reason.find('"', pos)) < 0:
                break
            opening = '"'
        elif (m := _OPENING.search(reason, pos)) is not None:
            start, opening = m.start(), m.group()
        else:
            break
        begin = start + 1  # every opening mark is one character
        end = _closing_quote(reason, begin, _CLOSING[opening])
        if end < 0:
            break  # no closing quote after this opening one: none after a later one either
        line_break = reason.find("\n", begin, end)
        if line_break >= 0:  # a quotation is on one line: start again after the break
            pos = line_break + 1
            continue
        quoted = reason[begin:end]
        if opening == '"' and "\\" in quoted:  # without a backslash there is no escape to read
            with contextlib.suppress(ValueError):  # not valid JSON escapes: compare as written
                quoted = json.loads(f'"{quoted}"')
        out.append(quoted)
        pos = end + 1
    return out


def _closing_quote(text: str, start: int, closing: str) -> int:
    """Where `closing` ends the quotation opened before `start` (-1: nowhere); a straight quote
    escaped with a backslash (an odd run of them) does not close it."""
    pos = start
    while (end := text.find(closing, pos)) >= 0:
        if closing != '"':
            return end
        slashes = end
        while slashes > start and text[slashes - 1] == "\\":
            slashes -= 1
        if (end - slashes) % 2 == 0:
            return end
        pos = end + 1
    return -1


# How loosely a quotation may follow its source. Models quote the way people do: a word left out or
# an article added, another inflection ("exceeding RAM" for "exceeds RAM"), a hyphen for a space,
# a compound ("memory-constrained") for a phrase. A careful reader calls those faithful; what they
# do not accept is a word the source never had ("plentiful" for "constrained", "high latency" for
# "low latency"), a changed number, or a negation dropped or added. So a quotation is compared word
# by word (inflection folded) with its best-matching stretch of the source: every content word of
# the quotation must be the source's, in the source's order; function words may differ cheaply,
# and the source's words may be left out within a budget that grows with the quotation's length.
# Stop words that carry meaning in a quotation ("only", "all", "before") are edited as content words.
_MEANINGFUL = "all any each few more most only some same other very too before after above below over under"
_LIGHT = STOPWORDS - frozenset([*_MEANINGFUL.split(), "against", "between", "again", "further", "once"])
# What is left of a contraction once split at its apostrophe ("memory's" -> memory, s).
_CONTRACTED = frozenset("s d m ll re ve".split())  # noqa: SIM905
_OMIT_LIGHT, _OMIT_CONTENT, _EDIT_LIGHT, _NEVER = 0.25, 0.5, 0.25, 1e6


# A thousands separator between digits ("1,000", "1 000", "1'000"): "1000" is the same number.
_DIGIT_GROUP = re.compile(r"(?<=\d)[,' \u00a0\u202f_](?=\d{3}(?!\d))")


def _words(text: str) -> list[str]:
    return _word_list(_DIGIT_GROUP.sub("", comparable(text)))


def _kind(word: str) -> int:
    """0: a function word (cheap to edit), 1: a content word, 2: never edited (a negation or number)."""
    if word in NEGATIONS or any(ch.isdigit() for ch in word):
        return 2
    return 0 if word in _LIGHT or word in _CONTRACTED else 1


class _Source:
    """A source's words as arrays, built once per source and reused for each of its quotations."""

    def __init__(self, text: str) -> None:
        import numpy as np

        words = _words(text)
        self.ids: dict[str, int] = {}
        keys = [self.ids.setdefault(inflection_key(w), len(self.ids)) for w in words]
        self.keys = np.array(keys, dtype=np.int64)
        self.kinds = np.array([_kind(w) for w in words], dtype=np.int64)
        omit = np.choose(self.kinds, [_OMIT_LIGHT, _OMIT_CONTENT, _NEVER]) if words else np.zeros(0)
        self.omit_cum = np.concatenate([[0.0], np.cumsum(omit)])

    def cost(self, quote: list[str]) -> float:
        """The least weighted word edit distance between `quote` and any stretch of the source
        (approximate substring matching: free start and end in the source)."""
        import numpy as np

        n = len(self.keys)
        row = np.zeros(n + 1)  # aligning no quote word costs nothing, wherever it starts
        for word in quote:
            kind = _kind(word)
            qid = self.ids.get(inflection_key(word), -1)
            insert = _NEVER if kind else _EDIT_LIGHT  # a content word, negation or number must be there
            # A function word for a function word is cheap; for a content word, it leaves that out.
            sub = np.where(self.kinds == 0, _EDIT_LIGHT, _OMIT_CONTENT + _EDIT_LIGHT) if not kind else _NEVER
            sub = np.where(self.kinds == 2, _NEVER, sub)
            sub = np.where(self.keys == qid, 0.0, sub)
            new = np.empty(n + 1)
            new[0] = row[0] + insert
            new[1:] = np.minimum(row[:-1] + sub, row[1:] + insert)
            # then skipping source words: new[j] = min over k <= j of new[k] + omitted cost k..j
            new = self.omit_cum + np.minimum.accumulate(new - self.omit_cum)
            row = new
        return float(row.min())


def _faithful(quote: list[str], source: _Source) -> bool:
    """Whether a quoted piece's words are its source's as a careful reader would accept them."""
    content = [w for w in quote if _kind(w)]
    if not content:
        return False  # only function words, and not verbatim: nothing to match loosely on
    if any(inflection_key(w) not in source.ids for w in content):  # a word the source never had
        return False
    return source.cost(quote) <= 0.25 + (len(content) - 1) / 4


# Word pairs compared loosely for one reason at most (about 20 ms): a crafted answer of many long
# loose quotations of a long chunk would otherwise cost (its words x the chunk's words). Beyond it
# a quotation must be verbatim, as it must be everywhere in the source before.
LOOSE_PAIRS = 2_000_000


def misquoted(reason: str, source: str) -> str | None:
    """The first quotation in `reason` that is not, loosely, in `source`, or None. Case, Unicode
    form, spacing and punctuation aside, an ellipsis may elide words between pieces, and a quotation
    may leave a word out, add an article or inflect a word differently (see `_faithful`); it may
    not bring a word the source lacks, nor change a number or a negation. A reason is the model's
    evidence that it read the chunk: a quotation that is not there was invented.

    A long chunk shown as its evidence (`shortening.py`) joins the kept passages with the elision
    mark (`evidence.ELISION`). Each passage is a source of its own: a quotation piece must lie
    inside one of them, never across a mark (the words on either side of it are not a phrase of the
    original), and a quotation that copies the mark is refused (`spans_elision`)."""
    quotes = _quotations(reason)
    if not quotes:
        return None
    segments = source.split(ELISION) if ELISION in source else [source]
    return _misquoted(quotes, segments, [_comparable(s) for s in segments])


def _misquoted(quotes: list[str], segments: Sequence[str], haystacks: Sequence[str]) -> str | None:
    """`misquoted` of a reason's quotations against a source's passages (`segments`) and their
    comparable forms (`haystacks`)."""
    words: list[_Source] | None = None
    pairs = 0
    for quote in quotes:
        if len(segments) > 1 and spans_elision(quote):
            return quote
        # every `_ELLIPSIS` holds "..." or is "\u2026": most quotations have neither, and skip the regex
        parts = _ELLIPSIS.split(quote) if "..." in quote or "\u2026" in quote else (quote,)
        for part in parts:
            piece = comparable(part).strip(_EDGE)
            if len(piece) < 3:  # one or two characters prove nothing
                continue
            for haystack in haystacks:  # (a loop, not any() of a generator: most pieces are found)
                if piece in haystack:
                    break
            else:
                words = words or [_Source(s) for s in segments]
                quoted = _words(piece)
                pairs += len(quoted) * sum(len(w.keys) + 1 for w in words)
                if pairs > LOOSE_PAIRS or not any(_faithful(quoted, w) for w in words):
                    return quote
    return None


_MARK = ELISION.strip()


def spans_elision(quote: str) -> bool:
    """Whether a quotation copies the elision mark that joins a shortened chunk's passages: it
    presents passages the original keeps apart as one phrase. (An ellipsis of the model's own,
    `...` or `…`, is judged as always: each piece must lie inside one passage.)"""
    return _MARK in quote


def _shown_parts(text: str, cid: str, meta: str | None, query: str | None) -> list[str]:
    """What the model was shown that a reason about a chunk may quote: the chunk's text, id and
    meta values (`meta`: their JSON), and the query ("answers "when to choose IVF" with ..."
    quotes the question, not an invention)."""
    shown = [text, cid]
    if meta is not None:
        shown.append(meta)
    if query:
        shown.append(query)
    return shown


def _joined(text: str, cid: str, meta: str | None, query: str | None) -> str:
    """`_shown_parts` as one text, a line each."""
    return "\n".join(_shown_parts(text, cid, meta, query))


@lru_cache(maxsize=2048)
def _shown(text: str, cid: str, meta: str | None, query: str | None
           ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(passages, their comparable forms) of what a chunk's reason may quote (`_joined`), made
    once per chunk and query: a chunk recurs (call after call, window after window), and joining,
    splitting and normalising its text again for each reason was most of the quotation check.

    Without an elision mark the comparable form is put together from the parts' own: `comparable`
    reads a line break as a space, and nothing composes with a space or reorders across it, so the
    joined text's form is the parts' forms joined by spaces (a property test holds them equal). The
    chunk's and the query's forms then come from `_comparable`, where the citation check
    (`_content_tokens`) and the call's other chunks put them."""
    source = _joined(text, cid, meta, query)
    if ELISION in source:
        segments = source.split(ELISION)
        return tuple(segments), tuple(comparable(s) for s in segments)
    forms = (_comparable(part) for part in _shown_parts(text, cid, meta, query))
    return (source,), (" ".join(form for form in forms if form),)


# `text.is_latin1` of a chunk text, once per text (`_Quotable.chunk_misquoted`): finding out copies the text.
_latin1 = lru_cache(maxsize=4096)(is_latin1)


class _Quotable:
    """What each chunk's reason may quote, built only for a reason that quotes something: a reason
    without a quotation mark costs one regex search, not a JSON dump of its chunk's meta."""

    def __init__(self, chunks: Sequence[Chunk], query: str | None = None) -> None:
        self.chunks = {c.id: c for c in chunks}
        self._query = query
        # Whether a chunk with an ASCII text and no meta is shown as one passage whatever its id:
        # the query (when shown) holds no elision mark. Settled once per answer (`chunk_misquoted`).
        self._one_passage = not query or ELISION not in query

    @property
    def where(self) -> str:
        """Where a quotation was looked for, for the violation: a caller judging without the query
        learns why a quotation of the question was refused, and how to allow it."""
        if self._query:
            return "neither in the chunk's text nor in the query"
        return ("not in the chunk's text (the query was not given: check_output(query=), "
                "rag-rerank check --query)")

    def refusal(self, cid: str, bad: str) -> str:
        """The violation's message for quotation `bad` in chunk `cid`'s reason: where it was looked
        for, and, for a chunk shown as its evidence, that a quotation stays inside one passage."""
        shown = bad if len(bad) <= 60 else bad[:57] + "..."
        chunk = self.chunks.get(cid)
        if chunk is not None and ELISION in chunk.text:
            if spans_elision(bad):
                return (f"reason quotes {shown!r}, which copies the elision mark {_MARK}: it joins passages "
                        "the original keeps apart, so they are not one phrase; quote one passage exactly "
                        "or do not quote")
            return (f"reason quotes {shown!r}, which is {self.where} as shown: a quotation must lie "
                    f"inside one passage (the mark {_MARK} between passages stands for text left out); "
                    "quote one passage exactly or do not quote")
        return f"reason quotes {shown!r}, which is {self.where}; quote the chunk exactly or do not quote"

    def misquoted(self, cid: str, reason: str) -> str | None:
        """`misquoted(reason, ...)` against what chunk `cid`'s reason may quote; None for an id
        that is not an input (that violation is reported on its own)."""
        chunk = self.chunks.get(cid)
        return None if chunk is None else self.chunk_misquoted(chunk, reason)

    def chunk_misquoted(self, chunk: Chunk, reason: str) -> str | None:
        """`misquoted` for an input chunk's reason.

        Short cut (in this method: it runs for each ranked item of each answer, and a call more
        cost about 450 instructions each time): when each quotation piece is, character for
        character, in the chunk's Latin-1 text (ASCII, accents, web mojibake: DL19's passages all
        are), for a chunk shown as one passage, `_misquoted` would find every piece (or find it too
        short to judge) and the verdict is None, without normalising a piece or searching the
        shown text.

        Why that holds: for Latin-1 text, `comparable` maps each character on its own (a control
        to a space, a soft hyphen to nothing, NFKC and the case fold to a fixed text: no Latin-1
        character combines with its neighbour, and the accents that NFKC splits off, such as
        "\u00a8", come after a space), then makes whitespace runs one space and trims the ends;
        each of those keeps a substring a substring, and the edge strip only shortens the piece
        (checked for every pair of Latin-1 characters and each of their slices). The chunk's
        comparable form is part of what `_shown` compares with, and with one passage (no elision
        mark in the text, which is Latin-1 and cannot hold its "\u2026", nor in the id or the
        query, and no meta) no piece is refused for spanning a mark. A property test holds the
        short cut equal to the full check on arbitrary Unicode."""
        if reason.isascii() and "\\" not in reason and "\n" not in reason:
            quotes = reason.split('"')[1:-1:2]  # `_quotations`' first case, without its call
        else:
            quotes = _quotations(reason)
        if not quotes:  # most reasons: no JSON dump of the chunk's meta, no look-up
            return None
        text = chunk.text
        if (self._one_passage and (text.isascii() or _latin1(text)) and chunk.meta is None
                and ELISION not in chunk.id):
            for quote in quotes:
                if "..." in quote or "\u2026" in quote:  # as `_misquoted` splits it, each piece in the text
                    if not all(part in text for part in _ELLIPSIS.split(quote)):
                        break
                elif quote not in text:
                    break
            else:
                return None  # every quotation as written in the text (the short cut above)
        meta = None if chunk.meta is None else json.dumps(chunk.meta, ensure_ascii=False, default=str)
        return _misquoted(quotes, *_shown(chunk.text, chunk.id, meta, self._query))


def _fold(cid: str) -> str:
    """What a model might have done to an id (case, width, Unicode form, spaces): only for the hint."""
    return unicodedata.normalize("NFKC", cid).strip().casefold()


def _near_hint(cid: str, near: str | None) -> str:
    if near is None:
        return ""
    if unicodedata.normalize("NFC", near) == unicodedata.normalize("NFC", cid):
        return f" (did you mean {near!a}? it differs only in Unicode normalisation: {cid!a})"
    return f" (did you mean {near!r}? ids are kept byte for byte)"


class _DuplicateKeys:
    """object_pairs_hook that remembers duplicate keys instead of silently keeping the last."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)  # the last value of a key wins, as json's own objects have it
        if len(out) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    self.found.append(key)
                seen.add(key)
        return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in JSON output (scores must be finite numbers)")


def _leading_problem(text: str) -> str:
    """Why a text that does not start with '{' is not one bare JSON object."""
    if text.startswith("```"):
        return "output is wrapped in a Markdown code fence; return the bare JSON object"
    if text.startswith("["):
        return "output is a JSON array; return one JSON object with a 'ranked' array"
    if text.lower().startswith("<think>"):
        return "output starts with a <think> block; return only the JSON object"
    if "{" in text:
        return f"text before the JSON object: {text[: min(text.index('{'), 40)]!r}"
    return "output holds no JSON object"


_DIGITS = re.compile(r"value has (\d+) digits")


def _value_message(exc: ValueError) -> str:
    """The decoder's refusal in the output contract's terms. Python refuses to read an integer
    literal of more than 4300 digits and says to raise an interpreter-wide limit; for a model's
    answer that advice is wrong: no score has that many digits, the answer is what is wrong."""
    text = str(exc)
    if "integer string conversion" in text:
        found = _DIGITS.search(text)
        size = f"{found.group(1)} digits" if found else "thousands of digits"
        return f"a number in the output has {size}; scores must be numbers in [0, 1]"
    return text


# The decoder of an answer whose keys are each written once (most): no Python call per object.
_PLAIN_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
# A key's closing quotation mark, then its colon: a text in which no quotation mark has white space
# then a colon after it (`_spaced_key`) writes each of its keys so, and holds `":` at least as often as
# it writes keys (more often when a string holds an escaped \":).
_KEY_END = '":'
# A quotation mark, JSON white space, a colon: how a key written with space before its colon looks
# (an escaped \" in a string before " :" looks so too, which only sends the text to the hook).
_SPACED_KEY = re.compile(r'"[ \t\n\r]+:')


def _spaced_key(text: str) -> bool:
    """Whether a key may be written with white space before its colon in `text` (`_SPACED_KEY`).
    The regular expression runs only on a text with white space right before a colon, found by
    substring searches first: a line break, tab or carriage return stands raw only between tokens
    (a string escapes it), so a compact answer has none, and a space before a colon is rare."""
    spaced = (" :" in text or ("\n" in text and "\n:" in text) or ("\t" in text and "\t:" in text)
              or ("\r" in text and "\r:" in text))
    return spaced and _SPACED_KEY.search(text) is not None


def _decoded(text: str) -> tuple[Any, int, list[str]]:
    """`text`'s leading JSON value, where it ends and the keys written twice in one of its objects,
    as `_hooked` reads them, without a Python call per object (a hook cost the guard a third of
    its time on a 50-chunk answer). Duplicates are ruled out by counting, in C: when no key is
    written with white space before its colon (`_spaced_key`), a text holds at least as many
    `_KEY_END`s as it writes keys; a text holds at least as many colons as it writes keys (each
    key has its own); it writes at least as many keys as its objects hold. So when either count
    equals the keys of the objects at an answer's two levels (`_sizes`, a part of all of them),
    every object holds every key written in it. The first count settles most answers (a colon in
    a reason, "Series: Flea Control", spoils the second). Anything else (counts that differ, a
    spaced key, a decoding error, another shape) is decoded again with the hook, which names the
    duplicates and raises the error the caller reports. (A regular expression for the keys cost
    more than the hook it saved.)"""
    try:
        obj, end = _PLAIN_DECODER.raw_decode(text)
    except (ValueError, RecursionError):
        return _hooked(text)
    size = _sizes(obj)
    if size is not None and ((text.count(_KEY_END, 0, end) == size and not _spaced_key(text))
                             or text.count(":", 0, end) == size):  # each key has a colon of its own
        return obj, end, []
    return _hooked(text)


def _sizes(obj: Any) -> int | None:
    """The keys of a top-level object and of the objects in its arrays (an answer's whole shape),
    or None for an object holding anything else that is a container (then `_decoded` uses the
    hook: a duplicate could hide in it)."""
    if type(obj) is not dict:
        return None
    size = len(obj)
    for value in obj.values():
        if type(value) is list:
            if value and set(map(type, value)) != {dict}:
                return None
            size += sum(map(len, value))
        elif type(value) is dict:
            return None
    return size


def _hooked(text: str) -> tuple[Any, int, list[str]]:
    """`_decoded` with a hook on every object, naming each key written twice."""
    hook = _DuplicateKeys()
    obj, end = json.JSONDecoder(object_pairs_hook=hook, parse_constant=_reject_constant).raw_decode(text)
    return obj, end, hook.found


def parse_output(raw: str) -> tuple[dict[str, Any] | None, list[Violation]]:
    """Strict parse: one JSON object, nothing before or after it (surrounding whitespace aside)."""
    if not isinstance(raw, str):
        return None, [Violation(path="$", message=f"output must be text, got {type(raw).__name__}")]
    text = raw.strip()
    if not text:
        return None, [Violation(path="$", message="output is empty")]
    if not text.startswith("{"):
        return None, [Violation(path="$", message=_leading_problem(text))]
    try:
        obj, end, duplicates = _decoded(text)
    except json.JSONDecodeError as exc:
        what = exc.msg.removesuffix(" at")  # "Unterminated string starting at" + " at char N"
        if exc.pos >= len(text) - 1 or "Unterminated" in exc.msg:
            msg = f"output is truncated or unterminated JSON ({what} at char {exc.pos})"
        else:
            msg = f"not valid JSON: {what} at line {exc.lineno} column {exc.colno}"
        return None, [Violation(path="$", message=msg)]
    except ValueError as exc:  # NaN / Infinity, or an integer with thousands of digits
        return None, [Violation(path="$", message=_value_message(exc))]
    except RecursionError:
        return None, [Violation(path="$", message="JSON nested too deeply")]
    violations: list[Violation] = []
    rest = text[end:].strip()
    if rest:
        violations.append(Violation(path="$", message=f"text after the JSON object: {rest[:40]!r}"))
    if duplicates:
        keys = sorted(set(duplicates))
        violations.append(Violation(path="$", message=f"duplicate keys in an object: {keys}"))
    return obj, violations


_validator: list[Draft202012Validator] = []


def _output_validator() -> Draft202012Validator:
    if not _validator:
        _validator.append(Draft202012Validator(load_schema("output")))
    return _validator[0]


def _json_path(parts: Sequence[Any]) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _schema_message(err: Any) -> str:
    if err.validator == "additionalProperties" and isinstance(err.instance, Mapping):
        allowed = list(err.schema.get("properties", {}))
        extra = [k for k in err.instance if k not in allowed]
        named = ", ".join(repr(k) for k in extra)
        return f"unknown key(s): {named} (allowed: {', '.join(allowed)})"
    if err.validator == "type":
        try:
            shown = json.dumps(err.instance)[:40]
        except (TypeError, ValueError, RecursionError):
            shown = type(err.instance).__name__
        return f"must be {err.validator_value}, got {shown}"
    if err.validator in ("minimum", "maximum"):
        shown = str(err.instance)
        return f"score {shown if len(shown) <= 24 else shown[:21] + '...'} is outside [0, 1]"
    if err.validator in ("minLength", "pattern"):
        return "must be a non-empty string"
    if err.validator == "required":
        return err.message
    return err.message.replace("\n", " ")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _item_violations(
    section: str, i: int, item: Mapping[str, Any], texts: Mapping[str, str], ranked_ids: set[str],
    lim: Limits, quotable: _Quotable,
) -> list[Violation]:
    """Rules about one item's content that the schema cannot express."""
    out: list[Violation] = []
    path, cid, reason = f"$.{section}[{i}]", item["id"], item.get("reason")
    if section == "ranked":
        score = item.get("score")
        # Range first: math.isfinite overflows on an integer literal with hundreds of digits.
        if _is_number(score) and 0 <= score <= 1 and math.isfinite(score) and score <= lim.min_score:
            msg = f"score {score} is not above the minimum {lim.min_score}; such a chunk belongs in dropped"
            out.append(Violation(path=f"{path}.score", message=msg, value=score, id=cid))
        concrete = not isinstance(reason, str) or cid not in texts or cites_chunk(reason, texts[cid])
        if not concrete:
            msg = (f"reason {reason[:60]!r} cites nothing concrete from the chunk's text "
                   "(name a phrase, entity or claim)")
            out.append(Violation(path=f"{path}.reason", message=msg, value=reason, id=cid))
        elif isinstance(reason, str) and (bad := quotable.misquoted(cid, reason)):
            msg = quotable.refusal(cid, bad)
            out.append(Violation(path=f"{path}.reason", message=msg, value=reason, id=cid))
    elif isinstance(reason, str) and (target := reasons.redundant_target(reason)) is not None:
        if target not in ranked_ids:
            msg = f"{reason!r} must name a ranked id"
            out.append(Violation(path=f"{path}.reason", message=msg, value=reason, id=cid))
    elif isinstance(reason, str) and (bad := reasons.problem(reason)) is not None:
        # Free text is the model's to write; a listed token written another way is not
        # machine-readable any more (`below_min_score (0.1)`), so it is worth a re-ask.
        out.append(Violation(path=f"{path}.reason", message=bad, value=reason, id=cid))
    return out


def _plainly_conformant(obj: Any) -> bool:
    """Whether the one-pass path (`_plain_violations`) takes the object: the schema checked by
    hand for the common, valid case; False sends the object through jsonschema, which explains
    what is wrong."""
    return _plain_violations(obj, (), 1, as_limits(None), None) is not None


def _sections(obj: Any) -> tuple[list[Any], list[Any]] | None:
    """(ranked, dropped) of an object whose top level is plainly conformant, else None."""
    if type(obj) is not dict or not obj.keys() <= {"ranked", "dropped"}:
        return None
    ranked, dropped = obj.get("ranked"), obj.get("dropped", [])
    if type(ranked) is not list or type(dropped) is not list:
        return None
    return ranked, dropped


def output_violations(
    obj: Any,
    chunks: Sequence[Chunk],
    top_k: int,
    *,
    limits: Limits | None = None,
    query: str | None = None,
) -> list[Violation]:
    """Every way a parsed output object breaks the contract for these chunks (`query`: what a reason
    may quote besides its chunk)."""
    lim = as_limits(limits)
    plain = _plain_violations(obj, chunks, top_k, lim, query)
    return plain if plain is not None else _general_violations(obj, chunks, top_k, lim, query)


def _general_violations(obj: Any, chunks: Sequence[Chunk], top_k: int, lim: Limits, query: str | None
                        ) -> list[Violation]:
    """`output_violations` of any object: the schema's errors, then each item's."""
    out = [
        Violation(path=_json_path(err.absolute_path), message=_schema_message(err), value=err.instance)
        for err in _output_validator().iter_errors(obj)
    ]
    if not isinstance(obj, Mapping):
        return out
    texts = {c.id: c.text for c in chunks}
    quotable = _Quotable(chunks, query)
    folded: dict[str, str] = {}
    for cid in texts:
        folded.setdefault(_fold(cid), cid)
    seen: dict[str, str] = {}
    ranked = obj.get("ranked") if isinstance(obj.get("ranked"), list) else []
    dropped = obj.get("dropped") if isinstance(obj.get("dropped"), list) else []
    ranked_ids = {it["id"] for it in ranked if isinstance(it, Mapping) and isinstance(it.get("id"), str)}
    for section, items in (("ranked", ranked), ("dropped", dropped)):
        for i, item in enumerate(items):
            if not isinstance(item, Mapping) or not isinstance(item.get("id"), str):
                continue
            path, cid = f"$.{section}[{i}]", item["id"]
            if cid not in texts:
                near = folded.get(_fold(cid))
                hint = _near_hint(cid, near)
                out.append(Violation(path=f"{path}.id", message=f"{cid!r} is not an input id{hint}",
                                     value=cid, id=cid))
            if cid in seen:
                msg = f"id {cid!r} appears twice (first at {seen[cid]})"
                out.append(Violation(path=f"{path}.id", message=msg, value=cid, id=cid))
            else:
                seen[cid] = path
            out.extend(_item_violations(section, i, item, texts, ranked_ids, lim, quotable))
    if len(ranked) > top_k:
        msg = f"{len(ranked)} ranked items is more than top_k={top_k}"
        out.append(Violation(path="$.ranked", message=msg, value=len(ranked)))
    return _unique(out)


def _plain_violations(obj: Any, chunks: Sequence[Chunk], top_k: int, lim: Limits, query: str | None
                      ) -> list[Violation] | None:
    """`output_violations` of a plainly conformant object in one pass over its items; None for
    any other object, which takes the general path. The same violations in the same order: an
    item's unknown id, its repeated id, then its own rules.

    Each item is checked against the schema here, in the loop (each item of each answer passes
    here; a function per item cost a call each): a ranked item holds a non-empty string id, a
    non-blank string reason (str.isspace reads the same Unicode property as the schema's `\\S`),
    a number score in [0, 1] and at most a string diversity note besides; a dropped item exactly
    a non-empty string id and a non-blank string reason. The required keys are read by subscript
    (a missing one refuses the item; with them there, three keys hold nothing else), not by
    `dict.get`'s method calls or set comparisons of the keys, which cost several times more."""
    sections = _sections(obj)
    if sections is None:
        return None
    ranked, dropped = sections
    out: list[Violation] = []
    quotable = _Quotable(chunks, query)
    texts = quotable.chunks  # id -> chunk, one map for the id, citation and quotation checks
    folded: dict[str, str] | None = None
    seen: dict[str, int] = {}  # id -> where it was first: its index, dropped ones after the ranked
    floor = lim.min_score
    for i, item in enumerate(ranked):
        if type(item) is not dict:
            return None
        try:
            cid, reason, score = item["id"], item["reason"], item["score"]
        except KeyError:
            return None
        size = len(item)
        if not (type(cid) is str and cid != "" and type(reason) is str and reason != ""
                and not reason.isspace() and (type(score) is float or type(score) is int) and 0 <= score <= 1
                and (size == 3 or (size == 4 and type(item.get("diversity_note")) is str))):
            return None
        chunk = texts.get(cid)
        if chunk is None or cid in seen:
            folded = _id_violations(out, "ranked", i, cid, texts, seen, len(ranked), folded)
        else:
            seen[cid] = i
        if score <= floor:
            msg = f"score {score} is not above the minimum {floor}; such a chunk belongs in dropped"
            out.append(Violation(path=f"$.ranked[{i}].score", message=msg, value=score, id=cid))
        if chunk is None:
            continue  # an unknown id: its violation above says so; nothing to cite or quote
        text = chunk.text
        # `cites_chunk`'s two tests asked here (a call less per item; most reasons pass the first)
        if not _shares_stem(reason, text) and not _shares_run(reason, text):
            msg = (f"reason {reason[:60]!r} cites nothing concrete from the chunk's text "
                   "(name a phrase, entity or claim)")
            out.append(Violation(path=f"$.ranked[{i}].reason", message=msg, value=reason, id=cid))
        elif bad := quotable.chunk_misquoted(chunk, reason):
            msg = quotable.refusal(cid, bad)
            out.append(Violation(path=f"$.ranked[{i}].reason", message=msg, value=reason, id=cid))
    ranked_ids = set(seen)  # every ranked item's id went into `seen`, and nothing else yet
    # Models give many dropped chunks one reason ("off topic", "outside top_k"): what it says (the
    # id a `redundant_with:` names, else its grammar problem) is read once per answer.
    readings: dict[str, tuple[str | None, str | None]] = {}
    for i, item in enumerate(dropped):
        if type(item) is not dict or len(item) != 2:
            return None
        try:
            cid, reason = item["id"], item["reason"]
        except KeyError:
            return None
        if not (type(cid) is str and cid != "" and type(reason) is str and reason != ""
                and not reason.isspace()):
            return None
        if cid not in texts or cid in seen:
            folded = _id_violations(out, "dropped", i, cid, texts, seen, len(ranked), folded)
        else:
            seen[cid] = len(ranked) + i
        reading = readings.get(reason)
        if reading is None:
            target = reasons.redundant_target(reason)
            reading = readings[reason] = (target, None if target is not None else reasons.problem(reason))
        target, bad = reading
        if target is not None:
            if target not in ranked_ids:
                msg = f"{reason!r} must name a ranked id"
                out.append(Violation(path=f"$.dropped[{i}].reason", message=msg, value=reason, id=cid))
        elif bad is not None:
            out.append(Violation(path=f"$.dropped[{i}].reason", message=bad, value=reason, id=cid))
    if len(ranked) > top_k:
        msg = f"{len(ranked)} ranked items is more than top_k={top_k}"
        out.append(Violation(path="$.ranked", message=msg, value=len(ranked)))
    return _unique(out) if out else out


def _id_violations(out: list[Violation], section: str, i: int, cid: str, texts: Mapping[str, Any],
                   seen: dict[str, int], n_ranked: int, folded: dict[str, str] | None
                   ) -> dict[str, str] | None:
    """An item's unknown id (with the hint of the input id it may have meant) and its repeated id,
    for `_plain_violations`; returns the folded ids, made on the first unknown one."""
    path = f"$.{section}[{i}]"
    if cid not in texts:
        if folded is None:
            folded = {}
            for known in texts:
                folded.setdefault(_fold(known), known)
        hint = _near_hint(cid, folded.get(_fold(cid)))
        out.append(Violation(path=f"{path}.id", message=f"{cid!r} is not an input id{hint}",
                             value=cid, id=cid))
    if cid in seen:
        first = seen[cid]
        where = f"$.ranked[{first}]" if first < n_ranked else f"$.dropped[{first - n_ranked}]"
        msg = f"id {cid!r} appears twice (first at {where})"
        out.append(Violation(path=f"{path}.id", message=msg, value=cid, id=cid))
    else:
        seen[cid] = i if section == "ranked" else n_ranked + i
    return folded


def _unique(violations: list[Violation]) -> list[Violation]:
    """Each (path, message) once, first occurrence kept: two schema rules can fail one field with
    the same wording (an empty reason breaks both minLength and the non-blank pattern), and a
    repeated line reads like two problems."""
    seen: set[tuple[str, str]] = set()
    out: list[Violation] = []
    for v in violations:
        if (v.path, v.message) not in seen:
            seen.add((v.path, v.message))
            out.append(v)
    return out


def judge(
    raw: str, chunks: Sequence[Chunk], top_k: int, limits: Limits | None = None, query: str | None = None
) -> tuple[dict[str, Any] | None, list[Violation]]:
    """Parse and check in one go: (object or None, every violation)."""
    obj, violations = parse_output(raw)
    if obj is not None:
        violations += output_violations(obj, chunks, top_k, limits=limits, query=query)
    return obj, violations


def check_output(
    raw: str, chunks: ChunkSource, top_k: int, limits: Limits | Mapping[str, Any] | None = None,
    query: str | None = None,
) -> dict[str, Any]:
    """The validated object, or an `OutputError` carrying every violation.

    `chunks` takes every form `rerank()` takes (JSONL text, a path, a list of dicts or `Chunk`s),
    through the input guard, so a caller checking an answer needs no extra parsing step. Bad
    chunks or a bad `top_k` (a string, 0, a bool) are the caller's mistake, not the model's: an
    `InputError`, raised before the output is judged. With `query`, a reason may quote the query as
    well as its chunk.
    """
    lim = as_limits(limits)
    top_k = normal_top_k(top_k)
    problems = top_k_violations(top_k)
    parsed: list[Chunk] = []
    if isinstance(chunks, (list, tuple)) and chunks and all(isinstance(c, Chunk) for c in chunks):
        parsed = list(chunks)  # already through the guard (parse_chunks / validate_request)
    else:
        try:
            parsed = parse_chunks(chunks, limits=lim)
        except InputError as exc:
            problems.extend(exc.violations)
    if problems:
        raise InputError(problems)
    obj, violations = judge(raw, parsed, top_k, limits=lim, query=query)
    if violations or obj is None:
        raise OutputError(violations, raw=raw)
    return obj
