"""Trigger-phrase routing: should this utterance go to a skill, and to which one?

An agent that holds a user's words (and maybe a number of chunks) asks `route()`; the answer is
`{"skill": name | None, "score": float, "reason": str}`. Every decision comes from the skill cards
under `skills/`: a card's `triggers`, `route_examples` and the `route: true` requests of its
routing examples file are the positive examples of a small text classifier fitted for that card,
its `not_for` items, `reject_examples` and `route: false` requests the negative ones, and its
`max_chunks` is a hard precondition no phrasing can override (a count stated in words counts too:
"a few hundred hits", "1,000 passages"; see `counts.py`). Nothing here names a skill or lists the
answers; adding a card adds a route.

Why a classifier and not the nearest phrase: a nearest-phrase rule decides by the one example an
utterance resembles most, so a new near-miss ("rank X by Y" with an X no reject mentions) or a new
phrasing of a request lands wherever its strongest shared word points. A logistic regression
weighs every word against all examples at once: "rank" appears on both sides and counts for
little, "passages", "retrieved" or "query" count for, "products", "summarise" or "explain"
against, and words no card uses count for nothing, so an utterance made of them falls back to the
(negative) intercept and abstains. Features are word stems (function words kept: "how" and
"should" mark a question *about* reranking), stem bigrams and in-word character 3–5-grams
("rerank" ~ "re-ranking" ~ "reranker"); with a semantic embedder (`sentence-transformers`) its
sentence vector is appended to them, and the bigrams include the start and the end ("^_how",
"question_?"), which tell a question about reranking from a request. The model is fitted when the
router is built (under a second for about 1,400 examples, deterministic: Newton's method from
zero). The threshold on its probability is chosen by `bench/route.py` on out-of-fold scores (each
source of the examples file scored by a router fitted without it) and stored per embedder below;
the held-out figures come from `golden/router/heldout.jsonl`, which nothing here reads.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from .counts import counts_before, shown
from .embed import Embedder, l2_normalise
from .errors import InputError, Violation
from .logistic import fit_kernel_logistic, sparse_gram
from .skill import SkillCard, SkillCardError, load_all_skills
from .text import INTENT_STOPWORDS, intent_stem
from .wording import counted

# Chosen on out-of-fold development scores by `python bench/route.py --write`; see the docstring.
THRESHOLDS: Mapping[str, float] = {"lexical": 0.6695, "sentence-transformers": 0.7052}
# Abstain when the best two skills score within this of each other: a coin toss is not a route.
AMBIGUITY_GAP = 0.05
# Inverse L2 strength of the classifier (per example) and the weight of each feature group (each
# group is L2-normalised first: w = stems, b = stem bigrams, c = character n-grams, e = sentence
# vector). At full weight the 384 dense dimensions fit the card's examples by themselves and
# route summaries of retrieved passages; at half weight the words still count. All chosen by
# cross-validation over the examples file's sources (recall at a fixed false-route rate), never
# on the held-out set.
REGULARISATION_C = 60.0
GROUP_WEIGHTS: Mapping[str, float] = {"w": 1.0, "b": 1.3, "c": 1.0, "e": 0.5}
MAX_UTTERANCE_CHARS = 4000

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")
# "summarize" and "summarise", "prioritized" and "prioritised" are one word to a user.
_BRITISH = re.compile(r"^([a-z]{3,})iz(e|ed|es|er|ers|ing|ation|ations)$")


def _words(text: str, possessives: bool = False) -> list[str]:
    """The lower-cased words of `text`, "re-rank" joined as "rerank"; with `possessives`, a curly
    apostrophe is a straight one and "'s" goes."""
    low = text.lower().replace("_", " ")
    if possessives:
        low = low.replace("\u2019", "'")
    low = re.sub(r"\bre-(?=[a-z])", "re", low)
    if possessives:
        low = re.sub(r"(?<=[a-z])'s\b", "", low)
    return _WORD.findall(low)


def _is_count(word: str) -> bool:
    return bool(_NUMBER.match(word)) or word in ("k", "n")


def _token(word: str) -> str:
    """A number or the placeholders k / n as "#n", any other word as its stem."""
    return "#n" if _is_count(word) else intent_stem(_BRITISH.sub(r"\1is\2", word))


def tokens(text: str) -> list[str]:
    """Lower-cased content-word stems; numbers and the placeholders k / n become one token "#n".

    "re-rank" and "rerank" are the same word, as are "top-5", "top 5", "top_k" and "top K", and
    "summarize" and "summarise".
    """
    return [_token(w) for w in _words(text) if w not in INTENT_STOPWORDS and (len(w) > 1 or _is_count(w))]


def _word_features(tok: str) -> list[str]:
    """A stem, plus the stem without a repetition prefix: "rerank" also counts as "rank"."""
    if tok.startswith("re") and len(tok) >= 6 and tok[2] not in "aeiou":
        return [tok, tok[2:]]
    return [tok]


def _features(text: str) -> Counter[str]:
    """Word stems plus their character 4-grams (marked so the two never collide)."""
    feats: Counter[str] = Counter()
    for tok in tokens(text):
        for w in _word_features(tok):
            feats["w:" + w] += 1.0
        padded = f"<{tok}>"
        if len(padded) > 4:
            for i in range(len(padded) - 3):
                feats["g:" + padded[i : i + 4]] += 0.25
    return feats


class CardLexicalEmbedder:
    """TF-IDF over word stems and in-word 4-grams, fitted on the cards' own routing text.

    It no longer decides a route (the classifier does); it names the card example an utterance
    is nearest to, so a reason can say which phrase it resembled.

    Fitting on the cards (not on the utterances) keeps the router independent of any evaluation
    data: a feature is worth as much as it is specific to few prototypes. Rows are L2-normalised,
    so a dot product is a cosine, as the `Embedder` protocol promises.
    """

    name = "lexical"

    def __init__(self, corpus: Sequence[str]) -> None:
        docs = [_features(t) for t in corpus]
        df: Counter[str] = Counter()
        for d in docs:
            df.update(d.keys())
        n = max(len(docs), 1)
        self.vocab: dict[str, int] = {f: i for i, f in enumerate(sorted(df))}
        # Features never seen in a card still dilute an utterance (off-topic words lower its
        # cosine) with the weight of the rarest known feature.
        self.idf = np.array([math.log((1 + n) / (1 + df[f])) + 1.0 for f in sorted(df)], dtype=np.float32)
        self.unseen_idf = float(math.log(1 + n) + 1.0)

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = np.zeros((len(texts), len(self.vocab) + 1), dtype=np.float32)
        for r, text in enumerate(texts):
            extra = 0.0
            for feat, tf in _features(text).items():
                col = self.vocab.get(feat)
                if col is None:
                    extra += (tf * self.unseen_idf) ** 2
                else:
                    rows[r, col] = tf * self.idf[col]
            rows[r, -1] = math.sqrt(extra)
        return l2_normalise(rows)


_ARTICLES = frozenset({"a", "an", "the"})


def _classifier_tokens(text: str) -> list[str]:
    """`tokens` without dropping function words: "how", "should" and "what" are what tell a
    question *about* reranking from a request to rerank, and the classifier can weigh them."""
    return [_token(w) for w in _words(text, possessives=True) if w not in _ARTICLES]


def _ending(text: str) -> str:
    """The end marker of a bigram sequence: a question ends differently from a request."""
    return "?" if text.rstrip().endswith("?") else "$"


@lru_cache(maxsize=16384)
def _classifier_features(text: str) -> dict[str, float]:
    """Stems, stem bigrams and in-word character 3-5-grams; each group L2-normalised, then weighted.

    Cached (callers only read the dict): every router built in a process, and every fold of the
    threshold's cross-validation, featurises the same 1,400 examples.

    Normalising over *all* of an utterance's features, known or not, means words the cards never
    use dilute the ones they do: a long off-topic request drifts towards the intercept.
    """
    toks = _classifier_tokens(text)
    grams: Counter[str] = Counter()
    for tok in toks:
        padded = f"<{tok}>"
        for n in (3, 4, 5):
            grams.update(padded[i : i + n] for i in range(len(padded) - n + 1))
    groups = {
        "w": Counter(toks),
        "b": Counter(f"{a}_{b}" for a, b in pairwise(["^", *toks, _ending(text)])),
        "c": grams,
    }
    out: dict[str, float] = {}
    for kind, counts in groups.items():
        norm = math.sqrt(sum(v * v for v in counts.values())) or 1.0
        weight = GROUP_WEIGHTS[kind]
        for feat, value in counts.items():
            out[f"{kind}:{feat}"] = weight * value / norm
    return out


class CardClassifier:
    """L2-regularised logistic regression: is this utterance one of the card's requests?

    Fitted on the card's own examples (positives: triggers, route examples and the routing file's
    `route: true` requests; negatives: not-for items, reject examples and `route: false`
    requests), classes weighted equally. It is solved by Newton's method in the span of the
    examples (the kernel form: an (n+1)-square linear system per step, not one over thousands of
    features), which converges in a dozen steps to the same weights on every machine.
    `dense` holds optional extra features per example (sentence vectors), appended as group "e".
    """

    def __init__(
        self,
        positive: Sequence[str],
        negative: Sequence[str],
        *,
        c: float,
        dense: np.ndarray | None = None,
    ) -> None:
        texts = [*positive, *negative]
        feats = [_classifier_features(t) for t in texts]
        self.vocab: dict[str, int] = {f: i for i, f in enumerate(sorted({k for d in feats for k in d}))}
        self.dense_dim = 0 if dense is None else int(dense.shape[1])
        # The examples as coordinate lists (row, column, value): a dense matrix would be examples x
        # vocabulary (about 1,500 x 18,000), almost all zeros.
        rows = np.array([r for r, d in enumerate(feats) for _ in d], dtype=np.int64)
        cols = np.array([self.vocab[f] for d in feats for f in d], dtype=np.int64)
        vals = np.array([v for d in feats for v in d.values()], dtype=np.float64)
        gram = sparse_gram(rows, cols, vals, len(texts))
        if dense is not None:
            scaled = GROUP_WEIGHTS["e"] * dense
            gram += scaled @ scaled.T
        y = np.array([1.0] * len(positive) + [0.0] * len(negative))
        n_pos, n_neg = max(len(positive), 1), max(len(negative), 1)
        sample_w = np.where(y == 1.0, 0.5 / n_pos, 0.5 / n_neg)
        alpha, self.bias = fit_kernel_logistic(gram, y, sample_w, lam=1.0 / (c * max(len(texts), 1)))
        # The weights are X' alpha: each example adds alpha_i times its features.
        weights = np.bincount(cols, weights=vals * alpha[rows], minlength=len(self.vocab))
        if dense is not None:
            weights = np.concatenate([weights, GROUP_WEIGHTS["e"] * (dense.T @ alpha)])
        self.weights = weights

    def probability(self, text: str, dense: np.ndarray | None = None) -> float:
        """P(the card's job | text); `dense` is the text's sentence vector when fitted with one."""
        z = self.bias
        for feat, value in _classifier_features(text).items():
            col = self.vocab.get(feat)
            if col is not None:
                z += self.weights[col] * value
        if self.dense_dim and dense is not None:
            z += GROUP_WEIGHTS["e"] * float(self.weights[len(self.vocab) :] @ dense)
        return 1.0 / (1.0 + math.exp(-z))


@dataclass(frozen=True)
class _Prototypes:
    card: SkillCard
    positive: tuple[str, ...]
    negative: tuple[str, ...]
    pos_vecs: np.ndarray
    neg_vecs: np.ndarray
    classifier: CardClassifier
    item_words: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class RouteDecision:
    """A routing answer and why; `scores` holds every card's score for debugging and benches."""

    skill: str | None
    score: float
    reason: str
    scores: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"skill": self.skill, "score": round(self.score, 4), "reason": self.reason}


