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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..embed import CallerVectors, get_embedder
from ..embed.static import StaticEmbedder, embed_and_match
from ..errors import Violation
from ..evidence import best_of, passages_of
from ..models import RerankRequest
from ..shortening import decided_spans
from .base import Capabilities, Completion
from .scored import answer, worded
from .terms import DEFAULT_BM25, Bm25, lexical_scores, stem

__all__ = ["FEATURES", "PROFILES", "Bm25", "Fusion", "LocalBackend", "Profile", "Signals", "cohesion_outlier",
           "compute_signals", "lexical_scores", "profile_for", "stem"]

FEATURES = ("semantic", "lexical", "tokens", "outlier", "context", "position")


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


class LocalBackend:
    """Deterministic offline scorer behind the Backend protocol (see the module docstring)."""

    name = "local"
    # Answers built by backends/scored.py: guard-valid by construction, never re-asked; no server.
    capabilities = Capabilities(scored=True)

    def __init__(self, embedder: Any = "lexical", *, fusion: Fusion | None = None,
                 bm25: Bm25 = DEFAULT_BM25) -> None:

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
        """The card's output object for `request`: at most `request.top_k` ranked, the rest dropped
        (`scored.answer`: guard-valid by construction, the minimum score in force honoured)."""
        return self.ranked(request)[0]

    def ranked(self, request: RerankRequest) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
        """`rank`'s object, and per chunk id the span of its text (as shown, without embedded meta
        values) whose score is the chunk's: its best passage (`Completion.decided`)."""
        texts = [c.text for c in request.chunks]
        # A chunk shown as its evidence (passages joined by elision marks) is scored by its best
        # passage; a text without marks is one passage, scored exactly as before.
        pieces, owner = passages_of(texts)
        ranks = None if request.ranks is None and len(pieces) == len(texts) else \
            [(request.ranks or range(len(texts)))[i] for i in owner.tolist()]
        lexical = lexical_scores(request.query, pieces, self.bm25)
        _, terms, term_w, _ = lexical
        sig = self.signals(request.query, pieces, lexical, ranks)
        weight_of = {t: float(x) for t, x in zip(terms, term_w, strict=True) if x > 0}
        per_piece = self.fusion(sig) if pieces else np.zeros(0)
        best, which = best_of(per_piece, owner, len(texts)) if len(pieces) != len(texts) else \
            (per_piece, np.arange(len(texts)))
        # Rounded before ordering: chunks that read alike at three decimals keep the input order,
        # as they did before the score was written out (the default's outputs are pinned).
        rounded = np.round(best, 3) if texts else np.zeros(0)

        def describe(i: int, score: float, phrase: str | None, matched: list[str]) -> str:
            semantic = float(sig.semantic[which[i]])
            return worded(phrase, matched,
                          lambda quoted: f"closest in meaning: {quoted} (semantic {semantic:.2f})")

        spans = decided_spans(texts, owner, which, [request.own_text(c) for c in request.chunks])
        # The reason quotes the passage the score was read from.
        obj = answer(request, [float(x) for x in rounded], describe, weight_of=weight_of, quote_in=spans)
        return obj, {c.id: span for c, span in zip(request.chunks, spans, strict=True)}

    # -- Backend protocol ------------------------------------------------------------------------

    def complete(self, prompt: str, request: RerankRequest, *, max_tokens: int,
                 feedback: Sequence[Violation] = (), previous: str | None = None) -> Completion:
        obj, decided = self.ranked(request)
        text = json.dumps(obj, ensure_ascii=False)
        return Completion(text=text, finish_reason="stop", model=self.model, usage={}, decided=decided)

    async def acomplete(self, prompt: str, request: RerankRequest, *, max_tokens: int,
                        feedback: Sequence[Violation] = (), previous: str | None = None) -> Completion:
        """Inline for the numpy profiles (milliseconds); in a worker thread for a model so one
        request's embedding does not stall the event loop."""
        if str(getattr(self.embedder, "name", "")).startswith(("lexical", "static")):
            return self.complete(prompt, request, max_tokens=max_tokens)
        return await asyncio.to_thread(self.complete, prompt, request, max_tokens=max_tokens)

