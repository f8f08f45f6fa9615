"""The card's answer from a list of numeric scores: what every scored backend (local, cross-encoder,
rerank API) shares.

A scorer gives one number per chunk and nothing else. To go through the same output guard and
post-pass as an LLM, that becomes the card's JSON object here: chunks at or below the minimum
score in force (`request.min_score`) are dropped (`below_min_score`), the best `request.top_k` of
the rest are ranked (the pipeline asks for candidate_k, so MMR has room), every other one is
`not_selected`, and each ranked chunk gets a reason that quotes its own best-matching phrase,
found by the local backend's `best_phrase`, so every scorer explains itself the same way.

**Valid by construction.** Each reason is checked here with the output guard's own functions
(`cites_chunk`, `misquoted`), on the same `text.comparable` form the guard uses. A quotation the
guard would refuse is replaced by the unquoted matched words; a chunk with nothing concrete to
name is dropped as `no_citable_phrase`. So a scored answer passes the guard whatever the Unicode
of the chunks, and a scored backend is never re-asked (`retry.py`): repeating a deterministic
scorer could only repeat its answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from .. import reasons
from ..embed.units import UNSPACED, kind
from ..evidence import ELISION
from ..guard.limits import load_limits
from ..guard.output import cites_chunk, misquoted
from ..models import RerankRequest
from ..shortening import piece_spans
from ..text import quote, readable
from .terms import STOPWORDS, lexical_scores, stem, word_spans

# Decimals of a written score for the model-backed scorers: enough that two chunks the model tells
# apart keep its order through the post-pass (which sees only the written scores).
SCORE_DECIMALS = 6
# describe(index, score, quoted phrase or None, matched query words) -> the reason's text
Describe = Callable[[int, float, "str | None", "list[str]"], str]


def worded(phrase: str | None, matched: list[str], otherwise: Callable[[str], str], tail: str = "") -> str:
    """A scored backend's reason: the quoted phrase and the query words it shares (then `tail`);
    `otherwise(quoted phrase)` when it shares none; the shared words alone when the phrase could
    not be quoted (None); "" (nothing to cite) when there is neither."""
    if phrase is None:
        return f"shares query terms {', '.join(matched)}{tail}" if matched else ""
    quoted = json.dumps(phrase, ensure_ascii=False)
    if matched:
        return f"quotes {quoted}, sharing query terms {', '.join(matched)}{tail}"
    return otherwise(quoted)


def labelled(label: str) -> Describe:
    """How a non-LLM scorer words its reasons: the quoted phrase and the query words it shares,
    then the scorer's name and its score."""

    def describe(index: int, score: float, phrase: str | None, matched: list[str]) -> str:
        return worded(phrase, matched, lambda quoted: f"{label} {score:.3f} for {quoted}",
                      f" ({label} {score:.3f})")

    return describe


@dataclass(frozen=True)
class _Tokens:
    stems: list[str]
    spans: list[tuple[int, int]]
    widths: list[float]  # how much of a word each token is: 1, or less for a character unit of CJK text


# A character unigram or bigram of unspaced text (two units per character) counts as a fifth of a
# word when `best_phrase` sizes its window: eight "words" of Chinese are about twenty characters.
_UNSPACED_WIDTH = 0.2
_EDGE_CHARS = 4
_NO_WORDS_CHARS = 60  # a chunk without words is quoted from its start, this many characters


@lru_cache(maxsize=2048)
def _tokenise(text: str) -> _Tokens:
    """A chunk's tokens, memoised per text: a ranked chunk is quoted again whenever it recurs."""
    found = word_spans(text)
    return _Tokens([stem(u) for u, _, _ in found], [(lo, hi) for _, lo, hi in found],
                   [_UNSPACED_WIDTH if len(u) <= 2 and kind(u[0]) == UNSPACED else 1.0 for u, _, _ in found])


@lru_cache(maxsize=2048)
def _window_ends(text: str, window: int) -> np.ndarray:
    """For each token of `text`, where `window` words' worth of tokens from it runs out (read-only)."""
    tokens = _tokenise(text)
    n = len(tokens.stems)
    cw = np.concatenate([[0.0], np.cumsum(tokens.widths)])
    ends = np.clip(np.searchsorted(cw, cw[:n] + window, side="right") - 1, np.arange(n) + 1, n)
    ends.flags.writeable = False
    return ends




