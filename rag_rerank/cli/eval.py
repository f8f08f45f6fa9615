"""`rag-rerank eval`: measured quality of a backend on a judged collection, input order vs reranked
(the `eval` extra); the metrics are `evaluate.py`'s, this module prints them as a table or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ..batchfile import exit_code_for
from ..charts import require_charts
from ..errors import InputError
from ..evaluate import EvalReport, evaluate
from ..guard.limits import load_limits
from ..wording import counted
from .common import (
    add_backend_args,
    add_flags,
    add_html_arg,
    add_meta_args,
    add_window_args,
    check_concurrency_flag,
    check_input_files,
    meta_options,
    progress_bar,
    run_options,
    whole_number,
    with_flags,
)


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("eval", "measure nDCG@10 / Recall / MRR of input vs reranked order (needs rag-rerank[eval])")
    p.add_argument("--candidates", required=True, metavar="FILE",
                   help="JSONL {qid, query, chunks:[{id,text}]}")
    p.add_argument("--qrels", required=True, metavar="FILE", help="TREC qrels")
    p.add_argument("--k", type=whole_number, default=10,
                   help="top_k to keep and Recall@k cut-off (default 10)")
    p.add_argument("--depth", type=whole_number, default=None,
                   help="rerank the first N candidates of each query (default 50, the card's limit; with "
                   "--window-size, all of them up to 1000); the rest keep their input positions after them")
    p.add_argument("--rel-level", type=int, default=1,
                   help="lowest qrels grade that counts as relevant for Recall and MRR (default 1; DL19 "
                   "convention: 2)")
    add_flags(p, "eval", "duplicate_threshold", "lambda_")
    p.add_argument("--subtopics", default=None, metavar="FILE", help="subtopic judgments for alpha-nDCG")
    add_flags(p, "eval", "concurrency")
    p.add_argument("--resume", default=None, metavar="FILE", help="cache of per-query results to resume from")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_html_arg(p, "the per-query difference of each metric, reranked against input order")
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    add_backend_args(p, "eval")
    add_window_args(p, "eval")
    add_meta_args(p, "eval")
    p.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    return run_eval(args, backend_options={**run_options(args), **meta_options(args)})




def format_table(report: EvalReport) -> str:
    """Metrics as rows, input and reranked side by side with the difference."""
    lines = [f"{'metric':<16}{'input':>10}{'reranked':>10}{'delta':>10}"]
    for name, before in report.input.items():
        after = report.reranked.get(name, float("nan"))
        lines.append(f"{name:<16}{before:>10.4f}{after:>10.4f}{after - before:>+10.4f}")
    cfg = report.config
    k = cfg.get("k")
    # What the columns and the less common rows are: a table pasted into a report must stand alone.
    lines += [f"input: the candidates' order; reranked: the reranker's top {k}, then the rest in input order",
              f"Recall, MRR: grade >= {report.rel_level} is relevant; "
              "novelty-nDCG: no gain for a near-copy of a chunk above",
              f"distance@{k}: mean pairwise cosine distance of the first {k} (higher = more varied)"]
    lam = cfg.get("lambda")
    lam_text = f"{load_limits().default_lambda:g} (default)" if lam is None else f"{lam:g}"
    unjudged = report.n_queries - (report.n_queries if report.n_judged is None else report.n_judged)
    if unjudged:
        lines.append(f"{unjudged} of the {counted(report.n_queries, 'query', 'queries')} "
                     f"{'has' if unjudged == 1 else 'have'} no judgments in the qrels: nDCG, "
                     "Recall, MRR and novelty-nDCG average over the others")
    lines.append(f"{counted(report.n_queries, 'query', 'queries')}, backend {cfg.get('backend')}, "
                 f"embedder {cfg.get('embedder')}, "
                 f"k {cfg.get('k')}, lambda {lam_text}, depth {cfg.get('depth')}, "
                 + (f"windows of {cfg['window_size']}, " if cfg.get("window_size") else "")
                 + f"{report.wall_s:.1f} s" + (f", {len(report.failed)} failed" if report.failed else ""))
    if set(report.statuses) - {"ok"}:  # a fallback's ranking is in the table: say how many there were
        counts = sorted(report.statuses.items())
        lines.append("statuses: " + ", ".join(f"{n} {status}" for status, n in counts))
    return "\n".join(lines)


def write_eval_page(report: EvalReport, args: Any, path: str) -> dict[str, Any]:
    """`--html`: eval's table and the per-query comparison of the two orders (`compare_runs`);
    returns the comparison's figures, which `--json` prints beside eval's."""
    from ..compare import DEFAULT_METRICS, compare_runs
    from ..judgments import read_qrels, read_subtopics
    from ..report import eval_page, write_page

    subtopics = read_subtopics(args.subtopics) if args.subtopics else None
    metrics = [DEFAULT_METRICS[0], f"Recall@{args.k}", DEFAULT_METRICS[2],
               *([f"alpha-nDCG@{args.k}"] if subtopics else [])]
    before, after = report.runs()
    comparison = compare_runs(before, after, read_qrels(args.qrels), metrics=metrics, subtopics=subtopics,
                              rel_level=report.rel_level)
    try:
        write_page(path, eval_page(report, comparison))
    except InputError as exc:
        raise with_flags(exc, {"html": "--html"}) from None
    return comparison.to_dict()


def run_eval(args: Any, backend_options: Mapping[str, Any]) -> int:
    """`rag-rerank eval`: metrics, then one stderr line per failed query; exit 0, or as `batch`
    does, by the worst failure: 2 bad input only, 3 a backend failure, 4 an internal error."""
    check_input_files(args, ("candidates", "qrels", "subtopics"))
    check_concurrency_flag(args)
    html = getattr(args, "html", None)
    if html is not None:
        require_charts()  # before the reranking, not after it
    rel_level = getattr(args, "rel_level", 1)
    progress, bar = progress_bar(not args.no_progress)
    opts = {key: v for key, v in backend_options.items() if v is not None}
    try:
        report = evaluate(args.candidates, args.qrels, k=args.k, lambda_=args.lambda_,
                          depth=getattr(args, "depth", None), subtopics=args.subtopics,
                          rel_level=rel_level, concurrency=args.concurrency,
                          duplicate_threshold=getattr(args, "duplicate_threshold", None),
                          progress=progress, resume=args.resume, **opts)
    except InputError as exc:  # the CLI's user knows the flag, not the keyword
        named = [replace(v, path="--rel-level", message=v.message.replace("rel_level ", "", 1))
                 if v.path == "rel_level" else v for v in exc.violations]
        raise InputError(named, exc.headline) from None
    finally:
        if bar is not None:
            bar.close()
    if html is not None:
        page = write_eval_page(report, args, html)
    data = {**report.to_dict(), **({"comparison": page} if html is not None else {})}
    print(json.dumps(data, ensure_ascii=False) if args.json else format_table(report))
    for qid, message in report.failed.items():
        print(f"rag-rerank: query {qid} kept its input order: {message}", file=sys.stderr)
    return exit_code_for(set(report.failure_kinds.values()))
