"""Evidence for long chunks: the passages of a chunk that answer the query, within a token budget.

Why not the first N tokens. Rerankers that cut every document to its head (Cohere's and vLLM's
`max_tokens_per_doc`) lose the answer whenever it sits in the middle: on SciFact, where each
claim's rationale sentences are marked in the abstract, the first 128 tokens hold a complete
rationale for a fifth of the pairs. A chunk over its budget is shown instead as its most
query-relevant passages, in document order, joined by a visible elision mark (`ELISION`), so the
model sees where text was left out and never reads two passages as one sentence.

How passages are chosen (`select`), computed once per (query, text, budget, scorer) and memoised:

* **Units.** Prose is cut into sentences (`sentences`). Text without sentence structure (code,
  tables, lists: most of its characters are not in lines ending a sentence) is cut into lines,
  and chosen as contiguous *windows* of lines (a function with its body, a table row with its
  neighbours) rather than as scattered lines. A unit longer than the budget is cut into word
  windows, so a budget is always met.
* **Relevance.** Each unit is scored by the lexical scorer the local backend uses (BM25 over the
  chunk's units, `backends.terms.lexical_scores`: idf within the chunk, so words present
  everywhere in it do not tell units apart) plus the static MiniLM table's token match (each query
  token's best match in the unit, weighted by rarity, as the local backend's default profile
  reads text), plus, when the session embeds with a model (sentence-transformers), that model's
  cosine of query and unit (`Scorer`, `Weights`). A unit also takes a share of its best
  neighbour's score (a finding often spans two sentences).
* **Choice.** Units are taken best first while they fit, each gap between kept passages paying
  for its elision mark; a unit adjacent to a kept one costs no mark. What is kept is shown in
  document order. The count of tokens is the caller's (`count`: the package's one estimator, or
  the model's tokenizer), and the shown text is counted again as a whole before it is returned.

Guarantees (property-tested on arbitrary Unicode): every passage is `text[start:end]` with
0 <= start < end <= len(text), passages are in order and do not overlap, the shown text is the
passages joined by `ELISION` (exactly the text when nothing was cut), and it is never longer than
the original in characters or tokens.

This module imports only leaves (text words, the lexical scorer, the static table); the engine,
the guard and the scored backends read its `Evidence`.
"""

from __future__ import annotations

import bisect
import re
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .backends.terms import lexical_scores
from .tokens import estimate_tokens

ELISION = " […] "
"""What stands between two kept passages: visible to a reader and to the model, and never inside
a quotation the guard accepts (a quote is checked passage by passage)."""

MIN_TOKENS_PER_CHUNK = 16
"""The smallest budget a chunk may be given: below it no sentence of ordinary prose fits."""

TokenCounter = Callable[[str], int]


