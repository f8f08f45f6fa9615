"""`embed.units`: the matching units of text in scripts `\\w+` and the static table mis-read."""

from __future__ import annotations

import re
import unicodedata

from rag_rerank.embed.units import reads_foreign, units, units_with_spans, visible


def test_chinese_without_spaces_becomes_characters_and_pairs_not_one_sentence_token() -> None:
    got = units("查看磁盘空间")
    assert "查看磁盘空间" not in got
    assert {"磁盘", "空间", "查看", "磁", "盘"} <= set(got)
    # a Latin word inside a Chinese sentence stays one unit, lower-cased
    assert "linux" in units("如何在Linux上查看")


def test_korean_particles_and_japanese_kana_share_units_with_the_bare_word() -> None:
    assert "비밀번호" not in units("비밀번호를")  # the particle is attached ...
    shared = set(units("비밀번호를")) & set(units("새 비밀번호는"))
    assert {"비밀", "밀번", "번호"} <= shared  # ... the pairs still meet
    assert {"パス", "ワー"} <= set(units("パスワードをリセット"))


def test_marks_stay_inside_their_word_and_nfd_equals_nfc() -> None:
    assert units("हिन्दी भाषा") == ["हिन्दी", "भाषा"]  # `\w+` would cut at every vowel sign
    nfc, nfd = (unicodedata.normalize(f, "Le café") for f in ("NFC", "NFD"))
    assert units(nfc) == units(nfd) == ["le", "café"]


def test_zero_width_characters_do_not_split_a_word() -> None:
    assert units("pass\u200bword re\u200dset\u00ad") == ["password", "reset"]


def test_ascii_words_are_exactly_the_plain_word_split() -> None:
    text = "Why does my pod_name keep OOMKilled 137 times?"
    assert units(text) == re.findall(r"\w+", text.lower())


def test_spans_point_back_into_the_original_text() -> None:
    text = "使用 df -h 查看磁盘空间"
    for unit, lo, hi in units_with_spans(text):
        assert text[lo:hi].lower() == unit or unit in text[lo:hi].lower(), (unit, text[lo:hi])


def test_the_dominant_script_picks_the_analyser() -> None:
    assert reads_foreign("如何在Linux上查看磁盘空间使用情况")
    assert reads_foreign("Как приготовить борщ?")
    assert reads_foreign("Docker 容器重启")  # a CJK character weighs about a word's worth of letters
    assert not reads_foreign("The Tokyo Tower (東京タワー) is 333 m tall.")  # English quoting a name
    assert not reads_foreign("Le café est ouvert le dimanche.")
    assert not reads_foreign("2πr and 1/λ⁴")
    assert not reads_foreign("")


def test_visible_text_has_no_controls_or_zero_width_characters() -> None:
    assert visible("password\x00reset\x1b[31m\u200b ok\tx") == "password reset [31m ok\tx"


def test_no_latin1_character_counts_for_a_foreign_script() -> None:
    """`reads_foreign` answers False for Latin-1 text without reading it: no Latin-1 character
    counts as a letter of a script that needs these units."""
    from rag_rerank.embed.units import _LETTER_KIND

    assert all("f" not in chr(c).translate(_LETTER_KIND) for c in range(256))
    assert not reads_foreign("".join(map(chr, range(256))) * 3)
