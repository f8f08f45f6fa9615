"""`rag-rerank eval`: measured quality of a backend on a judged collection, input order vs reranked.

Inputs are a candidates file (JSONL, one `{qid, query, chunks: [{id, text}, ...]}` per line, ids
being the collection's document ids, chunks in first-stage order) and TREC qrels. Every query is
reranked through the product's own batch machinery (`arerank_many`: bounded concurrency, the same
guards and post-pass as any call), then both orders are scored with ir-measures.

How the reranked run is built, so that it compares like with like with the input order: the
reranker returns only `top_k` ids, and nDCG@10 / Recall@k over a list shorter than the input's
would punish it for the ids it was never asked to order. The reranked run is therefore **the
ranked ids, then every other candidate in its input order** (dropped ones included). Candidates
beyond `depth` (default: the card's limit of 50) are not sent to the reranker and keep their input
positions after the reranked part. A query whose rerank failed keeps its input order and is
counted in `failed`.

Diversity is the average pairwise cosine distance (1 - cosine) of the `k` ids each order puts
first, with the evaluation's embedder. With subtopic judgments (TREC diversity qrels:
`qid subtopic docid rel`), subtopic recall and alpha-nDCG (alpha 0.5) at `k` are added (ir-measures'
pyndeval provider).

**Novelty-aware nDCG@k** (`novelty-nDCG@k`) is nDCG@k in which a chunk that is a near-duplicate
of one listed above it gains nothing, and the ideal list is built the same way from the judged
candidates (copies of a picked document are skipped). Plain nDCG counts a reranker's duplicate
removal as a loss on collections full of near-copies (MS MARCO); this one does not reward listing
the same passage twice. The duplicate criterion is fixed, whatever embedder is under test: cosine
of the `lexical` embedder's hashed word + character 5-gram vectors at or above 0.49, the
near-verbatim threshold measured on clough-stevenson (copied and lightly edited answers above it,
independent answers below; `embed/lexical.py`). Judged documents that are not among the candidates
have no text and count as distinct.

`--resume FILE` keeps one line per finished query (plus a header with the configuration) and skips
those queries on the next run, so an interrupted evaluation picks up where it stopped.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .batchfile import error_kind
from .concurrency import run_coroutine
from .embed import get_embedder
from .embed.lexical import LexicalEmbedder
from .embed.memo import Memo
from .errors import InputError, Violation
from .eval_resume import check_resumed, drop_partial_line, error_kind_of, eval_config, load_resume
from .guard.input import duplicate_threshold_violations, lambda_violations, window_size_violations
from .guard.limits import as_limits
from .judgments import (
    CandidateQuery,
    ir_measures_module,
    read_candidates,
    read_qrels,
    read_subtopics,
    rel_level_violations,
)
from .metrics import measure, novelty_ndcg, pairwise_distance, reranked_order
from .options import split_options
from .runfiles import Run, run_from_orders
from .session import Reranker
from .wording import counted

SLICE = 16  # queries per resume checkpoint


@dataclass(frozen=True)
class EvalReport:
    """Metrics of both orders, plus what was run and what failed."""

    input: Mapping[str, float]
    reranked: Mapping[str, float]
    n_queries: int
    failed: Mapping[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    config: Mapping[str, Any] = field(default_factory=dict)
    # Per failed qid: "input", "backend" or "internal"; the CLI's exit code follows the worst.
    failure_kinds: Mapping[str, str] = field(default_factory=dict)
    # The lowest grade counted relevant by Recall and MRR: kept out of `config` (the resume
    # header), since it changes the scoring, not the reranking.
    rel_level: int = 1
    # How many of the queries the qrels judge: nDCG, Recall, MRR and novelty-nDCG average over
    # those only, distance@k over all of them (None: all judged).
    n_judged: int | None = None
    # Each order scored, per qid ({"input": ..., "reranked": ...}): what a per-query comparison
    # (`compare.compare_runs`, the `--html` report) reads. Not in `to_dict`.
    orders: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)

    # How many reranked queries came with each `meta.status` (ok, repaired, reasked, fallback,
    # partial): a fallback's ranking is scored as the run's, so the table must say how many there were.
    statuses: Mapping[str, int] = field(default_factory=dict)

    def runs(self) -> tuple[Run, Run]:
        """The input order and the reranked order as runs (`runfiles.Run`), for `compare_runs`."""
        failed = dict(self.failed)
        return (run_from_orders("input", self.orders.get("input", {}), "input"),
                run_from_orders("reranked", self.orders.get("reranked", {}), "eval", failed, self.config))

    def to_dict(self) -> dict[str, Any]:
        info = {"queries": self.n_queries, "failed": dict(self.failed), "statuses": dict(self.statuses),
                "failure_kinds": dict(self.failure_kinds), "wall_s": round(self.wall_s, 3),
                "judged_queries": self.n_queries if self.n_judged is None else self.n_judged,
                "rel_level": self.rel_level}
        return {"input": dict(self.input), "reranked": dict(self.reranked),
                "info": {**info, **dict(self.config)}}


# ----------------------------------------------------------------------------------------- reranking


def default_depth(lim: Any, window_size: Any) -> int:
    """How many candidates per query are reranked when `depth` is not given: one prompt's worth,
    or with windows every candidate up to `max_total_chunks`."""
    return lim.max_chunks if window_size is None else lim.max_total_chunks


def rerank_queries(
    queries: Sequence[CandidateQuery],
    *,
    k: int = 10,
    lambda_: float | None = None,
    depth: int | None = None,
    concurrency: int = 4,
    progress: Callable[[int, int], None] | None = None,
    resume: str | Path | None = None,
    reranker: Reranker | None = None,
    statuses: dict[str, str] | None = None,
    **options: Any,
) -> tuple[dict[str, list[str]], dict[str, str], dict[str, str]]:
    """Ranked ids per qid (failed queries absent), and per failed qid its error message and kind
    ("input", "backend" or "internal", as in a batch file). Every query is reranked by one session:
    `reranker`, or one built from `options` (rerank's keywords) and closed at the end. `statuses`,
    when given, receives each reranked qid's `meta.status` (also kept in the resume file)."""
    lim = as_limits(options.get("limits"))
    depth = default_depth(lim, options.get("window_size")) if depth is None else depth
    own = reranker is None
    if reranker is None:
        session, request = split_options(options)
        reranker = Reranker(**session, **request)
    config = eval_config(k, lambda_, depth, options, reranker.embedder)
    path = Path(resume) if resume else None
    done, where = load_resume(path, config) if path else ({}, {})
    if path:
        check_resumed(done, where, queries, depth, path)
        drop_partial_line(path)
    if path and (not path.is_file() or path.stat().st_size == 0):  # new, or only a half-written header
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"config": config}) + "\n", encoding="utf-8")
    todo = [q for q in queries if q.qid not in done]
    total, finished = len(queries), len(queries) - len(todo)
    if progress is not None and finished:
        progress(finished, total)
    session_used = reranker

    async def run_slices() -> None:
        # One event loop for every slice: the session's async client (bound to its loop) keeps
        # its connections from slice to slice; a slice is a checkpoint for --resume.
        nonlocal finished
        try:
            for start in range(0, len(todo), SLICE):
                part = todo[start : start + SLICE]
                requests = [{"query": q.query, "chunks": list(q.chunks[:depth]), "top_k": k,
                             "lambda": lambda_} for q in part]

                def tick(n: int, _total: int, base: int = finished) -> None:
                    if progress is not None:
                        progress(base + n, total)

                outcomes = await session_used.arerank_many(requests, concurrency=concurrency, progress=tick)
                records = []
                for q, outcome in zip(part, outcomes, strict=True):
                    if isinstance(outcome, Exception):
                        # one line: the CLI prints it as one stderr line per failed query
                        text = " ".join(part.strip() for part in str(outcome).splitlines())
                        records.append({"qid": q.qid, "error": f"{type(outcome).__name__}: {text}"[:500],
                                        "kind": error_kind(outcome)})
                    else:
                        records.append({"qid": q.qid, "ranked": outcome.ids, "status": outcome.meta.status})
                finished += len(part)
                for rec in records:
                    done[rec["qid"]] = rec
                if path:
                    with path.open("a", encoding="utf-8") as fh:
                        fh.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        finally:  # a session built here is closed; a caller's keeps going, without this loop's clients
            if own:
                await session_used.aclose()
            else:
                await session_used.release_loop()

    run_coroutine(run_slices())
    # Only this run's queries: a resume file may hold others (a larger candidates file).
    ours = {q.qid for q in queries}
    ranked = {q: list(r["ranked"]) for q, r in done.items() if "ranked" in r and q in ours}
    failed = {q: str(r["error"]) for q, r in done.items() if "error" in r and q in ours}
    kinds = {q: error_kind_of(r) for q, r in done.items() if "error" in r and q in ours}
    if statuses is not None:  # a resume file written before statuses were recorded says none
        statuses.update({q: str(r["status"]) for q, r in done.items() if "status" in r and q in ours})
    return ranked, failed, kinds


