"""rag_rerank/redundancy.py, reading one text: the fast paths `read` and `surely_passage` take on
first sight (a text the process has not seen), each held to the plain rule it stands for, over
arbitrary Unicode and over the Latin-1 text those paths are for.

The pairwise judgement is tested in tests/test_redundancy.py.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from itertools import pairwise
from unittest.mock import patch

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rag_rerank import redundancy
from rag_rerank.frozen import generated_init, with_direct_init
from rag_rerank.redundancy import (
    _CLASSES,
    _DIGIT_GROUP_CORE,
    _INITIALS_CORE,
    _TOKEN,
    _TOKENS,
    Reading,
    _cleaned,
    _pieces,
    _raw_tokens,
    _run_tokens,
    _spelled_out,
    _word_runs,
    read,
)
from rag_rerank.text import is_latin1, latin1_translate, readable

# What the Latin-1 path must get right: capitals where a sentence opens and where it does not,
# openers, decimals, digit groups, dotted initials, accents and mojibake, acronyms, words inside
# words ("iPhone" / "Phone"), and the same word at both kinds of place.
_LATIN1_PIECES = st.sampled_from([
    "The", "the", "A", "a", "AB", "Phone", "iPhone", "Co2", "Co", "It", "IT", "\u00c9t\u00e9",
    "\u00e9t\u00e9",
    "\u00c3\u00a9", "\u00e2\u0080\u0099", "U.S.", "u.n.", "e.g.", "1.5", "1.5.2", "12.", ".5", "1..2", "a1.5",
    "1,000", "1 000", "2\u00a0500", "5'000", "1_000", "3rd", "\u00b2.3", "\u00aa", "\u00b5", "_", "x_1",
    ".", ",", "!", "?", ":", ";", '"', "(", ")", "\u00ab", "\u00bb", "-", "'", " ", "\u00a0", "\n", "\t",
    "\x85", "\x00", "\u00ad"])
_LATIN1_TEXT = st.one_of(
    st.lists(st.one_of(_LATIN1_PIECES, st.text(st.characters(max_codepoint=255), max_size=4)),
             max_size=40).map(" ".join),
    st.lists(st.one_of(_LATIN1_PIECES, st.text(st.characters(max_codepoint=255), max_size=4)),
             max_size=40).map("".join))


def _read_by_regex(text: str) -> Reading:
    """`read(text)` with the Latin-1 path switched off: every text split by the regexes."""
    read.cache_clear()
    _pieces.cache_clear()
    try:
        with patch.object(redundancy, "_word_runs", lambda shown: None):
            return read(text)
    finally:
        read.cache_clear()
        _pieces.cache_clear()


def _fields(reading: Reading) -> tuple[object, ...]:
    """Every field of a reading, the order of its counters and maps included."""
    return (reading.words, list(reading.content.items()), list(reading.surface.items()), reading.names,
            list(reading.numbers.items()), reading.negations, reading.shown, reading.folded, reading.length)


def _regex_reading(shown: str) -> tuple[str, list[str], tuple[tuple[str, ...], list[bool], list[bool]]]:
    """The plain rule: the text cleaned by its regexes, split by `_TOKENS` into gaps and words, and
    each word's place read from its gap (`_raw_tokens`)."""
    cleaned = _cleaned(shown)
    pieces = _TOKENS.split(cleaned)
    return cleaned, pieces[1::2], _raw_tokens(pieces)


