"""The machine-readable `dropped` reasons: one grammar, one list of tokens, used by every writer.

A reason is `token` or `token: detail`. A program reads the token (the part before the first
`:`) to know why a chunk was left out; the detail is for people. The one exception to the
space after the colon is `redundant_with:<id>`, spelled the way the skill card spells it: the
detail is an input id, byte for byte, and an id may itself begin with a space.

The local backend, the post-pass and the LLM path all write through `reason()`; a model's own
reason that does not start with one of these tokens is kept word for word as the detail of
`dropped_by_model`, so nothing the model said is lost and every token a program meets is listed
here (and in docs/dropped-reasons.md, which a test keeps in step with `TOKENS`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache

REDUNDANT_WITH = "redundant_with"
BELOW_MIN_SCORE = "below_min_score"
NOT_SELECTED = "not_selected"
OVER_WORD_BUDGET = "over_word_budget"
NO_CITABLE_PHRASE = "no_citable_phrase"
DROPPED_BY_MODEL = "dropped_by_model"
MISSING_META = "missing_meta"
NOT_IN_FINAL = "not_in_final"

TOKENS: Mapping[str, str] = {
    REDUNDANT_WITH: "a near-duplicate of the ranked chunk whose id follows the colon (no space); "
    "the more concise of the two was kept",
    BELOW_MIN_SCORE: "its relevance score is at or below the minimum score (0.2); the detail, when "
    "present, is the score",
    NOT_SELECTED: "relevant enough, but top_k and the MMR trade-off chose other chunks; the detail, "
    "when present, is the score, or says the scorer left the chunk out of its answer",
    OVER_WORD_BUDGET: "selected, but the ranked chunks before it already used up the word budget",
    NO_CITABLE_PHRASE: "the local backend found nothing concrete in the chunk to quote as a reason",
    DROPPED_BY_MODEL: "the model dropped it itself with a reason of its own, which is the detail, "
    "word for word",
    MISSING_META: "metadata fusion with missing_meta='drop': the chunk has no value for the field "
    "named in the detail",
    NOT_IN_FINAL: "with window_size: it lost in its window (not among the best window_size survivors, "
    "or dropped there) and never reached the final pass; the detail names the window and its score",
}

_HEAD = re.compile(r"[a-z][a-z0-9_]*")
_LONGEST = max(map(len, TOKENS))
# What starts a `redundant_with:<id>` reason: made once, as the guard and the post-pass ask of
# every reason whether it names a chunk (`redundant_target`), and of some reasons twice.
_REDUNDANT_PREFIX = f"{REDUNDANT_WITH}:"
_REDUNDANT_AT = len(_REDUNDANT_PREFIX)


def reason(token: str, detail: object = None) -> str:
    """`token`, or `token: detail` (`redundant_with:<id>` for that token), for a token in `TOKENS`."""
    if token not in TOKENS:
        raise ValueError(f"unknown dropped-reason token {token!r}")
    if detail is None or detail == "":
        return token
    if token == REDUNDANT_WITH:
        return f"{token}:{detail}"
    return f"{token}: {detail}"


def redundant_with(chunk_id: str) -> str:
    """`redundant_with:<id>`: the reason of a chunk that repeats `chunk_id` (the one place it is spelt)."""
    return f"{REDUNDANT_WITH}:{chunk_id}"


def redundant_target(text: str) -> str | None:
    """The id a `redundant_with:<id>` reason names ("" for one naming none), None for any other reason."""
    return text[_REDUNDANT_AT:] if isinstance(text, str) and text.startswith(_REDUNDANT_PREFIX) else None


def score_detail(score: float) -> str:
    """A score as a reason's detail: three decimals, like the scores people read elsewhere."""
    return f"{score:.3f}"


def score_in(text: str) -> float | None:
    """The score a `below_min_score: 0.150` / `not_selected: 0.410` reason carries, or None: the
    scored backends write every chunk's score there, so a dropped chunk's number is not lost."""
    return score_in_text(text) if isinstance(text, str) else None


@lru_cache(maxsize=4096)
def score_in_text(text: str) -> float | None:
    """`score_in` of a text (a `str`), memoised: `scores` reads every dropped reason of every answer,
    and reasons recur (a scored backend's `not_selected: 0.410` has a thousand spellings at most; a
    service meets the same passages, and so the same answers, again). `meta.scores_of` calls it
    itself after its own `isinstance` test, without `score_in`'s frame (30 a call at 50 passages)."""
    parts = split(text)
    if parts is None or parts[0] not in (BELOW_MIN_SCORE, NOT_SELECTED) or parts[1] is None:
        return None
    try:
        score = float(parts[1])
    except ValueError:
        return None
    return score if 0.0 <= score <= 1.0 else None


def split(text: str) -> tuple[str, str | None] | None:
    """(token, detail or None) for a reason that follows the grammar with a known token, else None.

    The token is what comes before the first `:` (or the whole text without one), and it must be
    one of `TOKENS` itself: every token is lowercase letters, digits and `_`, so a head that is a
    token has the token's shape, and no shorter head can end at a `:` either. A search for the
    colon and a dict lookup instead of a regular expression: the guard, the post-pass and `scores`
    ask this of every reason of every answer."""
    if not isinstance(text, str):
        return None
    # Only the first `_LONGEST + 1` characters are looked at: a head longer than every token is
    # none of them, so free text (`outside top_k`, a model's sentence) is not copied or hashed whole.
    colon = text.find(":", 0, _LONGEST + 1)
    token = text[:colon] if colon >= 0 else text[:_LONGEST + 1]
    if token not in TOKENS:
        return None
    if colon < 0:  # the head is a token, so shorter than what was taken: the whole text
        return token, None
    rest = text[colon + 1:]
    if token == REDUNDANT_WITH:
        return (token, rest) if rest else None
    if not rest.startswith(" ") or not rest.strip():
        return None
    return token, rest[1:]


def problem(text: str) -> str | None:
    """Why a reason that *uses* a known token breaks the grammar (`below_min_score (0.1)`,
    `not_selected:0.4`), or None. A reason not starting with a token is free text: not judged
    here (a model may explain in its own words; `normalise` files that under `dropped_by_model`)."""
    if not isinstance(text, str):
        return None
    head = _HEAD.match(text)
    if head is None or head.group(0) not in TOKENS or split(text) is not None:
        return None
    token = head.group(0)
    want = f"'{token}:<id>'" if token == REDUNDANT_WITH else f"'{token}' or '{token}: detail'"
    return f"reason {text[:60]!r} uses the token {token!r} but not the grammar {want}"


def normalise(text: str) -> str:
    """A reason as the grammar has it: unchanged when it already follows it, otherwise the model's
    own words as the detail of `dropped_by_model` (a known token written loosely, such as
    `below_min_score (0.1)`, is also kept word for word there rather than guessed at)."""
    if split(text) is not None:
        return text
    return reason(DROPPED_BY_MODEL, " ".join(str(text).split()) or "(no reason given)")


__all__ = ["TOKENS", "normalise", "problem", "reason", "redundant_target", "redundant_with", "score_detail",
           "score_in", "score_in_text", "split"]
