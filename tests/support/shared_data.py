"""Where the evaluation data (`shared/data`) and the seeds (`shared/seeds`) are, for every test and bench.

One answer for all of them, so no file names a machine's absolute path: `RAG_RERANK_DATA` when set
(the `data` folder itself; the seeds are its sibling `seeds`), else the first `shared/data` found
next to the checkout or next to one of its parent folders (a git worktree sits a level deeper than
the main checkout). Tests that need the data skip with this explanation when it is absent; it is
evaluation material, never shipped in the package.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "RAG_RERANK_DATA"
CHECKOUT = Path(__file__).resolve().parents[2]


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


def require(path: Path) -> Path:
    """`path` if it exists, else skip the calling test saying where the data was looked for."""
    import pytest  # benches import this module too, without pytest

    if not path.exists():
        pytest.skip(f"{path} not found: set {ENV} to the shared data folder")
    return path


def need(path: Path, flag: str = "--data") -> Path:
    """`path` if it exists; else end a bench script with one line saying what is missing and how to
    point at it (a FileNotFoundError traceback was all `python bench/overhead.py` printed on a
    machine without the shared data, the very run docs/speed.md invites)."""
    if not path.exists():
        raise SystemExit(f"{path} not found: this bench reads the shared evaluation data (not shipped "
                         f"with the package); set {ENV} to that data folder or pass {flag} FILE")
    return path
