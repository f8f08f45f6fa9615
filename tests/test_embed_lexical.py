"""The default lexical embedder: deterministic across processes, unit rows, copies close, topics apart."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rag_rerank.embed import CallerVectors, embed_texts, get_embedder
from rag_rerank.embed.lexical import (
    LexicalEmbedder,
    _code_points,
    _damped,
    _mix_in_place,
    _powers,
    _signs,
    _word_bounds,
    _word_hash,
    normalise_text,
)
from rag_rerank.errors import InputError, RerankError
from rag_rerank.text import STOPWORDS, comparable
from tests.support.shared_data import data_dir, require

CLOUGH = data_dir() / "clough-stevenson"
TEXTS = [
    "HNSW builds a hierarchical proximity graph; recall ~99% with low latency but RAM-heavy.",
    "IVF partitions vectors into Voronoi cells; only nprobe lists are scanned per query.",
    "Cooking risotto requires constant stirring and warm stock.",
    "東京は日本の首都です。",
]


def test_shape_dtype_and_unit_rows():
    emb = LexicalEmbedder()
    m = emb.embed([*TEXTS, "...!!!"])
    assert m.shape == (5, emb.dim) and m.dtype == np.float32
    assert np.allclose(np.linalg.norm(m[:4], axis=1), 1.0, atol=1e-5)
    assert not m[4].any()  # no word characters: a zero row, not NaN
    assert emb.embed([]).shape == (0, emb.dim)


def test_a_vector_depends_only_on_its_own_text():
    emb = LexicalEmbedder()
    alone = emb.embed([TEXTS[1]])[0]
    together = emb.embed(TEXTS)[1]
    assert np.array_equal(alone, together)


def test_same_vectors_in_another_process_with_another_hash_seed():
    code = (
        "import sys, numpy as np; from rag_rerank.embed.lexical import LexicalEmbedder;"
        f"sys.stdout.write(LexicalEmbedder().embed({TEXTS!r}).tobytes().hex())"
    )
    root = Path(__file__).resolve().parent.parent
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": str(root)},
        ).stdout
        for seed in ("1", "2")
    }
    assert outs == {LexicalEmbedder().embed(TEXTS).tobytes().hex()}


def test_case_punctuation_and_width_do_not_matter_but_words_do():
    emb = LexicalEmbedder()
    a, b, c = emb.embed(
        ["The IVF index, partitioned!", "the ivf   INDEX partitioned", "The HNSW graph, layered!"]
    )
    assert float(a @ b) > 0.999
    assert float(a @ c) < 0.3
    assert normalise_text("Ｆｕｌｌ-width") == " full width "


def test_copied_text_is_a_duplicate_and_independent_text_is_not():
    """One task of the clough-stevenson corpus (the full study is bench/duplicates.py)."""
    require(CLOUGH)
    import csv

    def read(name: str) -> str:
        raw = (CLOUGH / name).read_bytes()
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("cp1252")

    with (CLOUGH / "file_information.csv").open(encoding="utf-8") as fh:
        rows = [
            r for r in csv.DictReader(fh) if r["Task"] == "a" and r["Category"] in ("cut", "light", "non")
        ]
    emb = LexicalEmbedder()
    vectors = emb.embed([read("orig_taska.txt")] + [read(r["File"]) for r in rows])
    sims = vectors[1:] @ vectors[0]
    copied = [s for r, s in zip(rows, sims, strict=True) if r["Category"] != "non"]
    independent = [s for r, s in zip(rows, sims, strict=True) if r["Category"] == "non"]
    assert len(copied) >= 5 and len(independent) >= 5
    assert min(copied) >= emb.duplicate_threshold > max(independent)


def test_get_embedder_specs():
    assert isinstance(get_embedder(None), LexicalEmbedder)
    assert isinstance(get_embedder(" Lexical "), LexicalEmbedder)
    assert get_embedder("lexical").name == "lexical"
    custom = LexicalEmbedder(dim=1024)
    assert get_embedder(custom) is custom
    assert isinstance(get_embedder("caller"), CallerVectors)
    with pytest.raises(InputError, match="unknown embedder 'word2vec'"):
        get_embedder("word2vec")
    with pytest.raises(InputError, match="embedder must be"):
        get_embedder(42)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="power of two"):
        LexicalEmbedder(dim=1000)
    with pytest.raises(InputError, match="needs an 'embedding'"):
        get_embedder("caller").embed(["x"])


def test_stopword_weight_removes_function_word_similarity():
    query = "How do I reset a forgotten PostgreSQL password?"
    texts = ["How do I plant tulip bulbs in the autumn?", "Reset the PostgreSQL password with ALTER USER."]
    plain = LexicalEmbedder().embed([query, *texts])
    damped = LexicalEmbedder(stopword_weight=0.1).embed([query, *texts])
    assert float(plain[1] @ plain[0]) > 0.15  # "how do i" alone makes them look related
    assert abs(float(damped[1] @ damped[0])) < 0.05
    assert float(damped[2] @ damped[0]) > 0.4  # the content words still match


def test_text_is_read_in_the_one_comparable_form() -> None:
    # A zero-width space or a soft hyphen inside a word (web and PDF text) is not a word break,
    # and an NFD accent is the composed one: the duplicate detector sees what the guard sees.
    assert normalise_text("zero\u200bwidth soft\u00adhyphen") == " zerowidth softhyphen "
    assert normalise_text("cafe\u0301") == normalise_text("café")


# --------------------------------------------------------------------------- the fast paths, pinned
# `embed` and `normalise_text` take short cuts (ASCII without the regex or `comparable`, n-grams by
# slices, no function-word search at stopword_weight 1, touched cells found on a mask). These tests
# hold them to the rule written out plainly, one text and one n-gram at a time, bit for bit.

_NON_WORD_RUN = re.compile(r"[\W_]+")
_MASK = 2**64 - 1
_WORDISH = st.text(alphabet=st.sampled_from(
    "abcXYZ 019_-.,'\t\n\x00\x7f\u00a0\u200b\u00ad\u0301éß中ﬁＡİΣ\U0001d400"), max_size=40)
_ANY_TEXT = st.one_of(_WORDISH, st.text(max_size=40), st.from_regex(r"[ -~]{0,60}", fullmatch=True),
                      st.text(alphabet=st.characters(max_codepoint=255), max_size=40))


def _plain_normalise(text: str) -> str:
    return " " + _NON_WORD_RUN.sub(" ", comparable(text)).strip() + " "


@settings(max_examples=400, derandomize=True, deadline=None)
@given(_ANY_TEXT)
@example("Hello, World_foo \x00 \t bar-BAZ! 42")
@example("")
@example("__--__")
@example("Ｆｕｌｌ-width ﬁne")
@example("\x1b[31mred\x1b[0m\x85next")
@example("It\u00e2\x80\x99s caf\u00e9 \u00bd \u00b2 \u00aa\u00ba \u00d7\u00f7 \u00b5")
def test_normalise_text_is_the_plain_rule(text: str) -> None:
    assert normalise_text(text) == _plain_normalise(text)


def _mix_int(h: int) -> int:
    h ^= h >> 30
    h = h * 0xBF58476D1CE4E5B9 & _MASK
    h ^= h >> 27
    h = h * 0x94D049BB133111EB & _MASK
    return h ^ (h >> 31)


def _plain_rows(emb: LexicalEmbedder, texts: list[str]) -> np.ndarray:
    """`emb.embed(texts)` one text at a time in Python numbers: each word and n-gram hashed alone
    (`_word_hash`), its signed weight added to its bucket in reading order (words, then each n-gram
    length in turn), damped, and the row divided by its norm summed in bucket order."""
    stop_hashes = {_word_hash(w) for w in STOPWORDS}
    out = np.zeros((len(texts), emb.dim), dtype=np.float32)
    for r, text in enumerate(texts):
        s = normalise_text(text).replace("\x00", " ")
        sums: dict[int, float] = {}

        def add(h: int, weight: float, sums: dict[int, float] = sums) -> None:
            k = _mix_int(h)
            sums[k & (emb.dim - 1)] = sums.get(k & (emb.dim - 1), 0.0) + (-1.0 if k >> 63 else 1.0) * weight

        words = [(m.start(), m.end()) for m in re.finditer(r"[^ ]+", s)]
        stop = [_word_hash(s[a:e]) in stop_hashes for a, e in words]
        content = [False] * len(s)
        for (a, e), is_stop in zip(words, stop, strict=True):
            if not is_stop:
                content[a:e] = [True] * (e - a)
        if emb.word_weight:
            for (a, e), is_stop in zip(words, stop, strict=True):
                add(_word_hash(s[a:e]) ^ 0xD1B54A32D192ED03,
                    emb.word_weight * emb.stopword_weight if is_stop else emb.word_weight)
        for n_len, w in zip(emb.char_ngrams, emb.char_weights, strict=True):
            for a in range(len(s) - n_len + 1):
                glue = not any(content[a:a + n_len])
                add(_word_hash(s[a:a + n_len]) ^ (n_len * 0x9E3779B97F4A7C15 & _MASK),
                    w * emb.stopword_weight if glue else w)
        vals = {b: float(np.sign(v) * np.log1p(abs(v))) for b, v in sorted(sums.items()) if v != 0}
        total = 0.0
        for v in vals.values():
            total += v * v
        for b, v in vals.items():
            out[r, b] = v / float(np.sqrt(total))
    return out


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.lists(_ANY_TEXT, min_size=1, max_size=4))
@example(["the cat sat on the mat", "", "a of the", "Copy-edited TEXT, copied text!"])
@example(["東京は日本の首都です。", "x"])
def test_rows_are_the_plain_rule_bit_for_bit(texts: list[str]) -> None:
    for emb in (LexicalEmbedder(),
                LexicalEmbedder(stopword_weight=0.1, char_ngrams=(3, 5), char_weights=(0.5, 1.0)),
                LexicalEmbedder(dim=64, word_weight=0.0, char_ngrams=(1, 2), char_weights=(1.0, 0.25)),
                # signed zero weights: a cell summing them is +0.0, as an untouched one (`embed`)
                LexicalEmbedder(dim=16, char_ngrams=(2,), char_weights=(0.0,))):
        assert emb.embed(texts).tobytes() == _plain_rows(emb, texts).tobytes()


def _settings() -> list[LexicalEmbedder]:
    """The bit-for-bit test's settings, and one whose values differ in size by many orders."""
    return [LexicalEmbedder(),
            LexicalEmbedder(stopword_weight=0.1, char_ngrams=(3, 5), char_weights=(0.5, 1.0)),
            LexicalEmbedder(dim=64, word_weight=0.0, char_ngrams=(1, 2), char_weights=(1.0, 0.25)),
            LexicalEmbedder(dim=16, char_ngrams=(2,), char_weights=(0.0,)),
            # values far apart in size: the float32 norms' rounding depends on the order of the sums
            LexicalEmbedder(dim=4096, word_weight=1e-30, char_ngrams=(1, 3), char_weights=(3e5, 1e-7))]


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.lists(_ANY_TEXT, min_size=1, max_size=5), st.booleans())
@example(["the cat sat on the mat", "", "a of the", "Copy-edited TEXT, copied text!"], True)
@example(["東京は日本の首都です。", "x", " " * 3], False)
@example(["aaaa bbbb " * 60, "q"], True)
def test_unit_entries_are_the_checked_rows_bit_for_bit(texts: list[str], numpy_as_assumed: bool) -> None:
    """`unit_entries` is `embed_texts(emb, texts)` (the rows `l2_normalise`d again in float32) in
    float64, bit for bit, and its stored entries are each row's `np.flatnonzero` columns and
    values: from the touched cells alone, and by the dense way on a numpy that sums otherwise."""
    with patch("rag_rerank.embed.lexical.numpy_sums_as_assumed", lambda: numpy_as_assumed):
        _check_unit_entries(texts)


