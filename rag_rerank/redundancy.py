"""When are two chunks redundant? When one says nothing the other does not, and the words prove it.

The post-pass drops a chunk as `redundant_with` another only on evidence that the other says it
(issue 32: public paraphrase corpora showed a sentence cosine merging "the man is playing the
guitar" with "the girl is playing the guitar", and two arguments for one stance with different
reasons). Four kinds of evidence, and nothing else, make a pair redundant:

* **Copy**: the same words in the same order, whatever the white space, case, Unicode form (NFKC)
  or punctuation. Judged first and always: a copy is redundant whatever it says ("No. The limit
  is 5 GB." twice), at any cosine.
* **Same words**: the same content words (as multisets; order, function words and inflection
  aside) and no negation on one side only.
* **Containment**: one text's content words all in the other (which adds some): the contained text
  says nothing the container does not. **The container is kept** (`Verdict.keep`; `prefer` in
  `redundancy`): dropping it would lose what only it says.
* **Restatement**: both texts have words the other lacks, and each such word, on both sides, has a
  close substitute among the other's (the static table's word vectors, cosine at least
  `Rules.substitute`), and the two mean the same as a whole (sentence cosine at least `Rules.tau`;
  for a passage, the lexical near-copy cosine `LEXICAL_COPY`). A text whose lone words all have
  substitutes in a text that also says more is contained in it (the longer is kept).

What is *not* redundant, whatever the cosines: a content word on one side without a close
substitute on the other (another fact: "man" / "girl", a template filled with another value),
a number or a name one side lacks (a number or a name has no substitute), a negation of the shared
claim on one side only (a bare "No," answering a question negates nothing), a text without content
words (it says nothing another could say).

Reading the words: content words are those outside `FUNCTION_WORDS` (English function words, but
not those that carry a claim: before/after, above/below, all/each/only...; plus what a tokeniser
leaves of "'s" and "don't", and "said"/"says"), inflection folded, number words, decimals and
ordinals as numbers, dotted initials as one word ("U.S."). Spelling is not a difference: a typo or
an abbreviation of a word the vocabulary lacks (two vocabulary words are two words however alike:
"talking" / "walking"), a compound written apart, an acronym of the other side's words.

**Which one is kept** (one place: this module decides, `postpass.select` applies it): of a
contained pair, the container; of copies, same words and restatements, which state the same, the
more concise, as the card asks (then the more relevant).

`tau` and `substitute` are fitted per embedder family on MRPC train and STS Benchmark train and
checked on MRPC validation and STS dev (`python bench/redundancy.py --fit`, figures in
docs/postpass.md); the judgement is precision first: a restatement in words whose substitutes the
static vectors do not know is missed, and two chunks are kept where one would do.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import compress, count, filterfalse, islice
from operator import add, itemgetter, ne, not_
from typing import Any, Generic, TypeVar, overload

import numpy as np

from .embed.memo import RunMemo
from .embed.static import StaticEmbedder, in_vocabulary
from .frozen import direct_init_read_often
from .text import NEGATIONS, STOPWORDS, inflection_key, latin1_table, latin1_translate, readable

_T = TypeVar("_T")
_TOKEN = re.compile(r"\d+(?:\.\d+)+|\w+")  # a decimal number is one word
# The same words kept by `split`, which then gives the gap before each word too: gap, word, gap, ...
# Written to open with the class every word opens with (`\w`, then: a decimal if that was a digit,
# else the rest of the word), as `_TOKEN` opening with a branch is not: sre then scans a gap for that
# class instead of trying the whole pattern at each of its characters. On ASCII text `\w` and `\d`
# are the ASCII classes, which sre tests by a table look-up instead of a Unicode category
# (`tests/test_redundancy.py` holds both to `_TOKEN`).
_TOKENS = re.compile(r"(\w(?:(?<=\d)\d*(?:\.\d+)+|\w*))")
_TOKENS_ASCII = re.compile(_TOKENS.pattern, re.ASCII)
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+")
_DIGIT_GROUP = re.compile(r"(?<=\d)[,' \u00a0\u202f_](?=\d{3}(?!\d))")
# What any match of `_DIGIT_GROUP` holds, found faster (a pattern opening with its character set is
# searched for that set first): most texts have no digit group, and are not scanned for one.
_DIGIT_GROUP_CORE = re.compile(r"\d[,' \u00a0\u202f_]\d{3}")
_DIGIT_GROUP_CORE_ASCII = re.compile(_DIGIT_GROUP_CORE.pattern, re.ASCII)  # the same on ASCII text, faster
_UNITS = {w: i for i, w in enumerate(("zero one two three four five six seven eight nine ten eleven "  # noqa: SIM905
                                        "twelve thirteen fourteen fifteen sixteen seventeen eighteen "
                                        "nineteen").split())}
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80,
         "ninety": 90}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}
_NUMBER_WORDS = frozenset([*_UNITS, *_TENS, *_SCALES])
# Ordinals as the number they order ("third" / "3rd" / "three": one value).
_ORDINALS = {w: str(i) for i, w in enumerate(
    ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth"), 1)}
_ORDINAL_SUFFIX = re.compile(r"\A(\d+)(?:st|nd|rd|th)\Z")
_NUMBERS_AND_ORDINALS = frozenset([*_NUMBER_WORDS, *_ORDINALS])  # what `read` folds or rewrites
# Texts of at most this many words are sentences (what the judged pairs hold: 28 words at most),
# whose meaning the sentence vectors compare; a longer one is a passage, whose meaning only the
# lexical near-copy cosine stands for (`judge`).
SHORT_WORDS = 30
# The lexical embedder's near-copy cosine (embed/lexical.py, measured on clough-stevenson).
LEXICAL_COPY = 0.49
# "No," / "No." answering a question: it denies nothing of the claim that follows.
_INTERJECTION = re.compile(r"(?<!\w)no\s*[,.!;:]", re.IGNORECASE)
# Initials written with dots ("U.S.", "u.n.") are one word, as their undotted spelling is.
_INITIALS = re.compile(r"(?<!\w)(?:[^\W\d_]\.){2,}(?!\w)")
# What any match of `_INITIALS` holds ("U.S." holds ".S."), found by its opening "." at once.
_INITIALS_CORE = re.compile(r"\.[^\W\d_]\.")


def _class(ch: str) -> str:
    """A Latin-1 character's class in `_CLASSES`, by the regexes' own classes: "0" a digit (`\\d`), "a"
    a letter (`[^\\W\\d_]`), "," a separator of digit groups (`_DIGIT_GROUP`), "." a full stop, "-"
    anything else."""
    if re.match(r"\d", ch):
        return "0"
    if re.match(r"[^\W\d_]", ch):
        return "a"
    return "," if re.match(r"[,' \u00a0\u202f_]", ch) else "." if ch == "." else "-"


# Reading a text of Latin-1 characters (most text: ASCII, accents, web mojibake), `_pieces` asks
# whether it holds a digit group (`_DIGIT_GROUP_CORE`: "0,000"), dotted initials (`_INITIALS_CORE`:
# ".a.") or a decimal number ("0.0") by a substring search of its classes, one bytes translation
# (`_CLASSES`), instead of one regex search each. Without a decimal number its words are its runs
# of word characters (`_TOKEN` takes its decimal branch only at a digit, "." and a digit): they are
# `str.split` of another translation (`_WORD_RUNS`: every other character a space), where sre's
# split made a match object, a word and a gap for each word.
_CLASSES = latin1_table(_class)
_WORD_RUNS = latin1_table(lambda ch: ch if re.match(r"\w", ch) else " ")
# Function words that still carry a claim: an order in time or space, a quantity ("before" /
# "after", "all" / "each"): content words here, though not evidence in a quotation (`STOPWORDS`).
_MEANINGFUL = frozenset(("above", "after", "against", "before", "below", "down", "during", "few", "more",
                         "most", "off", "only", "under", "until", "all", "any", "each", "both"))
# What a tokeniser leaves of a contraction or a possessive ("it's", "don't", "we'll"), "us", and
# the reporting verbs: no claim of their own.
FUNCTION_WORDS = (STOPWORDS - _MEANINGFUL) | frozenset(
    "s d ll m re ve don doesn didn isn aren wasn weren hasn haven hadn us said says say".split())  # noqa: SIM905
_OPENERS = '.!?:;"(\u201c\u00ab'
_FIRST = itemgetter(0)  # a word's first character (no word is empty): its initial
_NOT_CONTENT = FUNCTION_WORDS | NEGATIONS  # a word in it is content only as a name


@dataclass(frozen=True)
class Rules:
    """The thresholds of one embedder family: `tau` on the sentence cosine of two short texts that
    restate each other, `substitute` on the static word vectors' cosine of a word and the word
    standing for it in the other text."""

    tau: float
    substitute: float = 0.5


# Fitted on MRPC train and STS train (`python bench/redundancy.py --fit`): the most STS pairs scored
# >= 4.5 caught with false merges at most 2/3 of issue 32's limits (2.7% of MRPC non-paraphrases,
# 1.3% of STS pairs <= 2.0), a margin for held-out pairs; docs/postpass.md gives the figures.
RULES: dict[str, Rules] = {
    "static": Rules(tau=0.70),
    "sentence-transformers": Rules(tau=0.70),
}


class _OnFirstUse(Generic[_T]):
    """`functools.cached_property` without its lock (CPython 3.11 takes one at each first use):
    the value is made from the instance once and stored in its dict, read from there after."""

    def __init__(self, rule: Callable[[Any], _T]) -> None:
        self.rule = rule
        self.name = rule.__name__
        self.__doc__ = rule.__doc__

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> _OnFirstUse[_T]: ...
    @overload
    def __get__(self, instance: object, owner: type | None = None) -> _T: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> _T | _OnFirstUse[_T]:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.rule(instance)
        return value


@direct_init_read_often  # built once per text, its fields read at every pair it is judged in
@dataclass(frozen=True)
class Reading:
    """What the judgement needs of one text, read once, in two stages.

    `read` makes what every text of a list is asked (`redundancy`: whether it is short, its copy
    key, its content-word keys for `_sharing`): the words, which of them are names, the content
    words and their keys. The rest (`content`, `surface`, `names`, `numbers`, `negations`,
    `folded`) is made from those on first use, once: only the texts of the few pairs a list judges
    word by word ask for it, and a pair that settles early (a copy, a negation) asks for less."""

    words: tuple[str, ...]  # every word, case-folded, number words folded into numbers
    shown: str  # the text as read (`readable`)
    length: int  # characters, white space folded: what "more concise" compares
    # Per word of `words`: whether it is a name (capitalised inside a sentence, an acronym, with a
    # digit); then the content words (not function words, or names) and the key of each, in order.
    # Made by `read`, never changed after.
    name_flags: list[bool] = field(hash=False, repr=False)
    content_words: list[str] = field(hash=False, repr=False)
    content_keys: list[str] = field(hash=False, repr=False)

    @_OnFirstUse
    def content(self) -> Counter[str]:
        """The keys of the content words, with their counts."""
        return Counter(self.content_keys)

    @_OnFirstUse
    def surface(self) -> dict[str, str]:
        """Each content key's first word (the last assignment wins, so they are made from the end)."""
        return dict(zip(reversed(self.content_keys), reversed(self.content_words), strict=True))

    @_OnFirstUse
    def named(self) -> list[str]:
        """The words that are names, in order. Every word holding a digit is a name (`_word`; a
        folded number and an ordinal are names too, and case folding adds no digit): the numbers
        are found among the names, not all the words."""
        return list(compress(self.words, self.name_flags))

    @_OnFirstUse
    def names(self) -> frozenset[str]:
        """The words kept as names, numbers aside."""
        return frozenset(filterfalse(_NUMERIC.__getitem__, self.named))

    @_OnFirstUse
    def numbers(self) -> Counter[str]:
        """The numbers, as keys (`_number`), with their counts."""
        return Counter(map(_KEYS.__getitem__, filter(_NUMERIC.__getitem__, self.named)))

    @_OnFirstUse
    def negations(self) -> int:
        """The negation words, less each "No," answering a question (it denies nothing)."""
        words = self.words
        if NEGATIONS.isdisjoint(words):
            return 0
        negations = sum(map(NEGATIONS.__contains__, words))
        if "no" in words:  # a "No," it discounts is the word "no": without it, there is none
            negations -= len(_INTERJECTION.findall(self.shown))
        return negations

    @_OnFirstUse
    def folded(self) -> str:
        """The text as read, case-folded: what tells two texts without a word apart."""
        return self.shown.casefold()

    @_OnFirstUse
    def sentences(self) -> tuple[str, ...]:
        """The text's sentences, split only when asked (`_negations_toward`, for a text with a
        negation word and another text to speak of)."""
        return tuple(s for s in _SENTENCE_END.split(self.shown) if s.strip())

    @_OnFirstUse
    def copy_key(self) -> str:
        """Equal for two readings exactly when `copies` says they are copies: the words joined by a
        space (no word holds one), or, without a word, the folded text behind a NUL (no word opens
        with one). A string, made once per text: it hashes once, where the tuple of words it stands
        for would be hashed again, word by word, every time a list groups its copies."""
        return " ".join(self.words) if self.words else "\x00" + self.folded

    @_OnFirstUse
    def keys(self) -> frozenset[str]:
        """The distinct content-word keys (the prefilter `_sharing`), made once per text."""
        return frozenset(self.content_keys)

    @_OnFirstUse
    def spellings(self) -> tuple[frozenset[str], str]:
        """Each way another text may write a stretch of these words as one word (`_spelled_out`):
        two adjacent words run together ("tie" "break" -> "tiebreak"), as a set (which pair it is,
        `joined_pair`, is asked only of a word found in it: seldom); and the words' initials as one
        string, in which an acronym of 2 to 6 adjacent words is found by `str.find` (one initial is
        one character, so the first match is the first stretch). Built once per text, when a pair's
        differences first need it, so a lookup replaces a scan of the words for every word
        compared."""
        words = self.words
        return frozenset(map(add, words, words[1:])), "".join(map(_FIRST, words))  # map stops at the end

    def joined_pair(self, word: str) -> tuple[str, ...]:
        """The first two adjacent words that `word` writes together, as a scan from the start finds
        them; () when none do."""
        words = self.words
        if word not in self.spellings[0]:
            return ()
        at = list(map(add, words, words[1:])).index(word)
        return words[at:at + 2]


