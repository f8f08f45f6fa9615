"""`rag-rerank calibrate`: fit a map from the backend's raw score to the probability that a person
judges the chunk relevant, on part of your judged queries, and report ECE / Brier before and after
on the rest (the work is `rag_rerank.calibration.calibrate`)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

from ..batchfile import exit_code_for
from ..calibration import METHODS, CalibrationRun, calibrate, save
from ..charts import require_charts
from ..errors import InputError, Violation
from ..options import split_options
from .common import (
    add_backend_args,
    add_flags,
    add_html_arg,
    check_concurrency_flag,
    check_input_files,
    progress_bar,
    run_options,
    whole_number,
    with_flags,
)

_FLAGS = {"rel_level": "--rel-level", "split": "--split", "depth": "--depth", "method": "--method",
          "candidates": "--candidates", "qrels": "--qrels"}


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("calibrate", "fit a calibration of the backend's scores on judged queries and report ECE / "
                "Brier before and after on held-out ones")
    p.add_argument("--candidates", required=True, metavar="FILE",
                   help="JSONL {qid, query, chunks:[{id,text}]} (rag-rerank eval's format)")
    p.add_argument("--qrels", required=True, metavar="FILE", help="TREC qrels: your judgements")
    p.add_argument("--output", "-o", required=True, metavar="FILE",
                   help="the calibration file to write (JSON)")
    p.add_argument("--rel-level", type=whole_number, default=1,
                   help="lowest qrels grade that counts as relevant (default 1)")
    p.add_argument("--split", type=float, default=0.5,
                   help="fraction of the queries to fit on; the rest measure it (default 0.5)")
    p.add_argument("--seed", type=whole_number, default=0, help="seed of the split (default 0)")
    p.add_argument("--method", choices=["auto", *METHODS], default="auto",
                   help="isotonic, platt, or auto: the better of the two by cross-validation on the fit "
                   "queries (default)")
    p.add_argument("--depth", type=whole_number, default=None,
                   help="the first N candidates of each query (default: all, at most 50)")
    add_flags(p, "calibrate", "top_k")
    add_flags(p, "calibrate", "concurrency")
    p.add_argument("--json", action="store_true", help="print the file's figures as JSON instead of a table")
    add_html_arg(p, "the reliability diagram before and after, on the held-out queries")
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    add_backend_args(p, "calibrate")
    p.set_defaults(func=run)


def format_table(run: CalibrationRun, output: str) -> str:
    cal = run.calibration
    figs = cal.figures
    fit, test = figs["fit"], figs["test"]

    def num(x: float | None) -> str:
        return "n/a" if x is None or math.isnan(x) else f"{x:.4f}"

    choice = figs["choice"]
    after = f"calibrated ({cal.method})"
    lines = [f"{'held-out scores':<22}{'ECE':>9}{'Brier':>9}",
             f"{'raw':<22}{num(test['before']['ece']):>9}{num(test['before']['brier']):>9}",
             f"{after:<22}{num(test['after']['ece']):>9}{num(test['after']['brier']):>9}"]
    for method, values in test["methods"].items():
        if method != cal.method:
            lines.append(f"{'  other: ' + method:<22}{num(values['ece']):>9}{num(values['brier']):>9}")
    cv = choice.get("cv_brier") or {}
    how = ("chosen by two-fold cross-validation on the fit queries (Brier "
           + ", ".join(f"{m} {num(v)}" for m, v in cv.items()) + ")")
    if choice["asked"] != "auto":
        how = "as asked"
    lines += [f"method {cal.method}, {how}",
              f"fitted on {fit['queries']} queries ({fit['chunks']} judged chunks, {fit['relevant']} "
              f"relevant), measured on {test['queries']} others ({test['chunks']} chunks, "
              f"{test['relevant']} relevant); "
              f"relevant = grade >= {cal.rel_level}",
              "ECE: mean |score - share relevant| over 10 score bins; Brier: mean (score - judgement)^2; "
              "lower is better",
              f"backend {cal.fitted_for.get('backend')}"
              + (f", model {cal.fitted_for['model']}" if cal.fitted_for.get("model") else "")
              + (f"; {run.unjudged} scored chunks not judged and {run.unscored} without a score were left out"
                 if run.unjudged or run.unscored else "")
              + (f"; {len(run.failed)} queries failed" if run.failed else ""),
              f"written to {output}"]
    return "\n".join(lines)


def reliability_json(result: CalibrationRun) -> dict[str, list[dict[str, float | int | None]]]:
    """The reliability diagram's points (held-out queries) as JSON: NaN of an empty bin is null."""
    def clean(x: float) -> float | None:
        return None if math.isnan(x) else round(x, 4)

    return {side: [{"mean_score": clean(p), "share_relevant": clean(y), "chunks": n} for p, y, n in rows]
            for side, rows in result.held_out_reliability().items()}


def run(args: argparse.Namespace) -> int:
    check_input_files(args, ("candidates", "qrels"))
    out = Path(args.output)
    if out.is_dir():
        raise InputError([Violation(path="--output", message=f"{out} is a directory; name the file to "
                                    "write")])
    check_concurrency_flag(args)
    if args.html is not None:
        require_charts()  # before the reranking, not after it
    options = {k: v for k, v in run_options(args).items() if v is not None}
    split_options(options)
    progress, bar = progress_bar(not args.no_progress, unit="query")
    try:
        result = calibrate(args.candidates, args.qrels, rel_level=args.rel_level, split=args.split,
                           seed=args.seed, method=args.method, depth=args.depth, top_k=args.top_k,
                           concurrency=args.concurrency, progress=progress, **options)
    except InputError as exc:  # the CLI's user knows the flag, not the keyword
        raise with_flags(exc, _FLAGS) from None
    finally:
        if bar is not None:
            bar.close()
    save(result.calibration, out)
    if args.html is not None:
        from ..report import calibrate_page, write_page

        try:
            write_page(args.html, calibrate_page(result))
        except InputError as exc:
            raise with_flags(exc, {"html": "--html"}) from None
    if args.json:
        print(json.dumps({**result.calibration.to_dict(), "failed": dict(result.failed),
                          "unjudged": result.unjudged, "unscored": result.unscored,
                          "reliability": reliability_json(result)}, ensure_ascii=False))
    else:
        print(format_table(result, str(out)))
    for qid, message in result.failed.items():
        print(f"rag-rerank: query {qid} not used: {message}", file=sys.stderr)
    return exit_code_for(set(result.failure_kinds.values()))
