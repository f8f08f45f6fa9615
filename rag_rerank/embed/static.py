"""The `static` embedder: a MiniLM-derived table of token vectors, looked up and averaged with numpy.

Why it exists: the default reranker must know that "kubectl" belongs with "Kubernetes" and
"OOMKilled" with a crashing container, without torch, a download or a network. A static table
(one vector per WordPiece token, distilled from all-MiniLM-L6-v2 by model2vec: see
`scripts/build_static_table.py` for origin, licence and method) carries much of a transformer's
vocabulary knowledge at the cost of a dictionary lookup. A text's vector is the mean of its token
vectors, L2-normalised: exactly what model2vec's `StaticModel.encode` computes.

Tokenisation is BERT's uncased WordPiece (the table's vocabulary), written out here so the core
install needs nothing but numpy: clean control characters, space out CJK ideographs, strip
accents, lowercase, split on white space and punctuation, then greedy longest-match word pieces.
`tests/test_embed_static.py` pins it token for token against Hugging Face `tokenizers` reading
MiniLM's own `tokenizer.json`. Kept rather than `tokenizers` (13.6 MB with huggingface-hub, not a
core dependency), measured with `python bench/libraries.py`: on the 4,297 distinct DL19 passages
`tokenizers` given the table's vocabulary and BERT's normaliser yields the same ids for all 4,297,
and ours, memoised per word, took 0.43-0.68 ms a passage at first sight and 0.15-0.23 ms for
text seen before against its 0.8-1.1 ms (load average 13-14 on a shared 2-core machine).

Not for near-duplicate detection: averaged token vectors of two different texts on one topic are
close, so its duplicate threshold is set high and the post-pass decides duplicates on text anyway.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..text import Latin1Table, latin1_table, latin1_translate
from .base import l2_normalise
from .memo import RunMemo, TextRows
from .units import WORD, clean_word, kind, reads_foreign, split_word

TABLE = Path(__file__).with_name("static_minilm.npz")
MAX_TOKENS = 512  # model2vec's default truncation for this table
_MAX_WORD_CHARS = 100  # BERT: a longer "word" is one unknown token
# Averaged static vectors of same-topic texts sit close together; only near-copies get this high.
STATIC_DUPLICATE_THRESHOLD = 0.97


@dataclass(frozen=True)
class _Table:
    vectors: np.ndarray  # (V, d) float32
    index: dict[str, int]


@lru_cache(maxsize=1)
def _table() -> _Table:
    with np.load(TABLE, allow_pickle=False) as data:
        vectors = np.asarray(data["vectors"], dtype=np.float32)
        vocab = [str(t) for t in data["vocab"]]
    return _Table(vectors, {tok: i for i, tok in enumerate(vocab)})


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def _is_punct(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


class _CharMap(dict[int, str | None]):
    """Each code point's replacement under BERT's per-character cleaning, for `str.translate`:
    ' ' for white space, None (deleted) for control characters, a spaced CJK ideograph, else
    itself. Filled on first sight of a code point, so a text costs one C-level pass."""

    def __missing__(self, cp: int) -> str | None:
        ch = chr(cp)
        cat = unicodedata.category(ch)
        out: str | None
        if ch in "\t\n\r" or ch == " " or cat == "Zs":
            out = " "
        elif ch == "\x00" or ch == "\ufffd" or cat.startswith("C"):
            out = None
        elif _is_cjk(cp):
            out = f" {ch} "
        else:
            out = ch
        self[cp] = out
        return out


class _MarkMap(dict[int, str | None]):
    """Deletes non-spacing marks (category Mn) with `str.translate`: the accents NFD splits off."""

    def __missing__(self, cp: int) -> str | None:
        ch = chr(cp)
        out = None if unicodedata.category(ch) == "Mn" else ch
        self[cp] = out
        return out


_CLEAN, _UNMARK = _CharMap(), _MarkMap()


def _normalise(text: str) -> str:
    """BERT's normaliser: control characters out, white space to ' ', CJK spaced, no accents, lower.
    Latin-1 text (ASCII, accents, and mojibake such as "â\x80\x99": most text) takes one bytes
    translation (`_latin1_table`) instead of a dictionary look-up per character (per distinct
    character for ASCII) in each of two translations."""
    normalised = latin1_translate(text, _latin1_table())
    return _normalise_unicode(text) if normalised is None else normalised


def _normalise_unicode(text: str) -> str:
    """`_normalise`'s rule before lower case, for any text."""
    cleaned = text.translate(_CLEAN)
    if cleaned.isascii():
        return cleaned.lower()
    return unicodedata.normalize("NFD", cleaned).translate(_UNMARK).lower()


