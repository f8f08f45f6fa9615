"""The one token estimator: how many tokens a text, a card's answer and an answer's budget are.

Why one module. The plan's cost (`cost.py`), a budget's meter and the first attempt's output budget
(`retry.py`), and the input guard's context budget (`guard/limits.py`) all count tokens; counted
four ways, they disagreed (a request the plan priced at one size was given an output budget sized
by another formula). Here each count is written once:

* `estimate_tokens(text)`: tokens a BPE tokenizer makes of a text, offline: pieces of a GPT-2 style
  pre-tokenizer (a word, a number, a run of punctuation), long words and non-Latin text counted by
  length (docs/cost.md: the measured error, `bench/tokens.py`);
* `answer_tokens(n, top_k, ids)`: what the card's answer costs, entry by entry;
* `answer_budget(...)`: the first attempt's `max_tokens`, that answer with room to spare;
* `tokens_in_chars(n_chars, chars_per_token)`: a bound from a length alone, with `chars_per_token`
  from `guard/limits.json`, where only lengths are at hand (the windows' final-pass packing). The
  input guard's context budget is not counted so any more: it counts with `estimate_tokens` (or
  the tokenizer) exactly as the shortening does (`shortening.prompt_tokens`, a byte bound first).

`tokenizer=` (a callable from text to a count, e.g. a real tokenizer's `len(encode(text))`) replaces
the offline estimate wherever text is counted: the hook for a caller who has one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from functools import lru_cache

Tokenizer = Callable[[str], int]

# One piece of a GPT-2 style pre-tokenizer: a contraction, a run of letters, of digits, of other
# symbols, the underscore among them (each optionally after one space), or a run of white space.
_PIECE = re.compile(r"""'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+""", re.UNICODE)
# A run of letters longer than this is split by BPE into about one token per this many characters:
# the largest value (0.1 steps) at which the estimate is not below SmolLM2's tokenizer on average over
# bench/tokens.py's development requests (even DL19 queries); the other splits are only reported.
_WORD_CHARS = 5.0
_ASCII_RUN = re.compile(r"[\x00-\x7f]+|[^\x00-\x7f]+")
# What the model writes per entry besides the id: `{"id": , "score": 0.93, "reason": ""},` is about
# 16 tokens, a ranked entry's reason about 24 more (the card asks for a short, concrete one); a
# dropped entry's reason is a code (`off_topic`, `redundant_with:<id>`).
RANKED_ENTRY_TOKENS = 40
DROPPED_ENTRY_TOKENS = 14
ANSWER_OVERHEAD_TOKENS = 12
# The first attempt's output budget: the expected answer times this (a model writes longer reasons
# than the card asks; a truncated answer costs a second call), never below the floor. 1.75 keeps
# the budget the former formula gave (64 + 70 per ranked, 24 per dropped entry) within a few tokens.
BUDGET_FACTOR = 1.75
BUDGET_FLOOR = 512


def estimate_tokens(text: str, tokenizer: Tokenizer | None = None) -> int:
    """Tokens a BPE tokenizer makes of `text`, estimated offline (module docstring); `tokenizer`'s
    own count when one is given."""
    if tokenizer is not None:
        return int(tokenizer(text))
    total = 0.0
    for match in _PIECE.finditer(text):
        piece = match.group()
        if piece.isspace():
            total += 1 if "\n" in piece or len(piece) > 1 else 0
            continue
        core = piece.lstrip(" ")
        if not core.isascii():
            total += _non_ascii_tokens(core)
        elif core[0].isalpha():
            total += max(1.0, len(core) / _WORD_CHARS)
        elif core[0].isdigit():
            total += math.ceil(len(core) / 3)
        else:
            total += max(1.0, len(core) / 2)
    return math.ceil(total)


def _non_ascii_tokens(core: str) -> float:
    """A piece holding non-ASCII characters. Byte-level BPE vocabularies learnt mostly from English
    seldom merge across a non-ASCII character: each ASCII stretch between two costs as an ASCII word
    of its length, each other letter (accented Latin, CJK, Cyrillic, Greek) about a token, and a
    combining mark (decomposed accents), a control or format character (web mojibake:
    `\u00e2\u0080\u0099`) or a symbol about a token per UTF-8 byte."""
    total = 0.0
    for run in _ASCII_RUN.findall(core):
        if run.isascii():
            total += max(1.0, len(run) / _WORD_CHARS)
        else:
            total += sum(1 if ch.isalpha() else len(ch.encode("utf-8")) for ch in run)
    return max(1.0, total)


def answer_tokens(n_chunks: int, top_k: int, ids: Sequence[str], tokenizer: Tokenizer | None = None) -> int:
    """Completion tokens of a card's answer for `n_chunks` chunks of which `top_k` are ranked."""
    ranked = min(top_k, n_chunks)
    if tokenizer is None:
        id_tokens = sum(map(_id_tokens, ids))
    else:
        id_tokens = sum(estimate_tokens(i, tokenizer) for i in ids)
    entries = ranked * RANKED_ENTRY_TOKENS + (n_chunks - ranked) * DROPPED_ENTRY_TOKENS
    return ANSWER_OVERHEAD_TOKENS + entries + id_tokens


@lru_cache(maxsize=16384)
def _id_tokens(chunk_id: str) -> int:
    """An id's estimated tokens, memoised: every call of a request counts the same ids again (its
    output budget, the budget's meter), and a corpus's ids recur from request to request."""
    return estimate_tokens(chunk_id)


def answer_budget(n_chunks: int, top_k: int, ids: Sequence[str], cap: int,
                  tokenizer: Tokenizer | None = None) -> int:
    """The first attempt's `max_tokens`: the expected answer (`answer_tokens`) with room to spare,
    at least `BUDGET_FLOOR`, at most `cap`."""
    expected = answer_tokens(n_chunks, top_k, ids, tokenizer)
    return max(BUDGET_FLOOR, min(cap, math.ceil(BUDGET_FACTOR * expected)))


def tokens_in_chars(n_chars: int, chars_per_token: int) -> int:
    """The guard's bound from a length alone (module docstring): one token per `chars_per_token`."""
    return -(-n_chars // chars_per_token)


__all__ = ["ANSWER_OVERHEAD_TOKENS", "BUDGET_FACTOR", "BUDGET_FLOOR", "DROPPED_ENTRY_TOKENS",
           "RANKED_ENTRY_TOKENS", "Tokenizer", "answer_budget", "answer_tokens", "estimate_tokens",
           "tokens_in_chars"]
