"""More candidates than one prompt takes: parallel windows, one final pass, then the post-pass.

With `window_size=W` and N > W candidates, `rerank`/`arerank` run

    windows   consecutive slices of at most W chunks in input order, each an ordinary call
              (its own candidate_k, output guard, retries), all in flight at once up to the
              concurrency bound (`concurrency.py`)
    survivors every chunk a window ranked above the minimum score, best window score first (ties:
              input order), at most W of them and no more than the token budget holds
    final     ONE call over the survivors, shown in input order, for the global ranking
    post-pass MMR and near-duplicates over the survivors (so across windows), as for any request

that is ceil(N / W) + 1 calls in two round trips, against about (N - 20) / 10 + 1 sequential calls
for a 20/10 sliding window (RankGPT, rank_llm). It works because the card's scores are on an
absolute scale: a 0.8 in one window means what a 0.8 means in another, so windows need not see
each other. The final pass fixes what they could not judge: one ordering of the best of all.

Survivors are shown to the final call in input order rather than by window score: it keeps the
first-stage order meaningful for a scorer that uses it (the local backend's prior), and does not
hand an LLM the windows' verdicts as a position bias.

Accounting: every input id is once in `ranked` or `dropped`. A chunk that lost in its window gets
one of these reasons (the `token: detail` grammar of every dropped reason):

* `below_min_score: window 2 of 5 scored it 0.150` (or dropped it with the model's own words);
* `not_in_final: window 2 of 5 scored it 0.410; the final pass took the best 20 (down to 0.550)`;
* `not_in_final: window 2 of 5 scored it 0.900; the final prompt's token budget was full`;
* `not_in_final: window 2 of 5 dropped it (<the model's reason>)`;
* `redundant_with:<id>` when its window called it a duplicate of a chunk that ended up ranked.

Survivors get the post-pass's reasons (`redundant_with:`, `not_selected`, ...).

Failure: a window whose call fails after its retries is ranked by the local backend when
`fallback="local"` (the window's entry in `meta.windows` says `"fallback": "local"`, and
`meta.notes` carries the error); otherwise the request fails with a `BackendError` that names the
window (`window 2 of 5 (chunks[40:80]): ...`). The final pass fails or falls back the same way.

This module holds the arithmetic on requests: what each call is asked (`asked`: a request with
top_k = candidate_k), how a request is cut into windows, which chunks survive them, and the reason
of each that did not; and the windowed request's flow (`windowed_flow`), which yields its calls as
the engine's other flows do (no I/O here either): the windows, the final pass, then the assembly of
their answers into one result and its `meta.windows`. The fallback of a failed window is decided
in `fallback.py`, as for every call.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .backends.factory import model_of
from .errors import BackendError, EmbedderError
from .evidence import TokenCounter
from .fallback import Answer, answers
from .guard.limits import Limits
from .meta import cache_meta, run_meta, scores_of, scoring_notes
from .models import CallRecord, Dropped, RerankRequest, RerankResult, add_usage
from .reasons import BELOW_MIN_SCORE, NOT_IN_FINAL, redundant_target
from .redaction import failure_summary, redacted
from .refill import postpass_refilled
from .render import render
from .retry import Outcome
from .shortening import chunk_tokens, token_counter, tokens_over
from .steps import Flow, Plan, Progress
from .tokens import estimate_tokens
from .wording import counted, scorer_words

BELOW_MIN = BELOW_MIN_SCORE
_REASON_CHARS = 120  # a window model's own reason quoted in a loser's detail is cut to this

# Called as `progress(calls_done, calls_total)` after each window call and after the final pass, in
# the caller's thread, by the synchronous `rerank`: 1,000 candidates are 21 LLM calls, a minute or
# more of silence without it. `rag-rerank rerank` sets it to a progress bar when stderr is a
# terminal; None (the default) reports nothing. (`batch` has its own bar, per request.)
WINDOW_PROGRESS: contextvars.ContextVar[Callable[[int, int], None] | None] = contextvars.ContextVar(
    "WINDOW_PROGRESS", default=None)
"""`callback(calls_done, calls_total)` for a synchronous windowed `rerank`; `.set()` it, as for any
`contextvars.ContextVar` (assigning to the name replaces the variable), and `.reset()` it after."""


def candidate_k(n_chunks: int, top_k: int, copies: int = 0) -> int:
    """How many ranked candidates to ask the model for.

    More than `top_k`: the post-pass picks the final `top_k`, and if the model only returned
    `top_k`, removing one near-duplicate would leave MMR nothing to promote in its place. So
    `candidate_k = min(n, max(2 * top_k, top_k + 5) + copies)`, and the output guard judges the
    answer against that number. `copies` is how many chunks repeat an earlier chunk's text exactly:
    they score alike, the post-pass drops all but one, so each gets a slot of its own instead of
    crowding out a distinct chunk (ten copies of the answer would otherwise fill the list)."""
    return max(1, min(n_chunks, max(2 * top_k, top_k + 5) + max(copies, 0)))


def asked(request: RerankRequest) -> RerankRequest:
    """`request` as one call is asked it: top_k = its candidate_k."""
    chunks = request.chunks
    copies = len(chunks) - len({c.text for c in chunks})
    return request.with_top_k(candidate_k(len(chunks), request.top_k, copies))


@dataclass(frozen=True)
class Window:
    """One call's share of the request: `ask` is the slice with top_k = its candidate_k."""

    index: int  # 1-based; the final pass is index total + 1
    total: int
    first: int  # chunks[first:end] of the request
    end: int
    ask: RerankRequest
    prompt: str
    final: bool = False

    @property
    def label(self) -> str:
        if self.final:
            return f"final pass over {counted(len(self.ask.chunks), 'survivor')}"
        return f"window {self.index} of {self.total} (chunks[{self.first}:{self.end}])"

    @property
    def name(self) -> str:
        return "the final pass" if self.final else f"window {self.index} of {self.total}"