@lru_cache(maxsize=1)
def _latin1_table() -> Latin1Table:
    """`_normalise_unicode` of Latin-1 text, one character at a time: each character cleaned,
    decomposed, stripped of its marks and lower-cased by the same rule. Exact for whole texts: no
    Latin-1 character composes with another or is a combining mark, the marks a decomposition makes
    (the only characters canonical reordering moves) are all deleted, and lower case is per
    character (its one rule with a context, the Greek final sigma, is beyond Latin-1). Each kept
    character stays one Latin-1 character (`latin1_table` refuses more; tests/test_embed_static.py)."""
    return latin1_table(lambda ch: unicodedata.normalize("NFD", ch.translate(_CLEAN)).translate(_UNMARK)
                        .lower())


_ASCII_WORDS = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9]")
_CACHED_CHUNK_CHARS = 64  # longer white-space-free runs are split uncached (rare; keeps the cache small)


def _split_punct(chunk: str) -> tuple[str, ...]:
    """One white-space-free run as words: each punctuation character a word of its own.

    A letter or digit (`str.isalnum`: Unicode categories L and N) is never punctuation, so a run of
    them alone (most words) is returned whole and the per-character test skips them."""
    if chunk.isalnum():
        return (chunk,)
    if chunk.isascii():  # cleaned ASCII holds no space or control character: all else is punctuation
        return tuple(_ASCII_WORDS.findall(chunk))
    words: list[str] = []
    start = 0
    for i, ch in enumerate(chunk):
        if not ch.isalnum() and _is_punct(ch):
            if start < i:
                words.append(chunk[start:i])
            words.append(ch)
            start = i + 1
    if start < len(chunk):
        words.append(chunk[start:])
    return tuple(words)


_split_punct_cached = lru_cache(maxsize=131072)(_split_punct)


def _chunk_words(chunk: str) -> tuple[str, ...]:
    return _split_punct_cached(chunk) if len(chunk) <= _CACHED_CHUNK_CHARS else _split_punct(chunk)


def _words(text: str) -> list[str]:
    """BERT's pre-tokeniser: split on white space, each punctuation character a word of its own."""
    return [w for chunk in _normalise(text).split() for w in _chunk_words(chunk)]


def _pieces(word: str) -> tuple[int, ...]:
    """Greedy longest-match WordPiece ids of one word; () when any part is unknown (BERT's [UNK],
    which model2vec drops from the mean)."""
    if len(word) > _MAX_WORD_CHARS:
        return ()
    return _word_pieces(word)


@lru_cache(maxsize=1)
def _longest_piece() -> int:
    """The length of the table's longest token: a longer piece of a word is never looked up."""
    return max(map(len, _table().index))


@lru_cache(maxsize=131072)
def _word_pieces(word: str) -> tuple[int, ...]:
    index = _table().index
    longest = _longest_piece()
    ids: list[int] = []
    start = 0
    while start < len(word):
        end = min(len(word), start + longest)  # greedy longest match, from the longest piece there can be
        found = None
        while start < end:
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            found = index.get(piece)
            if found is not None:
                break
            end -= 1
        if found is None:
            return ()
        ids.append(found)
        start = end
    return tuple(ids)


def _chunk_ids_uncached(chunk: str) -> tuple[int, ...]:
    if chunk.isalnum():  # one word (most runs): no punctuation to split off
        return _pieces(chunk)
    return tuple(i for w in _chunk_words(chunk) for i in _pieces(w))


