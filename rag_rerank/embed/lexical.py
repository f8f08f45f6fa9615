"""The default embedder: hashed word and character n-gram vectors, numpy only, deterministic.

Why this design:

* **No model, no download, no state.** A vector depends only on its own text (no batch IDF),
  so a chunk's similarity to another chunk does not change with whatever else is in the
  request; the duplicate threshold measured on clough-stevenson therefore means the same
  thing in every call, and vectors can be compared across calls.
* **Good at what the post-pass needs.** Near-verbatim duplicates (copied, lightly edited,
  re-chunked text) share most of their character 5-grams; independent text on the same topic
  shares its vocabulary but far fewer long n-grams. Whole words (weight 2) plus character
  5-grams (which span word boundaries, so they also carry word order) separated copied from
  independent answers best among the mixes tried in bench/duplicates.py; damping term frequency
  (log) is the "TF-IDF-like" part: a word repeated ten times does not outweigh ten distinct ones,
  without needing a corpus to count document frequencies in.
* **Stable hashing.** Python's `hash()` is salted per process; here every n-gram is hashed with
  a fixed polynomial over its code points followed by the splitmix64 finaliser, so the same
  text gives the same vector on every machine and every run.
* **Vectorised.** All texts of a call are joined into one code-point array; the hashes of every
  n-gram of every text come from one prefix-hash array (`(H[end] - H[start]) * P^-start`, exact
  in uint64 arithmetic because P is odd and so invertible modulo 2^64) and a single `bincount`
  builds the matrix. There is no Python loop over n-grams or words.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError, RerankError, Violation
from ..text import STOPWORDS, comparable, is_latin1, latin1_table, latin1_translate
from .base import l2_normalise, numpy_sums_as_assumed, sparse_row_norms
from .memo import UnitEntries, dense_entries, row_entries

_P = np.uint64(0x100000001B3)  # FNV-64 prime: odd, hence invertible modulo 2**64
_P_INV = np.uint64(pow(0x100000001B3, -1, 2**64))
_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)
_SEP = 0  # code point that separates texts in the joined array (never survives normalisation)
_SPACE = 32
# Cosine at or above which two chunks count as near-duplicates with this embedder. Chosen on
# clough-stevenson (bench/duplicates.py; numbers in docs/postpass.md): every `cut`
# and `light` answer is at or above it against its source, no `non` answer reaches it.
LEXICAL_DUPLICATE_THRESHOLD = 0.49


def _word_hash(word: str) -> int:
    """The polynomial hash `embed` computes for a word, in Python integers (mod 2**64)."""
    h, power = 0, 1
    for ch in word:
        h = (h + (ord(ch) + 1) * power) % 2**64
        power = power * 0x100000001B3 % 2**64
    return h


# English function words (`text.STOPWORDS`): they make unrelated questions ("How do I ...") look
# alike. With `stopword_weight` below 1 they, and the character n-grams made only of them and spaces,
# count for that fraction of a content word. Off by default: on clough-stevenson it narrows the
# copied-vs-independent gap (+0.039 -> +0.031 at 0.1), and the local backend is calibrated without it.
_STOP_HASHES = np.array(sorted({_word_hash(w) for w in STOPWORDS}), dtype=np.uint64)


def _mix_in_place(h: np.ndarray) -> None:
    """The splitmix64 finaliser (h ^= h >> 30; h *= 0xBF58476D1CE4E5B9; h ^= h >> 27;
    h *= 0x94D049BB133111EB; h ^= h >> 31, modulo 2**64): spreads polynomial hashes over all 64
    bits before bucketing. Every step is written over `h` with one scratch array: a call mixes all
    its words' and n-grams' hashes at once, without a new array per step."""
    t = np.empty_like(h)
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        np.right_shift(h, np.uint64(shift), out=t)
        h ^= t
        h *= np.uint64(factor)
    np.right_shift(h, np.uint64(31), out=t)
    h ^= t


# `_NON_WORD` as a bytes table for Latin-1 text: every character it matches a space, the others
# kept, and an ASCII capital in lower case.
_WORD_BYTES = latin1_table(lambda ch: " " if _NON_WORD.fullmatch(ch) else ch.lower() if ch.isascii() else ch)


def _latin1_word(ch: str) -> str:
    """`normalise_text`'s rule (`comparable`, then `_NON_WORD` a space) for one Latin-1 character
    between two letters: itself, a space or nothing; "\x00" (which no character becomes: a control
    is a space) for the few whose form is several characters or lies beyond Latin-1 (ß, ¼, ½, ¾, µ)."""
    form = _NON_WORD.sub(" ", comparable(f"a{ch}a"))[1:-1]
    return form if len(form) <= 1 and form <= "\xff" else "\x00"


# The rule, character by character, for whole Latin-1 texts (ASCII, accents, web mojibake such as
# "\u00e2\u0080\u0099"). Exact: `comparable` treats a Latin-1 text character by character (a
# control becomes a space, a soft hyphen nothing; each character's NFKC form opens with a base
# character, so nothing composes or reorders across two characters; case folding is per character),
# and every run of white space or other non-word characters ends as one space here anyway.
_LATIN1_WORD_BYTES = latin1_table(_latin1_word)


def normalise_text(text: str) -> str:
    """`text.comparable` (NFKC, case-folded, controls a space, invisible format characters gone: the
    form quotations are compared in), every run of non-word characters one space, padded by one
    space. The padding makes word boundaries part of the character n-grams (" cat" differs from "cat").

    Latin-1 text (ASCII, accents, mojibake: most text) takes one bytes translation through the rule
    for each character (`_LATIN1_WORD_BYTES`) and a split, instead of `comparable` (NFKC, case
    folding, a cleaning table) and the regex. The rest, and a Latin-1 text with one of the few
    characters that become several, is folded first; when the folded text is Latin-1, one bytes
    translation makes its non-word characters spaces. `tests/test_embed_lexical.py` holds both
    short cuts to the rule."""
    spaced = latin1_translate(text, _LATIN1_WORD_BYTES)
    if spaced is None or "\x00" in spaced:
        folded = comparable(text)
        spaced = latin1_translate(folded, _WORD_BYTES)
        if spaced is None:
            return " " + _NON_WORD.sub(" ", folded).strip() + " "
    return " " + " ".join(spaced.split()) + " "


def _spaced(text: str) -> bytes | None:
    """`text` through `_LATIN1_WORD_BYTES` (its words with one or more spaces around each) as
    Latin-1 bytes, or its `normalise_text` when a character becomes several; None when that is not
    Latin-1 or holds no word (`normalise_text` is then two spaces, which `_code_points` would make one)."""
    try:
        raw = text.encode("latin-1")
    except UnicodeEncodeError:
        return None
    # the table deletes no ASCII character: ASCII takes the translation's way without deletions
    raw = raw.translate(_LATIN1_WORD_BYTES[0]) if text.isascii() else raw.translate(*_LATIN1_WORD_BYTES)
    if b"\x00" in raw:
        normalised = normalise_text(text)
        if not normalised.isascii() and not is_latin1(normalised):
            return None
        raw = normalised.encode("latin-1")
    return None if raw.isspace() or not raw else raw


def _code_points(texts: list[str]) -> np.ndarray:
    """The code points (uint64) of `normalise_text` of each text, joined by "\x00".

    When every text is Latin-1 with a word (most calls), each is translated (`_spaced`) and the
    whole call's runs of spaces are made one in a single numpy pass (a space after a space is
    dropped; each text is padded by a space first), instead of a split and a join per text and a
    UTF-32 encoding of the lot. A text that normalises to a space run would lose one of its two
    spaces that way: such a call, and one with a text beyond Latin-1, joins `normalise_text` itself."""
    spaced = list(map(_spaced, texts))
    if None in spaced or not spaced:
        joined = "\x00".join(normalise_text(t).replace("\x00", " ") for t in texts)
        return np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    raw = np.frombuffer(b" " + b" \x00 ".join(spaced) + b" ", dtype=np.uint8)  # type: ignore[arg-type]
    space = raw == _SPACE
    kept = np.ones(len(raw), dtype=bool)
    np.logical_not(space[1:] & space[:-1], out=kept[1:])
    return raw[kept].astype(np.uint64)


# P**i and P**-i (mod 2**64) for i below their length: the same numbers for every call, so they are
# made once and grown (doubling) when a call's joined texts are longer (`_powers`).
_SIGN_BIT = np.uint64(1 << 63)
_ONE_BITS = np.uint64(0x3FF0000000000000)  # the bits of the float64 1.0


def _signs(keys: np.ndarray) -> np.ndarray:
    """-1.0 for each uint64 key whose top bit is set, else 1.0 (float64).

    Why: the top bit is kept and the bits of 1.0 put under it, read as float64: two whole-word
    passes, where a comparison and a choice (`np.where`) or `np.copysign` (numpy's is a loop
    without vector instructions) cost more."""
    signs = np.bitwise_and(keys, _SIGN_BIT)
    signs |= _ONE_BITS
    return signs.view(np.float64)


def _word_bounds(is_word: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each run of True in `is_word` starts, and where it ends (the position after it).

    Why: a call's joined text starts and ends with a space (`normalise_text` pads each text), so
    every run lies inside and its edges are where a position differs from the one before, a start
    and an end in turn: one comparison of neighbours and one scan for them, without widening the
    mask to integers and padding it at both ends for `np.diff` (the general way, kept for a mask
    that starts or ends in a run)."""
    if not len(is_word) or is_word[0] or is_word[-1]:
        edges = np.diff(is_word.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
        return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    edges = np.flatnonzero(is_word[:-1] != is_word[1:])
    edges += 1
    return edges[0::2], edges[1::2]


_POWERS = (np.ones(1, dtype=np.uint64), np.ones(1, dtype=np.uint64))


def _powers(length: int) -> tuple[np.ndarray, np.ndarray]:
    """(P**i, P**-i) mod 2**64 for i < `length` (views of `_POWERS`, grown first when too short)."""
    global _POWERS
    powers, inverses = _POWERS
    if len(powers) < length:
        size = max(length, 2 * len(powers), 4096)
        powers, inverses = np.full(size, _P), np.full(size, _P_INV)
        powers[0] = inverses[0] = 1
        with np.errstate(over="ignore"):
            powers, inverses = np.cumprod(powers), np.cumprod(inverses)
        powers.flags.writeable = inverses.flags.writeable = False
        _POWERS = (powers, inverses)
    return powers[:length], inverses[:length]


# sign(s) * log1p(|s|) for the whole numbers s from -_LOG_REACH to _LOG_REACH, at s + _LOG_REACH:
# computed by the same numpy expression over the same float64 numbers, so a look-up gives the bits
# that computing it for each cell gives (`_damped`).
_LOG_REACH = 1024
_WHOLE = np.arange(-_LOG_REACH, _LOG_REACH + 1, dtype=np.float64)
_DAMPED_WHOLE = np.sign(_WHOLE) * np.log1p(np.abs(_WHOLE))
_DAMPED_WHOLE.flags.writeable = False


def _damped(sums: np.ndarray, whole: bool) -> np.ndarray:
    """sign(s) * log1p(|s|) of each sum: looked up in `_DAMPED_WHOLE` when they are whole numbers
    within its reach (`whole`: the caller knows they are whole; a look-up costs a fraction of a
    `log1p`), else computed. Each sum's place in the table is its integer (exact: whole sums are
    below 2**53) plus the reach, and all are within the table when the largest of them read as
    unsigned is (a negative place wraps far above it): one pass to check, not an absolute value
    and its maximum."""
    if whole and len(sums):
        at = sums.astype(np.int64)
        at += _LOG_REACH
        if at.view(np.uint64).max() <= 2 * _LOG_REACH:
            return _DAMPED_WHOLE.take(at)
    return np.sign(sums) * np.log1p(np.abs(sums))


@dataclass(frozen=True)
class LexicalEmbedder:
    """Hashed bag of words + character n-grams, L2-normalised rows of `dim` float32.

    `char_ngrams` are the n-gram lengths; `char_weights` their weights (longer = more specific);
    `word_weight` the weight of whole words; with `stopword_weight` < 1, English function words
    and n-grams made only of them count that much less (default 1: off). Term frequency is
    damped to sign(x)·log(1+|x|) per bucket; feature signs come from the hash, so bucket
    collisions cancel instead of adding a positive bias to every similarity.
    """

    dim: int = 4096
    char_ngrams: tuple[int, ...] = (5,)
    char_weights: tuple[float, ...] = (1.0,)
    word_weight: float = 2.0
    stopword_weight: float = 1.0
    duplicate_threshold: float = LEXICAL_DUPLICATE_THRESHOLD
    name: str = field(default="lexical")

    def __post_init__(self) -> None:
        problems = []
        if (
            isinstance(self.dim, bool)
            or not isinstance(self.dim, int)
            or self.dim < 16
            or self.dim & (self.dim - 1)
        ):
            problems.append(
                Violation(
                    path="embedder.dim",
                    value=self.dim,
                    message=f"dim must be a power of two >= 16, got {self.dim!r}",
                )
            )
        if len(self.char_ngrams) != len(self.char_weights) or any(n < 1 for n in self.char_ngrams):
            problems.append(
                Violation(
                    path="embedder.char_ngrams",
                    value=self.char_ngrams,
                    message="char_ngrams must be positive lengths, one weight each",
                )
            )
        if problems:
            raise InputError(problems, headline="invalid lexical embedder settings")

    def _whole_sums(self, entries: int) -> bool:
        """Whether every cell's sum of `entries` signed weights is a whole number, exactly: each
        weight is one (no function word weighs a fraction) and no partial sum reaches 2**53."""
        weights = (self.word_weight, *self.char_weights)
        return (self.stopword_weight == 1 and all(float(w).is_integer() for w in weights)
                and max(map(abs, weights)) * entries < 2**53)

    def embed(self, texts: list[str]) -> np.ndarray:
        """One unit row per text (an all-zero row for a text without word characters). A row
        depends on its own text only: the same bits whatever else is embedded with it."""
        counts, cells, units, _ = self._unit_cells(texts)
        # The unit values written over the sums they came from, then every cell converted once:
        # the untouched cells are +0.0 (a sum of weights starting from +0.0 that comes back to zero
        # is +0.0), so this is the float32 matrix of zeros with the values cast into their cells,
        # without zeroing a second n * dim block.
        counts[cells] = units
        return counts.astype(np.float32).reshape(len(texts), self.dim)

    def unit_entries(self, texts: list[str]) -> UnitEntries:
        """`l2_normalise(self.embed(texts))` (what `embed.embed_texts` hands on: the float32 rows
        normalised once more in float32), as float64 rows with each row's non-zero entries: what
        the post-pass multiplies and what `TextRows` stores, made from the touched cells alone.

        Why: the dense way passes over all n * dim cells seven more times (to float32, a finiteness
        check, squares, their sums, a division, to float64, and the store's scan for non-zero
        entries); a row touches about one cell in ten. The float32 norms are numpy's own sums,
        taken over the entries (`sparse_row_norms`); on a numpy that sums otherwise, the dense way."""
        n, dim = len(texts), self.dim
        counts, cells, units, row_of = self._unit_cells(texts)
        values = units.astype(np.float32)
        if not np.isfinite(values).all():  # `embed_texts`' check, for weights that overflow
            raise RerankError(f"embedder {self.name!r} returned NaN or Infinity")
        if not numpy_sums_as_assumed():
            counts[cells] = units
            dense = l2_normalise(counts.astype(np.float32).reshape(n, dim))
            return UnitEntries(dense.astype(np.float64), dense_entries(dense))
        norms = sparse_row_norms(cells, values, n, dim).take(row_of)
        if norms.all():  # `l2_normalise`'s two ways: a plain division, zeros for a zero norm
            values = values / norms
        else:
            values = np.divide(values, norms, out=np.zeros_like(values), where=norms > 0)
        # The untouched cells' +0.0 stays (float32 +0.0 over any norm). The float32 values are
        # widened first (exactly, as the assignment would): a same-type assignment takes numpy's
        # plain indexed copy, a casting one its buffered iterator (about 1.5 times the work).
        counts[cells] = values.astype(np.float64)
        kept = values != 0
        if not kept.all():
            cells, values = cells[kept], values[kept]
        return UnitEntries(counts.reshape(n, dim), row_entries(cells, values, n, dim))

    def _unit_cells(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(the flat n * dim float64 block of each cell's summed signed weights, its non-zero cells
        in order, their unit values in float64, the row of each): the rule `embed` writes out."""
        n = len(texts)
        if n == 0:
            return np.zeros(0), *(np.zeros(0, dtype=np.int64),) * 3
        cp = _code_points(texts)
        length = len(cp)
        # where each position's row starts in the flat n * dim block: its text's index (the separator
        # starts the next text) times dim, shifted once here rather than multiplied for every entry
        row = np.cumsum(cp == _SEP)
        row <<= self.dim.bit_length() - 1
        # With the default stopword_weight of 1 every word and n-gram weighs what its kind weighs:
        # finding function words (a search per word, two cumulative sums) would change nothing.
        damped = self.stopword_weight != 1
        # prefix hashes: H[i] = sum_{j<i} (cp[j] + 1) * P^j  (mod 2^64); +1 so that code point 0 counts
        with np.errstate(over="ignore"):
            powers, inv = _powers(length)
            prefix = np.empty(length + 1, dtype=np.uint64)
            prefix[0] = 0
            np.cumsum((cp + np.uint64(1)) * powers, out=prefix[1:])

            keys: list[tuple[np.ndarray, int]] = []  # each kind's hashes and the salt they are mixed with
            rows: list[np.ndarray] = []  # where each entry's row starts in the flat block
            weights: list[np.ndarray | float] = []  # an array, or one weight for every entry
            not_sep = cp != _SEP
            is_word = not_sep & (cp != _SPACE)
            w_start, w_end = _word_bounds(is_word)
            w_hash = (prefix.take(w_end) - prefix.take(w_start)) * inv.take(w_start)
            if damped:
                at = np.minimum(np.searchsorted(_STOP_HASHES, w_hash), len(_STOP_HASHES) - 1)
                is_stop = _STOP_HASHES[at] == w_hash
                # characters that belong to a content word; an n-gram without any is function-word glue
                inside_stop = np.zeros(length + 1, dtype=np.int64)
                inside_stop[w_start[is_stop]] = 1  # starts and ends are distinct positions
                inside_stop[w_end[is_stop]] = -1
                content = is_word & (np.cumsum(inside_stop[:length]) == 0)
                content_before = np.concatenate(([0], np.cumsum(content)))
            if self.word_weight:
                keys.append((w_hash, 0xD1B54A32D192ED03))
                rows.append(row.take(w_start))
                weights.append(np.where(is_stop, self.word_weight * self.stopword_weight, self.word_weight)
                               if damped else self.word_weight)
            for n_len, w in zip(self.char_ngrams, self.char_weights, strict=True):
                if length < n_len:
                    continue
                # the n-gram starting at each position, counted when it lies inside one text; made
                # with slices (start = 0, 1, ...) instead of index gathers
                m = length - n_len + 1
                ok = not_sep[:m] & (row[:m] == row[n_len - 1:])
                h = (prefix[n_len:] - prefix[:m]) * inv[:m]
                salt = n_len * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
                if not damped and math.isfinite(w):
                    # every window kept, the few that cross a text's end weighing 0 (no boolean
                    # selection of the hashes and the rows): ±0.0 added to a cell changes no sum and
                    # leaves an untouched cell +0.0 (the sums start at +0.0). A damped or infinite
                    # weight (0 * inf is NaN) takes the selection.
                    keys.append((h, salt))
                    rows.append(row[:m])
                    weights.append(ok * float(w))
                    continue
                keys.append((h[ok], salt))
                rows.append(row[:m][ok])
                if damped:
                    glue = (content_before[n_len:] == content_before[:m])[ok]
                    weights.append(np.where(glue, w * self.stopword_weight, w))
                else:
                    weights.append(w)

        entries = sum(len(h) for h, _ in keys)
        if not entries:  # (`bincount` of nothing would be integers)
            nothing = np.zeros(0, dtype=np.int64)
            return np.zeros(n * self.dim), nothing, np.zeros(0), nothing
        # Each entry's key, cell and signed weight, every kind written into its stretch of the three
        # arrays (no concatenation of keys, rows and weights), the keys mixed all at once: the sign
        # is the key's top bit (`_signs`), the column its low bits (read through the key's int64 view).
        mixed, flat = np.empty(entries, dtype=np.uint64), np.empty(entries, dtype=np.int64)
        at = 0
        for (h, salt), _ in zip(keys, rows, strict=True):
            end = at + len(h)
            np.bitwise_xor(h, np.uint64(salt), out=mixed[at:end])
            at = end
        _mix_in_place(mixed)
        signed = _signs(mixed)
        at = 0
        for rows_of, weight in zip(rows, weights, strict=True):
            end = at + len(rows_of)
            bits = mixed[at:end].view(np.int64)
            if not (isinstance(weight, float) and weight == 1.0):  # (±1.0) · 1.0 is ±1.0
                signed[at:end] *= weight
            np.add(rows_of, bits & (self.dim - 1), out=flat[at:end])
            at = end
        counts = np.bincount(flat, weights=signed, minlength=n * self.dim)
        # Only the few touched cells are transformed and normalised: the dense matrix is mostly
        # zeros. They are found on a boolean mask (`counts != 0`, the same cells): `np.flatnonzero`
        # of the float sums themselves tests each of the n * dim cells through a slow generic path
        # (1.8 M instructions of the 14.3 M this function took for 20 DL19 passages), the mask's
        # comparison and scan are vectorised. (Sorting the touched cells with `np.unique` instead
        # of the dense sums cost more than both.)
        cells = np.flatnonzero(counts != 0)
        sums = counts.take(cells)
        vals = _damped(sums, whole=self._whole_sums(entries))
        row_of = cells >> (self.dim.bit_length() - 1)  # `cells // dim` for a power of two
        norms = np.sqrt(np.bincount(row_of, weights=vals * vals, minlength=n))
        return counts, cells, vals / norms.take(row_of), row_of
