"""The embedded default backend: offline, deterministic, and judged like any LLM.

**What a score means.** A chunk's score is the estimated probability that a person judges it
relevant to the query, for candidate lists like a RAG retriever's: a logistic model over six
signals, fitted on development data by `bench/tune_default.py` (held-out figures and calibration
error in docs/quality.md):

* `semantic`: cosine of query and chunk under the profile's scoring embedder: the `static`
  MiniLM-distilled token table for the default (lexical) profile (numpy only, milliseconds),
  MiniLM itself for the sentence-transformers profile;
* `lexical`: BM25 over the candidate set, normalised as coverage of the query (a chunk of
  average length holding every query term once scores 1). Words are `\\w+`; text mostly in CJK or
  another non-Latin script is counted in the units of `embed.units` (CJK character pairs);
* `tokens`: for each query token, its best static-vector match anywhere in the chunk, weighted by
  rarity (`embed.static.token_match`), so "kubectl" counts for "Kubernetes" in a long chunk;
* `outlier`: how far the chunk sits below the set's median cohesion (cosine to the centroid of
  the other candidates, weighted toward those most like the query); a chunk from another domain is
  the odd one out, and in a noisy list the noise is, not the few answers;
* `context`: the same outlier measure on each chunk's static vector *without the query's tokens*
  (`embed.static.context_vectors`), so a chunk that shares a keyword but not the subject ("vacuum
  bags" for a Postgres VACUUM question) stands out even though the shared word pulls its whole-text
  vector toward the others;
* `position`: log(1 + input index), the caller's first-stage rank, with a small fixed weight: it
  breaks near-ties toward the retriever's order and never lifts an unrelated chunk far.

The weights come from one objective on development data: a listwise part (which chunk beats which
within a query) over three judged small-RAG sets, TREC DL19 and SciFact, so no collection's base
rate leaks into the order, plus a pointwise part on the judged chunks and cross-domain negative sets
(lists where nothing is on the subject, as in the card's adversarial example) that sets the
intercept and the scale, so the score is a calibrated probability.

Chunks at or below the card's minimum score (0.2) go to `dropped` as `below_min_score`; the best
`request.top_k` of the rest are `ranked`, each with a reason that quotes the chunk's own
best-matching phrase. The answer is the card's JSON object as text, returned through the Backend
protocol, so the output guard and the post-pass treat it exactly like an LLM's answer.

`max_tokens`, `feedback` and `previous` are accepted for the protocol and ignored: the answer is
deterministic, so a re-ask could not change it.
"""

from __future__ import annotations

import asyncio
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from .. import reasons
from ..embed.units import UNSPACED, kind, reads_foreign, units, units_with_spans, visible
from ..errors import Violation
from ..guard.limits import load_limits
from ..guard.output import cites_chunk
from ..models import RerankRequest
from .base import Completion

# Words that carry no topic on their own. They still count for a little (`stopword_weight`):
# "when ..." questions are answered by "... when ..." sentences, but "the" must not make an
# unrelated chunk look relevant.
_STOPWORD_TEXT = """
a about above after again against all also am an and any are as at be because been before being
below between both but by can could did do does doing down during each either few for from further
had has have having he her here hers him his how i if in into is it its itself just me more most my
no nor not now of off on once only or other our out over own same she should so some such than that
the their them then there these they this those through to too under until up very was we were what
when where which while who whom why will with would you your yours one two per via s t
"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_WORD = re.compile(r"\w+", re.UNICODE)
_SUFFIXES = ("ations", "ation", "ings", "ing", "edly", "ies", "ied", "ed", "es", "ly", "s")


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A light, dependency-free English stemmer: strip one common suffix, keep at least 3 letters,
    then cut to 6 characters so 'preferred' / 'prefer' / 'preference' meet. Non-Latin words pass
    unchanged. Crude on purpose: it only has to make surface variants of a query term match."""
    w = word.lower()
    if not w.isascii():
        return w
    for suf in _SUFFIXES:
        if w.endswith(suf) and len(w) - len(suf) >= 3:
            w = w[: -len(suf)]
            break
    return w[:6]


FEATURES = ("semantic", "lexical", "tokens", "outlier", "context", "position")


@dataclass(frozen=True)
class Bm25:
    """BM25 constants of the lexical signal; function words count `stopword_weight` of a content word."""

    k1: float = 1.2
    b: float = 0.75
    stopword_weight: float = 0.1