def _chunk_bytes(chunk: str) -> bytes:
    """`_chunk_ids_uncached(chunk)` as native int64 bytes: a text's ids are then one `bytes.join`
    and one `np.frombuffer` away, without a Python int per id (`_wordpiece_array`)."""
    return array("q", _chunk_ids_uncached(chunk)).tobytes()


_chunk_ids_cached = RunMemo(_chunk_bytes, 131072, longest=_CACHED_CHUNK_CHARS)


@lru_cache(maxsize=65536)
def in_vocabulary(word: str) -> bool:
    """Whether `word` (lower case) is one whole token of the table's English vocabulary: a word
    the model knew, not one it spells in pieces (a typo, a rare name)."""
    return word in _table().index


def tokenize(text: str) -> list[str]:
    """The WordPiece tokens of `text` (unknown words left out), for tests and for reading."""
    vocab = {i: t for t, i in _table().index.items()}
    return [vocab[i] for w in _words(text) for i in _pieces(w)]


# White-space-separated runs looked up at once by `_wordpiece_array` (a DL19 passage has about 80).
_RUNS_AT_ONCE = 128


def _wordpiece_array(text: str) -> np.ndarray:
    """The WordPiece ids of `text`'s runs, in order, at most MAX_TOKENS, as a read-only int64 array.

    The runs are looked up `_RUNS_AT_ONCE` at a time with one `map` (C-level calls of the memo,
    which keeps no run longer than `_CACHED_CHUNK_CHARS`) instead of a Python loop per run, each
    run's ids held as bytes (`_chunk_bytes`), joined. It stops after the batch that reaches
    MAX_TOKENS."""
    runs = _normalise(text).split()
    parts: list[bytes] = []
    size = 0
    for start in range(0, len(runs), _RUNS_AT_ONCE):
        batch = runs if len(runs) <= _RUNS_AT_ONCE else runs[start:start + _RUNS_AT_ONCE]
        parts.append(b"".join(map(_chunk_ids_cached.__getitem__, batch)))
        size += len(parts[-1])
        if size >= 8 * MAX_TOKENS:
            break
    joined = parts[0] if len(parts) == 1 else b"".join(parts)
    return np.frombuffer(joined, dtype=np.int64)[:MAX_TOKENS]


def _wordpiece_ids(text: str, ids: list[int]) -> None:
    """Appends `_wordpiece_array(text)` to `ids` (callers keep their first MAX_TOKENS ids)."""
    ids += _wordpiece_array(text).tolist()


# --- text the table cannot read -------------------------------------------------------------------
# The table is an English WordPiece vocabulary: a Russian, Arabic, Korean or kana word becomes single
# letters, and the mean of letter vectors makes every text in that script look alike (cosine ~0.9
# between a borscht recipe and a sentence about Moscow). Such words (and Chinese, whose characters
# the vocabulary mostly lacks) get the units of `embed.units` instead, each with a fixed random
# vector drawn from a seed hashed from the unit: independent units are near-orthogonal, equal ones
# identical, so these signals measure shared words (and CJK character pairs) in those scripts, as
# BM25 does, instead of script membership. Their norm is the table's median whole-word norm (SIF
# weighting: a typical content word), the same for a CJK character and a pair: half weight for the
# single characters lost one of three relevant Chinese answers (bench/multilingual.py).
# Only text whose letters are mostly in such scripts takes this path (`embed.units.reads_foreign`), so
# English text, even quoting a Japanese name, is read exactly as before. Ids at or above OOV_BASE
# name hashed units.
OOV_BASE = 1 << 40


def _has_foreign(word: str) -> bool:

    return any(kind(ch) for ch in word)


@lru_cache(maxsize=131072)
def _oov_id(unit: str) -> int:
    return OOV_BASE + int.from_bytes(hashlib.blake2b(unit.encode("utf-8"), digest_size=5).digest(), "little")


@lru_cache(maxsize=1)
def _oov_norm() -> float:
    table = _table()
    whole = [i for tok, i in table.index.items() if tok.isascii() and tok.isalpha() and len(tok) > 3]
    return float(np.median(np.linalg.norm(table.vectors[whole], axis=1)))


