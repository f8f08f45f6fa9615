"""rag_rerank/redundancy.py, the judgement of a pair: the fast paths held to the plain rules.

`differences` and the helpers it calls find the words two texts do not share, spelling aside, with
indexes, set tests and early exits that skip most of the work of the rule as first written. Each
test here restates that rule plainly (word by word, as the module docstring says it) and checks
the fast path gives the same answer, over texts built from words that are alike in every way the
rule knows (typos, abbreviations, joins, acronyms, numbers, names) and over arbitrary Unicode.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rag_rerank.embed.memo import RunMemo
from rag_rerank.embed.static import in_vocabulary
from rag_rerank.redundancy import (
    _FOUND_BY,
    _HAS_VECTOR,
    _INITIALS_LONG,
    _KEYS,
    _LOOKS_FOR,
    LEXICAL_COPY,
    RULES,
    SHORT_WORDS,
    Reading,
    Verdict,
    _alike,
    _alike_keys,
    _differences,
    _found_by,
    _has_vector,
    _initials_long,
    _looks_for,
    _missing,
    _negations_toward,
    _one_edit,
    _sharing_a_key,
    _spelled_out,
    _substituted,
    _word_vector,
    copies,
    differences,
    judge,
    read,
    word_vectors,
)


def _plain_missing(mine: Counter[str], theirs: Counter[str]) -> list[str]:
    return list((mine - theirs).elements())


def _plain_unalike(only_a: list[str], a: Reading, only_b: list[str],
                   b: Reading) -> tuple[list[str], list[str]]:
    """Each word of `a` matched with the first word of `b` still unmatched that is `_alike` it, in
    their order; a number is never another spelling, nor are two vocabulary words."""
    def number(word: str) -> bool:
        return any(ch.isdigit() for ch in word)

    taken: set[int] = set()
    kept_a = []
    for x in only_a:
        sx = a.surface.get(x, x)
        match = None
        for k, y in enumerate(only_b):
            sy = b.surface.get(y, y)
            if k in taken or number(sx) or number(sy) or (in_vocabulary(sx) and in_vocabulary(sy)):
                continue
            if _alike(sx, sy):
                match = k
                break
        if match is None:
            kept_a.append(x)
        else:
            taken.add(match)
    return kept_a, [y for k, y in enumerate(only_b) if k not in taken]


def _plain_differences(a: Reading, b: Reading) -> tuple[list[str], list[str]]:
    """`differences` as first written: the Counter differences, the pairs of words alike taken
    out, then each remaining word that is two of the other text's words joined or their initials."""
    only_a, only_b = _plain_missing(a.content, b.content), _plain_missing(b.content, a.content)
    if only_a and only_b:
        only_a, only_b = _plain_unalike(only_a, a, only_b, b)
    for mine, theirs, own, other in ((only_a, only_b, a, b), (only_b, only_a, b, a)):
        for x in list(mine):
            parts = _spelled_out(own.surface.get(x, x), other)
            if parts:
                mine.remove(x)
                for part in parts:
                    if _KEYS[part] in theirs:
                        theirs.remove(_KEYS[part])
    return only_a, only_b


# Words alike in the ways the judgement knows: typos and abbreviations of vocabulary words (and of
# each other), two vocabulary words that are alike but two words, joins and acronyms, numbers,
# names, short words; and arbitrary Unicode.
_WORDS = st.sampled_from(["receive", "recieve", "reciev", "rec", "government", "goverment", "govt", "gov",
                          "play", "player", "plya", "talking", "walking", "tie", "break", "tiebreak",
                          "tie-break", "global", "interpreter", "lock", "GIL", "gil", "Obama", "Obamas",
                          "obama's", "teh", "the", "thee", "cat", "cats", "tac", "act", "3", "3rd", "three",
                          "1.5", "1.50", "x", "xy", "xyz", "xyzw", "yxzw", "xzyw", "Paris", "paris", "no",
                          "not", "color", "colour", "colr", "and", "a", "ab", "abc", "abcd", "abce", "bacd",
                          "acbd", "abcde", "é", "éa", "éab", "éabc"])
_TEXT = st.lists(st.one_of(_WORDS, _WORDS, _WORDS, st.text(max_size=8)), max_size=24).map(" ".join)


