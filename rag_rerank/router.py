"""Trigger-phrase routing: should this utterance go to a skill, and to which one?

An agent that holds a user's words (and maybe a number of chunks) asks `route()`; the answer is
`{"skill": name | None, "score": float, "reason": str}`. Every decision comes from the skill cards
under `skills/`: a card's `triggers` and `route_examples` (example requests) pull an utterance
towards it, its `not_for` items and `reject_examples` push it away, and its `max_chunks` is a hard
precondition no phrasing can override. Nothing here names a skill or lists the answers; adding a
card adds a route.

Two embedders, two scores. The default `lexical` embedder has no semantics, so it compares word
stems *and* in-word character n-grams ("rerank" ~ "re-rank" ~ "reranker", "relevance" ~
"relevant") weighted by how specific they are to the cards; the score is the cosine to the card's
profile, vetoed when a rejected phrase is nearer than every trigger. A semantic embedder
(`sentence-transformers`) scores by a k-nearest-neighbour margin: how much nearer the card's
triggers and examples the utterance is than its not-for items and rejects. The threshold is chosen
on the `tune` split of `golden/router/utterances.jsonl` by `bench/route.py` and stored per
embedder below; `bench/route.py` reports precision / recall / FPR on every split.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from .embed import Embedder, l2_normalise
from .errors import InputError, Violation
from .skill import SkillCard, load_all_skills

# Chosen on the tune split by `python bench/route.py --write`; see the module docstring.
THRESHOLDS: Mapping[str, float] = {"lexical": 0.1368, "sentence-transformers": 0.0597}
# Abstain when the best two skills score within this of each other: a coin toss is not a route.
AMBIGUITY_GAP = 0.05
ABOUT_WEIGHT = 0.5
# Semantic embedders score by a k-nearest-neighbour margin (see `Router.scores`); k = 3 lets one
# stray phrase of the card neither carry nor veto an utterance.
KNN_K = 3
MAX_UTTERANCE_CHARS = 4000

# Function words carry no intent; a small generic English list, nothing skill-specific.
_STOPWORD_TEXT = """
    a an the this these that those my our your their its it i me we you he she they them us of to in
    on for from with by at as into onto over out up about than then so and or but not no is are was
    were be been being am do does did done have has had can could would should will shall may might
    must please pls just all any each every some one ones here there below above what which who whom
    how why when where whether if also only very more most less own same i'm i've i'd let's it's
    that's what's don't isn't
"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")
# "summarize" and "summarise", "prioritized" and "prioritised" are one word to a user.
_BRITISH = re.compile(r"^([a-z]{3,})iz(e|ed|es|er|ers|ing|ation|ations)$")


def _stem(word: str) -> str:
    """A deliberately crude suffix stripper: both sides of every comparison go through it."""
    for suffix in (
        "ations",
        "ation",
        "ances",
        "ance",
        "ences",
        "ence",
        "ants",
        "ant",
        "ents",
        "ent",
        "ings",
        "ing",
        "ers",
        "er",
        "ies",
        "es",
        "ed",
        "s",
        "ly",
        "e",
    ):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


def tokens(text: str) -> list[str]:
    """Lower-cased content-word stems; numbers and the placeholders k / n become one token "#n".

    "re-rank" and "rerank" are the same word, as are "top-5", "top 5", "top_k" and "top K", and
    "summarize" and "summarise".
    """
    low = text.lower().replace("_", " ")
    low = re.sub(r"\bre-(?=[a-z])", "re", low)
    out: list[str] = []
    for word in _WORD.findall(low):
        if word in _STOPWORDS:
            continue
        if _NUMBER.match(word) or word in ("k", "n"):
            out.append("#n")
        elif len(word) > 1:
            out.append(_stem(_BRITISH.sub(r"\1is\2", word)))
    return out


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


