"""`rag-rerank compare`: is run B better or worse than run A on the same judged queries, beyond chance?

Per metric, every query both runs answer and the qrels judge is scored in each run with
ir-measures (trec_eval's definitions; alpha-nDCG through its pyndeval provider, with subtopic
judgments), and the per-query differences `B - A` give: each run's mean, the mean difference with a
paired bootstrap interval, a paired randomisation p-value (`significance.py`), Holm-adjusted over
the metrics compared, the queries won, lost and tied, and the queries that moved most.

**The gate** (`gates`, the CLI's `--fail-if-worse METRIC:MARGIN`): B fails on a metric when its mean
is below A's by more than MARGIN *and* a one-sided randomisation test of "B is at most MARGIN worse"
rejects it at `alpha` (Holm-adjusted over the gates). A noisy loss on a few queries does not fail a
build; a clear one does, and the queries that lost most are named, so the change can be looked at.

Metric names: ir-measures' (`nDCG@10`, `R@100`, `RR@10`, `P@5`, `AP`, `alpha_nDCG@10`, ...) and
the names `eval` prints (`Recall@k`, `MRR@k`, `alpha-nDCG@k`, `St-recall@k`); `rel_level` is the
lowest grade Recall and MRR count relevant, as in `eval`.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .cost import Prices
from .errors import InputError, MissingDependencyError, Violation
from .judgments import ir_measures_module, rel_level_violations
from .runfiles import Run
from .significance import METHODS, bootstrap_interval, holm, sign_flip_pvalue

DEFAULT_METRICS = ("nDCG@10", "Recall@10", "MRR@10")
TIE = 1e-9  # per-query differences smaller than this are ties
_ALIASES = (  # eval's names -> ir-measures' (rel_level added where it applies)
    (re.compile(r"^Recall@(\d+)$"), "R", True),
    (re.compile(r"^MRR@(\d+)$"), "RR", True),
    (re.compile(r"^alpha-nDCG@(\d+)$"), "alpha_nDCG", False),
    (re.compile(r"^St-recall@(\d+)$"), "StRecall", False),
)
SUBTOPIC_MEASURES = ("alpha_nDCG", "StRecall", "NRBP", "nERR_IA", "ERR_IA", "P_IA", "AP_IA")


@dataclass(frozen=True)
class MetricSpec:
    """A metric as asked for (`name`) and as ir-measures computes it; subtopic metrics read the
    subtopic judgments."""

    name: str
    measure: Any
    subtopic: bool


def parse_metric(name: str, rel_level: int = 1) -> MetricSpec:
    """`name` as ir-measures computes it, or an `InputError` naming it."""
    irm = ir_measures_module()
    text = name.strip()
    spelled = text
    for pattern, base, graded in _ALIASES:
        if m := pattern.match(text):
            rel = f"(rel={rel_level})" if graded and rel_level != 1 else ""
            spelled = f"{base}{rel}@{m.group(1)}"
            break
    try:
        measure = irm.parse_measure(spelled)
    except Exception as exc:  # ir-measures raises NameError / ValueError / its own parse errors
        raise InputError(
            [
                Violation(
                    path="metrics",
                    value=name,
                    message=f"unknown metric {name!r} ({exc}); "
                    "use ir-measures names (nDCG@10, R@100, RR@10, P@5, AP, alpha_nDCG@10) "
                    "or eval's (Recall@10, MRR@10, alpha-nDCG@10)",
                )
            ]
        ) from None
    return MetricSpec(text, measure, str(measure).split("@")[0].split("(")[0] in SUBTOPIC_MEASURES)


def parse_gate(text: str) -> tuple[str, float]:
    """`METRIC:MARGIN` (`nDCG@10:0.01`) as (metric, margin >= 0), or an `InputError` naming it."""
    metric, sep, margin = text.rpartition(":")
    try:
        value = float(margin)
    except ValueError:
        value = math.nan
    if not sep or not metric.strip() or not math.isfinite(value) or value < 0:
        raise InputError(
            [
                Violation(
                    path="gates",
                    value=text,
                    message=f"expected METRIC:MARGIN with a margin >= 0 (nDCG@10:0.01), got {text!r}",
                )
            ]
        )
    return metric.strip(), value


def per_query(
    specs: Sequence[MetricSpec], judgments: Sequence[Any], orders: Mapping[str, Sequence[str]]
) -> dict[str, dict[str, float]]:
    """Each metric's value for every query of `orders` the judgments judge (0 where ir-measures
    yields none), in one pass of ir-measures over the run (given as dicts: no tuple per document)."""
    irm = ir_measures_module()
    qrels: dict[str, dict[str, int]] = {}
    for j in judgments:
        if j.query_id in orders:
            qrels.setdefault(j.query_id, {})[j.doc_id] = int(j.relevance)
    run = {
        q: {doc: float(len(ids) - pos) for pos, doc in enumerate(ids)}
        for q, ids in orders.items()
        if q in qrels
    }
    values = {s.name: dict.fromkeys(run, 0.0) for s in specs}
    if not run:
        return values
    by_measure = {s.measure: s.name for s in specs}
    try:
        for m in irm.iter_calc(list(by_measure), qrels, run):
            values[by_measure[m.measure]][str(m.query_id)] = float(m.value)
    except ValueError as exc:
        if any(s.subtopic for s in specs):  # the pyndeval provider is missing
            raise MissingDependencyError("subtopic metrics (alpha-nDCG)", "eval", "pyndeval") from exc
        raise
    return values


@dataclass(frozen=True)
class MetricComparison:
    """One metric's paired comparison of B against A."""

    name: str
    qids: tuple[str, ...]
    a: tuple[float, ...]
    b: tuple[float, ...]
    ci: tuple[float, float]
    p_value: float
    p_holm: float

    @property
    def mean_a(self) -> float:
        return float(np.mean(self.a))

    @property
    def mean_b(self) -> float:
        return float(np.mean(self.b))

    @property
    def diffs(self) -> np.ndarray:
        return np.asarray(self.b) - np.asarray(self.a)

    @property
    def diff(self) -> float:
        return float(np.mean(self.diffs))

    @property
    def wins(self) -> int:
        return int(np.sum(self.diffs > TIE))

    @property
    def losses(self) -> int:
        return int(np.sum(self.diffs < -TIE))

    @property
    def ties(self) -> int:
        return len(self.qids) - self.wins - self.losses

    def moved(self, top: int = 5, worst_only: bool = False) -> list[tuple[str, float, float, float]]:
        """The `top` queries with the largest |B - A| (or the largest losses), as (qid, a, b, b - a)."""
        d = self.diffs
        order = np.argsort(d if worst_only else -np.abs(d), kind="stable")
        rows = [(self.qids[i], self.a[i], self.b[i], float(d[i])) for i in order[:top]]
        return [r for r in rows if (r[3] < -TIE if worst_only else abs(r[3]) > TIE)]

    def to_dict(self, top: int = 5) -> dict[str, Any]:
        return {
            "metric": self.name,
            "queries": len(self.qids),
            "mean_a": self.mean_a,
            "mean_b": self.mean_b,
            "diff": self.diff,
            "ci": list(self.ci),
            "p_value": self.p_value,
            "p_holm": self.p_holm,
            "wins": self.wins,
            "losses": self.losses,
            "ties": self.ties,
            "moved": [{"qid": q, "a": a, "b": b, "diff": d} for q, a, b, d in self.moved(top)],
            "per_query": {q: [a, b] for q, a, b in zip(self.qids, self.a, self.b, strict=True)},
        }