def _is_number(word: str) -> bool:
    return any(ch.isdigit() for ch in word)


def _key(word: str) -> str:
    """A word's inflection folded until nothing more folds: one strip of a suffix leaves "destroying"
    as "destroy" and "destroy" as "destro", so a single strip would call them two words."""
    if _is_number(word):
        return _number(word)
    key = inflection_key(word)
    while (shorter := inflection_key(key)) != key:
        key = shorter
    return key


def _number(word: str) -> str:
    """A number as one spelling: "1.50" and "1.5" alike, "1.0" as "1", "3rd" as "3"."""
    if "." in word and word.replace(".", "").isdigit():
        word = word.rstrip("0").rstrip(".")
    ordinal = _ORDINAL_SUFFIX.match(word)
    return ordinal.group(1) if ordinal else word


def _word(word: str) -> tuple[str, bool, bool, bool]:
    """(case-folded, a name wherever it stands, a name only where it stands inside a sentence, a
    content word wherever it stands) for one word as written: with a digit or an acronym it is a
    name anywhere; capitalised (and not a name anywhere), only after a sentence's start, the one
    kind whose place decides. A content word is a name or a word outside `_NOT_CONTENT`: a
    function word whose place decides is one only where it stands inside a sentence."""
    folded = word.casefold()
    anywhere = _is_number(word) or (len(word) > 1 and word.isupper())
    return folded, anywhere, not anywhere and word[0].isupper(), anywhere or folded not in _NOT_CONTENT


