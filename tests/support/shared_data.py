"""Where the evaluation data (`shared/data`) and the seeds (`shared/seeds`) are, for every test and bench.

One answer for all of them, so no file names a machine's absolute path: `RAG_RERANK_DATA` when set
(the `data` folder itself; the seeds are its sibling `seeds`), else the first `shared/data` found
next to the checkout or next to one of its parent folders (a git worktree sits a level deeper than
the main checkout). Tests that need the data skip when it is absent, naming the file they wanted and
where they looked (a clone of the repository alone has no data); bench scripts end with the same
words. It is evaluation material, never shipped in the package.

In CI (`CI=true`) a data folder is there, so a test skipping for want of a file in it would quietly
stop testing anything (a file moved, a path misspelt): `fail_unexpected_skip`, called by
`tests/conftest.py`, turns such a skip into a failure.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

ENV = "RAG_RERANK_DATA"
CHECKOUT = Path(__file__).resolve().parents[2]
# The first words of every skip for missing data: what `fail_unexpected_skip` recognises.
MISSING = "shared evaluation data not found"


def data_dir() -> Path:
    """The evaluation data folder (it may not exist: check before reading, or use `require`)."""
    configured = os.environ.get(ENV)
    if configured:
        return Path(configured).expanduser()
    for parent in CHECKOUT.parents:
        candidate = parent / "shared" / "data"
        if candidate.is_dir():
            return candidate
    return CHECKOUT.parent / "shared" / "data"


def seeds_dir() -> Path:
    """The seeds folder (the skill card and the systems we compare with), beside the data folder."""
    return data_dir().parent / "seeds"


def looked_in() -> str:
    """Where `data_dir` looked, in words: the variable's value, or every `shared/data` it tried."""
    configured = os.environ.get(ENV)
    if configured:
        return f"{ENV}={configured}"
    tried = ", ".join(str(parent / "shared" / "data") for parent in CHECKOUT.parents)
    return f"{ENV} unset; looked for {tried}"


def require(path: Path) -> Path:
    """`path` if it exists, else skip the calling test saying where the data was looked for."""
    import pytest  # benches import this module too, without pytest

    if not path.exists():
        pytest.skip(f"{MISSING}: {path} is missing ({looked_in()}); set {ENV} to the shared data folder")
    return path


def need(path: Path, flag: str = "--data") -> Path:
    """`path` if it exists; else end a bench script with one line saying what is missing and how to
    point at it (a FileNotFoundError traceback was all `python bench/overhead.py` printed on a
    machine without the shared data, the very run docs/speed.md invites). Inside pytest (a test
    reaching a bench helper) it skips the test instead, as `require` does: a SystemExit there
    failed the test on every machine without the data."""
    if not path.exists():
        if "pytest" in sys.modules:  # a bench run as a script never imports pytest
            require(path)
        raise SystemExit(f"{path} not found: this bench reads the shared evaluation data (not shipped "
                         f"with the package); set {ENV} to that data folder or pass {flag} FILE")
    return path


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def fail_unexpected_skip(report: Any) -> None:
    """Turn a test report's skip for missing data into a failure when CI runs with a data folder
    (module docstring); any other report is left as it is."""
    if not (report.skipped and in_ci() and data_dir().is_dir()):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if MISSING in str(reason):
        report.outcome = "failed"
        report.longrepr = (f"skipped in CI although the data folder {data_dir()} exists (CI=true): "
                           f"{str(reason).removeprefix('Skipped: ')}")
