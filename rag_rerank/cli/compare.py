"""`rag-rerank compare A B`: run B against run A on the same judged queries, with a paired bootstrap
interval, a randomisation test and a CI gate (the work is `rag_rerank.compare.compare_runs`; the
runs are read by `runfiles.py`, or reranked by `evaluate.rerank_run`; the page is `report.py`'s)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from ..charts import require_charts
from ..compare import DEFAULT_METRICS, Comparison, checked_options, compare_runs
from ..cost import Prices
from ..errors import InputError, Violation
from ..evaluate import rerank_run
from ..judgments import CandidateQuery, read_candidates, read_qrels, read_subtopics
from ..runfiles import Run, read_run, rerank_spec, run_from_orders
from ..significance import METHODS
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

EXIT_WORSE = 1
_FLAGS = {
    "metrics": "--metric",
    "gates": "--fail-if-worse",
    "alpha": "--alpha",
    "confidence": "--confidence",
    "n_resamples": "--resamples",
    "method": "--ci",
    "html": "--html",
    "rel_level": "--rel-level",
}


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command(
        "compare",
        "compare run B against run A on judged queries: paired bootstrap interval, "
        "randomisation test, Holm correction, and a CI gate (needs rag-rerank[eval])",
    )
    p.add_argument(
        "a",
        metavar="A",
        help="the baseline: a TREC run file, a batch output, an eval --resume file, "
        "'input' (the candidates' order) or rerank:KEY=VALUE,... (a configuration run on --candidates)",
    )
    p.add_argument("b", metavar="B", help="the change, in any of A's forms")
    p.add_argument("--qrels", required=True, metavar="FILE", help="TREC qrels")
    p.add_argument(
        "--candidates",
        default=None,
        metavar="FILE",
        help="eval's candidates JSONL: completes each run's order as eval does; needed by 'input' "
        "and rerank:...",
    )
    p.add_argument("--subtopics", default=None, metavar="FILE", help="subtopic judgments: adds alpha-nDCG@k")
    p.add_argument(
        "--metric",
        dest="metrics",
        action="append",
        default=None,
        metavar="NAME",
        help="a metric to compare, repeatable (default: nDCG@10, Recall@K, MRR@10, and alpha-nDCG@K "
        "with --subtopics); ir-measures names (P@5, AP, R@100) or eval's",
    )
    p.add_argument(
        "--k",
        type=whole_number,
        default=10,
        help="K of the default Recall@K and alpha-nDCG@K, and top_k of rerank:... runs (default 10)",
    )
    p.add_argument(
        "--rel-level",
        type=int,
        default=1,
        help="lowest grade Recall and MRR count relevant (default 1; DL19 convention: 2)",
    )
    p.add_argument(
        "--fail-if-worse",
        dest="gates",
        action="append",
        default=None,
        metavar="METRIC:MARGIN",
        help="exit 1 when B is worse than A on METRIC by more than MARGIN with p < --alpha "
        "(repeatable; Holm-adjusted over the gates)",
    )
    p.add_argument("--alpha", type=float, default=0.05, help="significance level of the gate (default 0.05)")
    p.add_argument(
        "--resamples",
        type=whole_number,
        default=10_000,
        help="bootstrap and randomisation resamples (default 10000)",
    )
    p.add_argument("--confidence", type=float, default=0.95, help="level of the interval (default 0.95)")
    p.add_argument(
        "--ci", choices=METHODS, default="bca", help="bootstrap interval: bca (default) or percentile"
    )
    p.add_argument("--seed", type=whole_number, default=0, help="seed of the resamples (default 0)")
    p.add_argument("--top", type=whole_number, default=5, help="queries listed as moved most (default 5)")
    add_flags(p, "compare", "prices", "concurrency")
    p.add_argument(
        "--json", action="store_true", help="print one JSON object (every figure) instead of a table"
    )
    add_html_arg(p, "the per-query difference chart and the cost per query when usage is known")
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    add_backend_args(p, "compare")
    p.set_defaults(func=run)


def _load(spec: str, label: str, args: argparse.Namespace, queries: Sequence[CandidateQuery] | None) -> Run:
    """One side of the comparison: a file, the candidates' order, or a configuration to rerank."""
    options = rerank_spec(spec)
    if spec == "input" or options is not None:
        if queries is None:
            raise InputError(
                [
                    Violation(
                        path=label,
                        value=spec,
                        message=f"{spec!r} needs --candidates FILE (the queries and chunks to order)",
                    )
                ]
            )
        if spec == "input":
            return run_from_orders("input", {q.qid: q.ids for q in queries}, "input")
        assert options is not None
        base = {k: v for k, v in run_options(args).items() if v is not None}
        settings = {"k": args.k, **base, **options}
        progress, bar = progress_bar(not args.no_progress)
        try:
            return rerank_run(queries, spec, concurrency=args.concurrency, progress=progress, **settings)
        finally:
            if bar is not None:
                bar.close()
    return read_run(spec, candidates=queries)