# The per-word memos below are `RunMemo`s: a word's rule looked up in C by `map(memo.__getitem__,
# ...)`, filled on first sight and emptied when full. A text's words are mostly words seen before,
# and an `lru_cache`'s per-word bookkeeping (its recency list) cost more than the look-up itself.
_WORD_MEMO_SIZE = 65536


_WORDS = RunMemo(_word, _WORD_MEMO_SIZE)
_KEYS = RunMemo(_key, _WORD_MEMO_SIZE)
_NUMERIC = RunMemo(_is_number, _WORD_MEMO_SIZE)


_Tokens = tuple[tuple[str, ...], list[bool], list[bool]]  # words, which are names, which are content words


def _raw_tokens(pieces: list[str]) -> _Tokens:
    """The words of a text split by `_TOKENS` (gap, word, gap, ..., gap), case-folded, in reading
    order, whether each is a name (capitalised inside a sentence, an acronym, or holding a digit),
    and whether each is a content word (a name, or a word outside `_NOT_CONTENT`). A word opens a
    sentence when nothing but white space stands before it, or the last other character before it
    is one of `_OPENERS`: looked for in the gap since the previous word only (a word's own last
    character is never an opener), and only for a word whose place decides (`_word`). The words'
    facts are memoised lookups (`_WORDS`)."""
    if len(pieces) == 1:
        return (), [], []
    words, anywhere, placed, kept = zip(*map(_WORDS.__getitem__, pieces[1::2]), strict=True)
    names, content = list(anywhere), list(kept)
    for k in compress(range(len(names)), placed):
        gap = pieces[2 * k].rstrip()
        opens = gap[-1] in _OPENERS if gap else k == 0  # a sentence starts at the word
        if not opens:
            names[k] = content[k] = True
    return words, names, content


# What `_run_tokens` finds last before a word: an opener, or a space when nothing stands before it.
_OPENERS_OR_NONE = _OPENERS + " "


