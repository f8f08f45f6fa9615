"""Where the product's data folders live.

`skills/`, `prompts/`, `guard/` and `golden/` sit at the top of a checkout, and inside the package
as `rag_rerank/_data/` once a wheel is installed. Everything that reads them asks this module, so
the two layouts never leak into the rest of the code.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


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
