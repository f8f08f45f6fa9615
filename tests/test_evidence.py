"""Evidence for long chunks: what is kept is the original's own text, in order, within the budget,
and it is the part that answers the query (prose by sentences, code and tables by windows)."""

from __future__ import annotations

import re
import unicodedata

import pytest
import regex
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
    # white space before a line break is left out of the sentence it follows
    ("First line  \nSecond line.\u00a0\nThird\t\r\n  fourth",
     ["First line", "Second line.", "Third", "fourth"]),
    # A full stop glued to the next sentence (abstracts, PDF text) ends it, unless it is part of an
    # abbreviation, an initial, a number, a name with a dot, a URL or an address.
    ("The DCIS phenotype.DCIS and IDC differ.The end (n=5).Then",
     ["The DCIS phenotype.", "DCIS and IDC differ.", "The end (n=5).", "Then"]),
    ("See e.g.The book by J.Smith, the U.S.A and Node.js at example.com.", [
        "See e.g.The book by J.Smith, the U.S.A and Node.js at example.com."]),
    ("It rose 3.5 percent at www.Example.org and user@Host.Com today.", [
        "It rose 3.5 percent at www.Example.org and user@Host.Com today."]),
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


# --------------------------------------------------------------------------- splitting


def _greedy_word_windows(text: str, limit: int, count: evidence.TokenCounter) -> list[tuple[int, int]]:
    """The plain way to cut a run-on text (the former `_split_long`: one count of the growing window
    per word, quadratic): what the linear cut must match for a counter whose count never falls as a
    window grows."""
    out: list[tuple[int, int]] = []
    cur: tuple[int, int] | None = None
    for m in re.finditer(r"\S+", text):
        ws, we = m.span()
        if cur is not None and count(text[cur[0]:we]) <= limit:
            cur = (cur[0], we)
            continue
        if cur is not None:
            out.append(cur)
        if count(text[ws:we]) <= limit:
            cur = (ws, we)
            continue
        cur = None
        lo = ws
        while lo < we:  # one very long "word": the longest prefixes that fit
            hi = lo + 1
            step = max(1, (we - lo) // 2)
            while step:
                if hi + step <= we and count(text[lo:hi + step]) <= limit:
                    hi += step
                else:
                    step //= 2
            out.append((lo, hi))
            lo = hi
    if cur is not None:
        out.append(cur)
    return out


_ASCII_WORDS = st.lists(st.sampled_from(["a", "memory", "index", "IVF", "x1", "(3.5)", "don't", "--", "HNSW,",
                                         "partition", "e.g.", "  ", "\n"]), min_size=1, max_size=300)


@given(words=_ASCII_WORDS, limit=st.integers(2, 60), count=COUNTERS)
@example(words=["memory"] * 200, limit=7, count=estimate_tokens)
def test_a_run_on_text_is_cut_where_the_word_by_word_cut_would(
    words: list[str], limit: int, count: evidence.TokenCounter
) -> None:
    text = " ".join(words)
    if not text.strip():
        return
    span = (0, len(text))
    got = evidence._split_long(text, span, limit, count)
    if count(text) <= limit:
        assert got == [span]
    else:
        assert got == _greedy_word_windows(text, limit, count)


def _uneven(text: str) -> int:
    """A tokenizer whose counts of pieces do not add up (nor grow steadily with the text)."""
    return len(text) // 3 + (7 if "e" in text[-3:] else 0) + text.count("  ") * 5


@given(query=st.text(max_size=10), text=TEXT, budget=st.integers(1, 60))
@example(query="index", text="memory index " * 300, budget=5)
@example(query="x", text="Memory index. " * 40 + "x" * 400, budget=9)
def test_the_budget_holds_for_a_tokenizer_whose_counts_do_not_add_up(
    query: str, text: str, budget: int
) -> None:
    evidence.clear_cache()
    ev = select(query, text, budget, count=_uneven)
    _check(ev, text, budget, _uneven)


def test_a_long_run_on_text_costs_a_few_counts_per_window_not_one_per_word() -> None:
    calls = []

    def counting(text: str) -> int:
        calls.append(len(text))
        return estimate_tokens(text)

    text = " ".join(["alpha", "vector", "memory", "index", "graph"] * 1600) + ". End."
    windows = evidence._split_long(text, (0, len(text)), 512, counting)
    assert windows == _greedy_word_windows(text, 512, estimate_tokens)
    # The plain cut counts ~len(text)/2 characters per word: hundreds of millions here.
    assert sum(calls) < 20 * len(text), sum(calls)


# Grapheme clusters as a reader sees them: the `regex` module's \X (UAX #29) is the judge.
_CLUSTERS = ["👩\u200d👩\u200d👧\u200d👦", "🇫🇷", "🇩🇪", "👍🏽", "e\u0301", "a\u0308\u0323", "ก", "เลือก",
             "น้ำ", "क्षत्रिय", "한국어", "\u1100\u1161\u11a8", "1\ufe0f\u20e3", "❤\ufe0f",
             "🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f", "\r\n", " ", "x", ". ", "\n",
             "中文。", "Fig. 2 ", "\u0301"]


@given(query=st.sampled_from(["", "เลือก", "🇩🇪", "x"]),
       pieces=st.lists(st.sampled_from(_CLUSTERS), max_size=400), budget=st.integers(1, 40), count=COUNTERS)
@example(query="x", pieces=["👩\u200d👩\u200d👧\u200d👦"] * 40, budget=3, count=estimate_tokens)
@example(query="x", pieces=["🇫🇷", "🇩🇪"] * 60, budget=5, count=chars_per_token)
@example(query="x", pieces=["เลือก"] * 80, budget=4, count=estimate_tokens)
def test_no_passage_starts_or_ends_inside_a_grapheme_cluster(
    query: str, pieces: list[str], budget: int, count: evidence.TokenCounter
) -> None:
    text = "".join(pieces)
    evidence.clear_cache()
    ev = select(query, text, budget, count=count)
    _check(ev, text, budget, count)
    bounds = {m.start() for m in regex.finditer(r"\X", text)} | {len(text)}
    for p in ev.passages:
        assert p.start in bounds and p.end in bounds, (text[max(0, p.start - 3):p.start + 3], p)


PYTHON = "\n\n".join(
    [f"def helper_{i}(x, y):\n    \"\"\"Add things number {i}.\"\"\"\n    total = x + y * {i}\n"
     f"    if total > 100:\n        return total - {i}\n    return total\n" for i in range(30)]
    + ["class IndexBuilder:\n    \"\"\"Builds the search index.\"\"\"\n\n"
       "    def build_ivf_index(self, vectors, nlist=1024):\n"
       "        \"\"\"Build an IVF index when memory is constrained; HNSW needs more RAM.\"\"\"\n"
       "        quantizer = faiss.IndexFlatL2(vectors.shape[1])\n"
       "        index = faiss.IndexIVFFlat(quantizer, vectors.shape[1], nlist)\n"
       "        index.train(vectors)\n        return index\n"]
    + [f"def other_{i}(items):\n    for item in items:\n        yield item * {i}\n" for i in range(30)])
YAML = "".join(f"service_{i}:\n  image: registry.example.com/app:{i}.0\n  replicas: {i % 4 + 1}\n"
               f"  env:\n    LOG_LEVEL: info\n    TIMEOUT: {i * 10}\n" for i in range(40)).replace(
    "service_20:\n", "vector_index:\n  kind: ivf\n  memory_limit: 2Gi\n  nlist: 1024\nservice_20:\n")
JSON = "{\n" + ",\n".join(f'  "item_{i}": {{\n    "name": "thing {i}.",\n    "price": {i}.5\n  }}'
                          for i in range(60)) + ',\n  "ivf_index": {\n    "memory": "2Gi"\n  }\n}\n'
MARKDOWN_LIST = "\n".join([f"- item {i}: buy milk and eggs at store {i}" for i in range(60)]
                          + ["- IVF: prefer it over HNSW when index memory is constrained"]
                          + [f"- item {i}: walk the dog {i}" for i in range(60)])
INDENTED_PROSE = "\n".join(["  The index is built once and read many times, then queried."] * 30
                           + ["  Use IVF over HNSW when memory is constrained."] * 2)
PROSE_LINES = "\n".join(["The index is built once and read many times."] * 30
                        + ["Use IVF over HNSW when memory is constrained:"]
                        + ["Queries are answered from the nearest partitions."] * 30)


@pytest.mark.parametrize(("text", "mode"), [(PYTHON, "windows"), (YAML, "windows"), (JSON, "windows"),
                                            (TABLE, "windows"), (MARKDOWN_LIST, "windows"), (CODE, "windows"),
                                            (PROSE_LINES, "sentences"), (INDENTED_PROSE, "sentences"),
                                            (ABSTRACT, "sentences")])
def test_code_configuration_and_tables_are_windows_prose_is_sentences(text: str, mode: str) -> None:
    assert select("ivf index memory", text, 64).mode == mode


def test_a_python_file_keeps_a_window_around_the_relevant_function() -> None:
    ev = select("build an IVF index when memory is constrained", PYTHON, 128, count=estimate_tokens)
    assert ev.mode == "windows" and ev.tokens_after <= 128
    assert len(ev.passages) <= 2
    window = max(ev.passage_texts(PYTHON), key=len)
    assert "def build_ivf_index(self, vectors, nlist=1024):" in window and "index.train(vectors)" in window


def test_a_yaml_file_keeps_the_matching_block() -> None:
    ev = select("vector index memory limit", YAML, 48, count=estimate_tokens)
    assert any("vector_index:" in k and "memory_limit: 2Gi" in k for k in ev.passage_texts(YAML))


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


@pytest.mark.parametrize(("units", "findings", "setup"), [
    (["OBJECTIVE To test x.", "More on x.", "RESULTS X rose.", "It fell later.", "CONCLUSIONS X helps."],
     [0, 0, 1, 1, 1], [1, 1, 0, 0, 0]),
    (["## Methods\nWe measured x.", "NASA flew it.", "Results: x rose."], [0, 0, 1], [1, 1, 0]),
    (["METHODS AND FINDINGS We followed 10 people.", "BACKGROUND Little."], [1, 0], [0, 1]),
    (["Plain prose about x.", "More plain prose, RESULTS in capitals later."], [0, 0], [0, 0]),
])
def test_sections_run_from_a_heading_to_the_next(units: list[str], findings: list[int],
                                                  setup: list[int]) -> None:
    """A unit under a findings heading (results, conclusions) and one under a setup heading
    (objective, background, methods): an upper-case label opening a unit, a Markdown heading or a
    known label and a colon; an unknown label ("NASA") keeps the section; text without headings has
    none."""
    found = Scorer().signals("x", units, sections=True)
    assert found["findings"].tolist() == findings and found["setup"].tolist() == setup


def test_in_a_structured_abstract_the_results_outrank_the_background_that_restates_the_claim() -> None:
    background = "BACKGROUND Statins may lower the risk of dementia in older adults with high cholesterol."
    result = ("RESULTS Statin users had a lower risk of dementia (hazard ratio 0.8) than older adults "
              "without them.")
    filler = "The cohort was drawn from primary care records in two regions. " * 3
    text = f"{background} {filler}{result} {filler}"
    query = "statins lower the risk of dementia in older adults"
    without = evidence.Weights(findings=0.0, setup=0.0)
    assert Scorer(None, without)(query, [background, result]).argmax() == 0  # word overlap alone
    assert Scorer()(query, [background, result]).argmax() == 1
    assert select(query, text, 32).passage_texts(text) == [result]


def test_text_without_headings_scores_as_without_the_section_weights() -> None:
    units = ["The harbour froze in winter.", "Ships waited at anchor for weeks, results unknown.",
             "Bakers rose at four."]
    plain = evidence.Weights(findings=0.0, setup=0.0)
    assert Scorer()("harbour ships winter", units).tolist() == Scorer(None, plain)("harbour ships winter",
                                                                                      units).tolist()