def _run_tokens(cleaned: str, runs: str, tokens: list[str]) -> _Tokens:
    """`_raw_tokens` of a text whose words (`tokens`) are its runs of word characters (`_word_runs`:
    `runs` is the cleaned text with every other character a space), which keeps no gaps. Only a
    word whose place decides (`_word`) is looked for: the first whole word equal to it after the
    last one found is that word (each word equal to it is one of those looked for). It opens a
    sentence when the last character before it that is not a space is one of `_OPENERS`, or when
    there is none: the gap's last character, or the last of the word before (never an opener), as
    white space in a text as read is one space: the character just before the word, or when that
    is a space the one before it (two spaces stand before the text, so a space there says there is
    none)."""
    if not tokens:
        return (), [], []
    words, anywhere, placed, kept = zip(*map(_WORDS.__getitem__, tokens), strict=True)
    names, content = list(anywhere), list(kept)
    if True in placed:
        runs, cleaned = f"  {runs} ", "  " + cleaned  # each word has two characters before it, and one after
        at = 0
        for k in compress(range(len(names)), placed):
            token = tokens[k]
            at = runs.find(f" {token} ", at) + 1  # where the word starts
            last = cleaned[at - 1]
            if last == " ":
                last = cleaned[at - 2]
            if last not in _OPENERS_OR_NONE:
                names[k] = content[k] = True
            at += len(token)
    return words, names, content


def _fold_numbers(words: Sequence[str], *flags: list[bool]) -> tuple[Any, ...]:
    """Number words as the number they spell ("forty five" -> "45", "two" -> "2"), a name; the
    words between two numbers are copied as they stand, a slice at a time. Each list of per-word
    flags given (which words are names; which are content words) is folded alongside: True for a
    folded number (a number is a name, and a content word). (words, *flags), folded."""
    if _NUMBER_WORDS.isdisjoint(words):
        return (words, *flags)  # most texts spell no number: nothing to fold
    starts = [k for k, w in enumerate(words) if w in _NUMBER_WORDS]
    out: list[str] = []
    outs: list[list[bool]] = [[] for _ in flags]
    i = 0
    for start in starts:
        if start < i:
            continue  # folded into the number before it
        out += words[i:start]
        for folded, given in zip(outs, flags, strict=True):
            folded += given[i:start]
        value = current = 0
        j = start
        while j < len(words):
            w = words[j]
            if w in _UNITS:
                current += _UNITS[w]
            elif w in _TENS:
                current += _TENS[w]
            elif w in _SCALES:
                value += max(current, 1) * _SCALES[w]
                current = 0
            elif (w == "and" and j > start and words[j - 1] in _SCALES and j + 1 < len(words)
                  and (words[j + 1] in _UNITS or words[j + 1] in _TENS)):
                pass  # "two hundred and five"
            else:
                break
            j += 1
        out.append(str(value + current))
        for folded in outs:
            folded.append(True)
        i = j
    out += words[i:]  # `+=` takes a tuple of words as well as a list
    for folded, given in zip(outs, flags, strict=True):
        folded += given[i:]
    return (out, *outs)


# Tokens `_fold_numbers` may fold into the number before them.
_FOLDABLE = _NUMBER_WORDS | {"and"}


def _foldable(word: str) -> bool:
    """Whether `word` as written, case-folded, is in `_FOLDABLE`."""
    return word.casefold() in _FOLDABLE


# `_foldable` of each word met: `surely_passage` asks it of every word of a text it looks at, and
# a look-up of the word hashes it once for `read`'s look-ups after (a word keeps its hash), where a
# case fold made a new string and hashed that.
_FOLDS = RunMemo(_foldable, _WORD_MEMO_SIZE)
_PASSAGE_HEAD = SHORT_WORDS + 10  # the words `surely_passage` looks at first


def _cleaned(shown: str) -> str:
    """Digit groups joined ("1,000" -> "1000") and dotted initials undotted ("U.S." -> "US"); each
    rewrite runs only on a text holding its core (most hold neither)."""
    if (_DIGIT_GROUP_CORE_ASCII if shown.isascii() else _DIGIT_GROUP_CORE).search(shown):
        shown = _DIGIT_GROUP.sub("", shown)
    if _INITIALS_CORE.search(shown):
        shown = _INITIALS.sub(lambda m: m.group().replace(".", ""), shown)
    return shown


def _word_runs(shown: str) -> tuple[str, str] | None:
    """The cleaned text (`_cleaned`) and the same with every character but a word character a space
    (`_WORD_RUNS`), when its words are its runs of word characters: a Latin-1 text without a
    decimal number. None for any other text. Most texts need no cleaning, and are not cleaned."""
    classes = latin1_translate(shown, _CLASSES)
    if classes is not None and ("0,000" in classes or ".a." in classes):  # a digit group, initials
        shown = _cleaned(shown)  # still Latin-1: cleaning only deletes characters
        classes = latin1_translate(shown, _CLASSES)
    if classes is None or "0.0" in classes:  # beyond Latin-1, or a digit, "." and a digit
        return None
    return shown, latin1_translate(shown, _WORD_RUNS)


@lru_cache(maxsize=256)
def _pieces(text: str) -> tuple[str, list[str], list[str] | tuple[str, str]]:
    """`readable(text)`, the words of its cleaned text (`_cleaned`), and what tells where each word
    stands: the cleaned text split into gaps and words (`_TOKENS`), or, when its words are its runs
    of word characters, the cleaned text and its runs (`_word_runs`). Where both `surely_passage`
    and `read` start, made once for a text both look at (a list's texts are asked the one, then
    read; a short memo: it hands over within one list)."""
    shown = readable(text)
    found = _word_runs(shown)
    if found is not None:
        return shown, found[1].split(), found
    cleaned = _cleaned(shown)
    pieces = (_TOKENS_ASCII if cleaned.isascii() else _TOKENS).split(cleaned)
    return shown, pieces[1::2], pieces


