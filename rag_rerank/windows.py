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
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .concurrency import call_slot
from .errors import BackendError, EmbedderError
from .models import Dropped, RerankRequest, RerankResult, add_usage
from .postpass import BELOW_MIN, REDUNDANT
from .reasons import NOT_IN_FINAL
from .render import render
from .wording import counted

if TYPE_CHECKING:
    from .rerank import _Plan

_REASON_CHARS = 120  # a window model's own reason quoted in a loser's detail is cut to this

# Called as `progress(calls_done, calls_total)` after each window call and after the final pass, in
# the caller's thread, by the synchronous `rerank` (`run_windows`): 1,000 candidates are 21 LLM
# calls, a minute or more of silence without it. `rag-rerank rerank` sets it to a progress bar when
# stderr is a terminal; None (the default) reports nothing. (`batch` has its own bar, per request.)
WINDOW_PROGRESS: contextvars.ContextVar[Callable[[int, int], None] | None] = contextvars.ContextVar(
    "WINDOW_PROGRESS", default=None)
"""`callback(calls_done, calls_total)` for a synchronous windowed `rerank`; `.set()` it, as for any
`contextvars.ContextVar` (assigning to the name replaces the variable), and `.reset()` it after."""


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


@dataclass(frozen=True)
class Scored:
    """A window's (or the final pass's) guard-valid answer and how it was obtained."""

    obj: Mapping[str, Any]
    attempts: int
    repairs: tuple[str, ...]
    usage: Mapping[str, int]
    model: str | None
    latency_ms: float
    fallback: str | None = None
    note: str | None = None  # why the fallback answered
    offline: _Plan | None = None  # the plan with the lexical embedder, when the embedder failed here


def windowed(request: RerankRequest, window_size: int | None) -> bool:
    """Whether `request` is ranked in windows: only when it has more candidates than one window."""
    return window_size is not None and len(request.chunks) > window_size


def _ask(request: RerankRequest) -> RerankRequest:
    from .rerank import candidate_k

    copies = len(request.chunks) - len({c.text for c in request.chunks})
    return replace(request, top_k=candidate_k(len(request.chunks), request.top_k, copies))