@settings(max_examples=600, deadline=None, derandomize=True)
@given(st.one_of(_LATIN1_TEXT, st.text(max_size=60)))
@example("The U.S. said: Two. (It) works, IBM says 3rd. \u00abLe\u00bb 1,000 iPhone Phone A AB A.")
@example("Phone iPhone Phone Co2 Co Co")
@example("End. Co2 Co. AB A")  # a word that is not looked up, opening a sentence, begins with one that is
@example('"The end" -The The. the The')
@example("Version 1.5 of It")
@example("1 000.5 It")
@example("")
def test_the_latin1_reading_is_the_regex_reading(text: str) -> None:
    """`_word_runs` finds the words of a Latin-1 text without a decimal number as its runs of word
    characters, and `_run_tokens` each capitalised word's place by looking the word up: the same
    cleaned text, words and names as the regexes' split and its gaps (and it is the path taken:
    None only for a text beyond Latin-1 or with a digit, "." and a digit once cleaned)."""
    shown = readable(text)
    cleaned, tokens, by_regex = _regex_reading(shown)
    found = _word_runs(shown)
    if found is None:
        assert not is_latin1(shown) or re.search(r"\d\.\d", cleaned)
        assert isinstance(_pieces(text)[2], list)
        return
    assert is_latin1(shown) and not re.search(r"\d\.\d", cleaned)
    assert found[0] == cleaned
    assert found[1].split() == tokens
    assert _run_tokens(*found, tokens) == by_regex  # words, names and content words
    assert _pieces(text) == (shown, tokens, found)
    assert _fields(read(text)) == _fields(_read_by_regex(text))

@settings(max_examples=300, deadline=None, derandomize=True)
@given(_LATIN1_TEXT)
@example("1,000 and U.S. and 1.5 and 12. and .5")
def test_the_classes_find_what_the_regexes_find(text: str) -> None:
    """`_word_runs` asks the class string (`_CLASSES`) for a digit group, dotted initials and a
    decimal number by a substring search: each found exactly when its regex finds it."""
    shown = readable(text)
    classes = latin1_translate(shown, _CLASSES)
    if classes is None:  # NFKC took it beyond Latin-1 ("\u00bc" is "1\u20444")
        assert not is_latin1(shown)
        return
    assert len(classes) == len(shown)
    assert ("0,000" in classes) == bool(_DIGIT_GROUP_CORE.search(shown))
    assert (".a." in classes) == bool(_INITIALS_CORE.search(shown))
    assert ("0.0" in classes) == bool(re.search(r"\d\.\d", shown))


def test_the_class_of_every_latin1_character_is_its_regex_class() -> None:
    """Each Latin-1 character's class, against the regexes' classes one character at a time."""
    classes = latin1_translate("".join(map(chr, range(256))), _CLASSES)
    assert classes is not None
    for ch, cls in zip(map(chr, range(256)), classes, strict=True):
        expected = ("0" if re.fullmatch(r"\d", ch) else "a" if re.fullmatch(r"[^\W\d_]", ch)
                    else "," if re.fullmatch(r"[,' \u00a0\u202f_]", ch) else "." if ch == "." else "-")
        assert cls == expected, (ch, cls)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.one_of(_LATIN1_TEXT, st.text(max_size=40)))
def test_the_words_are_the_plain_tokens(text: str) -> None:
    """Whichever path `_pieces` takes, its words are `_TOKEN`'s matches in the cleaned text."""
    assert _pieces(text)[1] == _TOKEN.findall(_cleaned(readable(text)))


def test_a_reading_is_built_by_the_direct_init_the_frozen_tests_hold() -> None:
    """`Reading` is built without a setattr per field (`frozen.direct_init_read_often`): it is
    among the classes tests/test_frozen.py holds to their generated `__init__`, and a reading made
    by it equals one made by the generated one."""
    reading = read("The cache holds 3 keys. It is not warm.")
    assert Reading in with_direct_init()
    fields = {f.name: getattr(reading, f.name) for f in dataclasses.fields(Reading)}
    expected = object.__new__(Reading)
    generated_init(Reading)(expected, **fields)
    assert expected == reading and list(vars(expected)) == [f.name for f in dataclasses.fields(Reading)]


