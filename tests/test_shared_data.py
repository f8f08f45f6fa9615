"""Tests that read the shared evaluation data skip without it, saying where they looked, and CI,
which has the data, fails rather than skip them (`tests/support/shared_data.py`, `conftest.py`).

Each case runs a real test of the suite in a pytest of its own, with `RAG_RERANK_DATA` pointing at
an empty or absent folder: what a clone of the repository alone (a new user's) runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.shared_data import ENV, data_dir

ROOT = Path(__file__).resolve().parent.parent
# Two tests that read DL19 through the helpers: `need` (also what bench scripts call) and `require`.
NEEDS_DATA = ["tests/test_redundancy.py::test_the_passage_shortcut_agrees_on_real_passages",
              "tests/test_evaluate.py::test_input_order_metrics_match_a_hand_computation"]


def _pytest(data: Path, ci: str | None, *ids: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS")}
    env.update({ENV: str(data), "PYTHONPATH": str(ROOT)})
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *ids],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_without_the_data_a_test_skips_and_says_where_it_looked(tmp_path: Path) -> None:
    empty = tmp_path / "data"
    empty.mkdir()
    out = _pytest(empty, None, *NEEDS_DATA)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 skipped" in out.stdout and "SystemExit" not in out.stdout + out.stderr
    assert str(empty / "trec-dl19") in out.stdout  # the file it wanted, under the folder it looked in
    assert ENV in out.stdout  # and how to point it elsewhere


def test_in_ci_with_the_data_folder_a_skip_for_missing_data_fails(tmp_path: Path) -> None:
    """CI has the data: a test that skips there for want of it (a file moved, a path misspelt)
    would silently stop testing anything, so the skip is turned into a failure."""
    empty = tmp_path / "data"
    empty.mkdir()
    out = _pytest(empty, "true", NEEDS_DATA[0])
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 failed" in out.stdout and "CI" in out.stdout


def test_in_ci_without_any_data_folder_the_tests_skip(tmp_path: Path) -> None:
    out = _pytest(tmp_path / "nowhere", "true", NEEDS_DATA[0])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 skipped" in out.stdout


def test_with_the_data_the_test_runs() -> None:
    if not (data_dir() / "trec-dl19" / "bm25-top100.json").is_file():
        pytest.skip(f"shared evaluation data not found: {data_dir()} has no trec-dl19 (set {ENV})")
    out = _pytest(data_dir(), "true", NEEDS_DATA[0])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout
