"""Words, stems and BM25 over a candidate set: the lexical evidence every scored backend shares.

The local backend's `lexical` signal and every scored backend's reasons (which query words a chunk
shares, `scored.best_phrase`) read a text the same way, through here. The stopword list and the
stemmer (`text.SCORER_STOPWORDS`, `text.scorer_stem`) and the Latin word split are the ones the
default profile's weights were fitted with (`bench/tune_default.py`): changing them changes every
default score, so they move only with a refit.

BM25 is computed here rather than with `bm25s` (in the `eval` extra), measured with `python
bench/libraries.py` on TREC DL19's 43 queries with their top 20 / 50 passages: given our stems and
every term weighted alike, bm25s scores every chunk below our clip to within 6e-7 (its float32;
it leaves out Lucene's constant k1 + 1 factor) and orders them the same on 43 of 43 queries. But
it builds a sparse index for a corpus, which a candidate set of 20-50 chunks rebuilds per query:
14-31 ms a query against our 0.8-1.3 ms (load average 14 on a shared 2-core machine), and it
has neither the function-word weight, nor document frequency over distinct texts, nor the
coverage normalisation the default profile was fitted with.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..embed.units import reads_foreign, units, units_with_spans
from ..text import SCORER_STOPWORDS as STOPWORDS
from ..text import scorer_stem as stem

WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class Bm25:
    """BM25 constants of the lexical signal; function words count `stopword_weight` of a content word."""

    k1: float = 1.2
    b: float = 0.75
    stopword_weight: float = 0.1


DEFAULT_BM25 = Bm25()

def word_spans(text: str) -> list[tuple[str, int, int]]:
    """The words of `text` with their spans. Text mostly in a script that `\\w+` cannot split
    (Chinese, Japanese, Korean, Thai) or that the static table cannot read (Cyrillic, Arabic, Hebrew,
    ...) gets the script-aware units of `embed.units`: CJK unigrams and bigrams, marks kept inside
    words, NFC, no zero-width characters. Latin text keeps the plain word split it was fitted on."""
    if text.isascii() or not reads_foreign(text):
        return [(m.group(), *m.span()) for m in WORD.finditer(text)]
    return units_with_spans(text)


def words(text: str) -> list[str]:
    """The lower-cased words of `text` (see `word_spans`); ASCII text at C speed. Latin text
    is NFC-normalised first, so an NFD "café" (e + combining accent) is one word, as the NFC one is."""
    if text.isascii():
        return WORD.findall(text.lower())
    if not reads_foreign(text):
        return WORD.findall(unicodedata.normalize("NFC", text).lower())
    return units(text)


def query_terms(query: str) -> tuple[list[str], np.ndarray]:
    """Distinct query stems and their base weight (1, or `stopword_weight` is applied later)."""
    seen: dict[str, bool] = {}
    for word in words(query):
        s = stem(word)
        if s not in seen:
            seen[s] = word in STOPWORDS
        elif word not in STOPWORDS:
            seen[s] = False
    terms = list(seen)
    return terms, np.array([seen[t] for t in terms], dtype=bool)


@lru_cache(maxsize=4096)
def stem_counts(text: str) -> tuple[dict[str, int], int]:
    """How often each stem occurs in `text` (its words stemmed), and how many words it has: a
    chunk's term frequencies for any query, memoised per text (chunks recur across queries)."""
    stems: dict[str, int] = {}
    counts = Counter(words(text))
    for word, count in counts.items():
        s = stem(word)
        stems[s] = stems.get(s, 0) + count
    return stems, counts.total()


def lexical_scores(
    query: str, texts: Sequence[str], weights: Bm25 = Bm25()
) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """BM25 over the candidate set, normalised to [0, 1] as coverage of the query.

    Returns (scores, query terms, per-term weights = idf x stopword factor, and per chunk whether it
    shares a content word, i.e. a query term that is not a function word). Words are counted with
    C-level `findall` / `Counter` and each distinct word is stemmed once; only words that stem to a
    query term are looked at per chunk, so 50 chunks cost a few milliseconds."""
    terms, is_stop = query_terms(query)
    n = len(texts)
    if not terms or n == 0:
        return np.zeros(n), terms, np.zeros(len(terms)), np.zeros(n, dtype=bool)
    read = [stem_counts(t) for t in texts]
    tf = np.array([[stems.get(term, 0) for term in terms] for stems, _ in read], dtype=np.float64)
    lengths = np.array([max(total, 1) for _, total in read], dtype=np.float64)
    # Document frequency over distinct texts: five identical copies of the one chunk that answers
    # are one document, not five, or their shared terms would look common and the copies would
    # all fall below the minimum score (removing copies is the post-pass's job, not scoring's).
    distinct = list({t: i for i, t in reversed(list(enumerate(texts)))}.values())
    df = (tf[distinct] > 0).sum(axis=0)
    idf = np.log1p((len(distinct) - df + 0.5) / (df + 0.5))
    term_w = idf * np.where(is_stop, weights.stopword_weight, 1.0)
    norm = weights.k1 * (1.0 - weights.b + weights.b * lengths / lengths.mean())
    sat = tf * (weights.k1 + 1.0) / (tf + norm[:, None])
    # A chunk of average length holding every query term once scores sum(term_w) exactly.
    ideal = term_w.sum()
    scores = (sat @ term_w) / ideal if ideal > 0 else np.zeros(n)
    content = (tf[:, ~is_stop] > 0).any(axis=1)
    return np.clip(scores, 0.0, 1.0), terms, term_w, content