def _check_unit_entries(texts: list[str]) -> None:
    for emb in _settings():
        made = emb.unit_entries(texts)
        checked = embed_texts(emb, texts)
        assert made.matrix.dtype == np.float64 and made.matrix.shape == checked.shape
        assert made.matrix.tobytes() == checked.astype(np.float64).tobytes()
        assert len(made.stored) == len(texts)
        for row, (columns, values) in zip(checked, made.stored, strict=True):
            nz = np.flatnonzero(row)
            assert np.frombuffer(columns, dtype=np.int32).tolist() == nz.tolist()
            assert values == row[nz].tobytes()


def test_unit_entries_raise_what_the_checked_rows_raise() -> None:
    emb = LexicalEmbedder(word_weight=1e308, char_weights=(1e308,))
    with pytest.raises(RerankError) as checked, np.errstate(invalid="ignore"):
        embed_texts(emb, ["a a a b b"])
    with pytest.raises(RerankError) as made, np.errstate(invalid="ignore"):
        emb.unit_entries(["a a a b b"])
    assert str(made.value) == str(checked.value)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=255), max_size=80))
@example("Straße, 5 µm, ¼ ½ ¾ cup")
@example("soft\xadhyphen, â\x80\x99s mojibake, ª º ¹²³ ¨´¸¯ \xa0 \x85 Ÿÿ ÀÉÎÕÜ")
@example("\x00\x1c\x1f\x7f\x9f")
@example("ǅ")  # beyond Latin-1: the folded way
def test_latin1_text_is_read_by_the_rule_character_by_character(text: str) -> None:
    """`normalise_text` of any Latin-1 text (one bytes translation through each character's own
    form) is the plain rule over the whole text: `comparable`, then the non-word runs one space."""
    assert normalise_text(text) == _plain_normalise(text)


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.lists(st.integers(-3000, 3000).filter(bool), max_size=50))
@example([1, -1, 2, 1024, -1024, 1025])
@example([3, -1025, -2049, 2049])  # beyond the reach below and above (a negative place wraps high)
def test_damped_sums_are_log1p_bit_for_bit(whole: list[int]) -> None:
    """A damped whole sum looked up (`_DAMPED_WHOLE`, within its reach) or computed is
    sign(s) * log1p(|s|) computed for it, the same bits."""
    sums = np.array(whole, dtype=np.float64)
    assert _damped(sums, whole=True).tobytes() == (np.sign(sums) * np.log1p(np.abs(sums))).tobytes()


