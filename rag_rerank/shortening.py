"""Long chunks in a prompt: each chunk's token budget, and the request as the model is shown it.

Two options decide it. `max_tokens_per_chunk=N` caps every chunk: one over N tokens is shown as its
evidence (`evidence.select`: its most query-relevant passages, in document order, joined by a
visible elision mark). And the context budget (`limits.max_context_tokens`) is met instead of
refused: when the chunks together (with the query, their ids and metadata) exceed it, **the longest
chunks' budgets shrink first**: every chunk gets the same cap, the largest that makes the prompt
fit, so a chunk shorter than the cap is never touched and the long ones lose the least they can
(water-filling). The request is refused (`InputError` naming `max_context_tokens`) only when even
`evidence.MIN_TOKENS_PER_CHUNK` tokens per chunk cannot fit, or, with `strict=True`, whenever the
chunks do not fit as they are (after the explicit cap).

With `window_size`, each window of consecutive chunks is one prompt and is fitted on its own.

Tokens are counted by one counter: the caller's tokenizer when one is given (`tokenizer=`: a
callable returning a count, or an object with `encode`, as Hugging Face and tiktoken tokenizers
have), else `cost.estimate_tokens`, the package's offline estimate. The choice is made once, here,
before rendering; the prompt, `plan()`'s token estimate, the output guard's quotation check (it
reads the text the model was shown) and `meta.evidence` all read it.
"""

from __future__ import annotations

import contextlib
import json
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from .errors import InputError, Violation
from .evidence import ELISION, MIN_TOKENS_PER_CHUNK, Evidence, Scorer, TokenCounter, select
from .frozen import direct_init
from .models import Chunk, RerankRequest
from .tokens import estimate_tokens


def token_counter(tokenizer: Any) -> TokenCounter:
    """The one counter: `tokenizer` (a callable returning an int, or an object with `encode`) or the
    package's estimate when it is None. Anything else is an `InputError` naming `tokenizer`."""
    if tokenizer is None:
        return estimate_tokens
    encode = getattr(tokenizer, "encode", None)
    if callable(encode):
        return _Encoded(encode)
    if callable(tokenizer):
        return _Counted(tokenizer)
    raise InputError([Violation(path="tokenizer", value=repr(tokenizer)[:80],
                                message="tokenizer must be None, a callable text -> token count, or an "
                                "object with encode(text) (a Hugging Face or tiktoken tokenizer)")])


@dataclass(frozen=True)
class _Encoded:
    encode: Callable[[str], Sequence[Any]]

    def __call__(self, text: str) -> int:
        encoded = self.encode(text)
        try:
            return len(encoded)
        except TypeError:  # no sequence: the text is not encoded a second time to say so
            raise _bad_count(encoded, text) from None


@dataclass(frozen=True)
class _Counted:
    count: Callable[[str], Any]

    def __call__(self, text: str) -> int:
        n = self.count(text)
        # A count that is no whole number >= 0 would pass every budget (-5) or crash deep inside
        # (None): it is the caller's tokenizer at fault, named as such.
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise _bad_count(n, text)
        return int(n)


def _bad_count(n: Any, text: str) -> InputError:
    msg = (f"tokenizer must return a whole number of tokens >= 0 (or a sequence from encode), got {n!r} "
           f"for a text of {len(text)} characters")
    return InputError([Violation(path="tokenizer", value=repr(n)[:80], message=msg)])


def check_max_tokens_per_chunk(value: Any) -> list[Violation]:
    """None, or a whole number of at least `MIN_TOKENS_PER_CHUNK`."""
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < MIN_TOKENS_PER_CHUNK:
        return [Violation(path="max_tokens_per_chunk", value=repr(value)[:80],
                          message=f"max_tokens_per_chunk must be a whole number of at least "
                          f"{MIN_TOKENS_PER_CHUNK} tokens (or left unset), got {value!r}")]
    return []


