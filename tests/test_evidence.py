"""Evidence for long chunks: what is kept is the original's own text, in order, within the budget,
and it is the part that answers the query (prose by sentences, code and tables by windows)."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from rag_rerank import evidence
from rag_rerank.cost import estimate_tokens
from rag_rerank.evidence import ELISION, Evidence, Scorer, chars_per_token, select, sentences

_PIECES = st.one_of(
    st.sampled_from(["The cat sat.", " ", ". ", "\n", "\n\n", "Dr. Smith", "e.g. this", "def f(x):",
                     "| a | b |", "- item", "café", "中文。", "\u0301", "\u200b", "\x00", "…", "?!", "ﬁle"]),
    st.text(max_size=12),
)
TEXT = st.one_of(st.text(max_size=200), st.lists(_PIECES, max_size=60).map("".join),
                 st.lists(_PIECES, max_size=60).map(lambda p: unicodedata.normalize("NFD", "".join(p))))
COUNTERS = st.sampled_from([chars_per_token, estimate_tokens])


def _check(ev: Evidence, text: str, budget: int, count: evidence.TokenCounter) -> None:
    for p in ev.passages:
        assert 0 <= p.start < p.end <= len(text)
    for a, b in zip(ev.passages, ev.passages[1:], strict=False):
        assert a.end <= b.start  # in document order, no overlap
    assert ev.text == ELISION.join(text[p.start:p.end] for p in ev.passages)
    assert ev.tokens_before == count(text)
    assert ev.tokens_after == count(ev.text)
    if ev.tokens_before <= budget:
        assert ev.text == text and not ev.shortened
    else:
        assert ev.shortened
        assert ev.tokens_after <= budget
        assert len(ev.text) < len(text)  # no chunk grows
        assert ev.tokens_after < ev.tokens_before
    if ev.best is not None:
        assert ev.best in ev.passages


@given(query=st.text(max_size=40), text=TEXT, budget=st.integers(1, 120), count=COUNTERS)
@example(query="cat", text="The cat sat. " * 40, budget=5, count=chars_per_token)
@example(query="", text=" " * 100, budget=3, count=chars_per_token)
@example(query="x", text="\u0301" * 90, budget=1, count=estimate_tokens)
@example(query="中文", text="中文。" * 60 + "句子", budget=7, count=estimate_tokens)
def test_the_kept_text_is_the_originals_own_in_order_within_the_budget(
    query: str, text: str, budget: int, count: evidence.TokenCounter
) -> None:
    evidence.clear_cache()
    _check(select(query, text, budget, count=count), text, budget, count)


ABSTRACT = (
    "Hypospadias is a common congenital malformation of the male external genitalia. "
    "We performed a genome-wide association study using pooled DNA from 436 individuals with hypospadias "
    "and 494 controls of European descent. "
    "Individual genotyping of two SNPs in DGKK, encoding diacylglycerol kinase kappa, produced compelling "
    "evidence for association with hypospadias (P = 2.5 x 10(-11)). "
    "Expression studies showed expression of DGKK in preputial tissue of cases and controls, which was lower "
    "in carriers of the risk allele. "
    "We propose DGKK as a major risk gene for hypospadias. "
) * 1 + "Funding was provided by the national research council and three private foundations. " * 4


def test_prose_keeps_the_sentences_that_answer_in_document_order() -> None:
    query = "a variant of the gene DGKK is associated with the risk of hypospadias"
    ev = select(query, ABSTRACT, 64)
    assert ev.mode == "sentences" and ev.tokens_after <= 64
    kept = ev.passage_texts(ABSTRACT)
    assert any("DGKK" in k for k in kept)
    assert not any("Funding" in k for k in kept)
    assert [p.start for p in ev.passages] == sorted(p.start for p in ev.passages)
    assert all(k in ABSTRACT for k in kept)
    assert ev.best is not None and "DGKK" in ABSTRACT[ev.best.start:ev.best.end]


def test_a_chunk_within_its_budget_is_shown_unchanged() -> None:
    ev = select("anything", "A short chunk.", 100)
    assert ev.text == "A short chunk." and ev.mode == "whole" and not ev.shortened


CODE = "\n".join(
    [f"def helper_{i}(value):\n    total = value * {i}\n    return total + {i}\n" for i in range(20)]
    + ["def connect_database(url, timeout):\n    pool = create_pool(url)\n    pool.timeout = timeout\n"
       "    return pool\n"]
    + [f"def other_{i}(items):\n    return sorted(items)[{i}]\n" for i in range(20)]
)


def test_code_falls_back_to_a_contiguous_window_around_the_match() -> None:
    ev = select("how do I set the database connection pool timeout", CODE, 48)
    assert ev.mode == "windows" and ev.tokens_after <= 48
    kept = "\n".join(ev.passage_texts(CODE))
    assert "pool.timeout = timeout" in kept
    assert any("def connect_database" in k and "pool.timeout" in k for k in ev.passage_texts(CODE))


TABLE = "| country | capital | population |\n|---|---|---|\n" + "".join(
    f"| country{i} | city{i} | {i * 1000} |\n" for i in range(60)) + "| Norway | Oslo | 5400000 |\n" + (
    "").join(
    f"| land{i} | town{i} | {i * 7} |\n" for i in range(60))


def test_a_table_keeps_the_matching_rows() -> None:
    ev = select("capital of Norway", TABLE, 40)
    assert ev.mode == "windows"
    assert any("Oslo" in k for k in ev.passage_texts(TABLE))


def test_the_choice_is_made_once_and_remembered() -> None:
    evidence.clear_cache()
    first = select("DGKK hypospadias", ABSTRACT, 64)
    assert select("DGKK hypospadias", ABSTRACT, 64) is first
    assert select("DGKK hypospadias", ABSTRACT, 96) is not first


@pytest.mark.parametrize(("text", "expected"), [
    ("One. Two! Three? Four", ["One.", "Two!", "Three?", "Four"]),
    ("Fig. 2 shows it. Smith et al. found it. J. Smith agreed.",
     ["Fig. 2 shows it.", "Smith et al. found it.", "J. Smith agreed."]),
    ("It rose 3.5 percent. Then fell.", ["It rose 3.5 percent.", "Then fell."]),
    ("A heading\nA line of text. 中文。下一句", ["A heading", "A line of text.", "中文。", "下一句"]),
])
def test_sentences(text: str, expected: list[str]) -> None:
    assert [text[a:b] for a, b in sentences(text)] == expected


def test_a_budget_below_one_token_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        select("q", "text", 0)


def test_another_embedder_is_read_through_its_own_vectors() -> None:
    class Letters:
        """A toy embedder: counts of a few letters (enough to tell a sentence about x from others)."""

        name = "letters"
        duplicate_threshold = 0.9

        def embed(self, texts: list[str]):
            import numpy as np

            rows = np.array([[t.count(c) for c in "xyz"] for t in texts], dtype=np.float32) + 1e-3
            return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    text = "Plain words here. " * 20 + "Xx xx xx zebra xx. " + "Plain words here. " * 20
    ev = select("xxx", text, 16, scorer=Scorer(Letters()))
    assert any("Xx xx" in k for k in ev.passage_texts(text))


def test_a_shown_text_is_scored_by_its_best_passage() -> None:
    import numpy as np

    from rag_rerank.evidence import best_of, passages_of

    pieces, owner = passages_of(["plain text", f"first part{ELISION}second part{ELISION}third", ELISION])
    assert pieces == ["plain text", "first part", "second part", "third", ELISION]
    assert owner.tolist() == [0, 1, 1, 1, 2]
    best, which = best_of(np.array([0.1, 0.3, 0.9, 0.2, 0.5]), owner, 3)
    assert best.tolist() == pytest.approx([0.1, 0.9, 0.5]) and which.tolist() == [0, 2, 4]


def test_a_sentence_that_poses_the_question_yields_to_the_one_that_answers() -> None:
    # Same query words in both; the first restates the question, the second reports the finding.
    aim = "We investigated whether folic acid lowers blood homocysteine in older adults."
    finding = "Folic acid lowered blood homocysteine by 23% in older adults."
    filler = "The clinic enrolled volunteers from three towns over the summer. " * 6
    text = filler + aim + " " + filler + finding + " " + filler
    query = "folic acid lowers blood homocysteine in older adults"
    scorer = Scorer()
    found = scorer.signals(query, [aim, finding])
    assert found["asks"].tolist() == [1.0, 0.0] and found["digits"].tolist() == [0.0, 1.0]
    scores = scorer(query, [aim, finding, "Nothing in common here."])
    assert scores[1] > scores[0] and scores[1] > scores[2]
    ev = select(query, text, 24)
    assert ev.passage_texts(text) == [finding]


def test_a_unit_sharing_the_query_word_outranks_one_with_only_cues() -> None:
    scores = Scorer()("zebra", ["Was 42 unknown?", "Zebras graze."])
    assert scores[1] > 0 and scores[0] <= scores[1]