def _item_words(card: SkillCard) -> frozenset[str]:
    """Nouns a stated count may refer to: the card's `count_nouns` ("chunks", "hits", "nodes"...),
    the `chunks` input's name and the words of the triggers and of the not-for item that states
    the size limit (e.g. "candidate sets larger than ~50 chunks")."""
    words = {intent_stem(spec.name) for spec in card.inputs if spec.type == "chunks"}
    words.update(intent_stem(w.lower()) for w in card.count_nouns)
    for text in (*card.triggers, *(n for n in card.not_for if re.search(r"\d", n))):
        words.update(t for t in tokens(text) if t != "#n")
    return frozenset(words)


class Router:
    """Routes utterances among the given cards with one embedder; build once, call `decide` often."""

    def __init__(
        self,
        cards: Sequence[SkillCard] | None = None,
        embedder: str | Embedder | None = "lexical",
        *,
        threshold: float | None = None,
        gap: float = AMBIGUITY_GAP,
    ) -> None:
        self.cards = tuple(cards if cards is not None else load_all_skills())
        texts: list[tuple[SkillCard, list[str], list[str], list[str], list[str]]] = []
        corpus: list[str] = []
        for card in self.cards:
            pos, neg = _phrases(card)
            train_pos, train_neg = training_examples(card)
            _check_both_sides(card, train_pos, train_neg)
            texts.append((card, pos, neg, train_pos, train_neg))
            corpus += pos + neg
        self.embedder = _resolve_embedder(embedder, corpus)
        kind = "lexical" if isinstance(self.embedder, CardLexicalEmbedder) else _embedder_kind(self.embedder)
        self.kind = kind
        # A semantic embedder's sentence vectors join the classifier's features; the lexical
        # embedder only names the nearest example in a reason (its features are the classifier's).
        self.semantic = kind != "lexical"
        self.threshold = THRESHOLDS.get(kind, THRESHOLDS["lexical"]) if threshold is None else threshold
        self.gap = gap
        protos = []
        for card, pos, neg, train_pos, train_neg in texts:
            if self.semantic:
                vecs = self._example_vectors([*pos, *neg, *train_pos, *train_neg])
                a, b = len(pos), len(pos) + len(neg)
                pos_vecs, neg_vecs = vecs[:a].astype(np.float32), vecs[a:b].astype(np.float32)
                dense: np.ndarray | None = vecs[b:]
            else:
                pos_vecs, neg_vecs, dense = self._embed(pos), self._embed(neg), None
            protos.append(
                _Prototypes(
                    card=card,
                    positive=tuple(pos),
                    negative=tuple(neg),
                    pos_vecs=pos_vecs,
                    neg_vecs=neg_vecs,
                    classifier=CardClassifier(train_pos, train_neg, c=REGULARISATION_C, dense=dense),
                    item_words=_item_words(card),
                )
            )
        self.prototypes = tuple(protos)

    def _example_vectors(self, texts: list[str]) -> np.ndarray:
        """Sentence vectors of a card's phrases and training examples, kept on disk between
        processes (see `embed.disk_cache`): embedding 1,500 examples is most of a semantic
        router's build."""
        from .embed.disk_cache import DiskCachedEmbedder
        from .paths import default_cache_dir

        directory = default_cache_dir()
        if directory is None:
            return self._embed(texts).astype(np.float64)
        cached = DiskCachedEmbedder(self.embedder, directory / "vectors")
        vecs = np.asarray(cached.embed(texts), dtype=np.float64)
        cached.save()
        return vecs

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._dim()), dtype=np.float32)
        return np.asarray(self.embedder.embed(list(texts)), dtype=np.float32)

    def _dim(self) -> int:
        return int(self.embedder.embed(["x"]).shape[1])

    def scores(self, utterance: str) -> list[tuple[float, float, float, int, int, _Prototypes]]:
        """Per card: (classifier probability, nearest positive similarity, nearest negative
        similarity, nearest positive, nearest negative).

        The probability decides; the two nearest examples only explain the decision in its
        reason (the user can see which card phrase the utterance resembled).
        """
        u = self._embed([utterance])[0]
        out = []
        for proto in self.prototypes:
            ps = proto.pos_vecs @ u if len(proto.positive) else np.zeros(1)
            ns = proto.neg_vecs @ u if len(proto.negative) else np.zeros(1)
            pi, ni = int(np.argmax(ps)), int(np.argmax(ns))
            prob = proto.classifier.probability(utterance, u.astype(np.float64) if self.semantic else None)
            out.append((prob, float(ps[pi]), float(ns[ni]), pi, ni, proto))
        return out

    def decide(self, utterance: str, n_chunks: int | None = None) -> RouteDecision:
        """Route, or abstain with the reason; raises `InputError` only for unusable arguments."""
        if isinstance(n_chunks, float) and n_chunks.is_integer():
            n_chunks = int(n_chunks)  # 12.0, what tool-calling models send: as top_k takes it
        _check_args(utterance, n_chunks)
        scored = self.scores(utterance)
        all_scores = {s[5].card.name: round(s[0], 4) for s in scored}
        eligible = []
        reasons = []
        for prob, near, neg, pi, ni, proto in scored:
            card = proto.card
            if n_chunks == 0:
                reasons.append(f"{card.name}: n_chunks=0, there is nothing to rank")
                continue
            stated = _stated_count(utterance, proto.item_words)
            count = max(x for x in (n_chunks, stated, 0) if x is not None)
            if count > card.max_chunks:
                src = (
                    f"n_chunks={shown(n_chunks)}"
                    if n_chunks is not None and n_chunks == count
                    else f"{shown(count)} stated"
                )
                reasons.append(f"{card.name}: {src} is over its max_chunks of {card.max_chunks}")
                continue
            if prob < self.threshold:
                nearest = (
                    f"nearest trigger {proto.positive[pi]!r}"
                    if near >= neg or not proto.negative
                    else f"closer to not-for {proto.negative[ni]!r} ({neg:.2f}) than to any trigger "
                    f"({proto.positive[pi]!r}, {near:.2f})"
                )
                reasons.append(
                    f"{card.name}: scores {prob:.2f} ({nearest}), below the threshold {self.threshold:.2f}"
                )
                continue
            eligible.append((prob, proto.positive[pi], card))
        best_score = max((s[0] for s in scored), default=0.0)
        if not eligible:
            return RouteDecision(None, best_score, "; ".join(reasons) or "no skill cards", all_scores)
        eligible.sort(key=lambda e: -e[0])
        top = eligible[0]
        if len(eligible) > 1 and top[0] - eligible[1][0] < self.gap:
            return RouteDecision(
                None,
                top[0],
                f"ambiguous: {top[2].name} ({top[0]:.2f}) and {eligible[1][2].name} ({eligible[1][0]:.2f}) "
                f"are within {self.gap:.2f}",
                all_scores,
            )
        return RouteDecision(
            top[2].name,
            top[0],
            f"close to trigger {top[1]!r} (scores {top[0]:.2f} >= threshold {self.threshold:.2f})",
            all_scores,
        )


