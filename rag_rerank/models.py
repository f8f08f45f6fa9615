"""The value types that cross module boundaries: immutable, so no stage can quietly edit
what an earlier stage decided."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Chunk:
    """One candidate as the caller gave it. `id` is never normalised in any way."""

    id: str
    text: str
    score: float | None = None
    meta: Mapping[str, Any] | None = None
    embedding: tuple[float, ...] | None = None

    def prompt_record(self) -> dict[str, Any]:
        """The record shown to the LLM: the caller's fields minus the embedding (vectors only cost tokens)."""
        rec: dict[str, Any] = {"id": self.id, "text": self.text}
        if self.score is not None:
            rec["score"] = self.score
        if self.meta is not None:
            rec["meta"] = dict(self.meta)
        return rec


@dataclass(frozen=True)
class Ranked:
    """One kept chunk of a result: its id byte for byte, a score in (min_score, 1], a reason that
    cites the chunk's own text, and a `diversity_note` when the post-pass moved or kept it for
    diversity. `to_dict()` is the card's output item."""

    id: str
    score: float
    reason: str
    diversity_note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "score": self.score, "reason": self.reason}
        if self.diversity_note:
            out["diversity_note"] = self.diversity_note
        return out


@dataclass(frozen=True)
class Dropped:
    """One chunk left out of `ranked`, with a machine-readable reason (`token` or `token: detail`,
    see `rag_rerank.reasons`), so every input id is accounted for."""

    id: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "reason": self.reason}


def add_usage(*usages: Mapping[str, int]) -> dict[str, int]:
    """Token counts summed key by key: attempts of one call, windows of one run, and the failed
    calls before a fallback (a fallback's answer is free, the calls before it were not)."""
    out: dict[str, int] = {}
    for usage in usages:
        for key, value in usage.items():
            out[key] = out.get(key, 0) + int(value)
    return out