@settings(max_examples=600, deadline=None, derandomize=True)
@given(_TEXT, _TEXT)
@example("the govt said it will recieve the tiebreak", "the government says it receives a tie break")
@example("abcd abce bacd", "acbd abcd abce")
@example("xyzw yxzw", "xzyw xyzw xyzw")
@example("Obama's cats play", "obamas tac plya colr")
@example("a tb and gil", "a tie break and global interpreter lock")  # acronyms of 2 and 3 letters
@example("my exwife has the global interpreter lock", "my ex wife has the gil")  # a join, then an acronym
@example("the xyzw", "the xzyw")  # a swap of the second and third letters: only their rest is alike
def test_differences_are_the_plain_rule(a: str, b: str) -> None:
    """`differences` (with its indexed `_unalike`) is the rule written word by word, both ways, and
    the words `_differences` hands `judge` with it are the lone keys' words."""
    ra, rb = read(a), read(b)
    for one, other in ((ra, rb), (rb, ra)):
        only_a, spelt_a, only_b, spelt_b = _differences(one, other)
        assert differences(one, other) == (only_a, only_b) == _plain_differences(one, other)
        assert spelt_a == [one.surface.get(x, x) for x in only_a]
        assert spelt_b == [other.surface.get(y, y) for y in only_b]


_EDITS = st.sampled_from(["replace", "insert", "delete", "swap", "prefix", "other"])


@settings(max_examples=1000, deadline=None, derandomize=True)
@given(st.text(min_size=1, max_size=10), st.integers(0, 12), _EDITS, st.text(min_size=1, max_size=10))
@example("receive", 0, "swap", "x")
@example("receive", 1, "swap", "x")
@example("receive", 0, "insert", "x")
@example("receive", 1, "delete", "x")
@example("abcd", 0, "replace", "x")
@example("abc", 3, "insert", "x")
@example("government", 3, "prefix", "x")
def test_alike_words_share_a_key(word: str, at: int, edit: str, other: str) -> None:
    """What lets `_unalike` compare only words sharing a key: two words `_alike` share one of their
    `_alike_keys` (a word and each kind of edit of it at every place, and arbitrary pairs)."""
    i = at % (len(word) + 1)
    edited = {"replace": word[:i] + other[0] + word[i + 1:], "insert": word[:i] + other[0] + word[i:],
              "delete": word[:i] + word[i + 1:],
              "swap": word[:i] + word[i + 1:i + 2] + word[i:i + 1] + word[i + 2:],
              "prefix": word[:i], "other": other}[edit]
    for a, b in ((word, edited), (edited, word), (word, other)):
        if _alike(a, b):
            assert _alike_keys(a) & _alike_keys(b), (a, b)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.dictionaries(st.text(max_size=3), st.integers(1, 4), max_size=12),
       st.dictionaries(st.text(max_size=3), st.integers(1, 4), max_size=12))
@example({"a": 3, "b": 1, "c": 2}, {"a": 1, "c": 2, "d": 1})
def test_missing_is_the_counter_difference(mine: dict[str, int], theirs: dict[str, int]) -> None:
    """`_missing` is `Counter` subtraction's elements, in `mine`'s order, without the Counter."""
    assert _missing(Counter(mine), Counter(theirs)) == _plain_missing(Counter(mine), Counter(theirs))


def _plain_substituted(lone: list[str], own: Reading, other_lone: list[str], other: Reading,
                       substitute: float) -> bool:
    """Every lone word a vocabulary word, neither a number nor a name, with a close substitute
    among the other's lone words that are such words too."""
    def comparable(word: str, reading: Reading) -> bool:
        return not any(ch.isdigit() for ch in word) and word not in reading.names and in_vocabulary(word)

    if not lone:
        return True
    mine = [own.surface.get(x, x) for x in lone]
    theirs = [w for w in (other.surface.get(y, y) for y in other_lone) if comparable(w, other)]
    if not all(comparable(w, own) for w in mine) or not theirs:
        return False
    cosines = word_vectors(tuple(mine)) @ word_vectors(tuple(theirs)).T
    return all(float(np.max(row)) >= substitute for row in cosines)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_TEXT, _TEXT, st.sampled_from([0.0, 0.3, 0.5, 0.8]))