def chars_per_token(text: str) -> int:
    """The simplest estimate (characters / 4, rounded up): what the benchmarks' figures use."""
    return -(-len(text) // 4)


@dataclass(frozen=True)
class Passage:
    """A kept stretch of the original text, `text[start:end]`, with its relevance score."""

    start: int
    end: int
    score: float


@dataclass(frozen=True)
class Evidence:
    """What the model is shown of one chunk.

    `text` is the chunk itself when it fits its budget (`shortened` False, one passage spanning
    it); otherwise the kept `passages` joined by `ELISION`. `best` is the passage holding the
    highest-scoring unit (what a scored backend's score is read from). `mode` is `whole`,
    `sentences` or `windows`."""

    text: str
    passages: tuple[Passage, ...]
    tokens_before: int
    tokens_after: int
    budget: int
    mode: str
    best: Passage | None

    @property
    def shortened(self) -> bool:
        return self.mode != "whole"

    def passage_texts(self, original: str) -> list[str]:
        """The kept passages as text (a quotation must lie inside one of them)."""
        return [original[p.start:p.end] for p in self.passages]

    def to_dict(self) -> dict[str, Any]:
        """For `meta.evidence`: tokens before and after and the kept spans of the original."""
        return {"tokens_before": self.tokens_before, "tokens_after": self.tokens_after, "budget": self.budget,
                "mode": self.mode, "passages": [[p.start, p.end] for p in self.passages],
                "best": None if self.best is None else [self.best.start, self.best.end]}


# --------------------------------------------------------------------------- units

# A sentence ends at . ! ? … (and their full-width forms), possibly followed by closing quotes or
# brackets, then white space; or at a CJK full stop with or without space; or at a blank line / line
# break (a heading, a list item). Not after a lone capital initial ("J. Smith"), a common
# abbreviation or a number's dot ("Fig. 2", "et al.", "e.g.").
# A full stop with no space after it, between a lower-case word (or a number, a bracket) and a
# capitalised one: text pasted from PDFs and abstracts ("...the DCIS phenotype.DCIS and IDC...").
# Zero-width, so the stop stays with its sentence. Not in "U.S.A" (capital before the stop),
# "3.5", "Node.js" or "example.com" (no capital after), nor in an abbreviation,
# an initial, a URL, an address or a dotted name ("e.g.The", "www.Example.org": `_glued_break`).
_GLUED = re.compile(r"(?<=[a-z0-9)\]%]\.)(?=[A-Z][A-Za-z])")
_ABBREVIATIONS = frozenset("""
al e.g i.e etc vs fig figs eq eqs ref refs no nos vol approx ca cf dr mr mrs ms prof st jr sr inc ltd co
resp sec chap ed eds pp p ph.d dept univ jan feb mar apr jun jul aug sep sept oct nov dec
""".split())  # noqa: SIM905 (a word list reads better as text)
_SENTENCE_LINE = re.compile(r"""[.!?…。！？]["'”’)\]]*\s*$""")
# An indented line: a block's body in code, a nested key in YAML or JSON, a docstring's line.
_INDENTED = re.compile(r"^(?:\t| {2})")
_WORD_RUN = re.compile(r"\S+")


_OPENER = re.compile(r"[:{\[(]\s*$")


def _is_nested(text: str, line_spans: Sequence[tuple[int, int]]) -> bool:
    """Whether the lines are laid out as nested blocks, as code and configuration are: a line ending
    in `:`, `{`, `[` or `(` followed by a more indented one (a `def`, a YAML key, a JSON object), or
    three or more levels of indentation. Uniformly indented prose (paragraphs with an indented first
    line) is not."""
    widths = [len(text[a:b]) - len(text[a:b].lstrip(" \t")) for a, b in line_spans]
    if len(set(widths)) >= 3:
        return True
    return any(_OPENER.search(text[a:b]) and widths[k + 1] > widths[k]
               for k, (a, b) in enumerate(line_spans[:-1]))


def _is_sentence_line(line: str, nested: bool) -> bool:
    """Whether a line ends a sentence and reads as prose: it ends with a sentence mark and, in text
    laid out as nested blocks, is not indented (a docstring's last line ends with a full stop too)."""
    return bool(_SENTENCE_LINE.search(line)) and not (nested and _INDENTED.match(line))


# --------------------------------------------------------------------------- grapheme clusters

_ZWJ = "\u200d"


def _hangul(ch: str) -> str:
    """The Hangul syllable type of `ch` (L, V, T, LV, LVT) or '' (UAX #29's GB6-GB8)."""
    cp = ord(ch)
    if 0x1100 <= cp <= 0x115F or 0xA960 <= cp <= 0xA97C:
        return "L"
    if 0x1160 <= cp <= 0x11A7 or 0xD7B0 <= cp <= 0xD7C6:
        return "V"
    if 0x11A8 <= cp <= 0x11FF or 0xD7CB <= cp <= 0xD7FB:
        return "T"
    if 0xAC00 <= cp <= 0xD7A3:
        return "LV" if (cp - 0xAC00) % 28 == 0 else "LVT"
    return ""


def _extends(ch: str) -> bool:
    """A character that belongs to the cluster before it: a combining or spacing mark (accents,
    Indic and Thai vowel signs), the zero-width joiner, a variation selector, an emoji modifier
    (skin tone) or a tag character (subdivision flags)."""
    cp = ord(ch)
    return (unicodedata.category(ch) in {"Mn", "Me", "Mc"} or ch == _ZWJ or 0xFE00 <= cp <= 0xFE0F
            or 0x1F3FB <= cp <= 0x1F3FF or 0xE0020 <= cp <= 0xE007F or 0xE0100 <= cp <= 0xE01EF
            or cp in (0x0E33, 0x0EB3, 0x200C, 0xFF9E, 0xFF9F))


def _is_regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def _pictographic(ch: str) -> bool:
    cp = ord(ch)
    return 0x1F000 <= cp <= 0x1FAFF or 0x2600 <= cp <= 0x27BF or unicodedata.category(ch) == "So"


def _cluster_boundary(text: str, i: int) -> bool:
    """Whether a cut at `i` leaves every user-perceived character (grapheme cluster) whole: the
    common rules of UAX #29 (marks and joiners stay with their base, an emoji ZWJ sequence and a
    flag's two regional indicators stay together, CR LF and Hangul jamo too, a virama joins the next
    letter). Not all of it: prepend marks, the finer Indic conjunct rules and characters newer than
    Python's Unicode tables are not known; where unsure it keeps characters together, which only
    moves a cut a character further."""
    if i <= 0 or i >= len(text):
        return True
    before, after = text[i - 1], text[i]
    if after < "\x80":  # an ASCII character after the cut starts a cluster unless it is LF after CR
        return not (before == "\r" and after == "\n")
    if before == "\r" and after == "\n":
        return False
    if before in "\r\n" or after in "\r\n":
        return True
    if _extends(after):
        return False
    if before == _ZWJ and _pictographic(after):
        return False
    if _is_regional(before) and _is_regional(after):
        run = 0
        k = i - 1
        while k >= 0 and _is_regional(text[k]):
            run += 1
            k -= 1
        return run % 2 == 0
    h, g = _hangul(before), _hangul(after)
    if h and g and ((h == "L" and g in {"L", "V", "LV", "LVT"}) or (h in {"LV", "V"} and g in {"V", "T"})
                    or (h in {"LVT", "T"} and g == "T")):
        return False
    # a virama joining two consonants (Devanagari क्ष) is one cluster too
    return not (unicodedata.combining(before) == 9 and unicodedata.category(after) == "Lo")


def _next_boundary(text: str, i: int) -> int:
    """`i`, or the first position after it where a cut leaves every grapheme cluster whole."""
    while not _cluster_boundary(text, i):
        i += 1
    return i


def _whole_clusters(text: str, spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """`spans` with each end moved forward to a grapheme cluster boundary (a start inside a cluster
    leaves its first marks to the gap before, an end inside one takes the rest of it); consecutive
    spans stay in order without overlap, and a span left empty is dropped."""
    if text.isascii():  # spans start and end next to a printing character: never inside CR LF
        return list(spans)
    out: list[tuple[int, int]] = []
    for a, b in spans:
        a, b = _next_boundary(text, a), _next_boundary(text, b)
        if out and a < out[-1][1]:
            a = out[-1][1]
        if a < b:
            out.append((a, b))
    return out


def _is_break(text: str, start: int, dot: int) -> bool:
    """Whether the full stop at `dot` ends the sentence begun at `start`: not after a common
    abbreviation or a lone letter (an initial). Only the last word is read (a few characters)."""
    words = text[max(start, dot - 24):dot].split()
    if not words:
        return True
    word = words[-1].lstrip("([\"'“‘").lower()
    return not (word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()))


def _glued_break(text: str, start: int, dot: int) -> bool:
    """Whether a full stop with a capital right after it (`_GLUED`) ends a sentence: as `_is_break`,
    and neither the word before it nor the one after is part of a URL, an address or a dotted name
    ("www.Example.org", "user@Host.com", "Example.Com/path")."""
    before = text[max(start, dot - 40):dot].split()
    after = text[dot + 1:dot + 41].split()
    word_before, word_after = (before[-1] if before else ""), (after[0] if after else "")
    if (any(c in word_before + word_after for c in "/@\\") or word_before.lower().startswith("www")
            or re.search(r"\.[a-z]", word_after)):
        return False
    return _is_break(text, start, dot)


# Where a sentence may end: white space after an end mark (and at most one closing quote or
# bracket), a CJK full stop (and the white space after it), or white space holding a line break.
# Each alternative starts with a character class, so the scan skips ordinary text quickly: the
# spaces before a line break are taken back in `_ends`, not matched (a pattern starting with white
# space would be tried at every space between two words).
_CANDIDATE = re.compile(r"""(?P<stop>[.!?…]["'”’)\]]?)(?P<ws>\s+)|[。！？]\s*|\n\s*""")


def _ends(text: str) -> list[tuple[int, int, bool]]:
    """The places where a sentence may end, in order, as (end, next start, after a full stop):
    `_CANDIDATE`, and a full stop glued to the next sentence (`_GLUED`). An end after a full stop
    is confirmed by `_is_break` / `_glued_break` (abbreviations, initials)."""
    found: list[tuple[int, int, bool]] = []
    for m in _CANDIDATE.finditer(text):
        stop = m.group("stop")
        if stop is not None:
            s = m.start("ws")
            found.append((s, m.end(), stop == "." and "\n" not in m.group("ws")))
        elif text[m.start()] in "。！？":
            found.append((m.start() + 1, m.end(), False))
        else:  # a line break, with the white space before it (no match ends in white space)
            start = m.start()
            while start and text[start - 1] != "\n" and text[start - 1].isspace():
                start -= 1
            found.append((start, m.end(), False))
    glued = [(m.start(), m.start(), True) for m in _GLUED.finditer(text)]
    return sorted(found + glued) if glued else found


def sentences(text: str) -> list[tuple[int, int]]:
    """Spans of the sentences of `text` (white space between them left out), in order."""
    spans: list[tuple[int, int]] = []
    start = 0
    for end, after, full_stop in _ends(text):
        if end <= start:
            start = max(start, after)
            continue
        if full_stop:
            glued = end == after
            if not (_glued_break(text, start, end - 1) if glued else _is_break(text, start, end - 1)):
                continue
        spans.append((start, end))
        start = after
    if start < len(text):
        spans.append((start, len(text)))
    return _whole_clusters(text, [(a, b) for a, b in spans if text[a:b].strip()])


def lines(text: str) -> list[tuple[int, int]]:
    """Spans of the non-blank lines of `text`, without their line breaks."""
    spans: list[tuple[int, int]] = []
    start = 0
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
        if body.strip():
            spans.append((start, start + len(body)))
        start += len(line)
    return spans


def has_prose(text: str, spans: Sequence[tuple[int, int]]) -> bool:
    """Whether `text` reads as prose: most of its characters are in lines that end a sentence
    (code, tables and lists end their lines with anything else, or hold no sentence at all)."""
    line_spans = lines(text)
    if len(line_spans) <= 1:  # one paragraph: prose if it has sentence ends at all
        return len(spans) > 1 or bool(_SENTENCE_LINE.search(text))
    total = sum(b - a for a, b in line_spans)
    nested = _is_nested(text, line_spans)
    ended = sum(b - a for a, b in line_spans if _is_sentence_line(text[a:b], nested))
    return ended * 2 >= total


def _at_most(text: str) -> int:
    """An upper bound of both of the package's own counts of `text` (`chars_per_token` and
    `tokens.estimate_tokens`): its UTF-8 bytes (the bound `shortening.most_tokens` explains)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _fits(text: str, limit: int, count: TokenCounter) -> bool:
    """`count(text) <= limit`, without counting when the byte bound already says so (only for the
    package's own counters: a caller's tokenizer is not bounded by bytes)."""
    if (count is chars_per_token or count is estimate_tokens) and _at_most(text) <= limit:
        return True
    return count(text) <= limit


def _longest(fits: Callable[[int], bool], lo: int, hi: int, guess: int) -> int:
    """The largest k in [lo, hi) with `fits(k)`, given `fits(lo)` and that fitting stops once it
    fails (a longer window never counts fewer tokens): galloping from `guess`, then bisection, so
    a window costs a few counts of about its own length, not one count per word."""
    guess = min(max(guess, lo), hi - 1)
    if fits(guess):
        lo, step = guess, 1
        while lo + step < hi and fits(lo + step):
            lo += step
            step *= 2
        hi = min(lo + step, hi)
    else:
        hi, step = guess, 1
        while hi - step > lo and not fits(hi - step):
            hi -= step
            step *= 2
        lo = max(lo, hi - step)
    while hi - lo > 1:  # fits(lo), and hi fails or is the end
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _split_long(text: str, span: tuple[int, int], limit: int, count: TokenCounter) -> list[tuple[int, int]]:
    """`span` cut into consecutive word windows of at most `limit` tokens each (a word longer than
    that is cut by characters, between grapheme clusters; a single cluster over the limit stays whole
    and the choice leaves it out).

    Linear in the length of the span: each word is counted once (with the white space before it) to
    place a window's end, and the window is then counted as a whole, a few times at most, to move
    the end to where the counter itself says the window is full. The counter decides, so the limit
    holds for any counter, including a tokenizer whose counts of pieces do not add up."""
    a, b = span
    whole = text[a:b]
    if (count is chars_per_token or count is estimate_tokens) and _at_most(whole) <= limit:
        return [span]
    total = count(whole)
    if total <= limit:
        return [span]
    chars = limit * (b - a) / total  # characters a window of `limit` tokens holds, on average here
    words = [m.span() for m in _WORD_RUN.finditer(text, a, b)]
    ends = [we for _, we in words]
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(words):
        ws = words[i][0]
        if not _fits(text[ws:words[i][1]], limit, count):
            out.extend(_split_word(text, words[i], limit, count))
            i += 1
            continue
        guess = bisect.bisect_right(ends, ws + chars) - 1
        j = _longest(lambda k, ws=ws: _fits(text[ws:words[k][1]], limit, count), i, len(words), guess)
        out.append((ws, words[j][1]))
        i = j + 1
    return _whole_clusters(text, out)


def _split_word(text: str, word: tuple[int, int], limit: int, count: TokenCounter) -> list[tuple[int, int]]:
    """One very long "word" cut into the longest pieces that fit, each ending between grapheme
    clusters; a piece's end is first guessed at `limit` characters (a token is rarely shorter)."""
    lo, we = word
    out: list[tuple[int, int]] = []
    while lo < we:
        hi = _longest(lambda k, lo=lo: _fits(text[lo:k], limit, count), lo + 1, we + 1, lo + limit)
        cut = hi
        while cut > lo and not _cluster_boundary(text, cut):
            cut -= 1
        if cut == lo:  # one cluster over the limit: kept whole as its own unit
            cut = _next_boundary(text, hi)
        out.append((lo, cut))
        lo = cut
    return out


# --------------------------------------------------------------------------- relevance


# Discourse cues (English). A sentence that *poses* the question (a question, an aim: "to assess
# whether", "we investigated", "the aim of") or states what is *not known* ("it is unclear",
# "remains", "little is known") restates the query's words without answering it: it is what most
# often outscores the answer on word overlap alone. Digits mark a sentence reporting a finding (a
# measurement, a date, a count). None of them reads a position or a section label (the section cues below do).
_ASK_START = re.compile(
    r"\W*(?:[A-Z]+\s+)?(?:to|we)\s+(?:assess|evaluate|determine|investigate|examine|test|compare|explore"
    r"|describe|identify|estimate|aimed|sought|investigated|examined|asked|tested|hypothesi[sz]ed)\b",
    re.IGNORECASE)
_ASK_ANYWHERE = re.compile(
    r"\?[\"'”’)\]]*\s*$|\bwhether\b|\b(?:aim|aims|objective|purpose|goal)\s+(?:of|was|is)\b", re.IGNORECASE)
_GAP = re.compile(r"\b(?:unclear|unknown|remains?|little is known|not (?:yet )?(?:known|clear|understood)"
                  r"|poorly understood)\b", re.IGNORECASE)
_DIGIT = re.compile(r"\d")
# Literal words one of which each searching pattern needs: a C-speed `in` test skips the regex
# for most units (a regex scan of a sentence costs about as much as the rest of its score).
_ASK_WORDS = ("?", "whether", "aim", "objective", "purpose", "goal")
_GAP_WORDS = ("unclear", "unknown", "remain", "little is known", "not", "poorly understood")


def _cues(unit: str) -> tuple[bool, bool, bool]:
    """Whether `unit` poses the question, says what is not known, holds a digit."""
    folded = unit.casefold()
    asks = bool(_ASK_START.match(unit)) or (any(w in folded for w in _ASK_WORDS)
                                            and bool(_ASK_ANYWHERE.search(unit)))
    unknown = any(w in folded for w in _GAP_WORDS) and bool(_GAP.search(unit))
    return asks, unknown, bool(_DIGIT.search(unit))


# Section headings of structured documents (a structured abstract's OBJECTIVE ... RESULTS ...
# CONCLUSIONS, a report's "## Results", "Methods:"): a unit under a heading that reports findings
# and one under a heading that sets the study up. A heading is an upper-case label at the start of
# a unit ("RESULTS Mean age was ..."), a Markdown heading, or a known label followed by a colon.
_HEADING = re.compile(r"\s*(?:#{1,6}\s*(?P<md>[^\n]{2,60}?)\s*(?:\n|$)"
                      r"|(?P<caps>[A-Z]{4,}(?:[ ,/&]+[A-Z]{2,})*)(?=[\s:]|$)"
                      r"|(?P<colon>[A-Za-z]+(?: [A-Za-z]+){0,3}):)")
_FINDING_LABELS = ("result", "finding", "conclusion", "interpretation", "discussion", "summary")
_SETUP_LABELS = ("objective", "background", "method", "context", "design", "setting", "purpose", "aim",
                 "introduction", "importance", "participant", "patient", "intervention", "measure",
                 "data source", "subject", "study selection", "exposure", "registration", "funding")


def _section(unit: str) -> str | None:
    """`findings`, `setup`, or None: what the heading opening `unit` announces, if it opens with one
    (a label naming both, "METHODS AND FINDINGS", reports findings)."""
    m = _HEADING.match(unit)
    if m is None:
        return None
    label = (m.group("md") or m.group("caps") or m.group("colon") or "").lower()
    if any(w in label for w in _FINDING_LABELS):
        return "findings"
    if any(w in label for w in _SETUP_LABELS):
        return "setup"
    return None


def _sections(units: Sequence[str]) -> tuple[list[bool], list[bool]]:
    """Per unit, whether it lies under a findings heading and under a setup heading: a heading's
    section runs to the next heading (a unit opening with an unknown label keeps the current one)."""
    current: str | None = None
    findings: list[bool] = []
    setup: list[bool] = []
    for unit in units:
        current = _section(unit) or current
        findings.append(current == "findings")
        setup.append(current == "setup")
    return findings, setup


@dataclass(frozen=True)
class Weights:
    """How the signals of a unit add up, and how much of its best neighbour's score it takes.

    Provenance: a pairwise logistic model (scikit-learn `LogisticRegression`, C=0.01, no
    intercept, features scaled by their spread) over every (rationale sentence, other sentence)
    pair of the same abstract in the tuning half of the SciFact training pairs (even claim ids,
    288 pairs); the weights are its coefficients scaled so that `tokens` is 2 (only the order of
    a chunk's units matters). `python bench/evidence.py --fit` refits them and prints the
    candidate features with their weights and the tuning half's precision at one; the odd claim
    ids are only reported (docs/long-chunks.md). Features that were tried and left out (adding
    nothing on the tuning half, or reading a property of structured abstracts only): idf-weighted
    coverage of the query within the chunk, the share of the query's rarest words, matched query
    bigrams, a window density of matches, query numbers matched, sentence length, terms only one
    unit holds, the static mean-vector cosine (`semantic`, 0), and the sentence's position
    (`later`, 0 by default: see its note). The section cues (`findings`, `setup`) were the last
    fitted (`--fit`'s last line), with every other weight refitted beside them.

    * `lexical`, `tokens`: BM25 within the chunk and the static table's token match (rarity-weighted,
      and "folate" finds "folic"), as before the fit (0.5 and 2 then).
    * `asks`, `unknown`: a unit that poses the question or says what is not known (`_cues`) is
      lowered; `digits`: a unit holding a digit is raised a little.
    * `findings`, `setup`: a unit under a heading that reports findings (results, conclusions)
      is raised, one under a heading that sets the study up (objective, background, methods) is
      lowered (`_sections`). Read from the document's own headings, so text without any (most
      retrieved passages) is scored as without them: on the tuning half precision at one rose
      from 0.622 to 0.660, and on TREC DL19 padded nDCG@10 did not drop (docs/long-chunks.md).
      The other weights were refitted with them (lexical 1.03 -> 1.32, asks -0.84 -> -0.5,
      unknown -0.46 -> -0.45, digits 0.35 -> 0.3).
    * `later`: a prior for units late in the chunk (position 0 to 1). On SciFact abstracts,
      where findings follow the background, it adds about 0.05 to precision at one, but it is a
      property of that genre, not of retrieved chunks in general: on TREC DL19 with each passage
      padded at a random position it lowered nDCG@10 at every budget (docs/long-chunks.md), so
      it is off by default.
    * `model` is the weight of a session model's own cosine (sentence-transformers); on the
      tuning half it neither helped nor hurt, so it counts half."""

    lexical: float = 1.32
    tokens: float = 2.0
    semantic: float = 0.0
    neighbours: float = 0.25
    model: float = 0.5
    asks: float = -0.5
    unknown: float = -0.45
    digits: float = 0.3
    later: float = 0.0
    findings: float = 0.56
    setup: float = -0.56


DEFAULT_WEIGHTS = Weights()


class Scorer:
    """Scores units of a chunk for a query with the lexical scorer and the static table, plus a
    session model's own cosine when the session has one.

    `embedder` is the session's: `None`, `lexical` or `static` read text through the static MiniLM
    table only (as the local backend's default profile does); any other object with
    `embed(texts)` (a sentence-transformers model) adds its cosine of query and unit."""

    def __init__(self, embedder: Any = None, weights: Weights | None = None) -> None:
        name = getattr(embedder, "name", embedder if isinstance(embedder, str) else None)
        family = name.split(":")[0] if isinstance(name, str) else None
        static = embedder is None or family in {"lexical", "static"}
        self.embedder = None if static else embedder
        self.weights = weights = weights or DEFAULT_WEIGHTS
        self.identity = ("static" if static else str(name or type(embedder).__name__), weights)

    def signals(self, query: str, units: list[str], sections: bool = False) -> dict[str, np.ndarray]:
        """Each signal of each unit, by the name of its weight (`Weights`): what `__call__` adds
        up, and what `bench/evidence.py --fit` fits the weights on. `semantic` and `model` are
        present only when they count (their weight is set; a session model)."""
        from .embed.static import segment_match, vectors_and_match

        n = len(units)
        cues = np.array([_cues(u) for u in units], dtype=np.float64).reshape(n, 3)
        out = {"lexical": np.asarray(lexical_scores(query, units)[0], dtype=np.float64),
               "tokens": np.asarray(segment_match(query, units), dtype=np.float64),
               **dict(zip(("asks", "unknown", "digits"), cues.T, strict=True)),
               "later": np.arange(n, dtype=np.float64) / max(n - 1, 1)}
        if self.weights.findings or self.weights.setup or sections:
            found, setup = _sections(units)
            out["findings"] = np.array(found, dtype=np.float64)
            out["setup"] = np.array(setup, dtype=np.float64)
        if self.weights.semantic:  # the mean vectors cost more than the rest together: only when they count
            vectors = vectors_and_match(query, units)[0]
            out["semantic"] = np.asarray(vectors[1:] @ vectors[0], dtype=np.float64)
        if self.embedder is not None and self.weights.model:
            own = np.asarray(self.embedder.embed([query, *units]), dtype=np.float32)
            out["model"] = np.asarray(own[1:] @ own[0], dtype=np.float64)
        return out

    def __call__(self, query: str, units: list[str]) -> np.ndarray:
        """Relevance of each unit to `query` (larger is better; comparable within one chunk only).
        The matching signals (lexical, tokens, semantic, model) add up to the unit's match; a unit
        whose match is 0 (no query word, no token of the table near any query token) scores 0
        whatever its cues, and one matching anything scores above 0 (the cues are offset by their
        most negative sum), so the choice still stops at units that match nothing."""
        w = self.weights
        found = self.signals(query, units)
        matching = ("lexical", "tokens", "semantic", "model")
        score = sum((getattr(w, k) * found[k] for k in matching if k in found), np.zeros(len(units)))
        cue_names = ("asks", "unknown", "digits", "later", "findings", "setup")
        cues = sum((getattr(w, k) * found[k] for k in cue_names if k in found), np.zeros(len(units)))
        # The section cues move the floor only in a chunk with a heading: text without any (most
        # retrieved passages) is scored exactly as with their weights at 0.
        headed = any(found[k].any() for k in ("findings", "setup") if k in found)
        floor = sum(min(getattr(w, k), 0.0) for k in cue_names if headed or k not in ("findings", "setup"))
        return np.asarray(np.where(score > 0, score + cues - floor, score), dtype=np.float64)


def _smooth(scores: np.ndarray, share: float) -> np.ndarray:
    if share <= 0 or len(scores) < 2:
        return scores
    padded = np.pad(scores, 1)
    return scores + share * np.maximum(padded[:-2], padded[2:])


# --------------------------------------------------------------------------- choosing


def _pick_units(scores: np.ndarray, costs: np.ndarray, budget: int, mark: int) -> list[int]:
    """Best first while they fit; a unit next to a kept one saves the elision mark it would need."""
    kept: set[int] = set()
    used = 0
    for i in np.argsort(-scores, kind="stable").tolist():
        if scores[i] == -np.inf or (scores[i] <= 0 and kept):
            break
        # Marks the kept set needs: one per gap between runs of kept units. A unit joining no run
        # adds one, next to one run none, between two runs it removes one. (An estimate: the
        # whole shown text is counted again afterwards.)
        marks = 0 if not kept else 1 - (i - 1 in kept) - (i + 1 in kept)
        cost = int(costs[i]) + mark * marks
        if used + cost <= budget:
            kept.add(i)
            used += cost
    return sorted(kept)


def _pick_windows(scores: np.ndarray, costs: np.ndarray, budget: int, mark: int) -> list[int]:
    """Contiguous runs of units around the strong matches: the units standing out of the chunk
    (at least halfway from its median score to its best) are taken best first while they fit, then
    the kept runs grow line by line into their surroundings (a function's signature and body, a
    table's neighbouring rows) while the budget allows. Scattered lines of code or rows without
    their neighbours read as noise; a window reads as the text it came from."""
    n = len(scores)
    middle = float(np.median(scores))
    strong = scores >= middle + 0.5 * (float(scores.max()) - middle)
    seeds = _pick_units(np.where(strong, scores, -np.inf), costs, budget, mark)
    kept = np.zeros(n, dtype=bool)
    kept[seeds] = True
    runs = sum(1 for i in seeds if i - 1 not in seeds)
    left = budget - int(costs[seeds].sum()) - mark * max(runs - 1, 0)
    grew = True
    while grew:  # surroundings: the unit after each run, then the one before
        grew = False
        for edge in (np.flatnonzero(kept[:-1] & ~kept[1:]) + 1, np.flatnonzero(~kept[:-1] & kept[1:])):
            for u in edge.tolist():
                joins = (u > 0 and kept[u - 1]) and (u + 1 < n and kept[u + 1])
                cost = int(costs[u]) - (mark if joins else 0)
                if not kept[u] and cost <= left:
                    kept[u] = True
                    left -= cost
                    grew = True
    return np.flatnonzero(kept).tolist()


def _runs(kept: list[int], spans: Sequence[tuple[int, int]]) -> list[tuple[int, int, list[int]]]:
    """Kept units merged into passages: adjacent units become one span of the original."""
    out: list[tuple[int, int, list[int]]] = []
    for i in kept:
        if out and out[-1][2][-1] == i - 1:
            a, _, members = out[-1]
            out[-1] = (a, spans[i][1], [*members, i])
        else:
            out.append((spans[i][0], spans[i][1], [i]))
    return out


def _choose(query: str, text: str, budget: int, count: TokenCounter, scorer: Scorer) -> Evidence:
    before = count(text)
    if before <= budget:
        whole = Passage(0, len(text), 1.0)
        kept = (whole,) if text else ()
        return Evidence(text, kept, before, before, budget, "whole", whole if text else None)
    spans = sentences(text)
    mode = "sentences" if has_prose(text, spans) else "windows"
    if mode == "windows":
        spans = lines(text) if len(lines(text)) > 1 else spans
    mark = count(ELISION)
    unit_limit = max(1, budget - 2 * mark) if mode == "sentences" else max(1, budget // 4)
    units = [piece for span in spans for piece in _split_long(text, span, unit_limit, count)]
    if not units:
        return Evidence("", (), before, 0, budget, mode, None)
    texts = [text[a:b] for a, b in units]
    raw = scorer(query, texts)
    scores = _smooth(raw, scorer.weights.neighbours)
    costs = np.array([count(t) for t in texts], dtype=np.int64)
    pick = _pick_windows if mode == "windows" else _pick_units
    kept = pick(scores, costs, budget, mark)
    while True:
        runs = _runs(kept, units)
        shown = ELISION.join(text[a:b] for a, b, _ in runs)
        after = count(shown)
        if (after <= budget and len(shown) < len(text)) or not kept:
            break
        kept.remove(min(kept, key=lambda i: (scores[i], -i)))  # the estimate was short: drop the weakest
    passages = tuple(Passage(a, b, float(max(raw[i] for i in members))) for a, b, members in runs)
    best = max(passages, key=lambda p: p.score) if passages else None
    return Evidence(shown, passages, before, after, budget, mode, best)


# --------------------------------------------------------------------------- memo

_CACHE_SIZE = 4096
_cache: OrderedDict[tuple[Any, ...], Evidence] = OrderedDict()
_lock = threading.Lock()


def select(query: str, text: str, budget: int, *, count: TokenCounter = chars_per_token,
           scorer: Scorer | None = None) -> Evidence:
    """The evidence of `text` for `query` within `budget` tokens (module docstring), memoised per
    (query, text, budget, counter, scorer): the prompt, the guard, `plan()` and `meta.evidence`
    read one choice. `budget` must be at least 1; the engine refuses budgets below
    `MIN_TOKENS_PER_CHUNK`."""
    if budget < 1:
        raise ValueError(f"budget must be at least 1 token, got {budget}")
    scorer = scorer or Scorer()
    key = (query, text, budget, count, scorer.identity)
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    found = _choose(query, text, budget, count, scorer)
    with _lock:
        _cache[key] = found
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return found


def clear_cache() -> None:
    """Forget every memoised choice (tests and benchmarks time the first one)."""
    with _lock:
        _cache.clear()


def passages_of(texts: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """Shown texts cut at their elision marks: the passages, and which text each came from. A scored
    backend scores a shortened chunk by its best passage (`best_of`): scored as one text, the
    passages' unrelated neighbours dilute a match that scored alone would stand out."""
    pieces: list[str] = []
    owner: list[int] = []
    for i, text in enumerate(texts):
        parts = [p for p in text.split(ELISION) if p.strip()] or [text]
        pieces.extend(parts)
        owner.extend([i] * len(parts))
    return pieces, np.asarray(owner, dtype=np.int64)


def best_of(values: np.ndarray, owner: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per text, the maximum of its passages' `values` and the index of the passage that gave it."""
    best = np.full(n, -np.inf)
    which = np.zeros(n, dtype=np.int64)
    scores = np.asarray(values, dtype=np.float64).tolist()
    for k, (i, v) in enumerate(zip(owner.tolist(), scores, strict=True)):
        if v > best[i]:
            best[i], which[i] = v, k
    return best, which


__all__ = ["DEFAULT_WEIGHTS", "ELISION", "MIN_TOKENS_PER_CHUNK", "Evidence", "Passage", "Scorer",
           "TokenCounter", "Weights", "best_of", "chars_per_token", "clear_cache", "has_prose", "lines",
           "passages_of", "select", "sentences"]