@dataclass(frozen=True)
class Signals:
    """Per-chunk evidence in input order: the fusion's features (see the module docstring)."""

    semantic: np.ndarray
    lexical: np.ndarray
    tokens: np.ndarray
    outlier: np.ndarray
    context: np.ndarray
    position: np.ndarray

    def matrix(self) -> np.ndarray:
        return np.column_stack([getattr(self, f) for f in FEATURES])


@dataclass(frozen=True)
class Fusion:
    """relevance = sigmoid(intercept + slope * sum of weight x signal).

    The shipped weights and intercept come from `bench/tune_default.py`'s joint fit (listwise on
    the judged sets, DL19 and SciFact; pointwise on the judged sets and cross-domain negatives), so
    the result is the probability that a person judges the chunk relevant. `slope` rescales a
    caller's own fusion (or an older two-stage fit); it is 1 where the joint fit already set the scale."""

    intercept: float
    slope: float
    semantic: float
    lexical: float
    tokens: float
    outlier: float
    context: float
    position: float

    def __call__(self, signals: Signals) -> np.ndarray:
        weights = np.array([getattr(self, f) for f in FEATURES])
        z = self.intercept + self.slope * (signals.matrix() @ weights)
        return 1.0 / (1.0 + np.exp(-z))


@dataclass(frozen=True)
class Profile:
    """The fusion that suits one family of embedders. `semantic` names the embedder whose cosine is
    the semantic signal: None means the pipeline's embedder itself (a trained model); the hashed
    n-gram `lexical` embedder is made for near-duplicates, not meaning, so its profile scores with
    the `static` MiniLM-distilled table instead."""

    fusion: Fusion
    semantic: str | None = None


# Per embedder family (matched on the embedder's name prefix); numbers from
# `python bench/tune_default.py` (lexical) and `... --profile sentence-transformers --negative-weight 0.1`.
PROFILES: dict[str, Profile] = {
    "lexical": Profile(Fusion(intercept=-3.8136, slope=1.0, semantic=2.1422, lexical=1.4289,
                              tokens=4.7813, outlier=3.5750, context=2.4450, position=-0.2),
                       semantic="static"),
    "sentence-transformers": Profile(Fusion(intercept=-2.9675, slope=1.0, semantic=5.6345,
                                            lexical=1.2156, tokens=1.1452, outlier=3.5459, context=3.2410,
                                            position=-0.2)),
}
PROFILES["static"] = PROFILES["lexical"]
# Unknown embedders (OpenAI, caller models) get the dense-model profile.
DEFAULT_PROFILE = PROFILES["sentence-transformers"]


def profile_for(embedder_name: str) -> Profile:
    for prefix, prof in PROFILES.items():
        if embedder_name.startswith(prefix):
            return prof
    return DEFAULT_PROFILE


COHESION_TEMPERATURE = 0.05  # softmax temperature of the query-weighted centroid (set a priori, not tuned)


def cohesion_outlier(vectors: np.ndarray, semantic: np.ndarray,
                     texts: Sequence[str] | None = None) -> np.ndarray:
    """How far each chunk's cosine to the query-weighted centroid of the *other* candidates falls
    below the median of those cosines (0 for chunks at or above it).

    The centroid weighs each candidate by softmax(semantic / COHESION_TEMPERATURE): it sits on the
    chunks most like the query. In a typical retriever list (mostly one subject) a chunk from
    another domain is then the odd one out; in a noisy list of 200 where three chunks answer, the
    centroid sits on those three and the noise is the odd one out, not the answers.

    With `texts`, identical texts count once (as BM25's document frequency does): ten copies of
    the answer would otherwise outweigh everything else."""
    vectors = np.asarray(vectors, dtype=np.float64)
    semantic = np.asarray(semantic, dtype=np.float64)
    if texts is not None:
        first = {t: i for i, t in reversed(list(enumerate(texts)))}
        distinct = sorted(first.values())
        slot = {i: k for k, i in enumerate(distinct)}
        per_distinct = cohesion_outlier(vectors[distinct], semantic[distinct])
        return np.array([per_distinct[slot[first[t]]] for t in texts], dtype=np.float64)
    n = len(vectors)
    if n < 3:
        return np.zeros(n)
    w = np.exp((semantic - semantic.max()) / COHESION_TEMPERATURE)
    weighted = w[:, None] * vectors
    others = weighted.sum(axis=0)[None, :] - weighted
    norms = np.linalg.norm(others, axis=1)
    cohesion = np.divide(np.einsum("ij,ij->i", others, vectors), norms, out=np.zeros(n), where=norms > 1e-12)
    return np.minimum(0.0, cohesion - np.median(cohesion))