@dataclass(frozen=True)
class _Prototypes:
    card: SkillCard
    positive: tuple[str, ...]
    negative: tuple[str, ...]
    pos_vecs: np.ndarray
    neg_vecs: np.ndarray
    profile: np.ndarray
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
    """Nouns a stated count may refer to: the `chunks` input's name and the words of the triggers
    and of the not-for item that states the size limit (e.g. "candidate sets larger than ~50 chunks")."""
    words = {_stem(spec.name) for spec in card.inputs if spec.type == "chunks"}
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
        texts: list[tuple[SkillCard, list[str], list[str], list[str]]] = []
        corpus: list[str] = []
        for card in self.cards:
            # The seed triggers plus the card's example utterances: four short phrases cannot
            # cover how people ask ("re-order these hits", "which snippets should the LLM read"),
            # so the card also lists example requests, written for the card (not taken from the
            # evaluation set), as more reference points of the same kind.
            pos = list(card.triggers) + list(card.route_examples)
            # The title and summary say what the skill does in the card's own words; they widen
            # the vocabulary of the profile at half the weight of a trigger.
            about = [t for t in (card.title, card.summary) if t]
            # A not-for item that states a size ("larger than ~50 chunks") is the max_chunks
            # precondition, checked exactly below; as text it would only repel every utterance
            # that mentions chunks or candidates. A parenthesis gives the alternative ("use a
            # retriever"), not the thing to avoid.
            neg = [re.sub(r"\s*\([^)]*\)", "", n) for n in card.not_for if not re.search(r"\d", n)]
            # Example requests the card rejects (other rankings, summaries, retrieval, small talk)
            # are anti-routes like the not-for items.
            neg += list(card.reject_examples)
            texts.append((card, pos, about, neg))
            corpus += pos + about + neg
        self.embedder = _resolve_embedder(embedder, corpus)
        kind = "lexical" if isinstance(self.embedder, CardLexicalEmbedder) else _embedder_kind(self.embedder)
        self.kind = kind
        # The lexical embedder has no semantics, so its score is the profile cosine with a
        # nearest-neighbour veto; a semantic embedder's cosines are meaningful one by one, so its
        # score is the k-NN margin (see `scores`).
        self.knn = kind != "lexical"
        self.threshold = THRESHOLDS.get(kind, THRESHOLDS["lexical"]) if threshold is None else threshold
        self.gap = gap
        protos = []
        for card, pos, about, neg in texts:
            pos_vecs, about_vecs = self._embed(pos), self._embed(about)
            profile = pos_vecs.sum(axis=0) + ABOUT_WEIGHT * about_vecs.sum(axis=0)
            norm = float(np.linalg.norm(profile))
            protos.append(
                _Prototypes(
                    card=card,
                    positive=tuple(pos),
                    negative=tuple(neg),
                    pos_vecs=pos_vecs,
                    neg_vecs=self._embed(neg),
                    profile=profile / norm if norm else profile,
                    item_words=_item_words(card),
                )
            )
        self.prototypes = tuple(protos)

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._dim()), dtype=np.float32)
        return np.asarray(self.embedder.embed(list(texts)), dtype=np.float32)

    def _dim(self) -> int:
        return int(self.embedder.embed(["x"]).shape[1])

    def scores(self, utterance: str) -> list[tuple[float, float, float, int, int, _Prototypes]]:
        """Per card: (similarity to the card's trigger profile, nearest trigger similarity,
        nearest not-for similarity, nearest trigger, nearest not-for item).

        Two questions, two measures. *How much is this the card's job?* is the profile (sum of the
        trigger and example vectors, plus the title and summary at half weight): users mix words
        of several triggers ("rank these passages by relevance"), which a max over single phrases
        over-rates when one word matches ("score these pitches" ~ "score each document") and
        under-rates when the words are spread. *Is it rather one of the things the card refuses?*
        is nearest neighbour against nearest neighbour: a not-for phrase that matches better than
        every trigger and example ("summarise these passages") is a refusal, however many
        retrieval words the utterance shares with the profile.

        With a semantic embedder (`sentence-transformers`, `openai`) the first number is instead
        the k-NN margin: mean cosine to the k nearest triggers/examples minus mean cosine to the k
        nearest not-for items/reject examples. A model's cosines are high for anything in the
        same register, so an absolute level says little; being nearer the card's examples than
        its rejects says more.
        """
        u = self._embed([utterance])[0]
        out = []
        for proto in self.prototypes:
            ps = proto.pos_vecs @ u if len(proto.positive) else np.zeros(1)
            ns = proto.neg_vecs @ u if len(proto.negative) else np.zeros(1)
            pi, ni = int(np.argmax(ps)), int(np.argmax(ns))
            if self.knn:
                score = float(np.sort(ps)[::-1][:KNN_K].mean() - np.sort(ns)[::-1][:KNN_K].mean())
            else:
                score = float(proto.profile @ u)
            out.append((score, float(ps[pi]), float(ns[ni]), pi, ni, proto))
        return out

    def decide(self, utterance: str, n_chunks: int | None = None) -> RouteDecision:
        """Route, or abstain with the reason; raises `InputError` only for unusable arguments."""
        _check_args(utterance, n_chunks)
        scored = self.scores(utterance)
        all_scores = {s[5].card.name: round(s[0], 4) for s in scored}
        eligible = []
        reasons = []
        for pos, near, neg, pi, ni, proto in scored:
            card = proto.card
            stated = _stated_count(utterance, proto.item_words)
            count = max(x for x in (n_chunks, stated, 0) if x is not None)
            if count > card.max_chunks:
                src = (
                    f"n_chunks={n_chunks}"
                    if n_chunks is not None and n_chunks == count
                    else f"{count} stated"
                )
                reasons.append(f"{card.name}: {src} is over its max_chunks of {card.max_chunks}")
                continue
            if not self.knn and neg > near:
                reasons.append(
                    f"{card.name}: closer to not-for {proto.negative[ni]!r} ({neg:.2f}) "
                    f"than to any trigger ({proto.positive[pi]!r}, {near:.2f})"
                )
                continue
            if pos < self.threshold:
                nearest = (
                    f"nearest trigger {proto.positive[pi]!r}"
                    if near >= neg
                    else f"nearer not-for {proto.negative[ni]!r} ({neg:.2f}) than trigger "
                    f"{proto.positive[pi]!r} ({near:.2f})"
                )
                reasons.append(
                    f"{card.name}: scores {pos:.2f} ({nearest}), below the threshold {self.threshold:.2f}"
                )
                continue
            eligible.append((pos, proto.positive[pi], card))
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
            f"close to trigger {top[1]!r} ({top[0]:.2f} >= threshold {self.threshold:.2f})",
            all_scores,
        )


