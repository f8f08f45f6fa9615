"""Reading the counts people write: digits with separators, k suffixes, words, vague quantities."""

from __future__ import annotations

import pytest

from rag_rerank.counts import MAX_COUNT, counts_before, tokenize


def first(text: str) -> tuple[int, list[str], str]:
    return next(iter(counts_before(text)))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1,000 hits", 1000),
        ("1 000 chunks", 1000),
        ("1_000 chunks", 1000),
        ("1.000 chunks", 1000),
        ("12,345,678 rows", 12345678),
        ("2k docs", 2000),
        ("1.5k docs", 1500),
        ("1e3 docs", 1000),
        ("5 dozen chunks", 60),
        ("2 thousand passages", 2000),
        ("1.5 thousand hits", 1500),
        ("99999999999999999999999 docs", 99999999999999999999999),
        ("ninety passages", 90),
        ("twenty-five chunks", 25),
        ("five hundred and twelve chunks", 512),
        ("one thousand two hundred results", 1200),
        ("a thousand results", 1000),
        ("a hundred chunks", 100),
        ("a dozen snippets", 12),
        ("a few hundred hits", 200),
        ("several hundred hits", 300),
        ("a couple of hundred passages", 200),
        ("hundreds of chunks", 200),
        ("thousands of chunks", 2000),
        ("dozens of chunks", 24),
        ("50 chunks", 50),
    ],
)
def test_counts_are_read_whole(text: str, value: int) -> None:
    got, after, _ = first(text)
    assert got == value
    # The number's own words are not offered as the words that follow it.
    assert after[-1] in {"hits", "chunks", "rows", "docs", "passages", "results", "snippets"}


def test_the_words_around_a_number_are_reported() -> None:
    got = list(counts_before("show more than 50 chunks please"))
    assert got == [(50, ["chunks", "please"], "more than")]
    assert [v for v, _, _ in counts_before("top 5 of these 30 chunks")] == [5, 30]


def test_a_space_group_before_a_hyphen_is_two_numbers() -> None:
    """"40 200-token chunks" is forty chunks of two hundred tokens, not 40,200 of anything."""
    assert [v for v, _, _ in counts_before("rerank these 40 200-token chunks")] == [40, 200]


@pytest.mark.parametrize(
    "text", ["a couple of chunks", "many chunks", "a few chunks", "one of them", "lambda 0.7"]
)
def test_vague_words_without_a_scale_are_not_large_counts(text: str) -> None:
    assert all(v <= 1 for v, _, _ in counts_before(text))


def test_decimals_are_not_thousands() -> None:
    assert first("lambda 0.75 please")[0] == 0
    assert tokenize("lambda 0.75, 30 chunks") == ["lambda", "0.75", "30", "chunks"]


def test_property_any_text_reads_without_error() -> None:
    hypothesis = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")

    @hypothesis.given(st.text(alphabet=st.characters(), max_size=80)
                      | st.lists(st.sampled_from(["1,000", "1 000", "2.5k", "a", "few", "hundred", "of",
                                                  "and", "twenty", "five", "chunks", "-", "0.7", "١٢٣"]))
                      .map(" ".join))
    def check(text: str) -> None:
        for value, after, before in counts_before(text):
            assert isinstance(value, int) and value >= 0
            assert isinstance(after, list) and isinstance(before, str)

    check()


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("rerank these 1e999 chunks", MAX_COUNT),  # a float overflow before
        ("rerank these " + "9" * 400 + ".5k chunks", MAX_COUNT),
        ("rerank " + "9" * 5000 + " chunks", MAX_COUNT),  # over Python's 4,300-digit int limit
        ("rerank " + "0" * 5000 + "7 chunks", 7),
        ("rerank 1e29 chunks", 10**29),
        ("rerank 99999999999999999999999 chunks", 99999999999999999999999),  # still exact below the cap
    ],
)
def test_absurdly_large_counts_are_capped_not_an_error(text: str, value: int) -> None:
    """An utterance is user input: "1e999" or a pasted 5,000-digit number must not crash the router."""
    assert [v for v, _, _ in counts_before(text)] == [value]