@lru_cache(maxsize=8192)
def surely_passage(text: str) -> bool:
    """True only when `read(text)` has more than `SHORT_WORDS` words, at a fraction of its cost: its
    words are the `_TOKEN` matches of the same cleaned text, less at most one per number word or
    "and" (folded into a number); False when that lower bound does not settle it. A list of
    passages is then judged on the lexical cosine alone, without reading any of them."""
    tokens = _pieces(text)[1]
    if len(tokens) <= SHORT_WORDS:
        return False
    # The first `_PASSAGE_HEAD` words settle most texts: more than SHORT_WORDS of them no number
    # absorbs (a passage has about 70 words, and a few "and"s); the rest are then not looked up.
    if len(tokens) > _PASSAGE_HEAD and \
            _PASSAGE_HEAD - sum(map(_FOLDS.__getitem__, islice(tokens, _PASSAGE_HEAD))) > SHORT_WORDS:
        return True
    foldable = sum(map(_FOLDS.__getitem__, tokens))
    return len(tokens) - foldable > SHORT_WORDS


@lru_cache(maxsize=8192)
def read(text: str) -> Reading:
    """`text` read for the judgement (memoised: a chunk is compared with many others): its words,
    names and content words, what every text of a list is asked; the rest of its `Reading` is made
    on first use. Word by word only where a word needs it: each step runs over the words in C."""
    shown, tokens, where = _pieces(text)
    words, names, kept = _run_tokens(*where, tokens) if isinstance(where, tuple) else _raw_tokens(where)
    if not _NUMBERS_AND_ORDINALS.isdisjoint(words):  # most texts spell neither: one pass tells
        words, names, kept = _fold_numbers(list(words), names, kept)
        if not _ORDINALS.keys().isdisjoint(words):
            for k, w in enumerate(words):
                if w in _ORDINALS:  # an ordinal is the number it orders: a name, and a content word
                    words[k], names[k], kept[k] = _ORDINALS[w], True, True
    content = list(compress(words, kept))
    return Reading(words=tuple(words), shown=shown, length=len(shown), name_flags=names,
                   content_words=content, content_keys=list(map(_KEYS.__getitem__, content)))


def _one_edit(a: str, b: str) -> bool:
    """A typo: one letter inserted, deleted, replaced or two swapped, in words of 4+ letters.

    Decided at the first letter where the words differ (`p`): a replacement leaves the rest
    equal, a swap the rest after the next letter, and an insertion or deletion anywhere is one at
    `p` (deleting any letter of a run of equal letters gives the same word). `p` is found in C
    (the first of the places where the letters differ), not by a generator over the letters."""
    if len(a) == len(b):
        if len(a) < 4 or a == b:
            return False
        p = next(compress(count(), map(ne, a, b)))  # equal in length and not equal: they differ
        return a[p + 1:] == b[p + 1:] or (a[p + 2:] == b[p + 2:] and a[p] == b[p + 1] and a[p + 1] == b[p])
    short, long = (a, b) if len(a) < len(b) else (b, a)
    if len(long) - len(short) > 1 or len(short) < 4:
        return False
    p = next(compress(count(), map(ne, short, long)), len(short))
    return long[p + 1:] == short[p:]


def _alike(a: str, b: str) -> bool:
    """Two words that are one word written two ways: a typo (one edit apart) or an abbreviation (a
    prefix of 3+ letters). Asked only of two words that are not numbers and not both in the static
    table's vocabulary (`differences` rules those out once per word): two vocabulary words are two
    words, however alike ("talking" / "walking", "play" / "player"); a typo or an abbreviation is a
    spelling the vocabulary lacks."""
    return _one_edit(a, b) or (len(b) >= 3 and a.startswith(b)) or (len(a) >= 3 and b.startswith(a))


def _spelled_out(word: str, other: Reading) -> tuple[str, ...]:
    """The words of the other text that `word` writes another way: two adjacent words written
    together ("tiebreak" / "tie break"), or the words whose initials it is (an acronym: "gil" /
    "global interpreter lock"); () when it is neither. The first such stretch, as a scan of the
    words from the start would find it (`Reading.spellings`)."""
    joined, initials = other.spellings
    if word in joined:
        return other.joined_pair(word)
    if not _initials_long(word):
        return ()
    at = initials.find(word)
    return other.words[at:at + len(word)] if at >= 0 else ()


def _missing(mine: Counter[str], theirs: Counter[str]) -> list[str]:
    """`list((mine - theirs).elements())` without building the Counter: each key as many times as
    `mine` has it more often than `theirs`, in `mine`'s order (both hold positive counts only)."""
    get = theirs.get
    out: list[str] = []
    for key, times in mine.items():
        if times > get(key, 0):
            out.append(key)
            if times > 1:  # the rest of its copies, if `theirs` has fewer by more than one
                out.extend([key] * (times - get(key, 0) - 1))
    return out


def _initials_long(word: str) -> bool:
    """Whether `word` is as long as a stretch of initials `_spelled_out` looks for (2 to 6 letters):
    a shorter or longer word is never one, though a one-letter word is in most texts' initials."""
    return 2 <= len(word) <= 6


_INITIALS_LONG = RunMemo(_initials_long, _WORD_MEMO_SIZE)


def differences(a: Reading, b: Reading) -> tuple[list[str], list[str]]:
    """The content words (keys) each text has that the other lacks, spelling aside."""
    only_a, _, only_b, _ = _differences(a, b)
    return only_a, only_b


def _differences(a: Reading, b: Reading) -> tuple[list[str], list[str], list[str], list[str]]:
    """`differences`, each list with the words its keys came from (`surface`), looked up once and
    kept in step with it, for `judge` to read them from: (only_a, its words, only_b, its words)."""
    return _spelling_aside(a, b, *_lone_words(a, b))


def _lone_words(a: Reading, b: Reading) -> tuple[list[str], list[str], list[str], list[str]]:
    """The content keys each text counts more often than the other (`_missing`), each list with
    the words its keys came from: what `_spelling_aside` starts from."""
    only_a = _missing(a.content, b.content)
    only_b = _missing(b.content, a.content)
    spelt_a = list(map(a.surface.__getitem__, only_a))  # every content key has its word
    spelt_b = list(map(b.surface.__getitem__, only_b))
    return only_a, spelt_a, only_b, spelt_b