@dataclass(frozen=True)
class GateResult:
    """One `--fail-if-worse METRIC:MARGIN`: failed when B is worse by more than the margin with the
    Holm-adjusted one-sided p below alpha; `drivers` are the queries that lost most."""

    metric: str
    margin: float
    alpha: float
    diff: float
    p_value: float
    failed: bool
    drivers: tuple[tuple[str, float, float, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "margin": self.margin,
            "alpha": self.alpha,
            "diff": self.diff,
            "p_value": self.p_value,
            "failed": self.failed,
            "drivers": [{"qid": q, "a": a, "b": b, "diff": d} for q, a, b, d in self.drivers],
        }


@dataclass(frozen=True)
class Comparison:
    """Every metric's comparison, the gates, and what was left out (queries only one run answered)."""

    a: str
    b: str
    metrics: tuple[MetricComparison, ...]
    gates: tuple[GateResult, ...] = ()
    left_out: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    cost: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return any(g.failed for g in self.gates)

    def metric(self, name: str) -> MetricComparison:
        return next(m for m in self.metrics if m.name == name)

    def to_dict(self, top: int = 5) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "metrics": [m.to_dict(top) for m in self.metrics],
            "gates": [g.to_dict() for g in self.gates],
            "failed": self.failed,
            "left_out": {k: list(v) for k, v in self.left_out.items()},
            "cost": {k: dict(v) for k, v in self.cost.items()},
            "settings": dict(self.settings),
        }