@example("the govt said it will recieve the cats", "Paris says 3 tac play colour", 0.3)
@example("colour play", "color player", 0.5)
def test_substitution_is_the_plain_rule(a: str, b: str, substitute: float) -> None:
    """`_substituted` (C passes over memoised word facts) is the rule written word by word."""
    ra, rb = read(a), read(b)
    only_a, only_b = _plain_differences(ra, rb)
    for lone, own, other_lone, other in ((only_a, ra, only_b, rb), (only_b, rb, only_a, ra)):
        mine = [own.surface.get(x, x) for x in lone]
        theirs = [other.surface.get(y, y) for y in other_lone]
        assert _substituted(mine, own, theirs, other, substitute) == \
            _plain_substituted(lone, own, other_lone, other, substitute)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.one_of(_WORDS, st.text(min_size=1, max_size=8)), min_size=1, max_size=20))
def test_the_pair_memos_are_their_rules(words: list[str]) -> None:
    """The per-word memos of the pair judgement are `RunMemo`s of their rules (whose filling and
    emptying tests/test_redundancy.py checks), the two key memos holding fewer words."""
    for memo, rule in ((_FOUND_BY, _found_by), (_LOOKS_FOR, _looks_for), (_HAS_VECTOR, _has_vector),
                       (_INITIALS_LONG, _initials_long)):
        assert isinstance(memo, RunMemo) and memo.rule is rule
        assert [memo[w] for w in words] == [rule(w) for w in words]
    assert _FOUND_BY.maxsize == _LOOKS_FOR.maxsize < _HAS_VECTOR.maxsize == _KEYS.maxsize


def _plain_judge(a: Reading, b: Reading, semantic: float, lexical: float) -> Verdict:
    """`judge` as the module docstring states it, on the plain rules above (static rules)."""
    rules = RULES["static"]
    if copies(a, b):
        return Verdict(True, "copy")
    if not a.content or not b.content:
        return Verdict(False, "no content")
    if _negations_toward(a, b) != _negations_toward(b, a):
        return Verdict(False, "negation")
    only_a, only_b = _plain_differences(a, b)
    passage = len(a.words) > SHORT_WORDS or len(b.words) > SHORT_WORDS
    close = lexical >= LEXICAL_COPY if passage else semantic >= rules.tau
    if not only_a and not only_b:
        return Verdict(True, "copy")
    a_in_b = not only_a or (close and _plain_substituted(only_a, a, only_b, b, rules.substitute))
    b_in_a = not only_b or (close and _plain_substituted(only_b, b, only_a, a, rules.substitute))
    if a_in_b and b_in_a:
        return Verdict(True, "restatement") if only_a and only_b else \
            Verdict(True, "contained", 1 if not only_a else 0)
    if a_in_b or b_in_a:
        return Verdict(True, "contained", 1 if a_in_b else 0)
    more_a = bool(_plain_missing(a.numbers, b.numbers))
    more_b = bool(_plain_missing(b.numbers, a.numbers))
    if more_a and more_b:
        return Verdict(False, "numbers")
    if any(a.surface.get(x, x) in a.names for x in only_a) or \
            any(b.surface.get(y, y) in b.names for y in only_b):
        return Verdict(False, "names")
    if more_a or more_b:
        return Verdict(False, "numbers")
    return Verdict(False, "substitution" if close else "meaning")


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_TEXT, _TEXT, st.sampled_from([0.0, 0.6, 0.95]), st.sampled_from([0.0, 0.3, 0.9]))
@example("Obama said 3 cats play", "Paris says 4 cats play", 0.95, 0.9)
@example("the govt will recieve colour", "the government receives color", 0.95, 0.9)
@example("No, it does not play", "it plays", 0.95, 0.9)
def test_judge_is_the_plain_rule(a: str, b: str, semantic: float, lexical: float) -> None:
    """`judge`, both ways, is the judgement written plainly on the plain rules."""
    ra, rb = read(a), read(b)
    assert judge(ra, rb, semantic, RULES["static"], lexical) == _plain_judge(ra, rb, semantic, lexical)
    assert judge(rb, ra, semantic, RULES["static"], lexical) == _plain_judge(rb, ra, semantic, lexical)


def _plain_one_edit(a: str, b: str) -> bool:
    """One letter inserted, deleted, replaced or two adjacent swapped, in words of 4+ letters: the
    edits tried one by one at every place."""
    if a == b or min(len(a), len(b)) < 4:
        return False
    if len(a) == len(b):
        differ = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        return len(differ) == 1 or (len(differ) == 2 and differ[1] == differ[0] + 1
                                    and a[differ[0]] == b[differ[1]] and a[differ[1]] == b[differ[0]])
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return len(long) == len(short) + 1 and any(long[:i] + long[i + 1:] == short for i in range(len(long)))