def _spelling_aside(a: Reading, b: Reading, only_a: list[str], spelt_a: list[str], only_b: list[str],
                    spelt_b: list[str]) -> tuple[list[str], list[str], list[str], list[str]]:
    """The lone words of `_lone_words` less those the other text writes another way: pairs of
    words alike (`_unalike`), then words spelled out there (`_spelled_out`), in place."""
    if only_a and only_b:
        only_a, spelt_a, only_b, spelt_b = _unalike(only_a, spelt_a, only_b, spelt_b)
    for mine, spelt, theirs, spelt_theirs, other in ((only_a, spelt_a, only_b, spelt_b, b),
                                                     (only_b, spelt_b, only_a, spelt_a, a)):
        if not mine:
            continue
        maybe = _may_be_spelled_out(spelt, other)
        if not maybe:
            continue  # no word of `mine` is two of the other's words joined, nor their initials
        for x, sx in zip(list(mine), list(spelt), strict=True):
            parts = _spelled_out(sx, other) if sx in maybe else ()
            if parts:
                _remove(x, mine, spelt)
                for part in parts:
                    if _KEYS[part] in theirs:
                        _remove(_KEYS[part], theirs, spelt_theirs)
    return only_a, spelt_a, only_b, spelt_b


def _may_be_spelled_out(spelt: list[str], other: Reading) -> frozenset[str]:
    """The words of `spelt` that `_spelled_out` may find in `other`, by its own two tests: two of
    the other's adjacent words joined, or 2 to 6 letters found in its initials. Few or none; and
    none of a list's words when none of a longer list's words."""
    joined, initials = other.spellings
    return joined.intersection(spelt).union(
        filter(initials.__contains__, filter(_INITIALS_LONG.__getitem__, spelt)))


def _remove(key: str, keys: list[str], spelt: list[str]) -> None:
    """`keys.remove(key)`, and the word at the same place of `spelt` with it."""
    at = keys.index(key)
    del keys[at], spelt[at]


def _alike_keys(word: str) -> frozenset[str]:
    """Strings two words `_alike` share at least one of (`test_alike_words_share_a_key`):
    - an abbreviation (a prefix of 3+ letters) and a typo past the second letter keep the first
      two letters;
    - a typo in the first two letters of words of 4+ letters keeps what follows it: after the
      third letter for a swap, the second for a replacement (words of one length); and for a
      letter inserted or deleted, the longer word after its second letter is the shorter after
      its first.
    A word of 2 letters or fewer has none (a typo needs 4, an abbreviation 3)."""
    if len(word) < 3:
        return frozenset()
    return frozenset((word[:2], word[1:], word[2:], word[3:]) if len(word) >= 4 else (word[:2],))


def _found_by(word: str) -> frozenset[str | tuple[str]]:
    """The keys under which `_unalike` finds `word` as the other text's word: its `_alike_keys`,
    and for a word outside the static table's vocabulary the same keys tagged (each in a 1-tuple,
    never equal to a string), which is all a vocabulary word looks for (`_looks_for`). A number
    has none: it is never another spelling. (A set keeps its members' hashes: the tuples are
    hashed once, here.)"""
    if _is_number(word):
        return frozenset()
    keys = _alike_keys(word)
    return keys if in_vocabulary(word) else keys | {(key,) for key in keys}


def _looks_for(word: str) -> frozenset[str | tuple[str]]:
    """The keys `_unalike` looks `word` up by (`_found_by`): an unknown word may be another spelling
    of any word but a number, so it looks for the plain keys; a vocabulary word only of an unknown
    word (two vocabulary words are two words), so it looks for the tagged keys; a number for none."""
    if _is_number(word):
        return frozenset()
    keys = _alike_keys(word)
    return frozenset((key,) for key in keys) if in_vocabulary(word) else keys


# The key memos of `_found_by` and `_looks_for` hold fewer words: a word's keys take about 0.7 KB
# each way (a set of four to eight strings and tuples) where `_WORDS`' facts take 0.14 KB, so that
# both stay within about 12 MB; the lone words of the pairs judged are far fewer than the words read.
_KEYS_MEMO_SIZE = 8192
_FOUND_BY = RunMemo(_found_by, _KEYS_MEMO_SIZE)
_LOOKS_FOR = RunMemo(_looks_for, _KEYS_MEMO_SIZE)


def _unalike(only_a: list[str], spelt_a: list[str], only_b: list[str],
             spelt_b: list[str]) -> tuple[list[str], list[str], list[str], list[str]]:
    """`only_a` and `only_b` (and the words they came from, `spelt_a` and `spelt_b`) less the pairs
    of words that are one word written two ways (`_alike`), each word of `a` matched with the first
    word of `b` still unmatched, in their order.

    A number is never another spelling, nor are two vocabulary words; and two words alike share a
    key (`_alike_keys`). Each word's keys, tagged by what it may be another spelling of, are read
    once per word (`_found_by`, `_looks_for`), so set operations in C find the few words of `a`
    that may be alike one of `b`'s (most pairs have none), and, for each, the words of `b` sharing
    a key with it (`_sharing_a_key`): only those are compared."""
    found_b = list(map(_FOUND_BY.__getitem__, spelt_b))
    index = set().union(*found_b)
    if not index:
        return only_a, spelt_a, only_b, spelt_b
    apart = list(map(index.isdisjoint, map(_LOOKS_FOR.__getitem__, spelt_a)))
    if all(apart):
        return only_a, spelt_a, only_b, spelt_b  # no word of `a` shares a key with one of b's it may be
    taken: set[int] = set()  # positions in only_b matched
    matched: set[int] = set()  # positions in only_a matched
    for i in compress(range(len(apart)), map(not_, apart)):
        sx = spelt_a[i]
        for k in _sharing_a_key(_LOOKS_FOR[sx], found_b):
            if k not in taken and _alike(sx, spelt_b[k]):
                taken.add(k)
                matched.add(i)
                break
    if not taken:
        return only_a, spelt_a, only_b, spelt_b
    kept_a = [i for i in range(len(only_a)) if i not in matched]
    kept_b = [k for k in range(len(only_b)) if k not in taken]
    return ([only_a[i] for i in kept_a], [spelt_a[i] for i in kept_a],
            [only_b[k] for k in kept_b], [spelt_b[k] for k in kept_b])