def stream(seed: int, *names: str) -> np.random.Generator:
    """The random stream of one kind of test (the intervals, the tests, one gate), from the seed."""
    return np.random.default_rng([seed, *(zlib.crc32(n.encode("utf-8")) for n in names)])


def usage_figures(run: Run, prices: Prices | None = None) -> dict[str, float]:
    """Mean tokens per query of a run whose usage is known (and the cost with `prices`); {} without."""
    if not run.usage:
        return {}
    rows = list(run.usage.values())
    prompt = float(np.mean([u.get("prompt_tokens", 0) for u in rows]))
    completion = float(np.mean([u.get("completion_tokens", 0) for u in rows]))
    out = {
        "queries": float(len(rows)),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if prices is not None:
        out["cost"] = prices.cost(prompt, completion)
    return out


def checked_options(
    metrics: Sequence[str],
    gates: Sequence[str | tuple[str, float]] = (),
    *,
    qrels: Sequence[Any] | None = None,
    subtopics: Sequence[Any] | None = None,
    rel_level: int = 1,
    alpha: float = 0.05,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    method: str = "bca",
) -> tuple[list[MetricSpec], list[tuple[str, float]]]:
    """The metrics (gated ones added) and the gates as `compare_runs` uses them, or one `InputError`
    with every problem: a caller about to rerank checks them first (`rag-rerank compare` does)."""
    problems = []
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 100:
        problems.append(
            Violation(
                path="n_resamples",
                value=n_resamples,
                message=f"n_resamples must be a whole number of at least 100, got {n_resamples!r}",
            )
        )
    for name, value in (("alpha", alpha), ("confidence", confidence)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            problems.append(
                Violation(
                    path=name, value=value, message=f"{name} must be strictly between 0 and 1, got {value!r}"
                )
            )
    if method not in METHODS:
        problems.append(
            Violation(
                path="method", value=method, message=f"method must be {' or '.join(METHODS)}, got {method!r}"
            )
        )
    parsed_gates = []
    for gate in gates:
        try:
            parsed_gates.append(parse_gate(gate) if isinstance(gate, str) else (str(gate[0]), float(gate[1])))
        except InputError as exc:
            problems += exc.violations
    names = list(dict.fromkeys([*metrics, *(g[0] for g in parsed_gates)]))
    specs = []
    for name in names:
        try:
            specs.append(parse_metric(name, rel_level))
        except InputError as exc:
            problems += exc.violations
    for spec in specs:
        if spec.subtopic and not subtopics:
            problems.append(
                Violation(
                    path="metrics",
                    value=spec.name,
                    message=f"{spec.name} needs subtopic judgments (subtopics / --subtopics)",
                )
            )
    if qrels is not None:
        problems += rel_level_violations(rel_level, qrels)
    if problems:
        raise InputError(problems)
    return specs, parsed_gates


def compare_runs(
    a: Run,
    b: Run,
    qrels: Sequence[Any],
    *,
    metrics: Sequence[str] = DEFAULT_METRICS,
    subtopics: Sequence[Any] | None = None,
    rel_level: int = 1,
    gates: Sequence[str | tuple[str, float]] = (),
    alpha: float = 0.05,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    method: str = "bca",
    seed: int = 0,
    top: int = 5,
    prices: Prices | None = None,
) -> Comparison:
    """B against A on every metric (module docstring). `qrels` / `subtopics` are ir-measures Qrels
    (`judgments.read_qrels` / `read_subtopics`); `gates` are `METRIC:MARGIN` strings or pairs."""
    specs, parsed_gates = checked_options(metrics, gates, qrels=qrels, subtopics=subtopics,
                                          rel_level=rel_level, alpha=alpha, n_resamples=n_resamples,
                                          confidence=confidence, method=method)
    judged = {j.query_id for j in qrels}
    both = set(a.orders) & set(b.orders)
    left_out = {
        f"only in {label}": tuple(sorted((set(mine) - set(other)) & judged))
        for label, mine, other in (("A", a.orders, b.orders), ("B", b.orders, a.orders))
    }
    left_out = {k: v for k, v in left_out.items() if v}
    values: dict[str, dict[str, dict[str, float]]] = {}
    for group in (False, True):  # plain metrics on the qrels, subtopic ones on the subtopic judgments
        chosen = [s for s in specs if s.subtopic == group]
        judgments = subtopics if group else qrels
        if chosen and judgments is not None:
            for side, run in (("a", a), ("b", b)):
                for name, per in per_query(chosen, judgments, {q: run.orders[q] for q in both}).items():
                    values.setdefault(name, {})[side] = per
    rows: dict[str, tuple[tuple[str, ...], tuple[float, ...], tuple[float, ...]]] = {}
    for spec in specs:
        va, vb = values[spec.name]["a"], values[spec.name]["b"]
        qids = tuple(sorted(set(va) & set(vb)))
        if not qids:
            raise InputError(
                [
                    Violation(
                        path="qrels",
                        message=f"no query is in both runs and judged for "
                        f"{spec.name} (check the qid columns of the runs and the qrels)",
                    )
                ]
            )
        rows[spec.name] = (qids, tuple(va[q] for q in qids), tuple(vb[q] for q in qids))
    # Metrics over the same queries share their resamples (one matrix product for all of them); the
    # draws depend only on the seed and the number of queries, so adding a metric changes no other's.
    intervals: dict[str, tuple[float, float]] = {}
    pvalues: dict[str, float] = {}
    for qids in dict.fromkeys(r[0] for r in rows.values()):
        names = [n for n, r in rows.items() if r[0] == qids]
        d = np.column_stack([np.asarray(rows[n][2]) - np.asarray(rows[n][1]) for n in names])
        ci = bootstrap_interval(
            d, n_resamples=n_resamples, confidence=confidence, method=method, rng=stream(seed, "interval")
        )
        p = sign_flip_pvalue(d, n_resamples=n_resamples, rng=stream(seed, "test"))
        for i, name in enumerate(names):
            intervals[name] = (float(ci[i, 0]), float(ci[i, 1]))
            pvalues[name] = float(p[i])
    adjusted = holm([pvalues[s.name] for s in specs])
    metric_rows = tuple(
        MetricComparison(s.name, *rows[s.name], intervals[s.name], pvalues[s.name], float(adj))
        for s, adj in zip(specs, adjusted, strict=True)
    )
    gate_rows = _gates(metric_rows, parsed_gates, alpha, n_resamples, seed, top)
    settings = {
        "n_resamples": n_resamples,
        "confidence": confidence,
        "method": method,
        "seed": seed,
        "alpha": alpha,
        "rel_level": rel_level,
        "test": "paired randomisation (sign flip)",
        "correction": "Holm",
    }
    cost = {label: figs for label, run in (("A", a), ("B", b)) if (figs := usage_figures(run, prices))}
    return Comparison(a.label, b.label, metric_rows, gate_rows, left_out, settings, cost)


def _gates(
    metric_rows: Sequence[MetricComparison],
    gates: Sequence[tuple[str, float]],
    alpha: float,
    n_resamples: int,
    seed: int,
    top: int,
) -> tuple[GateResult, ...]:
    if not gates:
        return ()
    by_name = {m.name: m for m in metric_rows}
    raw = []
    for name, margin in gates:
        m = by_name[name.strip()]
        raw.append(
            float(
                sign_flip_pvalue(
                    m.diffs,
                    n_resamples=n_resamples,
                    alternative="less",
                    shift=margin,
                    rng=stream(seed, m.name, f"gate {margin!r}"),
                )[0]
            )
        )
    adjusted = holm(raw)
    out = []
    for (name, margin), p in zip(gates, adjusted, strict=True):
        m = by_name[name.strip()]
        failed = bool(m.diff < -margin and p < alpha)
        out.append(
            GateResult(m.name, margin, alpha, m.diff, float(p), failed, tuple(m.moved(top, worst_only=True)))
        )
    return tuple(out)


__all__ = [
    "DEFAULT_METRICS",
    "SUBTOPIC_MEASURES",
    "TIE",
    "Comparison",
    "GateResult",
    "MetricComparison",
    "MetricSpec",
    "checked_options",
    "compare_runs",
    "parse_gate",
    "parse_metric",
    "per_query",
    "stream",
    "usage_figures",
]
