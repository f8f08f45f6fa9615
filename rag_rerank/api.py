"""`rerank()`, `arerank()` and `arerank_many()`: one-shot uses of a `Reranker` session, as httpx's
`httpx.get` is of a `Client`.

Each call builds a session from its options, reranks once and closes what it built. A program that
reranks many times should hold a `Reranker` instead: its backend's connection pool and its
embedder's model are then built once, not per call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .backends.common import planning
from .concurrency import check_concurrency
from .cost import CostPlan
from .guard.input import ChunkSource
from .models import RerankResult
from .options import split_options
from .session import Reranker, Result

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .options import RerankOptions


def rerank(query: str, chunks: ChunkSource, top_k: int | None = None, lambda_: float | None = None,
           **options: Unpack[RerankOptions]) -> RerankResult:
    """Rerank `chunks` for `query`: at most `top_k` ranked (default 5), MMR with `lambda_` (default 0.7).

    `chunks` is JSONL text, a path, or a list of dicts / `Chunk`s. `backend` is "local" (offline,
    deterministic), "openai" (any OpenAI-compatible server through `base_url`), "anthropic", or a
    backend instance. `embedder` drives MMR similarity: "lexical", "sentence-transformers[:MODEL]",
    "openai[:MODEL]" or an Embedder; with the local backend it also picks the scorer (the static
    MiniLM-distilled table for "lexical", the model itself otherwise). Near-duplicates are judged by
    what the texts say (`redundancy.py`, with the static table's sentence vectors, or the
    sentence-transformers model's own with that embedder); on the caller's vectors when every chunk
    carries one (cosine at or above 0.95); on lexical vectors when `duplicate_threshold` (a cosine in
    [0, 1]) is given. `strict=True`
    turns off the formatting-only repair (fences, prose, <think>) so the model's raw text must pass
    as is.
    `fallback="local"` returns the local ranking, flagged in `meta`, if the backend fails for good.
    `policy` is a `RetryPolicy` (attempts, re-asks, a wall-clock `deadline_s` that also cuts a call
    still running); `limits` a `Limits` or a mapping overriding some of its fields
    (`{"max_chunks": 100}`).
    "cross-encoder" (a sentence-transformers CrossEncoder, `model` a folder or cached hub name) and
    "rerank-api" (a Cohere / Jina `/v1/rerank` server at `base_url`) score without an LLM;
    `backend_options` carries their knobs (batch_size, device, max_length, calibration_factor;
    timeout, max_chars, score_mapping). `meta_field` and the other `meta_*` options fuse the scorer's
    order with a metadata field (dates, ratings) before MMR; `embed_meta_fields` lists meta keys whose
    values are put before each chunk's text for every scorer (see `rag_rerank.fusion`).
    `window_size` (at most `max_chunks`) ranks up to `max_total_chunks` candidates: windows of that
    many scored concurrently (at most `concurrency` calls in flight), then one final pass over the
    best survivors and the post-pass over them (see `rag_rerank.windows`); without it, more than
    `max_chunks` is an `InputError`.
    `cache` keeps the backend's guard-valid answers on disk (True: the default folder, a folder, or
    a `ResponseCache`; unset: the `RAG_RERANK_CACHE` environment variable decides), so an identical
    call makes no request (`meta.cache`). `budget` (a `Budget`: max calls, tokens, cost) refuses a
    rerank whose plan exceeds it before any request; `prices` (per million input / output tokens)
    prices the plan (`rag_rerank.plan`).

    Raises `InputError` for bad input, `BudgetError` for a plan over its budget, and `BackendError`
    (every attempt attached) when the backend fails and there is no fallback.
    """
    session, request = split_options(options)
    # The request's options go with the request, so its every problem is one InputError (`plan`).
    with Reranker(**session) as reranker:
        return reranker.rerank(query, chunks, top_k, lambda_, **request)


def plan(query: str, chunks: ChunkSource, top_k: int | None = None, lambda_: float | None = None,
         **options: Unpack[RerankOptions]) -> CostPlan:
    """What `rerank` with the same arguments would do and cost, without any request: the calls
    (windows, final pass) and round trips, the re-ask bound, the estimated prompt and completion
    tokens, the cost from `prices=`, which calls the response cache already holds, and which limits
    of `budget=` it would cross (`exceeded`). Bad input raises `InputError`, as `rerank` would.
    It needs no API key: nothing is sent."""
    session, request = split_options(options)
    with planning():
        reranker = Reranker(**session)
    with reranker:
        return reranker.plan(query, chunks, top_k, lambda_, **request)


async def arerank(query: str, chunks: ChunkSource, top_k: int | None = None, lambda_: float | None = None,
                  **options: Unpack[RerankOptions]) -> RerankResult:
    """`rerank` for asyncio: the backend call is awaited (the backend's `acomplete`), so many
    requests share one event loop. Arguments, result and errors are those of `rerank`."""
    session, request = split_options(options)
    async with Reranker(**session) as reranker:
        return await reranker.arerank(query, chunks, top_k, lambda_, **request)


async def arerank_many(requests: Iterable[Mapping[str, Any]], *, concurrency: int = 4,
                       progress: Callable[[int, int], None] | None = None, budget: Any = None,
                       **options: Any) -> list[Result]:
    """Rerank every `{query, chunks, top_k?, lambda?, window_size?}` mapping with at most `concurrency`
    requests, and as many backend calls, in flight (a request's windows share the bound); a request
    whose calls are done hands its slot to the next one before its post-pass.
    A request may also carry its own request options (module docstring).

    Returns one entry per request, in input order: a `RerankResult`, or the exception that request
    raised (`InputError`, `BackendError`, ...). `options` are `rerank`'s keyword arguments; the
    backend and embedder are built once and shared. `progress(done, total)` is called after each.
    `budget` bounds the whole batch (`Reranker.arerank_many`).
    """
    check_concurrency(concurrency)
    session, request = split_options(options)
    async with Reranker(**session, **request) as reranker:
        return await reranker.arerank_many(requests, concurrency=concurrency, progress=progress,
                                           budget=budget)


__all__ = ["arerank", "arerank_many", "plan", "rerank"]