def _check_both_sides(card: SkillCard, positive: Sequence[str], negative: Sequence[str]) -> None:
    """A classifier needs examples of both answers. With no request to refuse it scores every
    utterance 1.0, so a card of triggers alone would take all traffic and leave every other card
    "ambiguous"; with no request to route there is no trigger a reason could name."""
    if positive and negative:
        return
    raise SkillCardError(
        f"{card.path}: metadata.routing gives the router {counted(len(positive), 'example')} to route and "
        f"{len(negative)} to refuse; it needs at least one of each (triggers, route_examples or "
        "`route: true` lines; not_for, reject_examples or `route: false` lines)"
    )


def _embedder_kind(embedder: Embedder) -> str:
    name = getattr(embedder, "name", "")
    return name.split(":")[0] if name else "lexical"


def _resolve_embedder(spec: str | Embedder | None, corpus: Sequence[str]) -> Embedder:
    """`lexical` is the router's own card-fitted TF-IDF; anything else goes to `embed.get_embedder`."""
    if spec is None or spec == "lexical":
        return CardLexicalEmbedder(corpus)
    if isinstance(spec, str):
        from .embed import get_embedder, parse_embedder_spec  # lazy so lexical routing needs nothing

        if parse_embedder_spec(spec)[0] == "caller":
            # `caller` means "vectors in the chunk records": an utterance has none.
            raise InputError([Violation(path="embedder", value=spec, message="the router embeds the "
                                        "utterance itself; choose lexical, sentence-transformers[:MODEL] "
                                        "or openai[:MODEL], not 'caller'")])
        return get_embedder(spec)
    return spec