def evaluate(
    candidates: str | Path | Sequence[CandidateQuery],
    qrels: str | Path | Sequence[Any],
    *,
    k: int = 10,
    lambda_: float | None = None,
    depth: int | None = None,
    subtopics: str | Path | Sequence[Any] | None = None,
    rel_level: int = 1,
    concurrency: int = 4,
    progress: Callable[[int, int], None] | None = None,
    resume: str | Path | None = None,
    distance_embedder: Any = None,
    **options: Any,
) -> EvalReport:
    """Rerank every candidate query and score input vs reranked order (see the module docstring).

    `options` are `rerank`'s keywords: backend, model, base_url, api_key, embedder,
    duplicate_threshold, limits, ... `distance_embedder` (default: `embedder`) measures the
    pairwise distance, so tables comparing several embedders can share one yardstick.
    """
    ir_measures_module()
    if k < 1:
        raise InputError([Violation(path="k", value=k, message=f"k must be a positive integer, got {k}")])
    # Options shared by every query are checked once: a bad one is bad input (exit 2), not one
    # "failed" rerank per query (which the CLI reports as a backend failure, exit 3).
    problems = [*([] if lambda_ is None else lambda_violations(lambda_)),
                *duplicate_threshold_violations(options.get("duplicate_threshold"))]
    if problems:
        raise InputError(problems)
    queries = read_candidates(candidates) if isinstance(candidates, (str, Path)) else list(candidates)
    judgments = read_qrels(qrels) if isinstance(qrels, (str, Path)) else list(qrels)
    subs = read_subtopics(subtopics) if isinstance(subtopics, (str, Path)) else subtopics
    session, request = split_options(options)
    reranker = Reranker(**session, **request)  # one session for every query, closed at the end
    try:
        return _evaluate(queries, judgments, subs, reranker, k=k, lambda_=lambda_, depth=depth, qrels=qrels,
                         subtopics=subtopics, rel_level=rel_level, concurrency=concurrency, progress=progress,
                         resume=resume, distance_embedder=distance_embedder, options=options)
    finally:
        reranker.close()