def _spelled_out_by_scan(word: str, reading: Reading) -> tuple[str, ...]:
    """The plain rule `_spelled_out` answers from `Reading.spellings`: the first two adjacent words
    written together as `word`, else the first stretch of 2 to 6 words whose initials it is."""
    words = reading.words
    for k in range(len(words) - 1):
        if words[k] + words[k + 1] == word:
            return words[k:k + 2]
    if 2 <= len(word) <= 6:
        for k in range(len(words) - len(word) + 1):
            if "".join(w[0] for w in words[k:k + len(word)]) == word:
                return words[k:k + len(word)]
    return ()


_JOINABLE = st.lists(st.sampled_from(["tie", "break", "tiebreak", "a", "ab", "b", "ba", "aba", "\u00e9",
                                      "\u0130", "\u00df", "1", "12", "21"]), max_size=12).map(" ".join)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.one_of(_JOINABLE, st.text(max_size=60)), st.one_of(_JOINABLE, st.text(max_size=8)), st.data())
@example("tie break tiebreak tie break", "tiebreak", None)
@example("a ba b aba ab a", "aba", None)
@example("ab a b", "ab", None)
def test_the_joins_set_finds_the_first_pair_a_scan_finds(text: str, word: str,
                                                          data: st.DataObject | None) -> None:
    """`Reading.spellings`' set of joins holds exactly the adjacent pairs run together, and
    `joined_pair` / `_spelled_out` give the first stretch a scan from the start finds (the table it
    replaced kept each join's first pair)."""
    reading = read(text)
    words = reading.words
    if data is not None and len(words) > 1:  # a join that is there, often
        k = data.draw(st.integers(0, len(words) - 2))
        word = data.draw(st.sampled_from([word, words[k] + words[k + 1]]))
    assert reading.spellings[0] == {x + y for x, y in pairwise(words)}
    first = next((words[k:k + 2] for k in range(len(words) - 1) if words[k] + words[k + 1] == word), ())
    assert reading.joined_pair(word) == first
    assert _spelled_out(word, reading) == _spelled_out_by_scan(word, reading)


_MADE_ON_FIRST_USE = ("content", "surface", "named", "names", "numbers", "negations", "folded", "sentences",
                      "copy_key", "keys", "spellings")


def _made_at_once(reading: Reading) -> dict[str, object]:
    """The plain rule for each part of a reading `read` leaves to first use, from its words, their
    name flags and its text alone, word by word (the counters' and the map's order included)."""
    words, flags = reading.words, reading.name_flags
    content = [w for w, name in zip(words, flags, strict=True) if name or w not in redundancy._NOT_CONTENT]
    keys = [redundancy._key(w) for w in content]
    surface: dict[str, str] = {}  # each key's first word, the keys from the end (the order `read` had)
    for key, word in reversed(list(zip(keys, content, strict=True))):
        surface[key] = word  # a key keeps its place, and takes an earlier word
    named = [w for w, name in zip(words, flags, strict=True) if name]
    numbers = [redundancy._key(w) for w in named if any(ch.isdigit() for ch in w)]
    negations = sum(w in redundancy.NEGATIONS for w in words)
    if "no" in words:
        negations -= len(re.findall(r"(?<!\w)no\s*[,.!;:]", reading.shown, re.IGNORECASE))
    return {"content": list(Counter(keys).items()), "surface": list(surface.items()), "named": named,
            "names": {w for w in named if not any(ch.isdigit() for ch in w)},
            "numbers": list(Counter(numbers).items()), "negations": negations,
            "folded": reading.shown.casefold(),
            "sentences": tuple(s for s in re.split(r"(?<=[.!?;])\s+", reading.shown) if s.strip()),
            "copy_key": " ".join(words) if words else "\x00" + reading.shown.casefold(), "keys": set(keys),
            "spellings": ({x + y for x, y in pairwise(words)}, "".join(w[0] for w in words))}


