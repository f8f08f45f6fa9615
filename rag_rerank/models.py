"""The value types that cross module boundaries: immutable, so no stage can quietly edit
what an earlier stage decided."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import Attempt
from .frozen import direct_init
from .wording import scorer_words


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


@direct_init
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


@direct_init
@dataclass(frozen=True)
class Dropped:
    """One chunk left out of `ranked`, with a machine-readable reason (`token` or `token: detail`,
    see `rag_rerank.reasons`), so every input id is accounted for."""

    id: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "reason": self.reason}


def usage_tokens(usage: Mapping[str, int]) -> tuple[int, int]:
    """(prompt, completion) tokens of a reported usage, whichever names the server used."""
    prompt = int(usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0)
    completion = int(usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0)
    if prompt == 0 and completion == 0:
        prompt = int(usage.get("total_tokens", 0) or 0)
    return prompt, completion


def add_usage(*usages: Mapping[str, int]) -> dict[str, int]:
    """Token counts summed key by key: attempts of one call, windows of one run, and the failed
    calls before a fallback (a fallback's answer is free, the calls before it were not)."""
    out: dict[str, int] = {}
    for usage in usages:
        for key, value in usage.items():
            out[key] = out.get(key, 0) + int(value)
    return out


# What `meta.status` says of a result, best first (`RunMeta.status`).
STATUSES = ("ok", "repaired", "reasked", "fallback", "partial")


@direct_init
@dataclass(frozen=True)
class CallRecord:
    """One scorer call of a rerank as the engine decided and saw it: the one record `meta.status`,
    the spans and the log lines (`observe.py`) are views of. A call whose scorer failed and the
    calls of the fallback chain that followed it are records of their own, in the order made.

    `stage` is "call" (the only call), "window" or "final" (windows.py), `index` the window's number
    (the final pass's is the number of windows plus one; the only call's is 1), `pass_index` the
    consistency pass (None without `consistency=`). `role` is "primary" for the session's backend
    and "fallback" for a step of the chain (`scorer` names it). `attempts` are the requests made
    (none for a cache hit, nor for a call the budget refused), `usage` their tokens."""

    stage: str
    index: int
    scorer: str
    role: str = "primary"
    ok: bool = True
    attempts: tuple[Attempt, ...] = ()
    usage: Mapping[str, int] = field(default_factory=dict)
    model: str | None = None  # the model asked for (each attempt says which one answered)
    cached: bool = False
    error_type: str | None = None  # the failure's class when not ok (BackendError, EmbedderError, ...)
    refused: bool = False  # the budget refused its request
    size: int = 0  # chunks shown
    pass_index: int | None = None
    label: str = ""  # "window 2 of 3 (chunks 10-19)", "the final pass", "the call"
    repairs: tuple[str, ...] = ()
    start_ns: int = 0
    end_ns: int = 0

    @property
    def reasks(self) -> int:
        """Re-asks made: attempts whose answer the guard refused and that another attempt followed."""
        return sum(1 for a in self.attempts[:-1] if a.kind == "invalid_output")

    @property
    def failure(self) -> str:
        """How the call failed, in a few words without any text of it (safe for logs and spans): the
        last request's kind and the failure's class or HTTP status (`fatal: 401`), or the budget's
        refusal; "" when it did not fail."""
        if self.ok:
            return ""
        if self.refused:
            return "budget refused"
        last = self.attempts[-1] if self.attempts else None
        kind = last.kind if last is not None else "failed"
        detail = (last.error_type if last is not None and last.error_type else None) or self.error_type
        return f"{kind}: {detail}" if detail and detail != "BackendError" else kind

    @property
    def where(self) -> tuple[int | None, str, int]:
        """The call this record answers (the primary and its fallback steps share it)."""
        return (self.pass_index, self.stage, self.index)


@direct_init
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

    # Every scorer call the engine made for this result, in order (`CallRecord`): what `status`,
    # `fallback_reason`, `fallback_steps`, the spans and the logs are derived from. Not serialised
    # itself (`windows` and the derived fields say it in short).
    records: tuple[CallRecord, ...] = field(default=(), repr=False, compare=False)

    # --- views of the record ----------------------------------------------------------------

    @property
    def reasks(self) -> int:
        """Re-asks made over every call (an answer the guard refused, asked again with its errors)."""
        return sum(r.reasks for r in self.records)

    def _answered_by_fallback(self) -> tuple[int, int]:
        """(calls a fallback step answered, calls in all), over the records or, without them,
        `windows`' entries."""
        if self.records:
            calls: dict[tuple[int | None, str, int], bool] = {}
            for r in self.records:
                calls[r.where] = calls.get(r.where, False) or (r.role == "fallback" and r.ok)
            return sum(calls.values()), len(calls)
        if self.windows:
            return sum(1 for w in self.windows if w.get("fallback")), len(self.windows)
        return (1, 1) if self.fallback else (0, 1)

    @property
    def status(self) -> str:
        """How this result came, in one word (`STATUSES`), the worst that happened:
        `partial` (some calls, not all, were answered by the fallback chain: a window failed),
        `fallback` (every call was, or the embedder failed and lexical vectors stood in),
        `reasked` (the model was asked again with the guard's errors), `repaired` (an answer was
        mended by the output repairs), else `ok`."""
        fell, calls = self._answered_by_fallback()
        if fell:
            return "fallback" if fell == calls else "partial"
        if self.embedder_fallback:
            return "fallback"
        if self.reasks:
            return "reasked"
        if self.repairs:
            return "repaired"
        return "ok"

    @property
    def fallback_reason(self) -> str | None:
        """Why the fallback answered, from the record, in words that carry no text of the request or
        the server's reply (safe for logs and spans): who failed, in how many calls, how; None when
        nothing fell back."""
        failed = [r for r in self.records if not r.ok and r.role == "primary"]
        parts = []
        if failed:
            first = failed[0]
            kinds = ", ".join(dict.fromkeys(r.failure for r in failed))
            calls = len({r.where for r in self.records})
            where = f" in {len(failed)} of {calls} calls" if calls > 1 else ""
            parts.append(f"{first.scorer} failed{where} ({kinds})")
        elif self.fallback:  # a meta made without records (one put together by hand)
            parts.append(f"{self.backend} failed")
        if self.embedder_fallback:
            parts.append(f"the embedder failed: {self.embedder_fallback} vectors used")
        return "; ".join(parts) or None

    @property
    def fallback_steps(self) -> tuple[dict[str, Any], ...]:
        """Each call the fallback chain answered or tried: the call (`stage`, `index`, `pass` with
        consistency) and its steps in order, `{"scorer", "ok", "error"?}`, the failed primary first."""
        calls: dict[tuple[int | None, str, int], list[CallRecord]] = {}
        for r in self.records:
            calls.setdefault(r.where, []).append(r)
        out = []
        for (pass_index, stage, index), records in calls.items():
            if len(records) < 2:
                continue
            steps = [{"scorer": r.scorer, "ok": r.ok, **({} if r.ok else {"error": r.failure})}
                     for r in records]
            entry: dict[str, Any] = {"stage": stage, "index": index}
            if pass_index is not None:
                entry["pass"] = pass_index
            out.append({**entry, "steps": steps})
        return tuple(out)

    @property
    def tokens(self) -> dict[str, int]:
        """`{"input_tokens", "output_tokens"}` the calls consumed (Cohere's `meta.tokens`); a cache
        hit's tokens count, as in `usage`."""
        prompt, completion = usage_tokens(self.usage)
        return {"input_tokens": prompt, "output_tokens": completion}

    def billed_units(self, documents: int = 1) -> dict[str, int]:
        """Cohere's `meta.billed_units` for a rerank of `documents`: search units as Cohere counts
        them (one per query of up to 100 documents), and the tokens requests were billed for:
        `tokens` less what the response cache answered (a hit sends no request)."""
        saved = [usage_tokens(r.usage) for r in self.records if r.cached]
        prompt, completion = usage_tokens(self.usage)
        return {"search_units": max(1, math.ceil(documents / 100)),
                "input_tokens": max(0, prompt - sum(p for p, _ in saved)),
                "output_tokens": max(0, completion - sum(c for _, c in saved))}

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
            "status": self.status,
            "fallback_reason": self.fallback_reason,
            "fallback_steps": [dict(s) for s in self.fallback_steps],
        }

    def status_notice(self, how: str = "fallback local") -> str | None:
        """One line for any `status` but ok (None for ok): what replaced the backend's answer
        (`fallback_notice`), or that the model was re-asked or its answer repaired. The CLI prints
        it on stderr: a result that looks like any other must not hide how it came."""
        status = self.status
        if status == "ok":
            return None
        if status in ("fallback", "partial"):
            return self.fallback_notice(how) or f"meta.status {status}: {self.fallback_reason}"
        if status == "reasked":
            n = self.reasks
            return (f"the model was re-asked {n} time{'s' if n != 1 else ''}: the output guard refused its "
                    "answer (meta.status reasked)")
        return f"the model's answer was repaired: {'; '.join(self.repairs)[:400]} (meta.status repaired)"

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
            who = (scorer_words(self.fallback) if "," not in self.fallback
                   else f"the fallback chain ({self.fallback})")
            parts.append(f"{what} ranked by {who} ({how}): {why[:400]}")
        if self.embedder_fallback:
            why = next((n for n in self.notes if n.startswith("embedder ")), "the embedder failed")
            parts.append(why[:400].replace("(fallback local)", f"({how})"))
        return "; ".join(parts) or None