def split(request: RerankRequest, window_size: int) -> list[Window]:
    """Consecutive windows of at most `window_size` chunks, in input order."""
    n = len(request.chunks)
    total = -(-n // window_size)
    out = []
    for index, first in enumerate(range(0, n, window_size), start=1):
        end = min(first + window_size, n)
        ask = _ask(replace(request, chunks=request.chunks[first:end], ranks=tuple(range(first, end))))
        out.append(Window(index, total, first, end, ask, render(ask)))
    return out


# --------------------------------------------------------------------------- one call


def _scored(outcome: Any, started: float, fallback: str | None = None, note: str | None = None,
            failed: BackendError | None = None, offline: _Plan | None = None) -> Scored:
    """One window's answer; after a fallback, `failed` is the backend's failure, whose attempts
    and tokens count too (the window's entry and meta said 1 attempt and no usage after 3 calls)."""
    attempts, usage = len(outcome.attempts), dict(outcome.usage)
    if failed is not None:
        attempts, usage = attempts + len(failed.attempts), add_usage(failed.usage, usage)
    return Scored(outcome.obj, attempts, tuple(outcome.repairs), usage,
                  outcome.model, (time.perf_counter() - started) * 1000.0, fallback, note, offline)


def _fell_back(plan: _Plan, window: Window, error: BackendError, api_key: str | None, outcome: Any,
               used: _Plan, started: float) -> Scored:
    """A window the local backend answered after `error`: flagged as a fallback unless only the
    embedder of the local backend failed (then `used`, the offline plan, says so)."""
    offline = used if used.embedder_note is not None else None
    if isinstance(error, EmbedderError) and plan.backend_name == "local":
        return _scored(outcome, started, failed=error, offline=offline)
    return _scored(outcome, started, "local", _fallback_note(plan, window, error, api_key), error, offline)


def _named(plan: _Plan, window: Window, error: BackendError, api_key: str | None) -> BackendError:
    """The failure with the window it happened in at the front, API keys removed."""
    from .rerank import _redacted

    clean = _redacted(error, api_key)
    head = str(clean).split(" [#", 1)[0]
    return BackendError(f"{window.label}: {head}", clean.attempts, usage=clean.usage)


def _fallback_note(plan: _Plan, window: Window, error: BackendError, api_key: str | None) -> str:
    from .rerank import failure_summary

    summary = failure_summary(error, api_key)
    return (f"{window.name}: {plan.backend_name} failed after {counted(len(error.attempts), 'attempt')}, "
            f"ranked by the local backend: {summary}")


def _score(plan: _Plan, window: Window, policy: Any, strict: bool, fallback: str | None,
           api_key: str | None) -> Scored:
    from .rerank import _falls_back, _local_outcome
    from .retry import call_with_retries

    started = time.perf_counter()
    kw = {"guard_top_k": window.ask.top_k, "policy": policy, "limits": plan.limits}
    try:
        return _scored(call_with_retries(plan.backend, window.ask, window.prompt, repair=not strict, **kw),
                       started)
    except BackendError as exc:
        if not _falls_back(plan, fallback, exc):
            raise _named(plan, window, exc, api_key) from None
        try:
            outcome, used = _local_outcome(
                plan, exc, api_key, lambda local: call_with_retries(local, window.ask, window.prompt, **kw))
        except BackendError:
            raise _named(plan, window, exc, api_key) from None
        return _fell_back(plan, window, exc, api_key, outcome, used, started)


async def _ascore(plan: _Plan, window: Window, policy: Any, strict: bool, fallback: str | None,
                  api_key: str | None, limit: asyncio.Semaphore) -> Scored:
    from .rerank import _falls_back, _local_outcome
    from .retry import acall_with_retries, call_with_retries

    kw = {"guard_top_k": window.ask.top_k, "policy": policy, "limits": plan.limits}
    async with call_slot(limit):
        started = time.perf_counter()
        try:
            outcome = await acall_with_retries(plan.backend, window.ask, window.prompt, repair=not strict,
                                               **kw)
            return _scored(outcome, started)
        except BackendError as exc:
            error = exc
    if not _falls_back(plan, fallback, error):
        raise _named(plan, window, error, api_key)
    try:  # the local backend in a worker thread: its embedder may be a model or an HTTP endpoint
        outcome, used = await asyncio.to_thread(
            _local_outcome, plan, error, api_key,
            lambda local: call_with_retries(local, window.ask, window.prompt, **kw))
    except BackendError:
        raise _named(plan, window, error, api_key) from None
    return _fell_back(plan, window, error, api_key, outcome, used, started)


# --------------------------------------------------------------------------- survivors


@dataclass(frozen=True)
class Survivors:
    """Which chunks go to the final pass, and the reasons of those that do not."""

    indices: tuple[int, ...]  # request positions, input order
    reasons: Mapping[int, str]  # position -> dropped reason, for the windows' losers
    window_dropped: Mapping[int, tuple[Window, str]]  # position -> (window, the model's own reason)


def _quoted(reason: str) -> str:
    text = " ".join(str(reason).split())
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


def select_survivors(plan: _Plan, windows: Sequence[Window], scored: Sequence[Scored], size: int
                     ) -> Survivors:
    """The best `size` window scores (ties: input order) above the minimum whose texts fit the token
    budget of one prompt; everything else with its reason (module docstring)."""
    request, lim = plan.view or plan.request, plan.limits  # the texts the scorer sees (embed_meta_fields)
    floor = lim.min_score
    entries: list[tuple[float, int, Window]] = []
    reasons: dict[int, str] = {}
    window_dropped: dict[int, tuple[Window, str]] = {}
    for window, answer in zip(windows, scored, strict=True):
        ranked = {r["id"]: float(r["score"]) for r in answer.obj.get("ranked", ())}
        own = {d["id"]: d["reason"] for d in answer.obj.get("dropped", ()) or ()}
        for i in range(window.first, window.end):
            cid = request.chunks[i].id
            if cid in ranked and ranked[cid] > floor:
                entries.append((ranked[cid], i, window))
            elif cid in ranked:
                reasons[i] = f"{BELOW_MIN}: {window.name} scored it {ranked[cid]:.3f}"
            else:
                window_dropped[i] = (window, own.get(cid, ""))
    entries.sort(key=lambda e: (-e[0], e[1]))
    budget = lim.max_context_tokens
    used = len(request.query)
    taken: list[tuple[float, int, Window]] = []
    for score, i, window in entries:
        chars = len(request.chunks[i].text)
        if len(taken) < size and lim.estimate_tokens(used + chars) <= budget:
            taken.append((score, i, window))
            used += chars
        elif len(taken) < size:
            reasons[i] = (f"{NOT_IN_FINAL}: {window.name} scored it {score:.3f}; "
                          "the final prompt's token budget was full")
    cut = taken[-1][0] if taken else 0.0
    chosen = {i for _, i, _ in taken}
    for score, i, window in entries:
        if i not in chosen and i not in reasons:
            reasons[i] = (f"{NOT_IN_FINAL}: {window.name} scored it {score:.3f}; the final pass took the "
                          f"best {len(taken)} (down to {cut:.3f})")
    return Survivors(tuple(sorted(chosen)), reasons, window_dropped)


def _loser_reason(window: Window, own: str, ranked_ids: set[str]) -> str:
    """A chunk its window dropped: the window's `redundant_with:` if it names a ranked chunk,
    otherwise `below_min_score` / `not_in_final` with the model's own words as the detail."""
    if own.startswith(REDUNDANT) and own[len(REDUNDANT):] in ranked_ids:
        return own
    token = BELOW_MIN if own.startswith(BELOW_MIN) else NOT_IN_FINAL
    said = f" ({_quoted(own)})" if own else ""
    return f"{token}: {window.name} dropped it{said}"


# --------------------------------------------------------------------------- assembling the result


def _final_window(plan: _Plan, survivors: Survivors, total: int) -> Window:
    request = plan.view or plan.request
    chunks = tuple(request.chunks[i] for i in survivors.indices)
    ask = _ask(replace(request, chunks=chunks, ranks=survivors.indices))
    return Window(total + 1, total, 0, len(chunks), ask, render(ask), final=True)


def _entry(window: Window, answer: Scored, survivors: Survivors | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"stage": "final" if window.final else "window", "index": window.index,
                             "size": len(window.ask.chunks)}
    if not window.final:
        entry["chunks"] = [window.first, window.end]
        if survivors is not None:
            entry["survivors"] = sum(1 for i in survivors.indices if window.first <= i < window.end)
    entry.update({"attempts": answer.attempts, "usage": dict(answer.usage), "fallback": answer.fallback,
                  "latency_ms": round(answer.latency_ms, 3)})
    return entry


def assemble(plan: _Plan, windows: Sequence[Window], scored: Sequence[Scored], survivors: Survivors,
             final: tuple[Window, Scored] | None, layout: str, duplicate_threshold: float | None,
             fallback: str | None = None, api_key: str | None = None) -> RerankResult:
    """The post-pass over the survivors, the losers' reasons, and the meta of every call."""
    from .rerank import _meta, _postpass_or_offline, _scoring_notes

    request = plan.request
    # Once the embedder failed in a window, the rest of the request compares lexical vectors too.
    plan = next((a.offline for a in (*scored, *([final[1]] if final else [])) if a.offline), plan)
    if final is not None:
        window, answer = final
        kept = survivors.indices
        sub = replace(plan, request=replace(request, chunks=tuple(request.chunks[i] for i in kept)),
                      view=replace(plan.view, chunks=window.ask.chunks) if plan.view is not None else None)
        result, sub = _postpass_or_offline(sub, answer.obj, layout, duplicate_threshold, fallback, api_key)
        plan = replace(plan, embedder=sub.embedder, embedder_note=sub.embedder_note)
    else:  # no chunk scored above the minimum in any window: nothing to rank
        result = RerankResult(ranked=())
    ranked_ids = {r.id for r in result.ranked}
    reason_of = {d.id: d.reason for d in result.dropped}
    for i, why in survivors.reasons.items():
        reason_of[request.chunks[i].id] = why
    for i, (window, own) in survivors.window_dropped.items():
        reason_of[request.chunks[i].id] = _loser_reason(window, own, ranked_ids)
    dropped = tuple(Dropped(c.id, reason_of[c.id]) for c in request.chunks if c.id not in ranked_ids)

    calls = [*zip(windows, scored, strict=True), *([final] if final is not None else [])]
    usage = add_usage(*(answer.usage for _, answer in calls))
    repairs = [f"{w.name}: {r}" for w, a in calls for r in a.repairs]
    notes = [a.note for _, a in calls if a.note] + _scoring_notes(plan)
    notes.append(f"windows: {len(windows)} of at most {counted(windows[0].end - windows[0].first, 'chunk')}, "
                 f"{counted(len(survivors.indices), 'survivor')}"
                 + (", final pass skipped (no chunk above the minimum score)" if final is None else ""))
    model = next((a.model for w, a in reversed(calls) if a.fallback is None and a.model), None)
    meta = _meta(
        plan,
        model=model or getattr(plan.backend, "model", None),
        attempts=sum(a.attempts for _, a in calls),
        repairs=repairs,
        usage=usage,
        fallback="local" if any(a.fallback for _, a in calls) else None,
        notes=notes,
        calls=len(calls),
        windows=tuple(_entry(w, a, survivors) for w, a in calls),
    )
    meta = replace(meta, embedder=result.meta.embedder or meta.embedder,
                   notes=(*meta.notes, *result.meta.notes))
    return RerankResult(ranked=result.ranked, dropped=dropped, meta=meta)


# --------------------------------------------------------------------------- the two entry points


def _workers(plan: _Plan, n: int) -> int:
    """Threads for the synchronous path: the local backend is CPU-bound (the GIL would only add
    switching), a remote one waits on the network."""
    return 1 if plan.backend_name == "local" else max(1, min(plan.concurrency, n))


def run_windows(plan: _Plan, *, api_key: str | None, policy: Any, strict: bool, fallback: str | None,
                layout: str, duplicate_threshold: float | None) -> RerankResult:
    """`rerank` over windows: window calls on a thread pool of `concurrency`, then the final pass."""
    assert plan.window_size is not None
    windows = split(plan.view or plan.request, plan.window_size)
    progress = WINDOW_PROGRESS.get()
    total = len(windows) + 1
    with ThreadPoolExecutor(max_workers=_workers(plan, len(windows)),
                            thread_name_prefix="rag-rerank-window") as pool:
        # Each window in a copy of the caller's context: a request id or a tracing span held in a
        # ContextVar (structlog, OpenTelemetry, asgi-correlation-id) stays on the window's logs and
        # HTTP calls, as it does for `arerank`'s tasks. (One copy per window: a context cannot be
        # entered by two threads at once.)
        futures = [pool.submit(contextvars.copy_context().run, _score, plan, w, policy, strict, fallback,
                               api_key) for w in windows]
        if progress is not None:
            for done, _ in enumerate(as_completed(futures), start=1):
                progress(done, total)
        outcomes: list[Scored | BaseException] = []
        for future in futures:
            try:
                outcomes.append(future.result())
            except BaseException as exc:  # every window finishes; the first failure in order is raised
                outcomes.append(exc)
    scored = _raise_first(outcomes)
    survivors = select_survivors(plan, windows, scored, plan.window_size)
    final = None
    if survivors.indices:
        window = _final_window(plan, survivors, len(windows))
        final = (window, _score(plan, window, policy, strict, fallback, api_key))
    if progress is not None:
        progress(total, total)
    return assemble(plan, windows, scored, survivors, final, layout, duplicate_threshold, fallback, api_key)


async def arun_windows(plan: _Plan, *, api_key: str | None, policy: Any, strict: bool,
                       fallback: str | None, layout: str, duplicate_threshold: float | None) -> RerankResult:
    """`arerank` over windows: window calls gathered under the call limit, then the final pass."""
    from .rerank import _offload

    assert plan.window_size is not None
    windows = split(plan.view or plan.request, plan.window_size)
    limit = asyncio.Semaphore(plan.concurrency)
    outcomes = await asyncio.gather(
        *(_ascore(plan, w, policy, strict, fallback, api_key, limit) for w in windows), return_exceptions=True
    )
    scored = _raise_first(list(outcomes))
    survivors = select_survivors(plan, windows, scored, plan.window_size)
    final = None
    if survivors.indices:
        window = _final_window(plan, survivors, len(windows))
        final = (window, await _ascore(plan, window, policy, strict, fallback, api_key, limit))
    return await _offload(plan, assemble, plan, windows, scored, survivors, final, layout,
                          duplicate_threshold, fallback, api_key)


def _raise_first(outcomes: Sequence[Scored | BaseException]) -> list[Scored]:
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return [o for o in outcomes if isinstance(o, Scored)]


__all__ = ["NOT_IN_FINAL", "WINDOW_PROGRESS", "Scored", "Survivors", "Window", "select_survivors", "split",
           "windowed"]