def compute_signals(query_vec: np.ndarray, vectors: np.ndarray, lexical: np.ndarray, tokens: np.ndarray,
                    texts: Sequence[str] | None = None, ranks: Sequence[int] | None = None,
                    context: np.ndarray | None = None) -> Signals:
    """Every feature of the fusion, in input order, from the query and chunk vectors of the scoring
    embedder, the BM25 coverage, the static token match and the chunks' context vectors (static
    vectors without the query's tokens; none: the context signal is 0). `texts` lets copies count
    once in the cohesion; `ranks` are first-stage positions when the chunks are a window of a
    longer list (`RerankRequest.ranks`), else 0..n-1."""
    vectors = np.asarray(vectors, dtype=np.float64).reshape(len(lexical), -1)
    semantic = vectors @ np.asarray(query_vec, dtype=np.float64) if len(vectors) else np.zeros(0)
    at = np.arange(len(vectors)) if ranks is None else np.asarray(ranks)
    position = np.log1p(at.astype(np.float64))
    ctx = np.zeros(len(vectors)) if context is None else cohesion_outlier(context, semantic, texts)
    return Signals(semantic, lexical, tokens, cohesion_outlier(vectors, semantic, texts), ctx, position)


@dataclass(frozen=True)
class _Tokens:
    stems: list[str]
    spans: list[tuple[int, int]]
    widths: list[float]  # how much of a word each token is: 1, or less for a character unit of CJK text


# A character unigram or bigram of unspaced text (two units per character) counts as a fifth of a
# word when `best_phrase` sizes its window: eight "words" of Chinese are about twenty characters.
_UNSPACED_WIDTH = 0.2
_EDGE_CHARS = 4


def _tokenise(text: str) -> _Tokens:
    found = _units_with_spans(text)
    return _Tokens([stem(u) for u, _, _ in found], [(lo, hi) for _, lo, hi in found],
                   [_UNSPACED_WIDTH if len(u) <= 2 and kind(u[0]) == UNSPACED else 1.0 for u, _, _ in found])


def _units_with_spans(text: str) -> list[tuple[str, int, int]]:
    """The words of `text` with their spans. Text mostly in a script that `\\w+` cannot split
    (Chinese, Japanese, Korean, Thai) or that the static table cannot read (Cyrillic, Arabic, Hebrew,
    ...) gets the script-aware units of `embed.units`: CJK unigrams and bigrams, marks kept inside
    words, NFC, no zero-width characters. Latin text keeps the plain word split it was fitted on."""
    if text.isascii() or not reads_foreign(text):
        return [(m.group(), *m.span()) for m in _WORD.finditer(text)]
    return units_with_spans(text)


def _words(text: str) -> list[str]:
    """The lower-cased words of `text` (see `_units_with_spans`); ASCII text at C speed. Latin text
    is NFC-normalised first, so an NFD "café" (e + combining accent) is one word, as the NFC one is."""
    if text.isascii():
        return _WORD.findall(text.lower())
    if not reads_foreign(text):
        return _WORD.findall(unicodedata.normalize("NFC", text).lower())
    return units(text)


def _query_terms(query: str) -> tuple[list[str], np.ndarray]:
    """Distinct query stems and their base weight (1, or `stopword_weight` is applied later)."""
    seen: dict[str, bool] = {}
    for word in _words(query):
        s = stem(word)
        if s not in seen:
            seen[s] = word in _STOPWORDS
        elif word not in _STOPWORDS:
            seen[s] = False
    terms = list(seen)
    return terms, np.array([seen[t] for t in terms], dtype=bool)


def lexical_scores(
    query: str, texts: Sequence[str], weights: Bm25 = Bm25()
) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """BM25 over the candidate set, normalised to [0, 1] as coverage of the query.

    Returns (scores, query terms, per-term weights = idf x stopword factor, and per chunk whether it
    shares a content word, i.e. a query term that is not a function word). Words are counted with
    C-level `findall` / `Counter` and each distinct word is stemmed once; only words that stem to a
    query term are looked at per chunk, so 50 chunks cost a few milliseconds."""
    terms, is_stop = _query_terms(query)
    n = len(texts)
    if not terms or n == 0:
        return np.zeros(n), terms, np.zeros(len(terms)), np.zeros(n, dtype=bool)
    index = {t: j for j, t in enumerate(terms)}
    counts = [Counter(_words(t)) for t in texts]
    vocab = set().union(*counts)
    word_term = {w: index[st] for w in vocab if (st := stem(w)) in index}
    matching = word_term.keys()
    tf = np.zeros((n, len(terms)), dtype=np.float64)
    for i, c in enumerate(counts):
        for w in matching & c.keys():
            tf[i, word_term[w]] += c[w]
    lengths = np.array([max(c.total(), 1) for c in counts], dtype=np.float64)
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