def fit(sizes: Sequence[int], available: int, cap: int | None, *, shrink: bool) -> list[int] | None:
    """Each chunk's budget: its size, at most `cap`; then, with `shrink`, the largest common cap that
    makes the sum fit `available` (the longest chunks shrink first). None when it cannot fit (even at
    `MIN_TOKENS_PER_CHUNK` each, or at all without `shrink`)."""
    capped = [s if cap is None else min(s, cap) for s in sizes]
    if sum(capped) <= available:
        return capped
    if not shrink or sum(min(s, MIN_TOKENS_PER_CHUNK) for s in capped) > available:
        return None
    lo, hi = MIN_TOKENS_PER_CHUNK, max(capped)
    while lo < hi:  # the largest common cap c with sum(min(s, c)) <= available
        mid = (lo + hi + 1) // 2
        if sum(min(s, mid) for s in capped) <= available:
            lo = mid
        else:
            hi = mid - 1
    return [min(s, lo) for s in capped]


def chunk_tokens(chunk: Chunk, count: TokenCounter = estimate_tokens) -> int:
    """The tokens a chunk puts in the prompt: its text, id, score and metadata."""
    return count(chunk.text) + _overhead(chunk, count)


def prompt_tokens(query: str, chunks: Sequence[Chunk], count: TokenCounter = estimate_tokens) -> int:
    """The tokens the context budget counts for one prompt of `chunks`: the query and each chunk's
    `chunk_tokens`. The input guard (`guard.input`) and `shorten` both count this, so a request one
    of them accepts the other never refuses."""
    return count(query) + sum(chunk_tokens(c, count) for c in chunks)


def tokens_over(query: str, chunks: Sequence[Chunk], max_context_tokens: int,
                count: TokenCounter = estimate_tokens) -> int | None:
    """`prompt_tokens` when it is over `max_context_tokens`, else None. With the package's estimate
    the UTF-8 byte bound is tried first (`most_tokens`): a prompt that surely fits is not counted."""
    if count is estimate_tokens and _surely_fits(query, chunks, max_context_tokens, None):
        return None
    n = prompt_tokens(query, chunks, count)
    return n if n > max_context_tokens else None


def _overhead(chunk: Chunk, count: TokenCounter) -> int:
    """What a chunk puts in the prompt besides its text: its id and its metadata."""
    n = count(chunk.id) + (count(str(chunk.score)) if chunk.score is not None else 0)
    if chunk.meta:
        with contextlib.suppress(TypeError, ValueError, RecursionError):
            n += count(json.dumps(chunk.meta, ensure_ascii=False, default=str))
    return n