# A number directly followed by one of these measures the items ("40 200-token chunks"), it
# does not count them.
_MEASURE_TEXT = """token tokens word words char chars character characters byte bytes kb mb gb line lines
    sentence sentences dim dims dimension dimensions ms millisecond milliseconds second seconds sec
    secs minute minutes percent"""
_MEASURES = frozenset(_MEASURE_TEXT.split())


def _phrases(card: SkillCard) -> tuple[list[str], list[str]]:
    """The card's own phrases, which a reason may quote: (triggers and route examples, not-for
    items and reject examples)."""
    # The seed triggers plus the card's example utterances: four short phrases cannot cover how
    # people ask ("re-order these hits", "which snippets should the LLM read").
    pos = list(card.triggers) + list(card.route_examples)
    # A not-for item that states a size ("larger than ~50 chunks") is the max_chunks
    # precondition, checked exactly in `decide`; as a negative example it would only teach that
    # "chunks" and "candidates" are not the card's job. A parenthesis gives the alternative ("use
    # a retriever"), not the thing to avoid.
    neg = [re.sub(r"\s*\([^)]*\)", "", n) for n in card.not_for if not re.search(r"\d", n)]
    return pos, neg + list(card.reject_examples)


def training_examples(card: SkillCard) -> tuple[list[str], list[str]]:
    """What the card's classifier learns from: its phrases plus the routing examples file.

    A request refused only for its size ("rerank these 500 chunks") teaches nothing about
    wording, and as a negative it would teach that rerank requests are not the card's job; the
    size precondition handles it exactly, so it is left out.
    """
    pos, neg = _phrases(card)
    words = _item_words(card)
    for ex in card.routing_examples:
        if ex.route:
            pos.append(ex.utterance)
        elif not _over_limit(card, ex.utterance, ex.n_chunks, words):
            neg.append(ex.utterance)
    return pos, neg