def _as_compared(name: str, value: object) -> object:
    """A part as `_made_at_once` states it: a counter or a map as its items in order."""
    return list(value.items()) if name in ("content", "surface", "numbers") else value  # type: ignore[attr-defined]


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.one_of(_LATIN1_TEXT, st.text(max_size=60)), st.permutations(_MADE_ON_FIRST_USE))
@example("No, it is not 3 or two hundred and five. The U.S. never said: Two. No. 4th", _MADE_ON_FIRST_USE)
@example("NASA and nasa: the Moon, 1.50 and 1.5, no!", tuple(reversed(_MADE_ON_FIRST_USE)))
@example("\U0001f600 \U0001f601", _MADE_ON_FIRST_USE)
def test_each_part_made_on_first_use_is_the_plain_rule(text: str, order: tuple[str, ...]) -> None:
    """`read` makes the words, their names and the content words; every other part of a `Reading`
    is made on its first use (most texts of a list are never judged word by word): nothing of it
    before, and each part, asked in any order, what the plain rule makes of the words and the
    text at once."""
    reading = read.__wrapped__(text)  # a fresh reading, not the memoised one
    assert list(vars(reading)) == [f.name for f in dataclasses.fields(Reading)]
    assert reading.content_keys == [redundancy._key(w) for w in reading.content_words]
    expected = _made_at_once(reading)
    for name in order:
        assert _as_compared(name, getattr(reading, name)) == expected[name], name
        assert getattr(reading, name) is getattr(reading, name)  # made once


_FOLDISH = st.sampled_from(["two", "Two", "TWO", "tWo", "hundred", "and", "AND", "aNd", "five", "\ufb01ve",
                            "\u017fix", "1,000", "3rd", "andy", "an", "\u00df", "\u0130", "x", " ", "."])


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.one_of(st.lists(st.one_of(_FOLDISH, st.text(max_size=8)), min_size=25, max_size=70).map(" ".join),
                 st.text(max_size=80)))
@example(" ".join(["AND"] * 20 + ["word"] * 31))
@example(" ".join(["aNd"] * 2 + ["word"] * 30))
@example(" ".join(["and"] * 10 + ["word"] * 30 + ["and"]))  # the first 40 words settle nothing
@example(" ".join(["and"] * 10 + ["word"] * 30 + ["two"] + ["word"] * 5))
@example(" ".join(["word"] * 31 + ["and"] * 40))
def test_the_passage_bound_counts_the_foldable_words_plainly(text: str) -> None:
    """`surely_passage` counts the words a number may absorb through a memo of each word as
    written (`_FOLDS`), in the first 40 words first: the same answer as case-folding every token
    and looking it up."""
    tokens = _TOKEN.findall(_cleaned(readable(text)))
    foldable = sum(t.casefold() in redundancy._FOLDABLE for t in tokens)
    expected = len(tokens) > redundancy.SHORT_WORDS and len(tokens) - foldable > redundancy.SHORT_WORDS
    assert redundancy.surely_passage.__wrapped__(text) == expected


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.one_of(_LATIN1_TEXT, st.text(max_size=60)))
@example("The end. The The, In in IN: It said (It) \u00abThe\u00bb no No NO. Not")
@example("Two hundred and five, The first. the Third and AND Forty one, No: second")
@example("")
def test_the_content_flags_are_the_plain_rule(text: str) -> None:
    """Both ways of reading a text's words (`_run_tokens`, `_raw_tokens`) flag as content words the
    words that are names or outside `_NOT_CONTENT` (the word memo says so of every word whose
    place does not decide; the place decides the rest), and `read` keeps those flags through the
    folding of numbers and ordinals: the same words the plain rule keeps."""
    shown = readable(text)
    _, _, (words, names, kept) = _regex_reading(shown)
    assert kept == [name or w not in redundancy._NOT_CONTENT for w, name in zip(words, names, strict=True)]
    found = _word_runs(shown)
    if found is not None:
        assert _run_tokens(*found, found[1].split())[2] == kept
    reading = read.__wrapped__(text)
    assert reading.content_words == [w for w, name in zip(reading.words, reading.name_flags, strict=True)
                                     if name or w not in redundancy._NOT_CONTENT]