@lru_cache(maxsize=65536)
def _oov_vector(oov: int) -> np.ndarray:
    rng = np.random.default_rng(oov)
    v = rng.standard_normal(_table().vectors.shape[1])
    return (v * (_oov_norm() / np.linalg.norm(v))).astype(np.float32)


def _foreign_ids(word: str) -> tuple[int, ...]:
    """`_foreign_word_ids`, memoised for words of ordinary length; a long unspaced run (a Chinese
    paragraph is one "word") is cut to MAX_TOKENS characters first: it yields more units than that."""
    if len(word) <= _CACHED_CHUNK_CHARS:
        return _foreign_word_ids_cached(word)
    return _foreign_word_ids(word[:MAX_TOKENS])


def _foreign_word_ids(word: str) -> tuple[int, ...]:
    """Ids of one word holding non-Latin letters: a hashed id per matching unit, WordPiece ids for
    a Latin stretch inside it ("linux" in "如何在linux上")."""

    cleaned = clean_word(word)
    out: list[int] = []
    for unit, _ in split_word(cleaned):
        if _has_foreign(unit):
            out.append(_oov_id(unit))
        else:
            _wordpiece_ids(unit, out)
    return tuple(out)


_foreign_word_ids_cached = lru_cache(maxsize=131072)(_foreign_word_ids)


def _plain(text: str) -> bool:
    """Whether `text` is read by WordPiece alone (no script the table cannot read dominates it)."""
    return text.isascii() or not reads_foreign(text)


def token_ids(text: str) -> list[int]:
    """The token ids of `text`, at most MAX_TOKENS: WordPiece for what the table reads (memoised per
    white-space-separated run: a run recurs across texts, so most cost one dictionary lookup), and
    hashed units for words in scripts it cannot (see `OOV_BASE`), in reading order, when those
    scripts dominate the text (`embed.units.reads_foreign`)."""

    if _plain(text):
        return _wordpiece_array(text).tolist()
    ids: list[int] = []
    pos = 0
    for m in WORD.finditer(text):
        if not _has_foreign(m.group()):
            continue
        if pos < m.start():
            _wordpiece_ids(text[pos : m.start()], ids)
        ids += _foreign_ids(m.group())
        pos = m.end()
        if len(ids) >= MAX_TOKENS:
            return ids[:MAX_TOKENS]
    if pos < len(text):
        _wordpiece_ids(text[pos:], ids)
    return ids[:MAX_TOKENS]


@lru_cache(maxsize=4096)
def _text_ids(text: str) -> np.ndarray:
    """`token_ids(text)` as a read-only int64 array, memoised per text (about 1.6 KB each): the
    local backend and the post-pass tokenise the same chunks, and chunks come back across calls."""
    ids = _wordpiece_array(text) if _plain(text) else np.asarray(token_ids(text), dtype=np.int64)
    ids.flags.writeable = False
    return ids


def _rows(ids: Sequence[int] | np.ndarray, unit: bool = False) -> np.ndarray:
    """The vectors of `ids` (raw, or of unit length with `unit`), table and hashed units alike."""
    table = _unit_table() if unit else _table().vectors
    arr = np.asarray(ids, dtype=np.int64)
    known = arr < OOV_BASE
    if known.all():  # `take` copies whole rows; an index subscript walks them element by element
        return table.take(arr, axis=0)
    out = np.empty((len(arr), table.shape[1]), dtype=np.float32)
    out[known] = table.take(arr[known], axis=0)
    extra = np.stack([_oov_vector(int(i)) for i in arr[~known]])
    if unit:
        extra = extra / np.linalg.norm(extra, axis=1, keepdims=True)
    out[~known] = extra
    return out