def _embedder_kind(embedder: Embedder) -> str:
    name = getattr(embedder, "name", "")
    return name.split(":")[0] if name else "lexical"


def _resolve_embedder(spec: str | Embedder | None, corpus: Sequence[str]) -> Embedder:
    """`lexical` is the router's own card-fitted TF-IDF; anything else goes to `embed.get_embedder`."""
    if spec is None or spec == "lexical":
        return CardLexicalEmbedder(corpus)
    if isinstance(spec, str):
        from .embed import get_embedder  # engineer A's factory; lazy so lexical routing needs nothing

        return get_embedder(spec)
    return spec


def _stated_count(utterance: str, item_words: Iterable[str]) -> int | None:
    """The largest count of items the utterance states, e.g. 500 in "rerank these 500 chunks".

    A number counts when one of the next three words is an item noun of the card.
    """
    words = set(item_words)
    raw = re.findall(r"\d[\d,_]*|[a-z]+|>", utterance.lower())
    best: int | None = None
    for i, word in enumerate(raw):
        if not word[0].isdigit():
            continue
        for nxt in raw[i + 1 : i + 4]:
            if nxt[0].isdigit():
                break
            if _stem(nxt) in words:
                value = int(word.replace(",", "").replace("_", ""))
                # "more than 50 chunks" / "over 50" / "> 50" means at least 51.
                before = " ".join(raw[max(0, i - 2) : i])
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


@cache
def _default_router(embedder: str) -> Router:
    return Router(embedder=embedder)


def route(
    utterance: str,
    n_chunks: int | None = None,
    embedder: str | Embedder | None = "lexical",
    *,
    skills_root: Path | None = None,
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