def _over_limit(card: SkillCard, utterance: str, n_chunks: int | None, words: frozenset[str]) -> bool:
    stated = _stated_count(utterance, words)
    return max(x for x in (n_chunks, stated, 0) if x is not None) > card.max_chunks


_PRONOUNS = frozenset({"them", "those", "these"})


def _stated_count(utterance: str, item_words: Iterable[str]) -> int | None:
    """The largest count of items the utterance states: 500 in "rerank these 500 chunks", 200 in
    "a few hundred hits", 1000 in "1,000 passages" or "1k docs".

    A number counts when one of the next three words is an item noun of the card, before any
    other number, or a pronoun ("a few hundred of them") in a request that names the items
    somewhere; "more than 50" / "over 50" / "> 50" means at least 51.
    """
    words = set(item_words)
    names_items = any(intent_stem(w) in words for w in re.findall(r"[a-z]+", utterance.lower()))
    best: int | None = None
    for value, after, before in counts_before(utterance):
        if after and after[0] in _MEASURES:
            continue
        for nxt in after:
            if nxt[0].isdigit():
                break
            if intent_stem(nxt) in words or (names_items and nxt in _PRONOUNS):
                if re.search(r"(?:more|larger|bigger|greater) than$|(?:over|above|>)$", before):
                    value += 1
                best = value if best is None else max(best, value)
                break
    return best


