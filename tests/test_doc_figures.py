"""The figures the docs quote still reproduce: `python bench/figures.py --quick`, in the suite.

bench/figures.py holds the registry (each figure as documented, the docs' exact text quoting it,
the bench command that prints it, and a function recomputing it); this test runs its quick part
(the local backend with the default lexical profile: README's held-out rows, the DL19 and AMBIENT
tables of docs/quality.md, docs/eval.md, the windows table, the duplicate thresholds and AMBIENT
diversity of docs/postpass.md, the non-English table, the lexical router of docs/agents.md). The
figures are deterministic, so a change that moves one must update the doc that quotes it (and the
registry), or be a regression.
MiniLM, SciFact and cross-validation figures are in `python bench/figures.py` (full).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.shared_data import data_dir, require

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_the_quick_figures_the_docs_quote_reproduce() -> None:
    for part in ("trec-dl19/bm25-top100.json", "trec-dl19/qrels.txt", "ambient/STRel.txt",
                 "clough-stevenson/file_information.csv"):
        require(data_dir() / part)
    pytest.importorskip("ir_measures", reason="the eval extra (ir-measures) computes the TREC figures")
    pytest.importorskip("pyndeval", reason="the eval extra (pyndeval) computes AMBIENT's alpha-nDCG")
    saved = list(sys.path)
    sys.path.insert(0, str(BENCH))  # the bench modules import each other by name, also while measuring
    try:
        import figures

        chosen = figures.selected(quick=True)
        assert len(chosen) > 100, "the quick registry lost its figures"
        outcomes = figures.run_figures(chosen)
    finally:
        sys.path[:] = saved
    bad = [o for o in outcomes if o.status != "OK"]
    assert not bad, "figures the docs quote no longer reproduce (update the doc and bench/figures.py, " \
        "or fix the regression):\n" + "\n".join(
            f"- {o.status}: {o.figure.name}: documented {o.figure.value!r}, measured {o.measured!r}"
            f"{' (' + o.note + ')' if o.note else ''}; reproduce with: {o.figure.command}" for o in bad)
