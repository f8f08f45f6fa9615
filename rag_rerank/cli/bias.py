"""`rag-rerank bias`: how much the order a backend is shown moves its ranking (the work is
`rag_rerank.bias.measure_bias`; this module parses the flags and prints a table or JSON)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

from ..batchfile import exit_code_for
from ..bias import DECILES, BiasReport, measure_bias
from ..charts import require_charts
from ..errors import InputError
from ..options import split_options
from ..wording import counted
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


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("bias", "measure position bias: Kendall tau between the given, reversed and shuffled "
                "orders, and the rank shift by input position")
    p.add_argument("--candidates", required=True, metavar="FILE",
                   help="JSONL {qid, query, chunks:[{id,text}]} (rag-rerank eval's format)")
    p.add_argument("--depth", type=whole_number, default=None,
                   help="the first N candidates of each query (default: all, at most 50)")
    add_flags(p, "bias", "top_k")
    p.add_argument("--seed", type=whole_number, default=0, help="seed of the shuffled order (default 0)")
    add_flags(p, "bias", "concurrency")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_html_arg(p, "the rank-by-input-position curve with its confidence band")
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    add_backend_args(p, "bias")
    p.set_defaults(func=run)


def format_table(report: BiasReport) -> str:
    """Kendall tau per pair of orders, then the mean rank shift by input-position decile."""
    def num(x: float, sign: bool = False) -> str:
        return "n/a" if math.isnan(x) else (f"{x:+.2f}" if sign else f"{x:.3f}")

    lines = [f"{'orders compared':<24}{'Kendall tau':>12}"]
    for pair, tau in report.tau_by_pair.items():
        lines.append(f"{pair:<24}{num(tau):>12}")
    lines.append(f"{'mean':<24}{num(report.tau_mean):>12}")
    lines.append("")
    lines.append(f"{'input position':<24}{'rank shift':>12}")
    for d, shift in enumerate(report.shift_by_decile):
        lo, hi = d * 100 // DECILES, (d + 1) * 100 // DECILES
        lines.append(f"{f'{lo}-{hi}%':<24}{num(shift, sign=True):>12}")
    cfg = report.config
    lines += ["tau: 1 = the order shown does not move the ranking (ties count as ties)",
              "rank shift: mean ranks a chunk gained (+) or lost (-) against its mean rank over the three "
              "orders, by where it was shown (a primacy bias: + at 0-10%, - at 90-100%)",
              f"{counted(len(report.queries), 'query', 'queries')} measured, backend {cfg.get('backend')}"
              + (f", model {cfg['model']}" if cfg.get("model") else "")
              + f", depth {cfg.get('depth')}, top_k {cfg.get('top_k') or 'all'}, seed {cfg.get('seed')}, "
              f"{report.wall_s:.1f} s" + (f", {len(report.failed)} failed" if report.failed else "")]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    check_input_files(args, ("candidates",))
    check_concurrency_flag(args)
    if args.html is not None:
        require_charts()  # before the reranking, not after it
    options = {k: v for k, v in run_options(args).items() if v is not None}
    split_options(options)  # an unknown name is an InputError before any call
    progress, bar = progress_bar(not args.no_progress, unit="rerank")
    try:
        report = measure_bias(Path(args.candidates), depth=args.depth, top_k=args.top_k, seed=args.seed,
                              concurrency=args.concurrency, progress=progress, **options)
    except InputError as exc:  # the CLI's user knows the flag, not the keyword
        raise with_flags(exc, {"depth": "--depth", "top_k": "--top-k"}) from None
    finally:
        if bar is not None:
            bar.close()
    if args.html is not None:
        from ..report import bias_page, write_page

        try:
            write_page(args.html, bias_page(report))
        except InputError as exc:
            raise with_flags(exc, {"html": "--html"}) from None
    print(json.dumps(report.to_dict(), ensure_ascii=False) if args.json else format_table(report))
    for qid, message in report.failed.items():
        print(f"rag-rerank: query {qid} not measured: {message}", file=sys.stderr)
    return exit_code_for(set(report.failure_kinds.values()))
