"""Where the product's data folders live.

`skills/`, `prompts/`, `guard/` and `golden/` sit at the top of a checkout, and inside the package
as `rag_rerank/_data/` once a wheel is installed. Everything that reads them asks this module, so
the two layouts never leak into the rest of the code.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent

# The folder of every cache kept between processes (vectors, responses); `off` turns them off.
CACHE_DIR_ENV = "RAG_RERANK_CACHE_DIR"


@cache
def data_root() -> Path:
    """The folder holding skills/, prompts/, guard/ and golden/."""
    installed = _PACKAGE_DIR / "_data"
    if (installed / "guard").is_dir():
        return installed
    checkout = _PACKAGE_DIR.parent
    if (checkout / "guard").is_dir():
        return checkout
    raise FileNotFoundError(
        f"rag-rerank data folders not found in {installed} or {checkout}; the installation is incomplete"
    )


def skills_dir() -> Path:
    return data_root() / "skills"


def prompts_dir() -> Path:
    return data_root() / "prompts"


def guard_dir() -> Path:
    return data_root() / "guard"


def golden_dir() -> Path:
    return data_root() / "golden"


def default_cache_dir() -> Path | None:
    """`$RAG_RERANK_CACHE_DIR`, else `$XDG_CACHE_HOME/rag-rerank`, else `~/.cache/rag-rerank`;
    None when the variable is `off` (or empty), or when there is no home folder to put it in."""
    value = os.environ.get(CACHE_DIR_ENV)
    if value is not None:
        return None if value.strip().lower() in ("", "off", "0", "none") else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except RuntimeError:  # no HOME and no passwd entry (some containers): run without a cache
            return None
    return Path(base) / "rag-rerank"