@dataclass(frozen=True)
class RunMeta:
    """How a result was produced. Kept apart from the schema object so it never leaks into it."""

    backend: str = "local"
    model: str | None = None
    attempts: int = 1
    repairs: tuple[str, ...] = ()
    usage: Mapping[str, int] = field(default_factory=dict)
    latency_ms: float = 0.0
    fallback: str | None = None
    embedder: str | None = None
    notes: tuple[str, ...] = ()
    # Prompts sent: 1, or with `window_size` one per window plus the final pass (`attempts` also
    # counts retries and fallbacks). `windows` holds one entry per window and one for the final
    # pass: {"stage", "index", "chunks": [first, end), "attempts", "usage", "survivors", "fallback"}.
    calls: int = 1
    windows: tuple[Mapping[str, Any], ...] = ()
    # "lexical" when the embedder asked for (an `openai` server) failed and `fallback="local"` put
    # lexical vectors in its place (the post-pass's, and the local scorer's); `notes` says why.
    embedder_fallback: str | None = None
    # With a response cache (`cache=`): {"hits", "misses", "saved_tokens"} over the backend's calls;
    # a hit made no request (it counts no attempt) and its tokens are still in `usage`. None without one.
    cache: Mapping[str, int] | None = None
    # With `calibration=`: {"method", "file", "version"} of the map applied to the backend's scores.
    calibration: Mapping[str, Any] | None = None
    # With `consistency=k` (k > 1): {"passes", "aggregate", "agreement", "taus"}; agreement is the
    # mean Kendall tau between the passes' scores.
    consistency: Mapping[str, Any] | None = None
    # With chunks shown as their evidence (`max_tokens_per_chunk`, or to meet the context budget):
    # per shortened chunk id {"tokens_before", "tokens_after", "budget", "mode", "passages": [[start,
    # end], ...] (character offsets into the caller's text), "best": [start, end]}. None when none was.
    evidence: Mapping[str, Mapping[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = self._base_dict()
        if self.evidence is not None:
            out["evidence"] = {k: dict(v) for k, v in self.evidence.items()}
        # Only when used, so a result without them serialises as it always did.
        if self.calibration is not None:
            out["calibration"] = dict(self.calibration)
        if self.consistency is not None:
            out["consistency"] = dict(self.consistency)
        return out

    def _base_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "model": self.model,
            "attempts": self.attempts,
            "repairs": list(self.repairs),
            "usage": dict(self.usage),
            "latency_ms": round(self.latency_ms, 3),
            "fallback": self.fallback,
            "embedder": self.embedder,
            "notes": list(self.notes),
            "calls": self.calls,
            "windows": [dict(w) for w in self.windows],
            "embedder_fallback": self.embedder_fallback,
            "cache": None if self.cache is None else dict(self.cache),
        }

    def fallback_notice(self, how: str = "fallback local") -> str | None:
        """What `fallback="local"` replaced in this result, in one line, or None when nothing was.

        A result the fallback answered looks exactly like the backend's own (same schema, exit 0),
        so each surface says it in these words: the CLI on stderr, the MCP tool result to the
        calling model. `how` names the option the way that surface spells it (`--fallback local`)."""
        parts = []
        if self.fallback:
            fell = [w for w in self.windows if w.get("fallback")]
            what = (f"{len(fell)} of {len(self.windows)} calls {'was' if len(fell) == 1 else 'were'}" if fell
                    else "the result is")
            why = next((n for n in self.notes if " failed after " in n), f"{self.backend} failed")
            parts.append(f"{what} ranked by the local backend ({how}): {why[:400]}")
        if self.embedder_fallback:
            why = next((n for n in self.notes if n.startswith("embedder ")), "the embedder failed")
            parts.append(why[:400].replace("(fallback local)", f"({how})"))
        return "; ".join(parts) or None


@dataclass(frozen=True)
class RerankResult:
    """The answer: `ranked` and `dropped` (the card's object, `to_dict()`), `meta` (how it was
    produced) and `scores`: every input id with the relevance score its scorer gave it, ranked or
    not, or, for a chunk that has none, a short text saying why (the model dropped it without a
    score, or left it out). Rerankers that return a number per candidate (Cohere, FlashRank) are
    what users compare with: `scores` is that number, `full_order()` the order it gives."""

    ranked: tuple[Ranked, ...]
    dropped: tuple[Dropped, ...] = ()
    meta: RunMeta = field(default_factory=RunMeta)
    scores: Mapping[str, float | str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Exactly the card's output schema; `meta` and `scores` are deliberately absent."""
        return {"ranked": [r.to_dict() for r in self.ranked], "dropped": [d.to_dict() for d in self.dropped]}

    def full_order(self) -> list[str]:
        """Every input id: the ranked ones in their order, then the rest by score, best first (ties
        and ids without a score in `dropped` order): for callers who reorder rather than filter."""
        ranked = [r.id for r in self.ranked]
        rest = [d.id for d in self.dropped]
        position = {cid: i for i, cid in enumerate(rest)}

        def key(cid: str) -> tuple[int, float, int]:
            score = self.scores.get(cid)
            return (0, -score, position[cid]) if isinstance(score, float) else (1, 0.0, position[cid])

        return ranked + sorted(rest, key=key)

    def to_json(self, indent: int | None = None, scores: bool = False) -> str:
        """The card's object as JSON; with `scores`, a `"scores"` key beside `ranked` and `dropped`."""
        obj = self.to_dict()
        if scores:
            obj["scores"] = dict(self.scores)
        return json.dumps(obj, ensure_ascii=False, indent=indent)

    @property
    def ids(self) -> list[str]:
        return [r.id for r in self.ranked]


@dataclass(frozen=True)
class RerankRequest:
    """A request that passed the input guard: everything downstream may trust it."""

    query: str
    chunks: tuple[Chunk, ...]
    top_k: int
    lambda_: float
    # The first-stage rank (0-based position in the caller's whole list) of each chunk; None means
    # chunks[i] is at rank i. Windows (windows.py) set it, so a scorer that uses the retriever's
    # order (the local backend's prior) sees a window's or the survivors' true ranks, not 0..n-1.
    ranks: tuple[int, ...] | None = None
    # The caller's own text by chunk id when `chunks[i].text` has meta values put before it
    # (`embed_meta_fields`, fusion.with_embedded_meta); None means every text is the caller's.
    # A scorer may read the prefixed text, but a reason must quote the chunk, not its title.
    own_texts: Mapping[str, str] | None = field(default=None, hash=False)
    # The minimum score in force (`limits.min_score`): a scorer drops what is at or below it, the
    # output guard refuses it in `ranked`. None means the contract's own (`guard/limits.json`).
    min_score: float | None = None

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.chunks)

    def own_text(self, chunk: Chunk) -> str:
        """`chunk`'s text as the caller gave it (without any embedded meta values): what reasons quote."""
        return chunk.text if self.own_texts is None else self.own_texts.get(chunk.id, chunk.text)