def best_phrase(text: str, term_weight: dict[str, float], window: int = 8) -> tuple[str | None, list[str]]:
    """The `window`-word span of the chunk holding the most query weight, in its `text.quote` form
    (None when it has none: see there), and the chunk's words in it that match a query term.
    Without any shared term: the chunk's opening words."""
    tokens = _tokenise(text)
    n = len(tokens.stems)
    if n == 0:
        return quote(text, 0, _NO_WORDS_CHARS), []
    w = np.array([term_weight.get(s, 0.0) for s in tokens.stems])
    best_start, best_val = 0, 0.0
    ends = _window_ends(text, window)
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
    phrase = quote(text, lo, hi)  # the guard's own normal form: accepted by construction
    if phrase is not None and lo > 0:
        phrase = "…" + phrase
    if phrase is not None and hi < len(text.rstrip()):
        phrase += "…"
    matched: list[str] = []
    if best_val > 0:
        window_spans = zip(tokens.stems[best_start:end], tokens.spans[best_start:end], strict=True)
        for a, b in _merge_unspaced(text, [span for s, span in window_spans if term_weight.get(s, 0.0) > 0]):
            word = readable(text[a:b])
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



def query_term_weights(query: str, texts: Sequence[str]) -> dict[str, float]:
    """Per query stem, its weight over this candidate set (BM25 idf; function words count little)."""
    _, terms, term_w, _ = lexical_scores(query, texts)
    return {t: float(x) for t, x in zip(terms, term_w, strict=True) if x > 0}


def reason_for(text: str, index: int, score: float, weight_of: dict[str, float],
               describe: Describe) -> str | None:
    """A reason for chunk `index` (its own `text`) that the output guard accepts, or None when the
    chunk holds nothing concrete to name (see the module docstring)."""
    phrase, matched = best_phrase(text, weight_of)
    matched = [m for m in matched if m.lower() not in STOPWORDS] or matched
    reason = describe(index, score, phrase, matched)
    if phrase is not None and misquoted(reason, text) is not None:  # a bug in `text.quote` if ever
        reason = describe(index, score, None, matched)
    if reason and cites_chunk(reason, text):
        return reason
    return None


def quoted_passage(text: str, weight_of: dict[str, float]) -> str:
    """What a reason quotes from: the chunk's text, or, for a chunk shown as its evidence (passages
    joined by `ELISION`), the passage holding the most query weight: the output guard refuses a
    quotation across the mark, which joins passages the original keeps apart."""
    if ELISION not in text:
        return text
    pieces = [text[a:b] for a, b in piece_spans(text)]
    weights = [sum(weight_of.get(s, 0.0) for s in _tokenise(p).stems) for p in pieces]
    return pieces[int(np.argmax(weights))]


def _quoted(text: str, span: tuple[int, int] | None, weight_of: dict[str, float]) -> str:
    """`text[span]` when it is a non-empty span, else `quoted_passage`."""
    if span is not None and span[1] > span[0]:
        return text[span[0]:span[1]]
    return quoted_passage(text, weight_of)


def minimum_score(request: RerankRequest) -> float:
    """The minimum score in force for `request`: its own, else the contract's."""
    return load_limits().min_score if request.min_score is None else float(request.min_score)


def answer(request: RerankRequest, scores: Sequence[float | None], describe: Describe, *,
           decimals: int = 3, unscored_reason: str = reasons.reason(reasons.NOT_SELECTED, "not scored"),
           weight_of: dict[str, float] | None = None,
           quote_in: Sequence[tuple[int, int]] | None = None) -> dict[str, Any]:
    """The card's output object for `request` from per-chunk `scores` in [0, 1] (input order).

    Chunks are ordered by full-precision score (ties: input order) and their scores written with
    `decimals` decimals, so two chunks a scorer tells apart keep its order even when they round
    alike. A None score (a chunk the scorer did not return) is dropped with `unscored_reason`.
    `quote_in` is, per chunk, the [start, end) of its text a reason quotes from: the passage that
    decided a score read from a chunk's best passage (else `quoted_passage`)."""
    own = [request.own_text(c) for c in request.chunks]  # reasons quote the chunk, not an embedded title
    if weight_of is None:
        weight_of = query_term_weights(request.query, [c.text for c in request.chunks])
    floor = minimum_score(request)
    order = sorted(range(len(own)), key=lambda i: (scores[i] is None, -(scores[i] or 0.0), i))
    ranked: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    for i in order:
        cid, raw = request.chunks[i].id, scores[i]
        if raw is None:
            dropped.append({"id": cid, "reason": unscored_reason})
            continue
        score = round(float(raw), decimals)
        if score <= floor:
            dropped.append({"id": cid, "reason": reasons.reason(reasons.BELOW_MIN_SCORE,
                                                               reasons.score_detail(score))})
        elif len(ranked) >= request.top_k:
            dropped.append({"id": cid, "reason": reasons.reason(reasons.NOT_SELECTED,
                                                               reasons.score_detail(score))})
        elif (reason := reason_for(_quoted(own[i], quote_in[i] if quote_in else None, weight_of),
                                   i, score, weight_of, describe)) is not None:
            ranked.append({"id": cid, "score": score, "reason": reason})
        else:
            dropped.append({"id": cid, "reason": reasons.reason(reasons.NO_CITABLE_PHRASE,
                                                               "nothing concrete to quote")})
    return {"ranked": ranked, "dropped": dropped}