def best_phrase(text: str, term_weight: dict[str, float], window: int = 8) -> tuple[str, list[str]]:
    """The `window`-word span of the chunk holding the most query weight, and the chunk's words in
    it that match a query term. Without any shared term: the chunk's opening words."""
    tokens = _tokenise(text)
    n = len(tokens.stems)
    if n == 0:
        return text.strip()[:60], []
    w = np.array([term_weight.get(s, 0.0) for s in tokens.stems])
    best_start, best_val = 0, 0.0
    # the window ends where `window` words' worth of tokens after each start runs out
    cw = np.concatenate([[0.0], np.cumsum(tokens.widths)])
    ends = np.clip(np.searchsorted(cw, cw[:n] + window, side="right") - 1, np.arange(n) + 1, n)
    if w.any():
        csum = np.concatenate([[0.0], np.cumsum(w)])
        vals = csum[ends] - csum[:n]
        best_start = int(np.argmax(vals))
        best_val = float(vals[best_start])
    end = int(ends[best_start])
    lo, hi = tokens.spans[best_start][0], tokens.spans[end - 1][1]
    # a character unit may start or end inside a word ("밀번호" of "비밀번호"): widen the quote to
    # the word's edges, by at most a few characters (Chinese has no edges to find)
    for _ in range(_EDGE_CHARS):
        if lo > 0 and text[lo - 1].isalnum():
            lo -= 1
        if hi < len(text) and text[hi].isalnum():
            hi += 1
    phrase = " ".join(visible(text[lo:hi]).split())  # no control or zero-width characters in a quote
    if lo > 0:
        phrase = "…" + phrase
    if hi < len(text.rstrip()):
        phrase += "…"
    matched: list[str] = []
    if best_val > 0:
        window_spans = zip(tokens.stems[best_start:end], tokens.spans[best_start:end], strict=True)
        for a, b in _merge_unspaced(text, [span for s, span in window_spans if term_weight.get(s, 0.0) > 0]):
            word = text[a:b]
            if word.lower() not in {m.lower() for m in matched}:
                matched.append(word)
        # a lone CJK character ("の", "用") is named only when nothing longer matched
        longer = [m for m in matched if not (len(m) == 1 and kind(m) == UNSPACED)]
        matched = longer or matched
    return phrase, matched