def _check_args(utterance: Any, n_chunks: Any) -> None:
    problems = []
    if not isinstance(utterance, str):
        problems.append(
            Violation(path="utterance", message=f"utterance must be a string, got {type(utterance).__name__}")
        )
    elif not utterance.strip():
        problems.append(Violation(path="utterance", message="utterance is empty"))
    elif len(utterance) > MAX_UTTERANCE_CHARS:
        problems.append(
            Violation(
                path="utterance",
                message=f"utterance has {len(utterance)} characters, over the limit of {MAX_UTTERANCE_CHARS}",
                value=len(utterance),
            )
        )
    if n_chunks is not None and (isinstance(n_chunks, bool) or not isinstance(n_chunks, int) or n_chunks < 0):
        problems.append(
            Violation(
                path="n_chunks",
                message=f"n_chunks must be a non-negative integer, got {n_chunks!r}",
                value=n_chunks,
            )
        )
    if problems:
        raise InputError(problems)


_ROUTERS: dict[str, Router] = {}
_ROUTERS_LOCK = threading.Lock()


def _default_router(embedder: str) -> Router:
    """The router over the packaged cards for `embedder`, built once per process. Built under a
    lock: with `functools.cache`, a threaded server's first burst of requests built one router per
    thread at once (8 threads: 8 fits of about a second each, fighting for the GIL for a minute)."""
    with _ROUTERS_LOCK:
        router = _ROUTERS.get(embedder)
        if router is None:
            router = _ROUTERS[embedder] = Router(embedder=embedder)
        return router


def route(
    utterance: str,
    n_chunks: int | None = None,
    embedder: str | Embedder | None = "lexical",
    *,
    skills_root: str | Path | None = None,
) -> dict[str, Any]:
    """`{"skill": name | None, "score": float, "reason": str}` for one utterance.

    Routers over the packaged cards are cached per embedder spec, so an agent loop pays the
    fitting (or the model load) once.
    """
    if skills_root is not None:
        router = Router(load_all_skills(skills_root), embedder)
    elif isinstance(embedder, str) or embedder is None:
        router = _default_router(embedder or "lexical")
    else:
        router = Router(embedder=embedder)
    return router.decide(utterance, n_chunks).to_dict()