def _sharing_a_key(looks: frozenset[str | tuple[str]],
                   found: list[frozenset[str | tuple[str]]]) -> Iterator[int]:
    """The positions, in order, of the key sets in `found` that meet `looks`: one pass in C (each
    set's disjointness test, negated) instead of a Python iteration per word of the other text."""
    return compress(count(), map(not_, map(looks.isdisjoint, found)))


def copies(a: Reading, b: Reading) -> bool:
    """Two texts that differ at most in white space, case, Unicode form and punctuation: the same
    words in the same order (two texts without a word, such as two emoji, only when equal)."""
    return a.words == b.words and (bool(a.words) or a.folded == b.folded)


def _negations_toward(own: Reading, other: Reading) -> int:
    """The negations of the sentences of `own` that speak of what `other` says: those sharing a
    content word with it, and those with no content word at all ("No.", "Not really."), which
    belong to every claim of the text. A longer text's sentence on another matter does not count."""
    if NEGATIONS.isdisjoint(own.words) or len(own.sentences) < 2:
        # No negation word anywhere, so none in any sentence (a sentence's words are the text's,
        # and a "No," it discounts is itself the word "no"): all of them count 0; or one sentence.
        # Asked in this order, a text without a negation word is never split into sentences.
        return own.negations
    parts = [read(s) for s in own.sentences]
    # A sentence counting no negation adds nothing, whatever it speaks of; two counters share a
    # content word exactly when their keys meet (both hold positive counts only).
    return sum(p.negations for p in parts
               if p.negations and (not p.content or not p.content.keys().isdisjoint(other.content)))





def _has_vector(word: str) -> bool:
    """Whether `_substituted` may compare `word`: not a number, and a whole word of the static
    table's vocabulary (a fact of the word, memoised in `_HAS_VECTOR`)."""
    return not _is_number(word) and in_vocabulary(word)


_HAS_VECTOR = RunMemo(_has_vector, _WORD_MEMO_SIZE)


def _substituted(mine: Sequence[str], own: Reading, other_lone: Sequence[str], other: Reading,
                 substitute: float) -> bool:
    """Whether every word of `mine` (the words of `own` whose content-word keys the other text
    lacks, `_differences`) has a close substitute among `other_lone` (the other's such words): a
    word whose static vector's cosine with it is at least
    `substitute`; both words must be whole words of the table's vocabulary (a word it spells in
    pieces has no vector of its own to compare). A number or a name has none (another value,
    another subject), nor has any word when the other text has no word of its own to stand for it."""
    if not mine:
        return True
    if not other_lone:
        return False
    if not own.names.isdisjoint(mine) or not all(map(_HAS_VECTOR.__getitem__, mine)):
        return False
    theirs = list(filterfalse(other.names.__contains__, filter(_HAS_VECTOR.__getitem__, other_lone)))
    if not theirs:
        return False
    return bool((word_vectors(tuple(mine)) @ word_vectors(tuple(theirs)).T).max(axis=1).min() >= substitute)


@lru_cache(maxsize=1)
def _static() -> StaticEmbedder:
    return StaticEmbedder()


@lru_cache(maxsize=65536)
def _word_vector(word: str) -> np.ndarray:
    return np.asarray(_static().embed([word])[0], dtype=np.float64)


def word_vectors(words: tuple[str, ...]) -> np.ndarray:
    """The static table's unit vector of each word (memoised per word): what `_substituted` compares.
    One row per word, stacked by `np.array` (the same array as `np.vstack`, which costs about four
    times as much on a few rows); no word is `np.vstack`'s error."""
    rows = list(map(_word_vector, words))
    return np.array(rows) if rows else np.vstack(rows)


@dataclass(frozen=True)
class Verdict:
    """Whether two texts are redundant, which to keep (0: the first, 1: the second, None: the more
    concise), and why (for notes and tests)."""

    redundant: bool
    why: str
    keep: int | None = None


def judge(a: Reading, b: Reading, semantic: float, rules: Rules, lexical: float = 0.0) -> Verdict:
    """The judgement of the module docstring for one pair. `semantic` is the texts' cosine under
    the family's sentence vectors, `lexical` under the lexical embedder's (which stands for the
    meaning of a passage, a text longer than `SHORT_WORDS`)."""
    if copies(a, b):
        return Verdict(True, "copy")  # whatever it says, it is said twice
    if not a.content or not b.content:
        return Verdict(False, "no content")  # a text that says nothing is not said by another
    if _negations_toward(a, b) != _negations_toward(b, a):
        return Verdict(False, "negation")  # settled before the word-by-word comparison it needs not
    # Numbers one text has more often than the other (the Counter difference, without building it).
    more_a, more_b = bool(_missing(a.numbers, b.numbers)), bool(_missing(b.numbers, a.numbers))
    only_a, spelt_a, only_b, spelt_b = _lone_words(a, b)
    if more_a and more_b and not _may_be_spelled_out(spelt_a, b) and not _may_be_spelled_out(spelt_b, a):
        # Settled without `_spelling_aside`: each side keeps a number the other lacks (a number's
        # key is a lone key of its text; `_unalike` never takes a number, and nothing here is
        # spelled out), and a number has no substitute, so neither text is inside the other.
        return Verdict(False, "numbers")
    only_a, spelt_a, only_b, spelt_b = _spelling_aside(a, b, only_a, spelt_a, only_b, spelt_b)
    # Each text's words the other lacks, each with a close substitute there (or none to account for).
    passage = len(a.words) > SHORT_WORDS or len(b.words) > SHORT_WORDS
    close = lexical >= LEXICAL_COPY if passage else semantic >= rules.tau
    if not only_a and not only_b:
        return Verdict(True, "copy")  # the same content words: one text said again
    # A text whose every word the other has, or stands for with a close substitute, says nothing
    # the other does not: inside it when the other says more (that one is kept), else a restatement.
    a_in_b = not only_a or (close and _substituted(spelt_a, a, spelt_b, b, rules.substitute))
    b_in_a = not only_b or (close and _substituted(spelt_b, b, spelt_a, a, rules.substitute))
    if a_in_b and b_in_a:
        return Verdict(True, "restatement") if only_a and only_b else \
            Verdict(True, "contained", 1 if not only_a else 0)
    if a_in_b or b_in_a:
        return Verdict(True, "contained", 1 if a_in_b else 0)
    # Why not (for notes and tests): another value, another subject, another word.
    if more_a and more_b:
        return Verdict(False, "numbers")
    if not a.names.isdisjoint(spelt_a) or not b.names.isdisjoint(spelt_b):  # a lone word is a name
        return Verdict(False, "names")
    if more_a or more_b:
        return Verdict(False, "numbers")
    return Verdict(False, "substitution" if close else "meaning")