@settings(max_examples=1000, deadline=None, derandomize=True)
@given(st.text(max_size=9), st.integers(0, 10), st.sampled_from(["half swap", "replace", "insert", "delete",
                                                                "swap", "prefix", "other"]),
       st.text(min_size=1, max_size=9))
@example("receive", 1, "swap", "x")
@example("abcd", 0, "other", "xacd")  # a letter moved one place, another replaced: two edits
@example("abcd", 3, "insert", "é")
@example("aaaa", 0, "delete", "x")
@example("abcd", 0, "other", "abce")
def test_one_edit_is_the_plain_rule(word: str, at: int, edit: str, other: str) -> None:
    """`_one_edit`, which finds the first differing letter in C, is every single edit tried."""
    i = at % (len(word) + 1)
    edited = {"replace": word[:i] + other[0] + word[i + 1:], "insert": word[:i] + other[0] + word[i:],
              "delete": word[:i] + word[i + 1:],
              "swap": word[:i] + word[i + 1:i + 2] + word[i:i + 1] + word[i + 2:],
              "half swap": word[:i] + other[0] + word[i:i + 1] + word[i + 2:],
              "prefix": word[:i], "other": other}[edit]
    for a, b in ((word, edited), (edited, word), (word, other)):
        assert _one_edit(a, b) == _plain_one_edit(a, b), (a, b)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.one_of(_WORDS, st.text(min_size=1, max_size=8)), max_size=12),
       st.one_of(_WORDS, st.text(min_size=1, max_size=8)))
def test_sharing_a_key_is_every_word_meeting_the_keys(others: list[str], word: str) -> None:
    """`_sharing_a_key` gives, in order, exactly the positions whose key sets meet the word's."""
    looks = _looks_for(word)
    found = [_found_by(w) for w in others]
    assert list(_sharing_a_key(looks, found)) == [k for k, keys in enumerate(found) if keys & looks]


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.one_of(_WORDS, st.text(min_size=1, max_size=8)), max_size=6))
@example([])
def test_word_vectors_are_the_rows_stacked(words: list[str]) -> None:
    """`word_vectors` stacks the words' vectors by `np.array`: the very array `np.vstack` makes (the
    same values, dtype, shape and layout, so the cosines `_substituted` takes are the same bits),
    and no word is `np.vstack`'s error."""
    rows = [_word_vector(w) for w in words]
    if not words:
        with pytest.raises(ValueError):
            word_vectors(())
        return
    made, plain = word_vectors(tuple(words)), np.vstack(rows)
    assert made.dtype == plain.dtype and made.shape == plain.shape and made.flags.c_contiguous
    assert made.tobytes() == plain.tobytes()


# Texts with numbers on both sides, and numbers another text writes another way: digits run
# together ("2 0" / "20", "covid 19" / "covid19") and initials holding a digit ("g 7" / "g7").
_NUMBERED = st.lists(st.one_of(_WORDS, st.sampled_from(["2", "0", "20", "7", "19", "covid", "covid19", "g",
                                                       "g7", "2nd", "second", "3", "1.5", "cats"])),
                     max_size=16).map(" ".join)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(_NUMBERED, _NUMBERED, st.sampled_from([0.0, 0.95]), st.sampled_from([0.0, 0.9]))
@example("the 2 0 cats", "the 20 cats 7", 0.95, 0.9)  # a join takes both of one side's numbers
@example("covid 19 in 2 cats", "covid19 in 3 cats", 0.95, 0.9)
@example("g 7 meets 3 times", "the g7 met 2 times", 0.95, 0.9)
def test_judge_settles_numbers_as_the_plain_rule(a: str, b: str, semantic: float, lexical: float) -> None:
    """`judge` answers "numbers" early when each side has a number the other lacks and nothing can
    be spelled out: the same verdict as the plain rule, which spells out and matches every word."""
    ra, rb = read(a), read(b)
    assert judge(ra, rb, semantic, RULES["static"], lexical) == _plain_judge(ra, rb, semantic, lexical)
    assert judge(rb, ra, semantic, RULES["static"], lexical) == _plain_judge(rb, ra, semantic, lexical)
