"""The engine: every decision of one rerank, written once, without I/O.

    plan ─► flow:  [one call | windows ─► survivors ─► final pass]  ─► post-pass ─► RerankResult
                    └─ a failed call, with fallback="local": the local backend answers it

`plan()` checks the request and its options (every problem in one `InputError`, before any
request) and renders what the scorer is asked. `flow(plan)` is a generator, as httpx's
`Auth.auth_flow` is: it yields the work to do (`steps.py`: `Calls`, `Work`, `Progress`) and
receives its results, and returns the `RerankResult`. It never calls a backend itself, so the same
decisions serve the synchronous and the asynchronous worlds; the two short drivers that differ
live in `session.py`.

The decisions, and where each is written:

* one call: here (`_single`); windows, survivors and the final pass: `windows.py`;
  `consistency=k`, its passes and how their scores combine: `consistency.py`;
* what a failure means (`fallback="local"`: the local backend answers; lexical vectors replace a
  failed embedder): `fallback.py`, in one place for one call, each window and the final pass;
* what the option values are and whether they are valid: `options.py`; the calibration file:
  `calibration_map.py`; the plan's cost and budget: `cost.py`; `meta` and `scores`: `meta.py`;
  secrets out of every message: `redaction.py`.

**candidate_k** (`windows.asked`): the scorer is asked for more than `top_k` candidates so that
MMR and the removal of near-duplicates have room; the post-pass picks the final `top_k`. When the
merges use them up while a scored backend (which scores every chunk) left chunks above the
minimum outside them, it is asked again for all of them (`refill.py`): a scored list is
never short while a chunk waits.

The caller's query, chunk list and dicts are only read: the input guard builds new frozen
`Chunk`s and nothing downstream touches the originals.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Mapping, Sequence

from .backends.factory import model_of
from .calibration_map import resolve as resolve_calibration
from .consistency import aggregate, consistent_flow, pass_plans
from .cost import CostPlan, PlannedCall, Spending, estimate_plan, refuse
from .errors import BackendError
from .evidence import Evidence
from .fallback import answers, fallback_result
from .fusion import meta_values, with_embedded_meta
from .guard.input import ChunkSource
from .guard.limits import as_limits
from .meta import cache_meta, run_meta, scores_of, scoring_notes
from .models import CallRecord, RerankResult
from .options import Options, check_request_options, shortens
from .redaction import redacted
from .refill import postpass_refilled
from .render import render
from .retry import Outcome
from .shortening import shorten
from .steps import Flow, Plan, Setup
from .windows import asked, split, windowed, windowed_flow

# A batch's meter (`Reranker.arerank_many(budget=...)`): every request of the batch spends from it.
BATCH_SPENDING: contextvars.ContextVar[Spending | None] = contextvars.ContextVar("BATCH_SPENDING",
                                                                                 default=None)


# --------------------------------------------------------------------------- planning


def plan(setup: Setup, query: object, chunks: ChunkSource, options: Options, *, enforce: bool = True) -> Plan:
    """Every check and decision before the backend is called: the request, the options, the
    metadata values (all parsed before any call), the prompt or the windows; and, with a budget,
    the refusal of a plan that would exceed it (`BudgetError`; not when `enforce` is False, for a
    dry run that only reports it)."""
    started = time.perf_counter()
    lim = as_limits(options.limits)
    checked = check_request_options(query, chunks, options, lim)
    request, fusion, prices, budget = checked.request, checked.fusion, checked.prices, checked.budget
    values = meta_values(request, fusion) if fusion is not None else None
    shown = request
    evidence: Mapping[str, Evidence] = {}
    if shortens(options):
        short = shorten(request, max_context_tokens=lim.max_context_tokens,
                        max_tokens_per_chunk=options.max_tokens_per_chunk, strict=bool(options.strict),
                        window_size=options.window_size, embedder=setup.embedder, tokenizer=options.tokenizer)
        shown, evidence = short.request, short.evidence
    view = with_embedded_meta(shown, checked.embed_fields)
    spending = BATCH_SPENDING.get() or (Spending(budget, prices) if budget else None)
    calibration, calibration_file = resolve_calibration(options.calibration)
    window_size = options.window_size
    if window_size is not None and windowed(request, int(window_size)):
        # Each window and the final pass render their own prompt (windows.py).
        out = Plan(request, view, "", setup, options, lim, started, view, setup.embedder, fusion, values,
                   window_size=int(window_size), prices=prices, budget=budget, spending=spending,
                   calibration=calibration, calibration_file=calibration_file, settings=checked.settings,
                   evidence=evidence)
    else:
        ask = asked(view)
        out = Plan(request, ask, render(ask), setup, options, lim, started, view, setup.embedder, fusion,
                   values, prices=prices, budget=budget, spending=spending, calibration=calibration,
                   calibration_file=calibration_file, settings=checked.settings, evidence=evidence)
    if budget and enforce:
        refuse(cost_plan(out))
    return out


def cost_plan(plan: Plan) -> CostPlan:
    """What `plan` will do and cost, without any request (`cost.estimate_plan`): its calls (the
    windows and a final pass as large as a window, or the one call; each of them once per pass with
    `consistency=k`), which of them the cache already holds, the round trips, the re-ask bound and
    the estimated tokens and cost."""
    policy = plan.settings.policy
    return estimate_plan([_planned_calls(sub) for sub in pass_plans(plan)], backend=plan.backend,
                         backend_name=plan.backend_name, concurrency=plan.settings.concurrency,
                         max_attempts=policy.max_attempts, max_reasks=policy.max_reasks,
                         output_budget=policy.output_budget, prices=plan.prices, budget=plan.budget)


def _planned_calls(plan: Plan) -> list[PlannedCall]:
    """The calls of one pass: the one call, or each window and a final pass as large as the fullest
    window (the survivors are at most that many), each marked when the cache holds its answer."""
    if plan.window_size is None:
        stages = [("call", plan.ask, plan.prompt)]
    else:
        windows = split(plan.view, plan.window_size)
        stages = [("window", w.ask, w.prompt) for w in windows]
        fullest = max(windows, key=lambda w: len(w.ask.chunks))
        stages.append(("final", fullest.ask, fullest.prompt))
    cache = plan.setup.cache
    out = []
    for stage, ask, prompt in stages:
        key = plan.key(ask, prompt) if stage != "final" else None
        cached = key is not None and cache is not None and cache.contains(key)
        out.append(PlannedCall(stage, ask, prompt, cached))
    return out


# --------------------------------------------------------------------------- the flow


def flow(plan: Plan) -> Flow:
    """The whole rerank as steps for a driver (module docstring). The flow that does it, handed back
    as it is rather than delegated to (`yield from`): each step a driver sends then goes straight to
    it, not through two more generator frames."""
    if plan.settings.consistency > 1:
        return consistent_flow(plan, _one_pass)
    return _one_pass(plan)


def _one_pass(plan: Plan) -> Flow:
    """One ranking of the request in its own order: in windows, or in one call."""
    if plan.window_size is not None:
        return windowed_flow(plan)
    return _single(plan)


def _single(plan: Plan) -> Flow:
    """The request in one call; its failure raised (keys removed) or answered by the fallback."""
    (answer,) = yield from answers(plan, [(plan.ask, plan.prompt, "the call")], workers=1, limit=None)
    if answer.outcome is None:
        error = answer.error
        assert error is not None
        raise redacted(error, plan.setup.api_key) if isinstance(error, BackendError) else error
    if answer.error is None:
        return (yield from _finish(plan, answer.outcome, answer.records))
    return (yield from fallback_result(plan, answer))


def _finish(plan: Plan, outcome: Outcome, records: Sequence[CallRecord] = ()) -> Flow:
    """The post-pass over the one call's answer, and the result's meta and scores."""
    result, plan = yield from postpass_refilled(plan, outcome.obj, plan.view, plan.ask)
    notes = [*outcome.notes, *result.meta.notes]
    if plan.ask.top_k != plan.request.top_k:
        notes.append(f"candidate_k={plan.ask.top_k}")
    notes.extend(scoring_notes(plan))
    meta = run_meta(plan, model=outcome.model or model_of(plan.backend),
                    attempts=len(outcome.attempts), repairs=outcome.repairs, usage=outcome.usage, notes=notes,
                    cache=cache_meta(plan, [(outcome.cached, outcome.usage)]), records=records,
                    decided=outcome.decided)
    # Made once, not the post-pass's result copied with another meta (`dataclasses.replace`).
    scores = scores_of(plan.request, [outcome.obj], result.ranked)
    return RerankResult(result.ranked, result.dropped, meta, scores)


# `aggregate` is `consistency.aggregate`, named here too for the callers that found it here.
__all__ = ["BATCH_SPENDING", "aggregate", "cost_plan", "flow", "plan"]