def _evaluate(queries: Sequence[CandidateQuery], judgments: Sequence[Any], subs: Sequence[Any] | None,
              reranker: Reranker, *, k: int, lambda_: float | None, depth: int | None, qrels: Any,
              subtopics: Any, rel_level: int, concurrency: int, progress: Callable[[int, int], None] | None,
              resume: str | Path | None, distance_embedder: Any, options: Mapping[str, Any]) -> EvalReport:
    """`evaluate` once its files are read and its session built."""
    embedder = reranker.embedder
    lim = as_limits(options.get("limits"))
    window_size = options.get("window_size")
    if window_size is not None and (problems := window_size_violations(window_size, k, lim)):
        raise InputError(problems)  # checked once, not once per query
    depth_used = default_depth(lim, window_size) if depth is None else depth
    if depth_used < 1:
        raise InputError([Violation(path="depth", value=depth, message="depth must be a positive integer")])
    if window_size is None and depth_used > lim.max_chunks:  # every query would fail the input guard
        raise InputError([Violation(path="depth", value=depth,
                                    message=f"depth {depth_used} is over the limit of {lim.max_chunks} "
                                    "chunks per rerank (max_chunks); pass window_size (--window-size N) "
                                    f"to rerank up to {lim.max_total_chunks} in windows")])
    if depth_used > lim.max_total_chunks:
        raise InputError([Violation(path="depth", value=depth,
                                    message=f"depth {depth_used} is over the limit of "
                                    f"{lim.max_total_chunks} chunks per rerank (max_total_chunks)")])
    problems = rel_level_violations(rel_level, judgments, qrels if isinstance(qrels, (str, Path)) else None)
    if problems:
        raise InputError(problems)
    judged = {j.query_id for j in judgments} & {q.qid for q in queries}
    if not judged:
        # Every metric would be NaN (and `--json` would print invalid JSON): a mismatch of files.
        where = qrels if isinstance(qrels, (str, Path)) else "the qrels"
        shown = counted(len(queries), "candidate query", "candidate queries")
        raise InputError([Violation(path="qrels", message=f"{where} judges none of the {shown} "
                                    "(check the qid columns)")])
    if subs is not None and not {j.query_id for j in subs} & judged:
        # The subtopic rows would be left out of the table without a word.
        where = subtopics if isinstance(subtopics, (str, Path)) else "the subtopics"
        shown = counted(len(judged), "candidate query", "candidate queries")
        raise InputError([Violation(path="subtopics", message=f"{where} judges none of the {shown} "
                                    "the qrels judge (check the qid columns)")])
    yardstick = embedder if distance_embedder is None else get_embedder(distance_embedder)
    started = time.perf_counter()
    statuses: dict[str, str] = {}
    ranked, failed, kinds = rerank_queries(queries, k=k, lambda_=lambda_, depth=depth_used,
                                           concurrency=concurrency, progress=progress, resume=resume,
                                           reranker=reranker, statuses=statuses, **options)
    wall = time.perf_counter() - started
    input_orders = {q.qid: q.ids for q in queries}
    reranked_orders = {q.qid: reranked_order(q.ids, ranked.get(q.qid, [])) for q in queries}
    text_of = {q.qid: {str(c["id"]): str(c["text"]) for c in q.chunks} for q in queries}
    # Both orders hold the same candidates: their near-duplicate vectors are computed once.
    lexical = Memo(LexicalEmbedder(), max_texts=max(1, sum(len(t) for t in text_of.values())))
    result = {}
    for label, orders in (("input", input_orders), ("reranked", reranked_orders)):
        metrics = measure(judgments, orders, k=k, rel_level=rel_level, subtopics=subs)
        metrics[f"novelty-nDCG@{k}"] = novelty_ndcg(judgments, orders, text_of, k, lexical)
        metrics[f"distance@{k}"] = pairwise_distance(
            yardstick, [[text_of[q][i] for i in ids[:k]] for q, ids in orders.items()])
        result[label] = metrics
    config = eval_config(k, lambda_, depth_used, options, embedder)
    orders = {"input": {q: tuple(ids) for q, ids in input_orders.items()},
              "reranked": {q: tuple(ids) for q, ids in reranked_orders.items()}}
    return EvalReport(result["input"], result["reranked"], len(queries), failed, wall, config, kinds,
                      rel_level, len(judged), orders, dict(Counter(statuses.values())))


def rerank_run(queries: Sequence[CandidateQuery], label: str, *, k: int = 10, lambda_: float | None = None,
               depth: int | None = None, concurrency: int = 4,
               progress: Callable[[int, int], None] | None = None, **options: Any) -> Run:
    """The reranked order of every query as a run (`eval`'s: the ranked ids, then the rest in input
    order; a failed query keeps its input order and is listed), for `compare` to set against
    another configuration on the same candidates."""
    if problems := ([] if lambda_ is None else lambda_violations(lambda_)):
        raise InputError(problems)
    ranked, failed, _ = rerank_queries(queries, k=k, lambda_=lambda_, depth=depth, concurrency=concurrency,
                                       progress=progress, **options)
    orders = {q.qid: reranked_order(q.ids, ranked.get(q.qid, [])) for q in queries}
    config = {"k": k, "lambda": lambda_, "depth": depth, **{n: v for n, v in options.items()
                                                              if isinstance(v, (str, int, float, bool))}}
    return run_from_orders(label, orders, "rerank", failed, config)


__all__ = ["EvalReport", "default_depth", "evaluate", "rerank_queries", "rerank_run"]
