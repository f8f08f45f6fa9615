"""The `--html` reports of `compare`, `eval`, `bias` and `calibrate`: one self-contained page each.

A table says how much; a picture says where: which queries a change won and lost, where in the
prompt a chunk gains or loses rank, which scores are over- or under-confident. Each page is
rendered from one Jinja template (`report.html.j2`, autoescaped: ids and labels are the user's
text) with the figures inline as SVG (`charts.py`, the `report` extra), and holds no script, no
link and no font: it reads the same offline, printed, or kept as a CI artifact. Every figure's
numbers are also in the command's `--json`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from . import charts
from .bias import DECILES, BiasReport
from .calibration import CalibrationRun
from .compare import Comparison
from .errors import InputError, Violation
from .evaluate import EvalReport

TEMPLATE = "report.html.j2"


@cache
def _template() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).parent)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    return env.get_template(TEMPLATE)


def _num(x: float | None, digits: int = 4, sign: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def _p(p: float) -> str:
    return "< 0.0001" if p < 1e-4 else f"{p:.4f}"


def _cls(x: float) -> str:
    return "win" if x > 1e-9 else "loss" if x < -1e-9 else ""


def _render(title: str, subtitle: str, **sections: Any) -> str:
    from . import __version__

    context = {
        "eval_rows": None,
        "eval_note": "",
        "comparison": None,
        "cost_rows": None,
        "bias": None,
        "calibration": None,
        **sections,
    }
    footer = (
        "Written by rag-rerank " + __version__ + "; self-contained: no script, no link, figures "
        "as inline SVG. The same figures are in the command's --json."
    )
    return _template().render(title=title, subtitle=subtitle, version=__version__, footer=footer, **context)


def _comparison_context(c: Comparison, top: int, heading: str) -> dict[str, Any]:
    conf = c.settings.get("confidence", 0.95)
    metrics = []
    for m in c.metrics:
        metrics.append(
            {
                "name": m.name,
                "queries": len(m.qids),
                "mean_a": _num(m.mean_a),
                "mean_b": _num(m.mean_b),
                "diff": _num(m.diff, sign=True),
                "cls": _cls(m.diff),
                "ci": f"[{_num(m.ci[0], sign=True)}, {_num(m.ci[1], sign=True)}]",
                "p": _p(m.p_value),
                "p_holm": _p(m.p_holm),
                "wlt": f"{m.wins} / {m.losses} / {m.ties}",
                "chart": charts.difference_chart(m.qids, list(m.diffs), m.name),
                "moved": [
                    {"qid": q, "a": _num(a), "b": _num(b), "diff": _num(d, sign=True), "cls": _cls(d)}
                    for q, a, b, d in m.moved(top)
                ],
            }
        )
    gates = []
    for g in c.gates:
        verdict = "FAILS" if g.failed else "passes"
        text = (
            f"Gate {g.metric}:{g.margin:g} {verdict}: B − A = {_num(g.diff, sign=True)}, one-sided p "
            f"(B worse by more than {g.margin:g}, Holm) = {_p(g.p_value)}, alpha {g.alpha:g}"
        )
        if g.failed and g.drivers:
            text += "; lost most: " + ", ".join(f"{q} ({_num(d, sign=True)})" for q, _, _, d in g.drivers)
        gates.append({"failed": g.failed, "text": text})
    s = c.settings
    note = (
        f"B − A per query; interval: paired bootstrap ({s.get('method')}, {s.get('n_resamples')} "
        f"resamples, seed {s.get('seed')}); p: two-sided paired randomisation (sign-flip) test; "
        f"Holm: adjusted over the {len(c.metrics)} metrics; Recall and MRR count grade >= "
        f"{s.get('rel_level')} relevant."
    )
    left = "; ".join(
        f"{k}: {', '.join(v[:20])}" + (f" and {len(v) - 20} more" if len(v) > 20 else "")
        for k, v in c.left_out.items()
    )
    return {
        "heading": heading,
        "a": "A",
        "b": "B",
        "confidence": f"{round(100 * conf)}%",
        "metrics": metrics,
        "gates": gates,
        "note": note,
        "left_out": left,
    }


def _cost_rows(c: Comparison, labels: Mapping[str, str]) -> list[dict[str, str]] | None:
    rows = []
    for key, figs in c.cost.items():
        cost = figs.get("cost")
        rows.append(
            {
                "run": f"{key}: {labels.get(key, key)}",
                "queries": str(int(figs["queries"])),
                "prompt": f"{figs['prompt_tokens']:.0f}",
                "completion": f"{figs['completion_tokens']:.0f}",
                "total": f"{figs['total_tokens']:.0f}",
                "cost": "no prices given" if cost is None else f"{cost:.6f}",
            }
        )
    return rows or None


def compare_page(c: Comparison, top: int = 5) -> str:
    """The page of `rag-rerank compare --html`."""
    verdict = ("; gate failed" if c.failed else "; gate passed") if c.gates else ""
    return _render(
        "rag-rerank compare",
        f"A = {c.a} · B = {c.b}{verdict}",
        comparison=_comparison_context(c, top, "B against A, query by query"),
        cost_rows=_cost_rows(c, {"A": c.a, "B": c.b}),
    )


def eval_page(report: EvalReport, c: Comparison, top: int = 5) -> str:
    """The page of `rag-rerank eval --html`: eval's table, then the per-query comparison of the
    reranked order (B) against the input order (A)."""
    rows = []
    for name, before in report.input.items():
        after = report.reranked.get(name, math.nan)
        rows.append(
            {
                "name": name,
                "before": _num(before),
                "after": _num(after),
                "delta": _num(after - before, sign=True),
                "cls": _cls(after - before),
            }
        )
    cfg = report.config
    sub = (
        f"{report.n_queries} queries, backend {cfg.get('backend')}, embedder {cfg.get('embedder')}, "
        f"k {cfg.get('k')}, depth {cfg.get('depth')}"
        + (f", {len(report.failed)} failed" if report.failed else "")
    )
    note = (
        f"input: the candidates' order; reranked: the reranker's top {cfg.get('k')}, then the rest in input "
        f"order; Recall and MRR: grade >= {report.rel_level} is relevant."
    )
    return _render(
        "rag-rerank eval",
        sub,
        eval_rows=rows,
        eval_note=note,
        comparison=_comparison_context(c, top, "Reranked (B) against input order (A), query by query"),
    )


def bias_page(report: BiasReport, confidence: float = 0.95) -> str:
    """The page of `rag-rerank bias --html`."""
    low, high = report.shift_band(confidence)
    mean = report.shift_by_decile
    deciles = [
        {
            "label": f"{d * 100 // DECILES}-{(d + 1) * 100 // DECILES}%",
            "mean": _num(mean[d], 2, True),
            "low": _num(low[d], 2, True),
            "high": _num(high[d], 2, True),
        }
        for d in range(DECILES)
    ]
    taus = [{"pair": p, "tau": _num(t, 3)} for p, t in report.tau_by_pair.items()]
    taus.append({"pair": "mean", "tau": _num(report.tau_mean, 3)})
    cfg = report.config
    sub = (
        f"{len(report.queries)} queries measured, backend {cfg.get('backend')}"
        + (f", model {cfg['model']}" if cfg.get("model") else "")
        + f", depth {cfg.get('depth')}, "
        f"seed {cfg.get('seed')}"
    )
    bias = {
        "taus": taus,
        "deciles": deciles,
        "confidence": f"{round(100 * confidence)}%",
        "chart": charts.position_curve(mean, low, high, confidence),
    }
    return _render("rag-rerank bias", sub, bias=bias)


def calibrate_page(run: CalibrationRun) -> str:
    """The page of `rag-rerank calibrate --html`."""
    cal = run.calibration
    test = cal.figures["test"]
    rows = [
        {"label": "raw", "ece": _num(test["before"]["ece"]), "brier": _num(test["before"]["brier"])},
        {
            "label": f"calibrated ({cal.method})",
            "ece": _num(test["after"]["ece"]),
            "brier": _num(test["after"]["brier"]),
        },
    ]
    bins = run.held_out_reliability()
    table = []
    for i, (b, a) in enumerate(zip(bins["before"], bins["after"], strict=True)):
        table.append(
            {
                "label": f"{i / len(bins['before']):.1f}-{(i + 1) / len(bins['before']):.1f}",
                "bp": _num(b[0], 3),
                "by": _num(b[1], 3),
                "bn": str(b[2]),
                "ap": _num(a[0], 3),
                "ay": _num(a[1], 3),
                "an": str(a[2]),
            }
        )
    where = (
        f"{test['queries']} held-out queries ({test['chunks']} judged chunks, {test['relevant']} relevant)"
    )
    sub = (
        f"backend {cal.fitted_for.get('backend')}"
        + (f", model {cal.fitted_for['model']}" if cal.fitted_for.get("model") else "")
        + f"; relevant = grade >= {cal.rel_level}; measured on {where}"
    )
    calibration = {
        "rows": rows,
        "bins": table,
        "method": cal.method,
        "test": where,
        "chart": charts.reliability_diagram(bins["before"], bins["after"], f"calibrated ({cal.method})"),
    }
    return _render("rag-rerank calibrate", sub, calibration=calibration)


def write_page(path: str | Path, html: str) -> None:
    """Write a page, or an `InputError` naming the path (a directory, a missing folder)."""
    where = Path(path)
    try:
        where.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise InputError(
            [Violation(path="html", value=str(path), message=f"cannot write {path}: {exc.strerror or exc}")]
        ) from None


def sections(html: str) -> Sequence[str]:
    """The ids of the sections a page holds (what a test or a browser check looks for)."""
    return re.findall(r'<section id="([a-z]+)"', html)


__all__ = ["TEMPLATE", "bias_page", "calibrate_page", "compare_page", "eval_page", "sections", "write_page"]
