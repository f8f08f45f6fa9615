"""The `"input"` step of a fallback chain: the caller's first-stage order, as a scored answer.

For callers who must never fail a query: when every scorer before it failed, the chunks keep the
order the retriever gave them. Each chunk's score falls with its first-stage rank (the request's
`ranks`, so a window or the final pass sees the chunks' true positions in the caller's list),
from 1 for the first down to just above the minimum score for the last; nothing the retriever
returned is cut for a low score. The answer is built by `scored.answer`, so it passes the output
guard by construction (reasons quote each chunk and name its rank) and goes through the same
post-pass as any other: ids verbatim, near-duplicates still removed, MMR with the caller's lambda.
It reads no text beyond what the reasons quote and calls nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..errors import Violation
from ..models import RerankRequest
from .base import Completion
from .scored import SCORE_DECIMALS, answer, minimum_score, worded


class InputOrderBackend:
    """Scores by first-stage rank (module docstring): the last resort of `fallback=[..., "input"]`."""

    name = "input"
    model: str | None = "first-stage-order"
    scored = True  # guard-valid by construction, never re-asked

    def rank(self, request: RerankRequest) -> dict[str, Any]:
        n = len(request.chunks)
        ranks = list(request.ranks) if request.ranks is not None else list(range(n))
        span = max(ranks, default=0) + 1
        floor = minimum_score(request)
        # Strictly above the floor for every rank: the last first-stage chunk is still kept.
        scores = [floor + (1.0 - floor) * (span - r) / span for r in ranks]

        def describe(i: int, score: float, phrase: str | None, matched: list[str]) -> str:
            tail = f" (first-stage rank {ranks[i] + 1})"
            return worded(phrase, matched, lambda quoted: f"first-stage rank {ranks[i] + 1}: {quoted}", tail)

        return answer(request, scores, describe, decimals=SCORE_DECIMALS)

    def complete(self, prompt: str, request: RerankRequest, *, max_tokens: int,
                 feedback: Sequence[Violation] = (), previous: str | None = None) -> Completion:
        return Completion(text=json.dumps(self.rank(request), ensure_ascii=False), model=self.model)

    async def acomplete(self, prompt: str, request: RerankRequest, *, max_tokens: int,
                        feedback: Sequence[Violation] = (), previous: str | None = None) -> Completion:
        return self.complete(prompt, request, max_tokens=max_tokens)

    def close(self) -> None:
        """Nothing to close (a backend's lifecycle, kept for uniformity)."""


__all__ = ["InputOrderBackend"]