def windowed(request: RerankRequest, window_size: int | None) -> bool:
    """Whether `request` is ranked in windows: only when it has more candidates than one window."""
    return window_size is not None and len(request.chunks) > window_size


def split(request: RerankRequest, window_size: int) -> list[Window]:
    """Consecutive windows of at most `window_size` chunks, in input order."""
    n = len(request.chunks)
    total = -(-n // window_size)
    out = []
    for index, first in enumerate(range(0, n, window_size), start=1):
        end = min(first + window_size, n)
        ask = asked(replace(request, chunks=request.chunks[first:end], ranks=tuple(range(first, end))))
        out.append(Window(index, total, first, end, ask, render(ask)))
    return out


@dataclass(frozen=True)
class Survivors:
    """Which chunks go to the final pass, and the reasons of those that do not."""

    indices: tuple[int, ...]  # request positions, input order
    reasons: Mapping[int, str]  # position -> dropped reason, for the windows' losers
    window_dropped: Mapping[int, tuple[Window, str]]  # position -> (window, the model's own reason)


def _quoted(reason: str) -> str:
    text = " ".join(str(reason).split())
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


def select_survivors(request: RerankRequest, limits: Limits, windows: Sequence[Window],
                     answers: Sequence[Mapping[str, Any]], size: int,
                     count: TokenCounter = estimate_tokens) -> Survivors:
    """The best `size` window scores (ties: input order) above the minimum whose chunks fit the token
    budget of one prompt; everything else with its reason (module docstring). `request` holds the
    texts the scorer saw (with `embed_meta_fields`), `answers` each window's guarded answer. The
    prompt is counted as the input guard and the shortening count it (`shortening.prompt_tokens`,
    with `count`: the caller's tokenizer or the package's estimate), so a final pass the packing
    lets through is never one the guard would refuse."""
    floor = limits.min_score
    entries: list[tuple[float, int, Window]] = []
    reasons: dict[int, str] = {}
    window_dropped: dict[int, tuple[Window, str]] = {}
    for window, answer in zip(windows, answers, strict=True):
        ranked = {r["id"]: float(r["score"]) for r in answer.get("ranked", ())}
        own = {d["id"]: d["reason"] for d in answer.get("dropped", ()) or ()}
        for i in range(window.first, window.end):
            cid = request.chunks[i].id
            if cid in ranked and ranked[cid] > floor:
                entries.append((ranked[cid], i, window))
            elif cid in ranked:
                reasons[i] = f"{BELOW_MIN}: {window.name} scored it {ranked[cid]:.3f}"
            else:
                window_dropped[i] = (window, own.get(cid, ""))
    entries.sort(key=lambda e: (-e[0], e[1]))
    taken = _packed(request, entries, size, limits.max_context_tokens, count, reasons)
    cut = taken[-1][0] if taken else 0.0
    chosen = {i for _, i, _ in taken}
    for score, i, window in entries:
        if i not in chosen and i not in reasons:
            reasons[i] = (f"{NOT_IN_FINAL}: {window.name} scored it {score:.3f}; the final pass took the "
                          f"best {len(taken)} (down to {cut:.3f})")
    return Survivors(tuple(sorted(chosen)), reasons, window_dropped)


def _packed(request: RerankRequest, entries: Sequence[tuple[float, int, Window]], size: int, budget: int,
            count: TokenCounter, reasons: dict[int, str]) -> list[tuple[float, int, Window]]:
    """The entries taken best first while the prompt fits `budget` (at most `size`); a skipped one
    gets its reason in `reasons`. When the best `size` fit together (by the byte bound alone, most
    often: `shortening.tokens_over`), they are the answer without counting one by one."""
    best = list(entries[:size])
    if tokens_over(request.query, [request.chunks[i] for _, i, _ in best], budget, count) is None:
        return best
    taken: list[tuple[float, int, Window]] = []
    used = count(request.query)
    for score, i, window in entries:
        if len(taken) == size:
            break
        tokens = chunk_tokens(request.chunks[i], count)
        if used + tokens <= budget:
            taken.append((score, i, window))
            used += tokens
        else:
            reasons[i] = (f"{NOT_IN_FINAL}: {window.name} scored it {score:.3f}; "
                          "the final prompt's token budget was full")
    return taken


def loser_reason(window: Window, own: str, ranked_ids: set[str]) -> str:
    """A chunk its window dropped: the window's `redundant_with:` if it names a ranked chunk,
    otherwise `below_min_score` / `not_in_final` with the model's own words as the detail."""
    if redundant_target(own) in ranked_ids:
        return own
    token = BELOW_MIN if own.startswith(BELOW_MIN) else NOT_IN_FINAL
    said = f" ({_quoted(own)})" if own else ""
    return f"{token}: {window.name} dropped it{said}"


def final_window(request: RerankRequest, survivors: Survivors, total: int) -> Window:
    """The final pass: one call over the survivors, shown in input order."""
    chunks = tuple(request.chunks[i] for i in survivors.indices)
    ask = asked(replace(request, chunks=chunks, ranks=survivors.indices))
    return Window(total + 1, total, 0, len(chunks), ask, render(ask), final=True)


# --------------------------------------------------------------------------- the windowed flow


@dataclass(frozen=True)
class Scored:
    """One window's (or the final pass's) guard-valid answer and how it came."""

    obj: Mapping[str, Any]
    attempts: int
    repairs: tuple[str, ...]
    usage: Mapping[str, int]
    model: str | None
    latency_ms: float
    notes: tuple[str, ...] = ()
    fallback: str | None = None
    note: str | None = None  # why the fallback answered
    offline: Plan | None = None  # the plan with the lexical embedder, when the embedder failed here
    cached: bool = False  # the response cache answered it
    records: tuple[CallRecord, ...] = ()  # the calls made for it (fallback.Answer.records)
    decided: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # `Completion.decided`


def _scored(outcome: Outcome, records: tuple[CallRecord, ...], fallback: str | None = None,
            note: str | None = None, failed: BackendError | None = None,
            offline: Plan | None = None) -> Scored:
    """A call's answer, with the time the call that gave it took (the driver's measure) and the
    calls made for it; after a fallback, `failed` is the backend's failure, whose attempts and
    tokens count too."""
    attempts, usage = len(outcome.attempts), dict(outcome.usage)
    if failed is not None:
        attempts, usage = attempts + len(failed.attempts), add_usage(failed.usage, usage)
    return Scored(outcome.obj, attempts, tuple(outcome.repairs), usage, outcome.model,
                  outcome.latency_ms, tuple(outcome.notes), fallback, note, offline,
                  outcome.cached and failed is None, records, outcome.decided)


def windowed_flow(plan: Plan) -> Flow:
    """Windows scored concurrently, one final pass over the survivors, the post-pass over them."""
    assert plan.window_size is not None
    windows = split(plan.view, plan.window_size)
    concurrency = plan.settings.concurrency
    # Threads for the synchronous driver: the local backend is CPU-bound (the GIL would only add
    # switching), a remote one waits on the network.
    workers = 1 if plan.backend_name == "local" else max(1, min(concurrency, len(windows)))
    total = len(windows) + 1
    got = yield from answers(plan, [(w.ask, w.prompt, w.label) for w in windows], workers=workers,
                             limit=concurrency, progress=(0, total),
                             where=[("window", w.index) for w in windows])
    scored = [_window_answer(plan, w, a) for w, a in zip(windows, got, strict=True)]
    survivors = select_survivors(plan.view, plan.limits, windows, [s.obj for s in scored], plan.window_size,
                                 count=token_counter(plan.options.tokenizer))
    final = None
    if survivors.indices:
        window = final_window(plan.view, survivors, len(windows))
        (answer,) = yield from answers(plan, [(window.ask, window.prompt, window.label)], workers=1,
                                       limit=concurrency, where=[("final", window.index)])
        final = (window, _window_answer(plan, window, answer))
    yield Progress(total, total)
    return (yield from _assemble(plan, windows, scored, survivors, final))


def _window_answer(plan: Plan, window: Window, answer: Answer) -> Scored:
    """A window's (or the final pass's) answer, or its failure raised with the window named."""
    if answer.outcome is None:
        error = answer.error
        if isinstance(error, BackendError):
            raise _named(plan, window, error)
        raise error  # type: ignore[misc]
    if answer.error is None:
        return _scored(answer.outcome, answer.records)
    error, used = answer.error, answer.used
    assert isinstance(error, BackendError) and used is not None
    offline = used if used.embedder_note is not None else None
    if isinstance(error, EmbedderError) and plan.backend_name == "local":
        return _scored(answer.outcome, answer.records, failed=error, offline=offline)
    summary = failure_summary(error, plan.setup.api_key)
    note = (f"{window.name}: {plan.backend_name} failed after {counted(len(error.attempts), 'attempt')}, "
            f"ranked by {scorer_words(answer.step)}: {summary}")
    return _scored(answer.outcome, answer.records, answer.step, note, error, offline)


def _named(plan: Plan, window: Window, error: BackendError) -> BackendError:
    """The failure with the window it happened in at the front, API keys removed."""
    clean = redacted(error, plan.setup.api_key)
    head = str(clean).split(" [#", 1)[0]
    return BackendError(f"{window.label}: {head}", clean.attempts, usage=clean.usage, refused=clean.refused)


def _entry(window: Window, answer: Scored, survivors: Survivors | None, cache: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"stage": "final" if window.final else "window", "index": window.index,
                             "size": len(window.ask.chunks)}
    if not window.final:
        entry["chunks"] = [window.first, window.end]
        if survivors is not None:
            entry["survivors"] = sum(1 for i in survivors.indices if window.first <= i < window.end)
    entry.update({"attempts": answer.attempts, "usage": dict(answer.usage), "fallback": answer.fallback,
                  "latency_ms": round(answer.latency_ms, 3)})
    if cache:
        entry["cached"] = answer.cached
    return entry


def _assemble(plan: Plan, windows: Sequence[Window], scored: Sequence[Scored], survivors: Survivors,
              final: tuple[Window, Scored] | None) -> Flow:
    """The post-pass over the survivors, the losers' reasons, and the meta of every call."""
    request = plan.request
    # Once the embedder failed in a window, the rest of the request compares lexical vectors too.
    plan = next((a.offline for a in (*scored, *([final[1]] if final else [])) if a.offline), plan)
    if final is not None:
        window, answer = final
        kept = survivors.indices
        sub = replace(plan, request=replace(request, chunks=tuple(request.chunks[i] for i in kept)))
        shown = replace(plan.view, chunks=window.ask.chunks)
        result, sub = yield from postpass_refilled(sub, answer.obj, shown, window.ask)
        plan = replace(plan, embedder=sub.embedder, embedder_note=sub.embedder_note)
    else:  # no chunk scored above the minimum in any window: nothing to rank
        result = RerankResult(ranked=())
    ranked_ids = {r.id for r in result.ranked}
    reason_of = {d.id: d.reason for d in result.dropped}
    for i, why in survivors.reasons.items():
        reason_of[request.chunks[i].id] = why
    for i, (window, own) in survivors.window_dropped.items():
        reason_of[request.chunks[i].id] = loser_reason(window, own, ranked_ids)
    dropped = tuple(Dropped(c.id, reason_of[c.id]) for c in request.chunks if c.id not in ranked_ids)

    calls = [*zip(windows, scored, strict=True), *([final] if final is not None else [])]
    usage = add_usage(*(answer.usage for _, answer in calls))
    repairs = [f"{w.name}: {r}" for w, a in calls for r in a.repairs]
    notes = [a.note for _, a in calls if a.note] + scoring_notes(plan)
    notes.append(f"windows: {len(windows)} of at most {counted(windows[0].end - windows[0].first, 'chunk')}, "
                 f"{counted(len(survivors.indices), 'survivor')}"
                 + (", final pass skipped (no chunk above the minimum score)" if final is None else ""))
    model = next((a.model for w, a in reversed(calls) if a.fallback is None and a.model), None)
    cache = cache_meta(plan, [(a.cached, a.usage) for _, a in calls])
    steps = [a.fallback for _, a in calls if a.fallback]
    meta = run_meta(plan, model=model or model_of(plan.backend),
                    attempts=sum(a.attempts for _, a in calls), repairs=repairs, usage=usage,
                    fallback=", ".join(dict.fromkeys(steps)) or None, notes=notes,
                    calls=len(calls),
                    windows=tuple(_entry(w, a, survivors, cache is not None) for w, a in calls),
                    cache=cache, records=[r for _, a in calls for r in a.records],
                    # the last call that scored a chunk decided its score: the final pass's, else its window's
                    decided={cid: span for _, a in calls for cid, span in a.decided.items()})
    meta = replace(meta, embedder=result.meta.embedder or meta.embedder,
                   notes=(*meta.notes, *result.meta.notes))
    objs = [a.obj for a in scored] + ([final[1].obj] if final is not None else [])
    return RerankResult(ranked=result.ranked, dropped=dropped, meta=meta,
                        scores=scores_of(request, objs, result.ranked))


__all__ = ["NOT_IN_FINAL", "WINDOW_PROGRESS", "Scored", "Survivors", "Window", "asked", "candidate_k",
           "final_window", "loser_reason", "select_survivors", "split", "windowed", "windowed_flow"]
