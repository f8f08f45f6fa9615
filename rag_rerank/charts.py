"""The figures of the HTML reports as inline SVG, drawn by matplotlib (the `report` extra).

Self-contained by construction: matplotlib's SVG backend writes text as paths (`svg.fonttype =
"path"`), so a page needs no font; nothing is linked or scripted. Each figure is drawn on its own
`Figure` with the SVG canvas (no pyplot, no global backend switch, safe in a threaded server), and
the output is stable: no date in the metadata, a fixed hash salt for the ids.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Any

from .errors import MissingDependencyError

WIN, LOSS, NEUTRAL, BAND = "#1a7f37", "#c62828", "#555555", "#90caf9"


def require_charts() -> None:
    """A `MissingDependencyError` now, before a long run, when the `report` extra is missing."""
    _figure(1, 1)


def _figure(width: float = 7.0, height: float = 3.0) -> Any:
    try:
        import matplotlib
        from matplotlib.backends.backend_svg import FigureCanvasSVG
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingDependencyError("the HTML report (--html)", "report", "matplotlib") from None
    matplotlib.rcParams.update({"svg.fonttype": "path", "svg.hashsalt": "rag-rerank", "font.size": 9})
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasSVG(fig)
    return fig


def _svg(fig: Any, label: str) -> str:
    """The figure as an `<svg>` element for inline use (no XML prolog or DOCTYPE), titled `label`."""
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None, "Title": label})
    text = out.getvalue()
    text = text[text.index("<svg") :]
    # The RDF metadata block names vocabularies by URL: dropped, so the page names no address at all.
    text = re.sub(r"\s*<metadata>.*?</metadata>", "", text, count=1, flags=re.DOTALL)
    # Scalable in the page and named for screen readers.
    text = re.sub(r'<svg ([^>]*?)width="[^"]*" height="[^"]*"', r"<svg \1", text, count=1)
    return text.replace("<svg ", f'<svg role="img" aria-label="{label}" ', 1)


def difference_chart(
    qids: Sequence[str], diffs: Sequence[float], metric: str, a: str = "A", b: str = "B"
) -> str:
    """Per-query `B - A` of one metric, sorted, wins green and losses red, the mean dashed."""
    fig = _figure(7.0, 2.8)
    ax = fig.add_subplot()
    pairs = sorted(zip(diffs, qids, strict=True))
    values = [v for v, _ in pairs]
    colours = [WIN if v > 1e-9 else LOSS if v < -1e-9 else NEUTRAL for v in values]
    ax.bar(range(len(values)), values, color=colours, width=0.85)
    mean = sum(values) / len(values) if values else 0.0
    ax.axhline(0, color="black", linewidth=0.6)
    ax.axhline(mean, color=NEUTRAL, linestyle="--", linewidth=0.8, label=f"mean {mean:+.4f}")
    ax.set_xlabel(f"queries ({len(values)}), sorted by difference")
    ax.set_ylabel(f"{metric}: {b} - {a}")
    ax.set_xticks([])
    ax.legend(loc="upper left", frameon=False)
    return _svg(fig, f"per-query difference of {metric}")


def position_curve(
    mean: Sequence[float], low: Sequence[float], high: Sequence[float], confidence: float = 0.95
) -> str:
    """Mean rank shift by the decile of the input position shown, with its confidence band."""
    fig = _figure(7.0, 2.8)
    ax = fig.add_subplot()
    x = [10 * i + 5 for i in range(len(mean))]
    ax.fill_between(
        x,
        low,
        high,
        color=BAND,
        alpha=0.6,
        linewidth=0,
        label=f"{round(100 * confidence)}% bootstrap band over queries",
    )
    ax.plot(x, mean, marker="o", color="#0d47a1", linewidth=1.4, label="mean rank shift")
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(x, [f"{10 * i}-{10 * i + 10}%" for i in range(len(mean))])
    ax.set_xlabel("position the chunk was shown at (decile of the input order)")
    ax.set_ylabel("ranks gained (+) / lost (-)")
    ax.legend(loc="best", frameon=False)
    return _svg(fig, "rank shift by input position")


def reliability_diagram(
    before: Sequence[tuple[float, float, int]],
    after: Sequence[tuple[float, float, int]],
    after_label: str = "calibrated",
) -> str:
    """Share judged relevant against the mean score, per score bin: raw scores and calibrated
    ones on the held-out queries; the diagonal is perfect calibration, a marker's area its chunks."""
    fig = _figure(4.6, 4.2)
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], color="black", linewidth=0.6, linestyle=":", label="perfectly calibrated")
    for rows, colour, label in ((before, LOSS, "raw score"), (after, WIN, after_label)):
        kept = [r for r in rows if r[2] > 0]
        if not kept:
            continue
        top = max(r[2] for r in kept)
        ax.plot([r[0] for r in kept], [r[1] for r in kept], color=colour, linewidth=1.2, label=label)
        ax.scatter(
            [r[0] for r in kept],
            [r[1] for r in kept],
            s=[12 + 80 * r[2] / top for r in kept],
            color=colour,
            zorder=3,
        )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    ax.set_xlabel("mean score in the bin")
    ax.set_ylabel("share judged relevant")
    ax.legend(loc="upper left", frameon=False)
    return _svg(fig, "reliability diagram before and after calibration")


__all__ = ["difference_chart", "position_curve", "reliability_diagram", "require_charts"]
