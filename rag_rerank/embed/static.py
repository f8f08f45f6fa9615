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
MiniLM's own `tokenizer.json`.

Not for near-duplicate detection: averaged token vectors of two different texts on one topic are
close, so its duplicate threshold is set high and the post-pass decides duplicates on text anyway.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

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


def _normalise(text: str) -> str:
    """BERT's normaliser: control characters out, white space to ' ', CJK spaced, no accents, lower."""
    out = []
    for ch in text:
        if ch in "\t\n\r" or ch == " " or unicodedata.category(ch) == "Zs":
            out.append(" ")
        elif ch == "\x00" or ch == "\ufffd" or unicodedata.category(ch).startswith("C"):
            continue
        elif _is_cjk(ord(ch)):
            out.append(f" {ch} ")
        else:
            out.append(ch)
    decomposed = unicodedata.normalize("NFD", "".join(out))
    return "".join(ch for ch in decomposed if unicodedata.category(ch) != "Mn").lower()


def _words(text: str) -> list[str]:
    """BERT's pre-tokeniser: split on white space, each punctuation character a word of its own."""
    words: list[str] = []
    for chunk in _normalise(text).split():
        start = 0
        for i, ch in enumerate(chunk):
            if _is_punct(ch):
                if start < i:
                    words.append(chunk[start:i])
                words.append(ch)
                start = i + 1
        if start < len(chunk):
            words.append(chunk[start:])
    return words


@lru_cache(maxsize=131072)
def _pieces(word: str) -> tuple[int, ...]:
    """Greedy longest-match WordPiece ids of one word; () when any part is unknown (BERT's [UNK],
    which model2vec drops from the mean)."""
    index = _table().index
    if len(word) > _MAX_WORD_CHARS:
        return ()
    ids: list[int] = []
    start = 0
    while start < len(word):
        end = len(word)
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


def tokenize(text: str) -> list[str]:
    """The WordPiece tokens of `text` (unknown words left out), for tests and for reading."""
    vocab = {i: t for t, i in _table().index.items()}
    return [vocab[i] for w in _words(text) for i in _pieces(w)]


def token_ids(text: str) -> list[int]:
    ids = [i for w in _words(text) for i in _pieces(w)]
    return ids[:MAX_TOKENS]


@dataclass(frozen=True)
class StaticEmbedder:
    """Mean of static token vectors, L2-normalised; a text with no known token is a zero row."""

    name: str = field(default="static")
    duplicate_threshold: float = STATIC_DUPLICATE_THRESHOLD

    def embed(self, texts: list[str]) -> np.ndarray:
        table = _table()
        out = np.zeros((len(texts), table.vectors.shape[1]), dtype=np.float32)
        for row, text in enumerate(texts):
            ids = token_ids(text)
            if ids:
                out[row] = table.vectors[ids].mean(axis=0)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return np.divide(out, norms, out=np.zeros_like(out), where=norms > 0)


def token_match(query: str, texts: list[str]) -> np.ndarray:
    """How well each text covers the query token by token, in [-1, 1].

    For every distinct query token, the best cosine with any token of the text; averaged with the
    query tokens' raw vector norms as weights. The table's vectors are SIF-weighted, so frequent
    tokens ("the", "how") have short vectors and count little, rare ones ("kubernetes") a lot,
    without any corpus statistics. Unlike the mean vector, one strong match ("kubectl" for
    "kubernetes") is not averaged away by a long chunk's other words."""
    table = _table()
    q_ids = sorted(set(token_ids(query)))
    out = np.zeros(len(texts))
    if not q_ids:
        return out
    q_raw = table.vectors[q_ids]
    q_norm = np.linalg.norm(q_raw, axis=1)
    q_unit = q_raw / np.maximum(q_norm, 1e-12)[:, None]
    weights = q_norm / q_norm.sum()
    unit = _unit_table()
    for row, text in enumerate(texts):
        ids = sorted(set(token_ids(text)))
        if ids:
            best = (q_unit @ unit[ids].T).max(axis=1)
            out[row] = float(weights @ best)
    return out


@lru_cache(maxsize=1)
def _unit_table() -> np.ndarray:
    v = _table().vectors
    n = np.linalg.norm(v, axis=1, keepdims=True)
    return np.divide(v, n, out=np.zeros_like(v), where=n > 0)