@lru_cache(maxsize=16384)
def _judged(a: str, b: str, semantic: float, tau: float, substitute: float, lexical: float) -> Verdict:
    """`judge` of two texts, memoised on everything it reads (the texts, both cosines, the rules'
    two numbers, cheaper to hash than the `Rules` value): a pair compared before (a window's
    survivors again in the final pass, passages a service retrieves again and again) costs a
    lookup. Judging a short text against a passage word by word is the post-pass's dearest step
    (about 0.1 ms a pair)."""
    return judge(read(a), read(b), semantic, Rules(tau, substitute), lexical)


def rules_for(family: str) -> Rules:
    """The rules of an embedder family ("static" for the default and unknown ones)."""
    for prefix, rules in RULES.items():
        if family.startswith(prefix):
            return rules
    return RULES["static"]


def _sharing(texts: Sequence[str], short: Sequence[bool]) -> list[tuple[int, int]]:
    """The pairs (i < j) with a short text (`short[i]` or `short[j]`) of which the text with fewer
    distinct content words shares at least half of them with the other (it may be inside it, or a
    copy). Only such pairs are asked about (`redundancy`): a short text has a few dozen words, and
    a list holds a few short texts at most. Each pair's answer is `_shares_half`'s."""
    found = []
    for i in (i for i, s in enumerate(short) if s):
        mine = texts[i]
        for j, theirs in enumerate(texts):
            if j == i or (j < i and short[j]):  # itself, or a pair already seen from the other side
                continue
            if _shares_half(mine, theirs):
                found.append((i, j) if i < j else (j, i))
    return found


@lru_cache(maxsize=65536)
def _shares_half(a: str, b: str) -> bool:
    """Whether the text of `a` and `b` with fewer distinct content words shares at least half of
    them with the other: a fact of the two texts alone, memoised as the judgement is (`_judged`),
    so a pair met again (the same passages retrieved for another question) costs a lookup instead
    of a set intersection. Symmetric; each pair is asked in one order by `_sharing`."""
    mine, theirs = read(a).keys, read(b).keys
    smaller = min(len(mine), len(theirs))
    return bool(smaller) and 2 * len(mine & theirs) >= smaller


def redundancy(texts: Sequence[str], semantic: np.ndarray | Callable[[], np.ndarray], rules: Rules,
               lexical: np.ndarray, candidates: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For every pair of `texts`: whether they are redundant (a symmetric bool matrix), and which
    to keep of a redundant pair (`prefer[i, j]` True when `i` is to be kept over `j` because it
    contains `j`: it says all `j` says and more). `semantic` is the texts' cosine matrix under the
    family's sentence vectors (or a function making it, called unless every text is surely a
    passage: a list of passages needs none), `lexical` under the lexical embedder's.

    Only pairs that could be redundant are read word by word: the `candidates` (a bool matrix, a
    cheap prefilter the caller computed), else the pairs close in meaning (cosine at or above
    `tau`), near copies (lexical cosine at or above `LEXICAL_COPY`), or a short text sharing at least
    half of its content words with the other. Two passages (more than `SHORT_WORDS` words each) are
    candidates only as near copies: their sentence vectors say little (`judge`)."""
    n = len(texts)
    redundant = np.zeros((n, n), dtype=bool)
    prefer = np.zeros((n, n), dtype=bool)
    if n < 2:
        return redundant, prefer
    copy = lexical >= LEXICAL_COPY
    given = candidates
    if all(map(surely_passage, texts)):  # every pair is two passages: only near copies are candidates
        judged = copy if candidates is None else copy & candidates
        semantic_of: np.ndarray | None = None
    else:
        semantic_of = semantic() if callable(semantic) else semantic
        short = [len(read(t).words) <= SHORT_WORDS for t in texts]
        if candidates is None:
            in_short = np.array(short)
            with_short = in_short[:, None] | in_short[None, :]
            candidates = copy | (with_short & (semantic_of >= rules.tau))
            for i, j in _sharing(texts, short):
                candidates[i, j] = True
        judged = candidates.copy()
        groups: dict[str, list[int]] = {}
        for i, t in enumerate(texts):  # copies are judged whatever their cosines (a zero vector has none)
            groups.setdefault(read(t).copy_key, []).append(i)
        for members in (m for m in groups.values() if len(m) > 1):
            for x, i in enumerate(members):
                for j in members[x + 1:]:
                    judged[i, j] |= given is None or bool(given[i, j])
    rows, cols = np.nonzero(judged)
    upper = rows < cols  # the pairs above the diagonal, row by row
    rows, cols = rows[upper], cols[upper]
    cosines = [0.0] * len(rows) if semantic_of is None else semantic_of[rows, cols].tolist()
    lexicals = lexical[rows, cols].tolist()
    tau, substitute = rules.tau, rules.substitute
    for i, j, cosine, lex in zip(rows.tolist(), cols.tolist(), cosines, lexicals, strict=True):
        verdict = _judged(texts[i], texts[j], cosine, tau, substitute, lex)
        if verdict.redundant:
            redundant[i, j] = redundant[j, i] = True
            if verdict.keep is not None:
                kept, other = (i, j) if verdict.keep == 0 else (j, i)
                prefer[kept, other] = True
    return redundant, prefer


__all__ = ["FUNCTION_WORDS", "LEXICAL_COPY", "RULES", "SHORT_WORDS", "Reading",
           "Rules", "Verdict", "differences", "judge", "read", "redundancy", "rules_for", "surely_passage",
           "word_vectors"]