def test_the_powers_are_the_prime_and_its_inverse() -> None:
    powers, inverses = _powers(9000)
    assert len(powers) == len(inverses) == 9000
    for i in (0, 1, 2, 4095, 4096, 8999):
        assert int(powers[i]) == pow(0x100000001B3, i, 2**64)
        assert int(inverses[i]) == pow(0x100000001B3, -i, 2**64)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(_ANY_TEXT | st.sampled_from(["", "  ", "!?", "Straße", "½ cup", "µm", "東京"]), max_size=6))
@example(["the cat", "", "a  b\t c"])
@example(["Stra\u00dfe  5", "x"])
@example(["\u00bd", "y"])
def test_code_points_are_the_normalised_texts_joined(texts: list[str]) -> None:
    """`_code_points` (one pass over the call's translated bytes) is the code points of the texts'
    `normalise_text` joined by NUL, as the plain way joins and encodes them."""
    joined = "\x00".join(normalise_text(t) for t in texts)
    plain = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    got = _code_points(texts)
    assert got.dtype == np.uint64 and got.tolist() == plain.tolist()


def test_the_latin1_table_deletes_no_ascii_character() -> None:
    """`_spaced` translates ASCII text without the deletions: the table must delete none of it."""
    from rag_rerank.embed.lexical import _LATIN1_WORD_BYTES

    assert all(c >= 128 for c in _LATIN1_WORD_BYTES[1])


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.integers(0, _MASK), max_size=40))
@example([0, 1, _MASK, 1 << 63, 0x7FF0000000000001, 0xFFF8000000000000, 0x8000000000000001,
          0x7FF0000000000000])
