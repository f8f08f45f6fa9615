"""The embedded default backend: offline, deterministic, and judged like any LLM.

It scores every chunk with two signals, each mapped to [0, 1] on an absolute scale:

* **semantic**: cosine of the query and chunk embeddings (the configured embedder), mapped
  through a per-embedder calibration `(lo, hi)`: a cosine at or below `lo` (what unrelated text
  gets from that embedder) is 0, at or above `hi` is 1, linear in between.
* **lexical**: BM25 term weighting computed over the candidate set itself (idf from these
  chunks, so terms every candidate shares count little), normalised by what a chunk matching
  every query term once would score. That is coverage of the query, not a per-query max, so a
  set of unrelated chunks stays near 0 instead of its best chunk being stretched to 1.

topical = w_sem * semantic + w_lex * lexical, with the calibration and weights of the embedder's
`Profile` (MiniLM: 0.7 / 0.3; lexical: 0.2 / 0.8, and its n-gram cosine only counts for chunks
sharing a content word with the query; both chosen on a dev split, see README "Quality").

**First-stage prior** (lexical profile only): the input order is the caller's retriever ranking,
and a retriever with whole-corpus statistics (BM25's idf over millions of passages) knows things
50 candidates cannot tell us. So, as in reciprocal-rank fusion, the chunk at input position i
(0-based) gets the prior p = (c + 1) / (c + 1 + i), and a chunk's evidence above the card's
minimum score (0.2) is discounted by its rank:

    relevance = min + (topical - min) * ((1 - a) + a * p)      (only where topical > min)

With the lexical profile's c = 5, a = 0.9 the first chunk keeps its topical score, the 6th keeps
59% of its evidence above the minimum, the 50th 20%. The prior can only lower a score, never
raise it, and a chunk at or below the minimum keeps its score and is dropped: the prior never
creates relevance, so the card's adversarial example still ranks nothing however its chunks are
ordered. It reorders only among chunks with topical evidence, as a blend of evidence and
retriever rank; a clear answer further down still beats a weak early pick (the card's happy path
keeps c3, third in input, first). The input position is used, not the chunk's `score`, because
first-stage scores have no common scale or direction (BM25 is unbounded, distances are
lower-is-better): pass chunks in your retriever's order. `Weights(prior=0)` turns it off. The
MiniLM profile does not use it: on the held-out half it made both collections worse (README
"Quality").

Chunks at or below the card's minimum score go to `dropped`; the best `request.top_k` of the rest
are `ranked` (the pipeline asks for candidate_k > top_k so the post-pass has room for MMR), each
with a reason that quotes the chunk's own best-matching phrase. The answer is the card's JSON
object as text, returned through the Backend protocol, so the output guard and the post-pass treat
it exactly like an LLM's answer.

The minimum score is the packaged limit (0.2). `max_tokens`, `feedback` and `previous` are
accepted for the protocol and ignored: the answer is deterministic, so a re-ask could not change it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

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


@dataclass(frozen=True)
class Calibration:
    """Cosine values an embedder gives unrelated text (`lo`) and a clear match (`hi`)."""

    lo: float
    hi: float

    def apply(self, cosine: np.ndarray) -> np.ndarray:
        return np.clip((cosine - self.lo) / (self.hi - self.lo), 0.0, 1.0)


@dataclass(frozen=True)
class Weights:
    """How the two signals combine, the BM25 constants of the lexical one, and the first-stage
    prior: `prior` is a in [0, 1], the largest share of a chunk's evidence above the minimum that a
    late input rank takes away (0 = off), `prior_c` the RRF-style c of p = (c + 1) / (c + 1 + i)."""

    semantic: float = 0.5
    lexical: float = 0.5
    k1: float = 1.2
    b: float = 0.75
    stopword_weight: float = 0.1
    prior: float = 0.0
    prior_c: float = 5.0


@dataclass(frozen=True)
class Profile:
    """The calibration and weights that suit one family of embedders."""

    calibration: Calibration
    weights: Weights
    # Count the embedder's cosine only for chunks sharing at least one content word (not a function
    # word) with the query. The hashed n-gram embedder has no idf, so "How do I ..." alone makes two
    # unrelated questions look alike; a trained model needs no such gate.
    needs_content_match: bool = False


# Per embedder family (matched on the embedder's name prefix). The cosine ranges are where each
# embedder puts unrelated text (lo) and a clear answer (hi); the weights were tuned on the
# development split described in the README section "Quality" and then frozen.
PROFILES: dict[str, Profile] = {
    "lexical": Profile(Calibration(0.02, 0.3),
                       Weights(semantic=0.2, lexical=0.8, prior=0.9, prior_c=5.0),
                       needs_content_match=True),
    "sentence-transformers": Profile(Calibration(0.15, 0.75), Weights(semantic=0.7, lexical=0.3)),
}
# Unknown embedders (OpenAI, caller models) get the dense-model profile.
DEFAULT_PROFILE = PROFILES["sentence-transformers"]


def profile_for(embedder_name: str) -> Profile:
    for prefix, prof in PROFILES.items():
        if embedder_name.startswith(prefix):
            return prof
    return DEFAULT_PROFILE


@dataclass(frozen=True)
class Scores:
    """Per-chunk signals, in input order: `topical` is the text-only blend, `relevance` the final
    score (topical fused with the first-stage prior, when the profile uses one)."""

    semantic: np.ndarray
    lexical: np.ndarray
    topical: np.ndarray
    relevance: np.ndarray


@dataclass(frozen=True)
class _Tokens:
    stems: list[str]
    spans: list[tuple[int, int]]


def _tokenise(text: str) -> _Tokens:
    stems, spans = [], []
    for m in _WORD.finditer(text):
        stems.append(stem(m.group()))
        spans.append(m.span())
    return _Tokens(stems, spans)


def _query_terms(query: str) -> tuple[list[str], np.ndarray]:
    """Distinct query stems and their base weight (1, or `stopword_weight` is applied later)."""
    seen: dict[str, bool] = {}
    for m in _WORD.finditer(query):
        word = m.group().lower()
        s = stem(word)
        if s not in seen:
            seen[s] = word in _STOPWORDS
        elif word not in _STOPWORDS:
            seen[s] = False
    terms = list(seen)
    return terms, np.array([seen[t] for t in terms], dtype=bool)


def lexical_scores(
    query: str, texts: Sequence[str], weights: Weights = Weights()
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
    counts = [Counter(_WORD.findall(t.lower())) for t in texts]
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


def rank_prior(n: int, c: float, ranks: Sequence[int] | None = None) -> np.ndarray:
    """RRF-style prior of input positions 0..n-1 (or of the given first-stage `ranks`, for a window
    of a longer list): 1 for the first, (c + 1) / (c + 1 + i) after."""
    at = np.arange(n, dtype=np.float64) if ranks is None else np.asarray(ranks, dtype=np.float64)
    return (c + 1.0) / (c + 1.0 + at)


def fuse_prior(topical: np.ndarray, prior: np.ndarray, share: float, minimum: float) -> np.ndarray:
    """Discount each chunk's evidence above `minimum` by its rank: times `(1 - share) + share * prior`.

    The factor is in [1 - share, 1], so a score only ever goes down, and only where there is
    evidence: scores are compared at the 3 decimals the answer carries, and a chunk at or below
    the minimum there keeps its score. So the prior reorders topical chunks but can never lift an
    unrelated one into `ranked`. (A chunk whose discounted evidence rounds to the minimum is then
    dropped as below the minimum, like any other.)"""
    if share <= 0.0 or topical.size == 0:
        return topical
    factor = (1.0 - share) + share * prior
    fused = minimum + (topical - minimum) * factor
    return np.where(np.round(topical, 3) > minimum, fused, topical)


def best_phrase(text: str, term_weight: dict[str, float], window: int = 8) -> tuple[str, list[str]]:
    """The `window`-word span of the chunk holding the most query weight, and the chunk's words in
    it that match a query term. Without any shared term: the chunk's opening words."""
    tokens = _tokenise(text)
    n = len(tokens.stems)
    if n == 0:
        return text.strip()[:60], []
    w = np.array([term_weight.get(s, 0.0) for s in tokens.stems])
    best_start, best_val = 0, 0.0
    if w.any():
        csum = np.concatenate([[0.0], np.cumsum(w)])
        ends = np.minimum(np.arange(n) + window, n)
        vals = csum[ends] - csum[:n]
        best_start = int(np.argmax(vals))
        best_val = float(vals[best_start])
    end = min(best_start + window, n)
    lo, hi = tokens.spans[best_start][0], tokens.spans[end - 1][1]
    phrase = " ".join(text[lo:hi].split())
    if lo > 0:
        phrase = "…" + phrase
    if hi < len(text.rstrip()):
        phrase += "…"
    matched: list[str] = []
    if best_val > 0:
        for s, (a, b) in zip(tokens.stems[best_start:end], tokens.spans[best_start:end], strict=True):
            word = text[a:b]
            if term_weight.get(s, 0.0) > 0 and word.lower() not in {m.lower() for m in matched}:
                matched.append(word)
    return phrase, matched