def _mean_vectors(ids_per_text: Sequence[Sequence[int] | np.ndarray]) -> np.ndarray:
    """Each text's mean token vector, L2-normalised (a zero row for a text without tokens).

    The token vectors of all texts are looked up in one gather; each text's are then summed with
    `np.add.reduce` over its own rows (what `mean(axis=0)` sums with: one row after another, in
    float32; `np.add.reduceat` adds in another order and gives other bits), and all sums are
    divided by their counts at once (the same correctly rounded float32 quotients)."""
    table = _table()
    out = np.zeros((len(ids_per_text), table.vectors.shape[1]), dtype=np.float32)
    counts = np.fromiter(map(len, ids_per_text), dtype=np.int64, count=len(ids_per_text))
    have = np.flatnonzero(counts)
    if len(have):
        rows = _rows(np.concatenate([np.asarray(ids_per_text[k], dtype=np.int64) for k in have]))
        ends = np.cumsum(counts[have]).tolist()
        for k, start, end in zip(have.tolist(), [0, *ends[:-1]], ends, strict=True):
            np.add.reduce(rows[start:end], axis=0, out=out[k])
        out[have] /= counts[have, None].astype(np.float32)
    return l2_normalise(out)  # (a plain division when no row is zero: a masked one costs far more)


@dataclass(frozen=True)
class StaticEmbedder:
    """Mean of static token vectors, L2-normalised; a text with no known token is a zero row."""

    name: str = field(default="static")
    duplicate_threshold: float = STATIC_DUPLICATE_THRESHOLD

    @property
    def dim(self) -> int:
        """The length of a row (the table's)."""
        return int(_table().vectors.shape[1])

    def embed(self, texts: list[str]) -> np.ndarray:
        """A row depends on its own text only (each row is normalised alone), so the rows of texts
        seen recently come from `ROWS`."""
        return ROWS.rows(list(texts), list(texts), _text_vectors, self.dim)


def _text_vectors(texts: list[str]) -> np.ndarray:
    return _mean_vectors([_text_ids(t) for t in texts])


# The static rows of the last texts embedded (1.5 KB each: at most 6 MB).
ROWS = TextRows(4096)


def token_match(query: str, texts: list[str]) -> np.ndarray:
    """How well each text covers the query token by token, in [-1, 1].

    For every distinct query token, the best cosine with any token of the text; averaged with the
    query tokens' raw vector norms as weights. The table's vectors are SIF-weighted, so frequent
    tokens ("the", "how") have short vectors and count little, rare ones ("kubernetes") a lot,
    without any corpus statistics. Unlike the mean vector, one strong match ("kubectl" for
    "kubernetes") is not averaged away by a long chunk's other words."""
    return _match_ids(token_ids(query), [token_ids(t) for t in texts])


