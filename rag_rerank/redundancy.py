"""When are two chunks redundant? When one says nothing the other does not: the same claim copied,
lightly edited, restated in other words, or wholly contained in the other. Never two facts written
from one template ("Python 3.12 removed the distutils module." / "... the asynchat module.").

A similarity threshold alone gets both directions wrong: template siblings are more alike than
most restatements (they share every word but one), and a restatement shares few words with its
original. So the judgement reads the words, then the meaning:

* **What differs.** Each text's content words (stop words out, inflection folded, number words
  as numbers, a capitalised word inside a sentence, an acronym or anything with a digit kept as a
  *name*) are compared as multisets. Spelling is not a difference: a one-letter typo, a compound
  written apart ("tie-break" / "tiebreak"), an abbreviation ("min" / "minutes") or an acronym of
  the other side's words ("GIL" / "global interpreter lock").
* **Numbers.** Each side with a number the other lacks: distinct (90 / 180 days).
* **Mostly the same words** (at least `overlap` of the smaller text's content words shared):
  a word on each side that the other lacks is a substitution, another fact (a template filled
  with other values, "enabled" / "disabled"); a negation on one side only (of the matching
  sentences, so a longer chunk's extra sentence does not count): distinct. Otherwise one text's
  words are the other's, or a subset of them: redundant (a copy, or one contained in the other).
* **Other words**: a name on each side that the other lacks is another subject (the Louvre / the
  Musée d'Orsay); otherwise the texts are the same claim when their meaning is close, `semantic`
  at or above `tau` (the cosine of the embedder's sentence vectors, measured per embedder family),
  and both texts read as English: both families' vectors come from an English vocabulary, in which
  a French or Spanish sentence is word pieces whose mean is close to any other such sentence's (a
  text where fewer than `ENGLISH_SHARE` of the words are English function words is compared by its
  words only; no English text of the development pairs that restates another is under it).

Which one is kept: when one text contains the other plus something more (three content words or
more, or a number or a name: the containing one says more, and dropping it would lose that), the
containing one; otherwise (copies, restatements, a word added) the more concise one, as the card
asks.

The thresholds are fitted on `golden/redundancy/pairs-dev.jsonl` and reported on the held-out
pairs by `bench/duplicates.py` (figures in docs/postpass.md). Numbers and rules are dictionary-free
and English-leaning; text in other scripts is compared by the same multisets of its words.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

from .text import NEGATIONS, STOPWORDS, inflection_key, readable

_TOKEN = re.compile(r"\w+")
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+")
_DIGIT_GROUP = re.compile(r"(?<=\d)[,' \u00a0\u202f_](?=\d{3}(?!\d))")
_UNITS = {w: i for i, w in enumerate(("zero one two three four five six seven eight nine ten eleven "  # noqa: SIM905
                                        "twelve thirteen fourteen fifteen sixteen seventeen eighteen "
                                        "nineteen").split())}
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80,
         "ninety": 90}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}
_NUMBER_WORDS = frozenset([*_UNITS, *_TENS, *_SCALES])
# Texts of at most this many words are judged sentence by sentence (what the judged pairs hold: 28
# words at most); a longer one is a passage (`_passages`).
SHORT_WORDS = 30
# The lexical embedder's near-copy cosine (embed/lexical.py, measured on clough-stevenson).
LEXICAL_COPY = 0.49
# The share of a text's words that must be English function words for its meaning to be compared
# through the sentence vectors (see the module docstring; measured on the multilingual judged set:
# German, French and Spanish chunks hold at most 6%, English development texts stating a claim in a
# sentence 14% and more, and none of those under 10% is a restatement).
ENGLISH_SHARE = 0.1
_LETTERS = re.compile(r"[^\W\d_]+")
_OPENERS = '.!?:;"(\u201c\u00ab'


@dataclass(frozen=True)
class Rules:
    """The thresholds of one embedder family: `tau` on the sentence cosine for texts that share
    few words, `overlap` the share of the smaller text's content words above which two texts are
    read as one text edited (a substitution then changes the fact)."""

    tau: float
    overlap: float = 0.7


# Fitted on the development data (`python bench/redundancy.py --fit`): the lowest `tau` (0.02 steps)
# at which at most 1 pair in 25 of distinct facts, and at most 1 in 200 pairs of same-topic chunks
# stating different claims (a retriever's list: many pairs, so each must rarely merge), is merged,
# with the family's own sentence vectors. The judgement is precision first: a fact restated in
# words far from the original's is often missed (docs/postpass.md gives the figures).
RULES: dict[str, Rules] = {
    "static": Rules(tau=0.80),
    "sentence-transformers": Rules(tau=0.80),
}


@dataclass(frozen=True)
class Reading:
    """What the judgement needs of one text, read once."""

    words: tuple[str, ...]  # every word, case-folded, number words folded into numbers
    content: Counter[str] = field(hash=False)  # keys of the content words, with their counts
    surface: dict[str, str] = field(hash=False)  # key -> a word it came from
    names: frozenset[str]  # words kept as names (capitalised inside a sentence, acronyms, with a digit)
    numbers: Counter[str] = field(hash=False)
    negations: int
    sentences: tuple[str, ...]
    english: float  # the share of its words that are English function words (`ENGLISH_SHARE`)
    length: int  # characters, white space folded: what "more concise" compares

    @cached_property
    def keys(self) -> frozenset[str]:
        """The distinct content-word keys (the prefilter's overlap test), made once per text."""
        return frozenset(self.content)

    @cached_property
    def spellings(self) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
        """Each way another text may write a stretch of these words as one word (`_spelled_out`):
        two adjacent words run together ("tie" "break" -> "tiebreak"), then the initials of 2 to 6
        adjacent words (an acronym), the first stretch of each. Built once per text, when a pair's
        differences first need it, so a lookup replaces a scan of the words for every word compared."""
        words = self.words
        joined: dict[str, tuple[str, ...]] = {}
        for i in range(len(words) - 1):
            joined.setdefault(words[i] + words[i + 1], (words[i], words[i + 1]))
        initials = [w[0] for w in words]
        acronyms: dict[str, tuple[str, ...]] = {}
        for n in range(2, 7):
            for i in range(len(words) - n + 1):
                acronyms.setdefault("".join(initials[i:i + n]), words[i:i + n])
        return joined, acronyms


@lru_cache(maxsize=65536)
def _is_number(word: str) -> bool:
    return any(ch.isdigit() for ch in word)


@lru_cache(maxsize=65536)
def _key(word: str) -> str:
    return word if _is_number(word) else inflection_key(word)


@lru_cache(maxsize=65536)
def _word(word: str) -> tuple[str, bool, bool]:
    """(case-folded, a name wherever it stands, a name inside a sentence) for one word as written:
    with a digit or an acronym it is a name anywhere; capitalised, only after a sentence's start.
    Memoised: a text's words are mostly words seen before, so reading one costs lookups."""
    anywhere = _is_number(word) or (len(word) > 1 and word.isupper())
    return word.casefold(), anywhere, word[0].isupper()


def _raw_tokens(text: str) -> list[tuple[str, bool]]:
    """(word, is a name) in reading order: a name is capitalised inside a sentence, an acronym, or
    holds a digit. A word opens a sentence when nothing but white space stands before it, or the
    last other character before it is one of `_OPENERS`: looked for in the gap since the previous
    word only (a word's own last character is never an opener), so a text is read in one pass."""
    out = []
    end = 0
    for m in _TOKEN.finditer(text):
        start = m.start()
        gap = text[end:start].rstrip()
        initial = gap[-1] in _OPENERS if gap else end == 0
        folded, anywhere, capital = _word(m.group())
        out.append((folded, anywhere or (capital and not initial)))
        end = m.end()
    return out


def _fold_numbers(tokens: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """Number words as the number they spell ("forty five" -> "45", "two" -> "2")."""
    if _NUMBER_WORDS.isdisjoint([w for w, _ in tokens]):
        return tokens  # most texts spell no number: nothing to fold
    out: list[tuple[str, bool]] = []
    i = 0
    while i < len(tokens):
        word = tokens[i][0]
        if word not in _UNITS and word not in _TENS and word not in _SCALES:
            out.append(tokens[i])
            i += 1
            continue
        value = current = 0
        j = i
        while j < len(tokens):
            w = tokens[j][0]
            if w in _UNITS:
                current += _UNITS[w]
            elif w in _TENS:
                current += _TENS[w]
            elif w in _SCALES:
                value += max(current, 1) * _SCALES[w]
                current = 0
            elif (w == "and" and j > i and tokens[j - 1][0] in _SCALES and j + 1 < len(tokens)
                  and (tokens[j + 1][0] in _UNITS or tokens[j + 1][0] in _TENS)):
                pass  # "two hundred and five"
            else:
                break
            j += 1
        out.append((str(value + current), True))
        i = j
    return out


# Tokens `_fold_numbers` may fold into the number before them.
_FOLDABLE = _NUMBER_WORDS | {"and"}


@lru_cache(maxsize=8192)
def surely_passage(text: str) -> bool:
    """True only when `read(text)` has more than `SHORT_WORDS` words, at a fraction of its cost: its
    words are the `_TOKEN` matches of the same cleaned text, less at most one per number word or
    "and" (folded into a number); False when that lower bound does not settle it. A list of
    passages is then judged on the lexical cosine alone, without reading any of them."""
    tokens = _TOKEN.findall(_DIGIT_GROUP.sub("", readable(text)))
    if len(tokens) <= SHORT_WORDS:
        return False
    foldable = sum(1 for t in tokens if t.casefold() in _FOLDABLE)
    return len(tokens) - foldable > SHORT_WORDS


@lru_cache(maxsize=8192)
def read(text: str) -> Reading:
    """`text` read for the judgement (memoised: a chunk is compared with many others)."""
    shown = readable(text)
    tokens = _fold_numbers(_raw_tokens(_DIGIT_GROUP.sub("", shown)))
    words = tuple(w for w, _ in tokens)
    content: Counter[str] = Counter()
    surface: dict[str, str] = {}
    for word, name in tokens:
        if name or (word not in STOPWORDS and word not in NEGATIONS):
            k = _key(word)
            content[k] += 1
            surface.setdefault(k, word)
    return Reading(
        words=words,
        content=content,
        surface=surface,
        names=frozenset(w for w, name in tokens if name and not _is_number(w)),
        numbers=Counter(w for w in words if _is_number(w)),
        negations=sum(1 for w in words if w in NEGATIONS),
        sentences=tuple(s for s in _SENTENCE_END.split(shown) if s.strip()),
        length=len(shown),
        english=_english_share(shown),
    )


def _english_share(text: str) -> float:
    letters = [w.casefold() for w in _LETTERS.findall(text)]
    return sum(1 for w in letters if w in STOPWORDS) / len(letters) if letters else 0.0


def _one_edit(a: str, b: str) -> bool:
    """A typo: one letter inserted, deleted, replaced or two swapped, in words of 4+ letters.

    Decided at the first letter where the words differ (`p`): a replacement leaves the rest
    equal, a swap the rest after the next letter, and an insertion or deletion anywhere is one at
    `p` (deleting any letter of a run of equal letters gives the same word)."""
    if abs(len(a) - len(b)) > 1 or min(len(a), len(b)) < 4 or a == b:
        return False
    p = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    if len(a) == len(b):
        return a[p + 1:] == b[p + 1:] or (a[p + 2:] == b[p + 2:] and a[p] == b[p + 1] and a[p + 1] == b[p])
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return long[p + 1:] == short[p:]


def _same_spelling(a: str, b: str) -> bool:
    """Two words that are one word written two ways: a typo or an abbreviation (a prefix of 3+)."""
    if _is_number(a) or _is_number(b):
        return False
    return _one_edit(a, b) or (len(b) >= 3 and a.startswith(b)) or (len(a) >= 3 and b.startswith(a))


def _spelled_out(word: str, other: Reading) -> tuple[str, ...]:
    """The words of the other text that `word` writes another way: two adjacent words written
    together ("tiebreak" / "tie break"), or the words whose initials it is (an acronym: "gil" /
    "global interpreter lock"); () when it is neither. The first such stretch, as a scan of the
    words from the start would find it (`Reading.spellings`)."""
    joined, acronyms = other.spellings
    found = joined.get(word)
    if found is not None:
        return found
    return acronyms.get(word, ()) if 2 <= len(word) <= 6 else ()


def _may_share_spelling(a: str, b: str) -> bool:
    """False when `_same_spelling(a, b)` is certainly False, for a cheap test before the full one:
    a typo keeps the length within one letter, an abbreviation shares the first letter."""
    return a[:1] == b[:1] or -1 <= len(a) - len(b) <= 1


def differences(a: Reading, b: Reading) -> tuple[list[str], list[str]]:
    """The content words (keys) each text has that the other lacks, spelling aside."""
    only_a = list((a.content - b.content).elements())
    only_b = list((b.content - a.content).elements())
    if only_a and only_b:
        spelt_b = [b.surface.get(y, y) for y in only_b]  # kept in step with only_b
        for x in list(only_a):
            sx = a.surface.get(x, x)
            if _is_number(sx):
                continue  # a number is never another spelling of a word
            for k, sy in enumerate(spelt_b):
                if _may_share_spelling(sx, sy) and _same_spelling(sx, sy):
                    only_a.remove(x)
                    del only_b[k]  # the first occurrence of its key: an earlier one would have matched
                    del spelt_b[k]
                    break
    for mine, theirs, other in ((only_a, only_b, b), (only_b, only_a, a)):
        own = a if other is b else b
        for x in list(mine):
            parts = _spelled_out(own.surface.get(x, x), other)
            if parts:
                mine.remove(x)
                for part in parts:
                    if _key(part) in theirs:
                        theirs.remove(_key(part))
    return only_a, only_b


def _negations_against(short: Reading, long: Reading) -> int:
    """The negations of the sentences of `long` that share content words with `short`."""
    parts = [read(s) for s in long.sentences]
    matching = [p for p in parts if (p.content & short.content)] or [long]
    return sum(p.negations for p in matching)


@dataclass(frozen=True)
class Verdict:
    """Whether two texts are redundant, which to keep (0: the first, 1: the second, None: the more
    concise), and why (for notes and tests)."""

    redundant: bool
    why: str
    keep: int | None = None


def judge(a: Reading, b: Reading, semantic: float, rules: Rules, lexical: float = 0.0) -> Verdict:
    """The judgement of the module docstring for one pair (`lexical`: the texts' lexical cosine,
    which decides for passages longer than `SHORT_WORDS`)."""
    if len(a.words) > SHORT_WORDS or len(b.words) > SHORT_WORDS:
        return _passages(a, b, lexical)
    if (a.numbers - b.numbers) and (b.numbers - a.numbers):
        return Verdict(False, "numbers")
    only_a, only_b = differences(a, b)
    shared = sum((a.content & b.content).values())
    smaller = min(sum(a.content.values()), sum(b.content.values()))
    if smaller and shared / smaller >= rules.overlap:
        if only_a and only_b:
            return Verdict(False, "substitution")
        short, long = (a, b) if only_b else (b, a)
        if short.negations != _negations_against(short, long):
            return Verdict(False, "negation")
        return Verdict(True, "copy" if not only_a and not only_b else "contained")
    names_a = any(a.surface.get(x, x) in a.names for x in only_a)
    if names_a and any(b.surface.get(y, y) in b.names for y in only_b):
        return Verdict(False, "names")
    if semantic >= rules.tau and min(a.english, b.english) >= ENGLISH_SHARE:
        return Verdict(True, "restatement")
    return Verdict(False, "meaning")


def _passages(a: Reading, b: Reading, lexical: float) -> Verdict:
    """Two texts of which one is a passage (more than `SHORT_WORDS` words): a passage's sentence
    vector is the mean of many words, close to any other passage on its subject, and an edited copy
    has many small substitutions, so neither the meaning threshold nor the substitution rule holds
    there (measured: DL19 passages on one subject merged by the first, clough-stevenson's copied
    answers refused by the second). A near-copy is what the lexical vectors' cosine says it is
    (`LEXICAL_COPY`, chosen on clough-stevenson: every copied or lightly edited answer at or above
    it, no independent one); a short text wholly inside a passage (its words all there, no negation
    of its own) is contained in it."""
    if lexical >= LEXICAL_COPY:
        return Verdict(True, "near-copy")
    short, long = (a, b) if len(a.words) <= len(b.words) else (b, a)
    if len(short.words) > SHORT_WORDS or not short.content:
        return Verdict(False, "passages")
    # Three conditions, any of which says "not contained": the cheapest first.
    if short.numbers - long.numbers:
        return Verdict(False, "passages")
    only_short, _ = differences(short, long)
    if only_short or short.negations != _negations_against(short, long):
        return Verdict(False, "passages")
    return Verdict(True, "contained")


@lru_cache(maxsize=16384)
def _judged(a: str, b: str, semantic: float, rules: Rules, lexical: float) -> Verdict:
    """`judge` of two texts, memoised on everything it reads (the texts, both cosines, the rules):
    a pair compared before (a window's survivors again in the final pass, passages a service
    retrieves again and again) costs a lookup. Judging a short text against a passage word by word
    is the post-pass's dearest step (about 0.1 ms a pair)."""
    return judge(read(a), read(b), semantic, rules, lexical)


def rules_for(family: str) -> Rules:
    """The rules of an embedder family ("static" for the default and unknown ones)."""
    for prefix, rules in RULES.items():
        if family.startswith(prefix):
            return rules
    return RULES["static"]


def redundancy(texts: Sequence[str], semantic: np.ndarray | Callable[[], np.ndarray], rules: Rules,
               lexical: np.ndarray, candidates: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For every pair of `texts`: whether they are redundant (a symmetric bool matrix), and which
    to keep of a redundant pair (`prefer[i, j]` True when `i` is to be kept over `j` because it
    contains `j` and says more). `semantic` is the texts' cosine matrix under the family's
    sentence vectors (or a function making it, called unless every text is surely a passage: a
    list of passages needs none), `lexical` under the lexical embedder's.

    Only pairs that could be redundant are judged: the `candidates` (a bool matrix, a cheap
    prefilter the caller computed), else those close in meaning (cosine at or above `tau`), near
    copies, or sharing most of their content words. Two passages (more than `SHORT_WORDS` words
    each) are redundant exactly when they are near copies (`_passages`), read off `lexical` for all
    such pairs at once; only a pair with a short text is read word by word."""
    n = len(texts)
    redundant = np.zeros((n, n), dtype=bool)
    prefer = np.zeros((n, n), dtype=bool)
    if n < 2:
        return redundant, prefer
    copy = lexical >= LEXICAL_COPY
    if all(surely_passage(t) for t in texts):  # every pair is two passages: `_passages` is `copy`
        redundant = np.triu(copy if candidates is None else copy & candidates, 1)
        return redundant | redundant.T, prefer
    if callable(semantic):
        semantic = semantic()
    readings = [read(t) for t in texts]
    short = np.array([len(r.words) <= SHORT_WORDS for r in readings])
    with_short = short[:, None] | short[None, :]
    if candidates is None:
        candidates = (semantic >= rules.tau) | copy
        keys = [r.keys for r in readings]
        # Sharing most content words matters only where a short text is judged (two passages are
        # decided by `copy`, which the candidates already hold).
        for i, j in zip(*np.nonzero(np.triu(with_short & ~candidates, 1)), strict=True):
            smaller = min(len(keys[i]), len(keys[j]))
            if smaller and len(keys[i] & keys[j]) / smaller >= rules.overlap:
                candidates[i, j] = True
    judged = np.triu(candidates, 1)
    passages = judged & ~with_short & copy
    redundant |= passages | passages.T
    for i, j in zip(*np.nonzero(judged & with_short), strict=True):
        verdict = _judged(texts[i], texts[j], float(semantic[i, j]), rules, float(lexical[i, j]))
        if verdict.redundant:
            redundant[i, j] = redundant[j, i] = True
            if verdict.keep is not None:
                kept, other = (i, j) if verdict.keep == 0 else (j, i)
                prefer[kept, other] = True
    return redundant, prefer


__all__ = ["ENGLISH_SHARE", "LEXICAL_COPY", "RULES", "SHORT_WORDS", "Reading", "Rules", "Verdict",
           "differences", "judge", "read", "redundancy", "rules_for", "surely_passage"]