@direct_init
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

    def to_cohere(self, *, request_id: str | None = None, top_n: int | None = None) -> dict[str, Any]:
        """The result in the shape of Cohere's `/v2/rerank` response, for proxies and clients built
        on it: `results` (each ranked chunk's `index` in the caller's list and its
        `relevance_score`, best first, at most `top_n`) and `meta` with `billed_units` (search units,
        the tokens requests were billed for) and `tokens` (what the calls consumed), plus rag-rerank's
        own `status` (and `fallback_reason` when a fallback answered, and `evidence` when long chunks
        were shown as their evidence: `meta.evidence` as a list with each chunk's `index`), which
        Cohere's clients ignore.

        The caller's order is `scores`' (every input id, in input order); a result made by hand
        without `scores` counts ranked then dropped ids."""
        order = list(self.scores) or [*(r.id for r in self.ranked), *(d.id for d in self.dropped)]
        index = {cid: i for i, cid in enumerate(order)}
        shown = self.ranked if top_n is None else self.ranked[:max(0, int(top_n))]
        meta: dict[str, Any] = {"api_version": {"version": "2"},
                                "billed_units": self.meta.billed_units(len(order)),
                                "tokens": self.meta.tokens, "status": self.meta.status}
        if self.meta.fallback_reason:
            meta["fallback_reason"] = self.meta.fallback_reason
        if self.meta.evidence:  # the long chunks shown as their evidence, by the caller's index
            shortened = self.meta.evidence.items()
            meta["evidence"] = sorted(({"index": index[cid], **dict(ev)} for cid, ev in shortened),
                                      key=lambda e: e["index"])
        out: dict[str, Any] = {"results": [{"index": index[r.id], "relevance_score": r.score} for r in shown],
                               "meta": meta}
        if request_id is not None:
            out = {"id": request_id, **out}
        return out


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
        return tuple([c.id for c in self.chunks])  # a list first: faster than a generator

    def with_top_k(self, top_k: int) -> RerankRequest:
        """This request asking for `top_k`: what `dataclasses.replace(self, top_k=top_k)` makes,
        without its pass over every field by reflection (every call is asked so, `windows.asked`).
        There is no `__post_init__` to run; `tests/test_models.py` pins that the two agree. The new
        instance dict is set whole, as `Options.merged` sets its own: filled key by key, CPython
        3.11 keeps a dict's keys shared with the class's, and every later read of a field of that
        request then misses the specialised attribute load (about three times the instructions per
        read; requests are read often)."""
        out = object.__new__(type(self))
        object.__setattr__(out, "__dict__", {**self.__dict__, "top_k": top_k})
        return out

    def own_text(self, chunk: Chunk) -> str:
        """`chunk`'s text as the caller gave it (without any embedded meta values): what reasons quote."""
        return chunk.text if self.own_texts is None else self.own_texts.get(chunk.id, chunk.text)