def embed_and_match(query: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`StaticEmbedder().embed([query, *texts])`, `token_match(query, texts)` and
    `context_vectors(query, texts)` with each text tokenised once: the local backend needs all
    three for every chunk."""
    query_ids = token_ids(query)
    ids = [_text_ids(t) for t in texts]
    vectors = np.vstack([_mean_vectors([query_ids]), StaticEmbedder().embed(texts)])  # rows stand alone
    return vectors, _match_unique(query_ids, [_unique_ids(t) for t in texts]), _context_ids(query_ids, ids)


def vectors_and_match(query: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """`embed_and_match` without the context vectors (`segment_match` for the match)."""
    vectors = np.vstack([_mean_vectors([token_ids(query)]), StaticEmbedder().embed(texts)])
    return vectors, segment_match(query, texts)


def segment_match(query: str, texts: list[str]) -> np.ndarray:
    """`token_match(query, texts)` for many short texts (a long chunk's sentences, `evidence.Scorer`):
    the query's tokens are compared once with each distinct token of all the texts together (a
    chunk's sentences share most of their words), in column blocks small enough that the BLAS runs
    them on the calling thread (`SINGLE_THREAD_MNK`), and each text takes the best of its own."""
    q_ids = sorted(set(token_ids(query)))
    out = np.zeros(len(texts))
    if not q_ids:
        return out
    ids = [_text_ids(t) for t in texts]
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    if not lengths.any():
        return out
    q_raw = _rows(q_ids)
    q_norm = np.linalg.norm(q_raw, axis=1)
    q_unit = q_raw / np.maximum(q_norm, 1e-12)[:, None]
    weights = q_norm / q_norm.sum()
    distinct, where = np.unique(np.concatenate(ids), return_inverse=True)
    sims = _single_thread_product(q_unit, _rows(distinct, unit=True))[:, where]
    starts = np.concatenate([[0], np.cumsum(lengths[lengths > 0])[:-1]])
    best = np.maximum.reduceat(sims, starts, axis=1)  # (query tokens, non-empty texts)
    out[lengths > 0] = weights @ best
    return out


# OpenBLAS (numpy's wheels) splits a matrix product over threads above m*n*k = 65536 * 4: for the few
# hundred columns of a chunk's tokens that costs far more CPU than it saves (waking and spinning
# threads: 7.9 ms of CPU instead of 0.3 ms for 10 x 384 x 600 on a loaded 2-core machine).
SINGLE_THREAD_MNK = 65536 * 4
# Its bound for a symmetric product `x @ x.T` (numpy calls the BLAS's syrk for it), x of n rows and
# k columns: one thread while (n + 1) * n * k <= 109944 * 4 (OpenBLAS interface/syrk.c).
SINGLE_THREAD_SYRK = 109944 * 4


def _single_thread_product(left: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`left @ rows.T`, cut into blocks of rows each below the BLAS's threading threshold."""
    step = max(1, SINGLE_THREAD_MNK // max(left.shape[0] * left.shape[1], 1))
    if len(rows) <= step:
        return left @ rows.T
    return np.concatenate([left @ rows[j:j + step].T for j in range(0, len(rows), step)], axis=1)


@lru_cache(maxsize=4096)
def _unique_ids(text: str) -> np.ndarray:
    """A text's distinct token ids, sorted (read-only): what its token match compares."""
    ids = np.unique(_text_ids(text))
    ids.flags.writeable = False
    return ids


def _match_ids(query_ids: Sequence[int], ids_per_text: Sequence[Sequence[int] | np.ndarray]) -> np.ndarray:
    return _match_unique(query_ids, [np.unique(np.asarray(ids, dtype=np.int64)) for ids in ids_per_text])


def _match_unique(query_ids: Sequence[int], unique_per_text: Sequence[np.ndarray]) -> np.ndarray:
    """`_match_ids` of texts whose ids are already distinct and sorted."""
    q_ids = sorted(set(query_ids))
    out = np.zeros(len(unique_per_text))
    if not q_ids:
        return out
    q_raw = _rows(q_ids)
    q_norm = np.linalg.norm(q_raw, axis=1)
    q_unit = q_raw / np.maximum(q_norm, 1e-12)[:, None]
    weights = q_norm / q_norm.sum()
    for row, ids in enumerate(unique_per_text):
        if len(ids):
            best = (q_unit @ _rows(ids, unit=True).T).max(axis=1)
            out[row] = float(weights @ best)
    return out


@lru_cache(maxsize=1)
def _unit_table() -> np.ndarray:
    v = _table().vectors
    n = np.linalg.norm(v, axis=1, keepdims=True)
    return np.divide(v, n, out=np.zeros_like(v), where=n > 0)


def context_vectors(query: str, texts: list[str]) -> np.ndarray:
    """Each text's static vector without the query's own tokens: what the chunk is about apart from
    the words it shares with the query, L2-normalised (a zero row when nothing is left).

    Why: a keyword retriever returns "vacuum bags for sous vide" for "postgres vacuum bloat". The
    shared word pulls its whole-text vector toward the Postgres chunks; its context ("bags, sous
    vide, seal") is nowhere near theirs ("dead tuples, autovacuum, table"). The local backend's
    `context` signal compares these vectors across the candidate set."""
    return _context_ids(token_ids(query), [token_ids(t) for t in texts])


def _context_ids(query_ids: Sequence[int], ids_per_text: Sequence[Sequence[int] | np.ndarray]) -> np.ndarray:
    shared = np.array(sorted(set(query_ids)), dtype=np.int64)
    return _mean_vectors([np.asarray(ids, dtype=np.int64)[~np.isin(ids, shared)] for ids in ids_per_text])