def _merge_unspaced(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans of matched words, with overlapping or adjacent CJK character units merged into the
    stretch of text they cover: "查看磁盘空间", not "查看, 看磁, 磁盘, 盘空, 空间"."""
    def cjk(a: int, b: int) -> bool:
        return kind(text[a]) == UNSPACED and kind(text[b - 1]) == UNSPACED

    out: list[tuple[int, int]] = []
    for a, b in spans:
        if out and a <= out[-1][1] and cjk(a, b) and cjk(*out[-1]):
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class LocalBackend:
    """Deterministic offline scorer behind the Backend protocol (see the module docstring)."""

    name = "local"

    def __init__(self, embedder: Any = "lexical", *, fusion: Fusion | None = None,
                 bm25: Bm25 = Bm25()) -> None:
        from ..embed import CallerVectors, get_embedder

        self.embedder = get_embedder(embedder)
        if isinstance(self.embedder, CallerVectors):
            # Scoring needs the query's vector too, and the caller gives chunk vectors only: score
            # with the default profile; the post-pass still uses (and insists on) the caller's vectors.
            self.embedder = get_embedder("lexical")
        prof = profile_for(str(getattr(self.embedder, "name", "")))
        self.fusion = fusion or prof.fusion
        self.bm25 = bm25
        self.scorer = get_embedder(prof.semantic) if prof.semantic else self.embedder
        self.model = f"local-fusion:{getattr(self.scorer, 'name', 'embedder')}"

    # -- scoring -------------------------------------------------------------------------------

    def signals(self, query: str, texts: Sequence[str],
                lexical: tuple[np.ndarray, list[str], np.ndarray, np.ndarray] | None = None,
                ranks: Sequence[int] | None = None) -> Signals:
        """The fusion's features of each text for `query`, `texts` in first-stage order (or at
        first-stage positions `ranks`); `lexical` is `lexical_scores`' answer when already known."""
        from ..embed.static import StaticEmbedder, embed_and_match

        lex = (lexical or lexical_scores(query, texts, self.bm25))[0]
        if not texts:
            return compute_signals(np.zeros(1), np.zeros((0, 1)), lex, np.zeros(0))
        # One tokenisation per text serves the static vectors, the token match and the context.
        static_vecs, tokens, context = embed_and_match(query, list(texts))
        if isinstance(self.scorer, StaticEmbedder):
            vecs = np.asarray(static_vecs, dtype=np.float64)
        else:
            vecs = np.asarray(self.scorer.embed([query, *texts]), dtype=np.float64)
        return compute_signals(vecs[0], vecs[1:], lex, tokens, texts, ranks, context)

    def scores(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """The calibrated relevance of each text: the estimated probability it is judged relevant."""
        return self.fusion(self.signals(query, texts)) if texts else np.zeros(0)

    def rank(self, request: RerankRequest) -> dict[str, Any]:
        """The card's output object for `request`: at most `request.top_k` ranked, the rest dropped."""
        texts = [c.text for c in request.chunks]
        lexical = lexical_scores(request.query, texts, self.bm25)
        _, terms, term_w, _ = lexical
        sig = self.signals(request.query, texts, lexical, request.ranks)
        weight_of = {t: float(x) for t, x in zip(terms, term_w, strict=True) if x > 0}
        min_score = load_limits().min_score
        rounded = np.round(self.fusion(sig), 3) if texts else np.zeros(0)
        order = sorted(range(len(texts)), key=lambda i: (-rounded[i], i))
        ranked: list[dict[str, Any]] = []
        dropped: list[dict[str, Any]] = []
        for i in order:
            chunk = request.chunks[i]
            score = float(rounded[i])
            if score <= min_score:
                dropped.append({"id": chunk.id, "reason": reasons.reason(reasons.BELOW_MIN_SCORE,
                                                                        reasons.score_detail(score))})
                continue
            if len(ranked) >= request.top_k:
                dropped.append({"id": chunk.id, "reason": reasons.reason(reasons.NOT_SELECTED,
                                                                        reasons.score_detail(score))})
                continue
            own = request.own_text(chunk)  # the quote comes from the chunk, never an embedded title
            phrase, matched = best_phrase(own, weight_of)
            matched = [m for m in matched if m.lower() not in _STOPWORDS] or matched
            reason = _reason(phrase, matched, float(sig.semantic[i]), float(sig.lexical[i]))
            if not cites_chunk(reason, own):
                dropped.append({"id": chunk.id, "reason": reasons.reason(reasons.NO_CITABLE_PHRASE,
                                                                        "nothing concrete to quote")})
                continue
            ranked.append({"id": chunk.id, "score": score, "reason": reason})
        return {"ranked": ranked, "dropped": dropped}

    # -- Backend protocol ------------------------------------------------------------------------

    def complete(self, prompt: str, request: RerankRequest, *, max_tokens: int,
                 feedback: Sequence[Violation] = (), previous: str | None = None) -> Completion:
        text = json.dumps(self.rank(request), ensure_ascii=False)
        return Completion(text=text, finish_reason="stop", model=self.model, usage={})

    async def acomplete(self, prompt: str, request: RerankRequest, *, max_tokens: int,
                        feedback: Sequence[Violation] = (), previous: str | None = None) -> Completion:
        """Inline for the numpy profiles (milliseconds); in a worker thread for a model so one
        request's embedding does not stall the event loop."""
        if str(getattr(self.embedder, "name", "")).startswith(("lexical", "static")):
            return self.complete(prompt, request, max_tokens=max_tokens)
        return await asyncio.to_thread(self.complete, prompt, request, max_tokens=max_tokens)


def _reason(phrase: str, matched: list[str], semantic: float, lexical: float) -> str:
    quoted = json.dumps(phrase, ensure_ascii=False)
    if matched:
        return f"quotes {quoted}, sharing query terms {', '.join(matched)}"
    return f"closest in meaning: {quoted} (semantic {semantic:.2f})"