def format_table(c: Comparison, top: int) -> str:
    """One row per metric, then the gates and the queries that moved most."""
    lines = [
        f"A = {c.a}",
        f"B = {c.b}",
        f"{'metric':<16}{'n':>5}{'A':>9}{'B':>9}{'B-A':>9}{'interval':>22}{'p':>9}{'p Holm':>9}  W/L/T",
    ]
    for m in c.metrics:
        ci = f"[{m.ci[0]:+.4f}, {m.ci[1]:+.4f}]"
        lines.append(
            f"{m.name:<16}{len(m.qids):>5}{m.mean_a:>9.4f}{m.mean_b:>9.4f}{m.diff:>+9.4f}{ci:>22}"
            f"{m.p_value:>9.4f}{m.p_holm:>9.4f}  {m.wins}/{m.losses}/{m.ties}"
        )
    s = c.settings
    lines.append(
        f"interval: {round(100 * s['confidence'])}% paired bootstrap ({s['method']}, {s['n_resamples']} "
        f"resamples, seed {s['seed']}); p: two-sided paired randomisation test; Holm over "
        f"{counted(len(c.metrics), 'metric')}"
    )
    for m in c.metrics:
        moved = m.moved(top)
        if moved:
            lines.append(f"{m.name} moved most: " + ", ".join(f"{q} {d:+.3f}" for q, _, _, d in moved))
    for key, queries in c.left_out.items():
        lines.append(
            f"left out ({key}): {counted(len(queries), 'judged query', 'judged queries')}: "
            + ", ".join(queries[:10])
            + (" ..." if len(queries) > 10 else "")
        )
    for key, figs in c.cost.items():
        cost = f", cost {figs['cost']:.6f}" if "cost" in figs else ""
        lines.append(
            f"{key}: {figs['total_tokens']:.0f} tokens per query ({figs['prompt_tokens']:.0f} prompt, "
            f"{figs['completion_tokens']:.0f} completion){cost}"
        )
    for g in c.gates:
        verdict = "FAILED" if g.failed else "passed"
        lines.append(
            f"gate {g.metric}:{g.margin:g} {verdict}: B-A {g.diff:+.4f}, one-sided p {g.p_value:.4f} "
            f"(Holm) vs alpha {g.alpha:g}"
        )
    return "\n".join(lines)


def _prices(args: argparse.Namespace) -> Prices | None:
    if args.price_input is None and args.price_output is None:
        return None
    return Prices(args.price_input or 0.0, args.price_output or 0.0)


def run(args: argparse.Namespace) -> int:
    check_input_files(args, ("qrels", "candidates", "subtopics"))
    check_concurrency_flag(args)
    if args.html is not None:
        require_charts()  # the extra is checked before any work
    queries = read_candidates(args.candidates) if args.candidates else None
    qrels = read_qrels(args.qrels)
    subtopics = read_subtopics(args.subtopics) if args.subtopics else None
    metrics = args.metrics or [
        *DEFAULT_METRICS[:1],
        f"Recall@{args.k}",
        *DEFAULT_METRICS[2:],
        *([f"alpha-nDCG@{args.k}"] if subtopics else []),
    ]
    try:
        # Bad metrics, gates or settings are named before a configuration is reranked for minutes.
        checked_options(metrics, args.gates or (), qrels=qrels, subtopics=subtopics, rel_level=args.rel_level,
                        alpha=args.alpha, n_resamples=args.resamples, confidence=args.confidence,
                        method=args.ci)
        a = _load(args.a, "A", args, queries)
        b = _load(args.b, "B", args, queries)
        comparison = compare_runs(
            a,
            b,
            qrels,
            metrics=metrics,
            subtopics=subtopics,
            rel_level=args.rel_level,
            gates=args.gates or (),
            alpha=args.alpha,
            n_resamples=args.resamples,
            confidence=args.confidence,
            method=args.ci,
            seed=args.seed,
            top=args.top,
            prices=_prices(args),
        )
    except InputError as exc:
        raise with_flags(exc, _FLAGS) from None
    if args.html is not None:
        from ..report import compare_page, write_page

        try:
            write_page(args.html, compare_page(comparison, args.top))
        except InputError as exc:
            raise with_flags(exc, _FLAGS) from None
    print(
        json.dumps(comparison.to_dict(args.top), ensure_ascii=False)
        if args.json
        else format_table(comparison, args.top)
    )
    for label, r in (("A", a), ("B", b)):
        if r.failed:
            print(
                f"rag-rerank: {label} failed on {counted(len(r.failed), 'query', 'queries')} "
                f"({', '.join(list(r.failed)[:5])}); "
                + ("they keep their input order" if queries is not None else "they are left out"),
                file=sys.stderr,
            )
    for g in comparison.gates:
        if g.failed:
            drivers = ", ".join(f"{q} ({d:+.3f})" for q, _, _, d in g.drivers)
            print(
                f"rag-rerank: B is worse than A on {g.metric} by {-g.diff:.4f} (more than {g.margin:g}, "
                f"p {g.p_value:.4f} < {g.alpha:g}); lost most: {drivers}",
                file=sys.stderr,
            )
    return EXIT_WORSE if comparison.failed else 0


__all__ = ["EXIT_WORSE", "format_table", "register", "run"]