def test_keys_are_mixed_and_signed_as_the_plain_rule(keys: list[int]) -> None:
    """`_mix_in_place` is the splitmix64 finaliser in Python integers, and `_signs` is -1.0 for a
    key with its top bit set, else 1.0: the (±1.0) each entry's weight is multiplied by."""
    raw = np.array(keys, dtype=np.uint64)
    mixed = raw.copy()
    _mix_in_place(mixed)
    assert mixed.tolist() == [_mix_int(k) for k in keys]
    for bits in (raw, mixed):  # the keys as given, then mixed
        signs = _signs(bits)
        assert signs.dtype == np.float64
        assert signs.tobytes() == np.array([-1.0 if k >> 63 else 1.0 for k in bits.tolist()]).tobytes()


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.lists(st.booleans(), max_size=60))
@example([])
@example([True])
@example([False, True, True, False, True, False])
@example([True, False, True])
def test_word_bounds_are_the_edges_of_the_padded_mask(mask: list[bool]) -> None:
    """`_word_bounds` is the plain rule, `np.diff` of the mask padded by False at both ends: +1 where
    a run starts, -1 where it ends; over masks that start or end inside a run too."""
    is_word = np.array(mask, dtype=bool)
    edges = np.diff(np.concatenate(([0], is_word.astype(np.int64), [0])))
    starts, ends = _word_bounds(is_word)
    assert starts.dtype == ends.dtype == np.int64
    assert starts.tolist() == np.flatnonzero(edges == 1).tolist()
    assert ends.tolist() == np.flatnonzero(edges == -1).tolist()


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.lists(_ANY_TEXT | st.sampled_from(["", "  ", "!?", "ab", "abcd", "Straße"]), min_size=1,
                max_size=5),
       st.sampled_from([(5,), (3, 5)]), st.sampled_from([1.0, 2.5, -1.0, 0.0]))
@example(["", ""], (5,), 1.0)
@example(["ab", "cd", "ef"], (5,), 1.0)
@example(["abcd", "x"], (3, 5), -1.0)
def test_windows_across_texts_add_nothing(texts: list[str], ngrams: tuple[int, ...], weight: float) -> None:
    """A call's n-gram windows that cross from one text into the next (kept with weight 0 in the
    joined array) leave every row the bits of the text embedded alone."""
    emb = LexicalEmbedder(char_ngrams=ngrams, char_weights=(weight,) * len(ngrams))
    together = emb.embed(texts)
    alone = np.vstack([emb.embed([t]) for t in texts])
    assert together.tobytes() == alone.tobytes()