def most_tokens(text: str) -> int:
    """An upper bound of `estimate_tokens(text)`: its UTF-8 bytes. An ASCII character (one byte) is
    never more than a token, a non-ASCII one never more than its bytes; counting bytes rather than
    four per character keeps a mostly-English text with one curly quote (most of TREC DL19's
    candidate lists) on the fast path."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _surely_fits(query: str, chunks: Sequence[Chunk], max_context_tokens: int, cap: int | None) -> bool:
    """Whether every chunk is within `cap` and the prompt within the budget by the upper bound alone
    (`_sure_fit`)."""
    return _sure_fit(query, chunks, max_context_tokens, cap)[0]


def _sure_fit(query: str, chunks: Sequence[Chunk], max_context_tokens: int, cap: int | None
              ) -> tuple[bool, bool]:
    """Whether every chunk is within `cap` and the prompt within the budget by the upper bound alone
    (`most_tokens`: the UTF-8 bytes), and, when it is, whether any text holds the elision mark (what
    `marks_shown` asks; the bound is the same either way: `…` and `⋯` are one character and three
    UTF-8 bytes each). The texts' bytes are first bounded by their lengths (four bytes at most per
    non-ASCII text's character), encoding the non-ASCII texts only when that rough bound does not
    fit: every request asks this. One plain loop over the chunks: Python 3.11 reads a frozen value's
    fields in a loop for a fraction of what a `map` of an `attrgetter` costs per item, and this asked
    six such passes and `marks_shown` a seventh (`tests/test_shortening.py` pins it against them)."""
    total = most_tokens(query)
    length = 0  # the texts' characters
    wide: list[str] = []  # the texts that are not ASCII
    marked = False
    for chunk in chunks:
        cid = chunk.id
        total += len(cid) if cid.isascii() else most_tokens(cid)  # `most_tokens`, without its call
        if chunk.score is not None:
            total += 32  # a float's repr: < 32 characters
        meta = chunk.meta
        if meta:
            try:
                total += most_tokens(json.dumps(meta, ensure_ascii=False, default=str))
            except (TypeError, ValueError, RecursionError):
                return False, False  # counted the long way (`_overhead`)
        text = chunk.text
        length += len(text)
        if not text.isascii():
            wide.append(text)
            marked = marked or _MARK in text  # the mark is not ASCII
    if cap is not None:
        sizes = [_text_bytes(chunk.text) for chunk in chunks]
        return not (sizes and max(sizes) > cap) and total + sum(sizes) <= max_context_tokens, marked
    total += length
    wide_chars = sum(map(len, wide))
    if total + 3 * wide_chars <= max_context_tokens:
        return True, marked
    fits = bool(wide) and total + sum(map(_text_bytes, wide)) - wide_chars <= max_context_tokens
    return fits, marked


@lru_cache(maxsize=4096)
def _text_bytes(text: str) -> int:
    """`most_tokens` of a chunk's text, memoised for `_surely_fits`: encoding a non-ASCII text is
    the one part of the bound that grows with the text (a third of its instructions at 50 DL19
    passages), and a service meets the same passages again, as the chunk memos assume."""
    return most_tokens(text)


def scorer_for(embedder: Any) -> Scorer:
    """The evidence scorer of a session's embedder: a sentence-transformers model reads passages
    itself; every other embedder (lexical, static, an HTTP endpoint, the caller's vectors) through the
    static table, so choosing evidence never makes a request."""
    name = str(getattr(embedder, "name", embedder or ""))
    return Scorer(embedder if name.startswith("sentence-transformers") else None)


@direct_init
@dataclass(frozen=True)
class Shortened:
    """The request as the model is shown it, and the evidence of each chunk that was shortened."""

    request: RerankRequest
    evidence: Mapping[str, Evidence]


_MARK = ELISION.strip()
LITERAL_MARK = "[\u22ef]"
"""How a caller's own `[…]` is shown to the model: `[⋯]` (midline ellipsis, one character for one,
so every offset stays put). The shown text then holds the elision mark only where passages were
joined, and the output guard, which judges a quotation passage by passage between marks, accepts
a quotation of the caller's own elided text inside one passage instead of refusing it as one that
runs across a cut."""


def marks_shown(request: RerankRequest) -> RerankRequest:
    """`request` with each `[…]` of its chunks' texts shown as `LITERAL_MARK` (the same request,
    not a copy, when no text holds one)."""
    if not any(_MARK in c.text for c in request.chunks):
        return request
    return replace(request, chunks=tuple(replace(c, text=c.text.replace(_MARK, LITERAL_MARK))
                                         if _MARK in c.text else c for c in request.chunks))


def shorten(request: RerankRequest, *, max_context_tokens: int, max_tokens_per_chunk: int | None,
            strict: bool, window_size: int | None, embedder: Any = None, tokenizer: Any = None) -> Shortened:
    """Fit `request` to its budgets (module docstring); an `InputError` naming the limit when it cannot.
    A caller's own elision mark is shown as `LITERAL_MARK` (counted so, and chosen from so)."""
    count = token_counter(tokenizer)
    cap = max_tokens_per_chunk
    if count is estimate_tokens:
        fits, marked = _sure_fit(request.query, request.chunks, max_context_tokens, cap)
        if fits:  # the common case, without counting every chunk's tokens
            return Shortened(marks_shown(request) if marked else request, {})
    request = marks_shown(request)
    chunks = request.chunks
    size = window_size or max(len(chunks), 1)
    query = count(request.query)
    sizes = [count(c.text) for c in chunks]
    budgets: list[int] = []
    problems: list[Violation] = []
    for first in range(0, len(chunks), size):
        part = range(first, min(first + size, len(chunks)))
        available = max_context_tokens - query - sum(_overhead(chunks[i], count) for i in part)
        got = fit([sizes[i] for i in part], available, max_tokens_per_chunk, shrink=not strict)
        if got is None:
            where = "the chunks" if window_size is None else f"chunks[{part.start}:{part.stop}]"
            need = sum(sizes[i] if strict else min(sizes[i], MIN_TOKENS_PER_CHUNK) for i in part)
            how = ("as they are (strict)" if strict else
                   f"even at {MIN_TOKENS_PER_CHUNK} tokens per chunk")
            problems.append(Violation(
                path="chunks", value=need,
                message=f"{where} need about {need + max_context_tokens - available} tokens {how}, over the "
                f"budget of {max_context_tokens} (max_context_tokens); send fewer chunks, use window_size or "
                "raise the budget"))
            got = list(sizes[i] for i in part)
        budgets.extend(got)
    if problems:
        raise InputError(problems)
    scorer = scorer_for(embedder)
    shown: list[Chunk] = []
    evidence: dict[str, Evidence] = {}
    for chunk, n, budget in zip(chunks, sizes, budgets, strict=True):
        if n <= budget:
            shown.append(chunk)
            continue
        ev = select(request.query, chunk.text, budget, count=count, scorer=scorer)
        evidence[chunk.id] = ev
        shown.append(replace(chunk, text=ev.text))
    if not evidence:
        return Shortened(request, {})
    return Shortened(replace(request, chunks=tuple(shown)), evidence)


