"""The one normalisation of quoted text: a quotation written by `text.quote` is accepted by the
output guard for any text and any slice of it, whatever its Unicode (controls, NFD accents,
format characters, ligatures, CJK)."""

from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rag_rerank.guard.output import cites_chunk, misquoted
from rag_rerank.text import comparable, quote, readable

# What web and PDF text is made of: words, mojibake bytes (C1 controls), decomposed accents,
# invisible format characters, ligatures and compatibility forms, other scripts.
_MANGLE = [chr(c) for c in range(0x80, 0xA0)] + [
    "\u0301", "\u0308", "\u200b", "\u202e", "\ufeff", "\u00ad", "\U0001f600", "\ufb01", "\u2126", "é",
    "中文", "ש", "\x00", "\t", "\n", "\u00a0", "ß", "İ", "ǰ", "\u1100\u1161\u11a8"]
_PIECES = st.one_of(st.sampled_from(["Bluetooth", "secure", "café", "naïve", "IVF", "HNSW", " ", ". "]),
                    st.sampled_from(_MANGLE), st.text(max_size=5))
MANGLED = st.lists(_PIECES, min_size=1, max_size=30).map("".join)
ANY_TEXT = st.one_of(st.text(max_size=80), MANGLED, MANGLED.map(lambda t: unicodedata.normalize("NFD", t)))


@given(ANY_TEXT, st.data())
def test_a_quote_of_any_slice_passes_the_guard(text: str, data: st.DataObject) -> None:
    lo = data.draw(st.integers(0, len(text)))
    hi = data.draw(st.integers(lo, len(text)))
    phrase = quote(text, lo, hi)
    if phrase is None:
        return
    assert comparable(phrase) in comparable(text)
    assert misquoted(f"quotes {json.dumps(phrase, ensure_ascii=False)}", text) is None


@given(ANY_TEXT)
def test_readable_and_comparable_are_idempotent(text: str) -> None:
    once = readable(text)
    assert readable(once) == once
    assert comparable(once) == comparable(text)
    assert comparable(comparable(text)) == comparable(text)
    assert not any(unicodedata.category(ch) in ("Cc", "Cf") for ch in once)


@pytest.mark.parametrize(("text", "phrase"), [
    ("Bluetooth is \u00e2\u0080\u009cfairly\u00e2\u0080\u009d secure.", "Bluetooth is â fairlyâ secure"),
    ("un cafe\u0301 noir", "un café noir"),  # NFD in, one composed spelling out
    ("the \ufb01le system", "the file system"),
    ("zero\u200bwidth", "zerowidth"),
])
def test_the_mojibake_and_nfd_that_failed_on_web_text_are_quoted_and_accepted(text: str, phrase: str) -> None:
    assert quote(text, 0, len(text.rstrip("."))) == phrase
    reason = f"quotes {json.dumps(phrase, ensure_ascii=False)}"
    assert misquoted(reason, text) is None and cites_chunk(reason, text)


def test_a_slice_ending_before_a_combining_accent_takes_the_accent() -> None:
    text = "un cafe\u0301 noir"
    assert quote(text, 0, 7) == "un café"  # text[:7] is "un cafe", the accent follows


def test_cites_chunk_compares_in_the_same_form() -> None:
    # Regression: an NFD chunk hid "café" from a reason that names it (composed), so the local
    # backend dropped a relevant chunk as no_citable_phrase and an LLM's reason was re-asked.
    assert cites_chunk("mentions café prices", "Le cafe\u0301 est cher")
    assert cites_chunk("names the fairly secure pairing", "Bluetooth is \u00e2\u0080\u009cfairly\u00e2")


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=255), max_size=40) | st.text(max_size=20))
@example("It\u00e2\x80\x99s caf\u00e9\u00ad \x85next\u00a0line\x00\x1b[0m")
@example("".join(map(chr, range(256))))
def test_latin1_text_is_cleaned_as_the_character_table_cleans_it(text: str) -> None:
    """Latin-1 text is cleaned with one bytes translation: the same text as the per-character
    table (controls a space, format characters gone), then NFKC and one space per run."""
    from rag_rerank.text import _CLEAN

    assert readable(text) == " ".join(unicodedata.normalize("NFKC", text.translate(_CLEAN)).split())


@settings(max_examples=500, derandomize=True, deadline=None)
@given(st.lists(st.sampled_from([" ", "  ", "word", "caf\u00e9", "\u0301", "x"]), max_size=12).map("".join))
@example("")
@example(" ")
@example("a b")
def test_the_one_space_short_cut_is_the_join_of_the_split(text: str) -> None:
    """`readable`'s last step hands back a one-spaced text as it is, without splitting and joining
    it: the same string as the split and join, for a text whose only white space is " "."""
    from rag_rerank.text import _one_space

    assert _one_space(text) == " ".join(text.split())


def test_the_only_white_space_readable_joins_by_its_short_cut_is_the_space() -> None:
    """What `_one_space` rests on, over every character: printable ASCII holds no white space but
    " "; nor does a Latin-1 character other than a control or a format character once NFKC made
    it compatible, and NFKC's composition makes no white space (none decomposes into two)."""
    printable = bytes(range(0x20, 0x7F)).decode("ascii")
    assert [c for c in printable if c.isspace()] == [" "]
    kept = [chr(c) for c in range(256) if unicodedata.category(chr(c)) not in ("Cc", "Cf")]
    assert not [c for c in kept if any(w.isspace() and w != " " for w in unicodedata.normalize("NFKC", c))]
    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    assert not [c for c in spaces if len(unicodedata.decomposition(c).split()) == 2
                and not unicodedata.decomposition(c).startswith("<")]


_SPACES_AND_CONTROLS = st.sampled_from([
    " ", "  ", "\t", "\n", "\x0b", "\x0c", "\r", "\x1c", "\x1f", "\x85", "\x7f", "\x00", "\u00a0", "\u00a8",
    "\u00ad", "\u1680", "\u2000", "\u2028", "\u3000", "\u200b", "\ufeff", "word", "caf\u00e9"])


@settings(max_examples=500, derandomize=True, deadline=None)
@given(st.lists(st.one_of(_SPACES_AND_CONTROLS, st.text(max_size=6)), max_size=12).map("".join))
@example("")
@example(" a ")
@example("a\x7fb")
@example("\u00a8")
def test_readable_is_its_plain_rule(text: str) -> None:
    """`readable` by its short cuts is the rule the module docstring states, written plainly."""
    from rag_rerank.text import _CLEAN

    assert readable(text) == " ".join(unicodedata.normalize("NFKC", text.translate(_CLEAN)).split())