class LocalBackend:
    """Deterministic offline scorer behind the Backend protocol (see the module docstring)."""

    name = "local"

    def __init__(self, embedder: Any = "lexical", *, weights: Weights | None = None,
                 calibration: Calibration | None = None) -> None:
        from ..embed import CallerVectors, get_embedder

        self.embedder = get_embedder(embedder)
        if isinstance(self.embedder, CallerVectors):
            # Scoring needs the query's vector too, and the caller gives chunk vectors only: score
            # with the default embedder; the post-pass still uses (and insists on) the caller's vectors.
            self.embedder = get_embedder("lexical")
        prof = profile_for(str(getattr(self.embedder, "name", "")))
        self.weights = weights or prof.weights
        self.calibration = calibration or prof.calibration
        self.needs_content_match = prof.needs_content_match
        self.model = f"local-hybrid:{getattr(self.embedder, 'name', 'embedder')}"

    # -- scoring -------------------------------------------------------------------------------

    def scores(self, query: str, texts: Sequence[str]) -> Scores:
        """Semantic, lexical, topical and final relevance of each text for `query`, all in [0, 1];
        `texts` are taken to be in the first-stage order (see the module docstring)."""
        lex, _, _, content = lexical_scores(query, texts, self.weights)
        return self._combine(query, texts, lex, content)

    def _combine(self, query: str, texts: Sequence[str], lex: np.ndarray, content: np.ndarray,
                 ranks: Sequence[int] | None = None) -> Scores:
        if not texts:
            z = np.zeros(0)
            return Scores(z, z, z, z)
        vecs = np.asarray(self.embedder.embed([query, *texts]), dtype=np.float64)
        cos = vecs[1:] @ vecs[0]
        sem = self.calibration.apply(cos)
        if self.needs_content_match:
            sem = np.where(content, sem, 0.0)
        w = self.weights
        topical = np.clip((w.semantic * sem + w.lexical * lex) / (w.semantic + w.lexical), 0.0, 1.0)
        rel = fuse_prior(topical, rank_prior(len(texts), w.prior_c, ranks), w.prior, load_limits().min_score)
        return Scores(sem, lex, topical, rel)

    def rank(self, request: RerankRequest) -> dict[str, Any]:
        """The card's output object for `request`: at most `request.top_k` ranked, the rest dropped."""
        texts = [c.text for c in request.chunks]
        lex, terms, term_w, content = lexical_scores(request.query, texts, self.weights)
        sc = self._combine(request.query, texts, lex, content, request.ranks)
        weight_of = {t: float(x) for t, x in zip(terms, term_w, strict=True) if x > 0}
        min_score = load_limits().min_score
        rounded = np.round(sc.relevance, 3)
        order = sorted(range(len(texts)), key=lambda i: (-rounded[i], i))
        ranked: list[dict[str, Any]] = []
        dropped: list[dict[str, Any]] = []
        for i in order:
            chunk = request.chunks[i]
            score = float(rounded[i])
            if score <= min_score:
                dropped.append({"id": chunk.id, "reason": f"below_min_score: {score:.3f}"})
                continue
            if len(ranked) >= request.top_k:
                dropped.append({"id": chunk.id, "reason": f"not_selected: {score:.3f}"})
                continue
            phrase, matched = best_phrase(chunk.text, weight_of)
            matched = [m for m in matched if m.lower() not in _STOPWORDS] or matched
            reason = _reason(phrase, matched, float(sc.semantic[i]), float(sc.lexical[i]))
            if not cites_chunk(reason, chunk.text):
                dropped.append({"id": chunk.id, "reason": "no_citable_phrase: nothing concrete to quote"})
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
        """Inline for the lexical embedder (sub-millisecond); in a worker thread for a model so
        one request's embedding does not stall the event loop."""
        if str(getattr(self.embedder, "name", "")).startswith("lexical"):
            return self.complete(prompt, request, max_tokens=max_tokens)
        return await asyncio.to_thread(self.complete, prompt, request, max_tokens=max_tokens)


def _reason(phrase: str, matched: list[str], semantic: float, lexical: float) -> str:
    quoted = json.dumps(phrase, ensure_ascii=False)
    if matched:
        return f"quotes {quoted}, sharing query terms {', '.join(matched)}"
    return f"closest in meaning: {quoted} (semantic {semantic:.2f})"