def piece_spans(text: str) -> list[tuple[int, int]]:
    """Where in `text` each passage `evidence.passages_of` cuts it into lies, as [start, end)
    character offsets: the pieces between elision marks that are not blank, else the whole text.
    A scored backend reports the piece that decided a chunk's score by its span (`decided_spans`)."""
    if ELISION not in text:
        return [(0, len(text))]
    spans: list[tuple[int, int]] = []
    pos = 0
    for part in text.split(ELISION):
        if part.strip():
            spans.append((pos, pos + len(part)))
        pos += len(part) + len(ELISION)
    return spans or [(0, len(text))]


def decided_spans(texts: Sequence[str], owner: np.ndarray, which: np.ndarray,
                  own: Sequence[str] | None = None) -> list[tuple[int, int]]:
    """Per text, the [start, end) span of the passage whose score is the text's (`which`: the index
    among all texts' passages, as `evidence.best_of` gives it; `owner`: each passage's text). With
    `own` (the caller's texts, when embedded meta values were put before them), the span is in the
    caller's text: the prefix is taken off and a span inside it is clipped to the text's start."""
    first = np.searchsorted(owner, np.arange(len(texts)), side="left").tolist()
    out: list[tuple[int, int]] = []
    for i, text in enumerate(texts):
        a, b = piece_spans(text)[int(which[i]) - first[i]]
        if own is not None:
            cut = len(text) - len(own[i])
            a, b = max(a - cut, 0), max(b - cut, 0)
        out.append((a, b))
    return out


def original_span(ev: Evidence, span: tuple[int, int]) -> list[int] | None:
    """`span`, [start, end) in the text the model was shown (`ev.text`), as offsets into the caller's
    original text; None when it does not lie inside one kept passage."""
    a, b = span
    pos = 0
    for p in ev.passages:
        length = p.end - p.start
        if pos <= a and b <= pos + length:
            return [p.start + a - pos, p.start + b - pos]
        pos += length + len(ELISION)
    return None


def evidence_meta(evidence: Mapping[str, Evidence],
                  decided: Mapping[str, tuple[int, int]] | None = None) -> dict[str, dict[str, Any]] | None:
    """`meta.evidence`: per shortened chunk id, tokens before and after, the kept passages and
    `decided`, the passage a scored backend's score was read from (its best passage, `decided`:
    spans in the shown text, mapped here to the original) or None when the ranker was an LLM, all
    as [start, end) character offsets into the caller's text (None when no chunk was shortened)."""
    decided = decided or {}
    out: dict[str, dict[str, Any]] = {}
    for cid, ev in evidence.items():
        span = decided.get(cid)
        out[cid] = {**ev.to_dict(), "decided": None if span is None else original_span(ev, span)}
    return out or None


__all__ = ["LITERAL_MARK", "Shortened", "check_max_tokens_per_chunk", "chunk_tokens", "decided_spans",
           "evidence_meta", "fit", "marks_shown", "most_tokens", "original_span", "piece_spans",
           "prompt_tokens", "scorer_for", "shorten", "token_counter", "tokens_over"]
