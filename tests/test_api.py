"""The public API surface (rag_rerank/__init__.py) is pinned: adding or removing a name is a decision."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

import rag_rerank

PUBLIC = [
    "Attempt",
    "BackendError",
    "Budget",
    "BudgetError",
    "CacheMissError",
    "Chunk",
    "ConfigError",
    "CostPlan",
    "Dropped",
    "EmbedderError",
    "InputError",
    "Limits",
    "MissingDependencyError",
    "OutputError",
    "Prices",
    "Ranked",
    "RerankError",
    "RerankRequest",
    "RerankResult",
    "Reranker",
    "ResponseCache",
    "RetryPolicy",
    "Router",
    "RunMeta",
    "SkillCard",
    "Violation",
    "__version__",
    "anthropic_tool",
    "arerank",
    "arerank_many",
    "call_tool",
    "check_output",
    "load_skill",
    "make_backend",
    "openai_tool",
    "parse_chunks",
    "plan",
    "render",
    "repair_output",
    "rerank",
    "route",
    "validate_request",
]


def test_all_is_pinned_and_sorted() -> None:
    assert rag_rerank.__all__ == PUBLIC


def test_every_name_in_all_exists() -> None:
    for name in rag_rerank.__all__:
        assert hasattr(rag_rerank, name), name


def test_no_public_name_is_left_out_of_all() -> None:
    public = {
        n
        for n, v in vars(rag_rerank).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType)
    }
    public.discard("annotations")  # from __future__
    assert public <= set(PUBLIC)


def test_exported_objects_come_from_the_package() -> None:
    for name in rag_rerank.__all__:
        obj = getattr(rag_rerank, name)
        if hasattr(obj, "__module__"):
            assert obj.__module__.startswith("rag_rerank"), (name, obj.__module__)


def test_error_hierarchy() -> None:
    for cls in (
        rag_rerank.InputError,
        rag_rerank.OutputError,
        rag_rerank.BackendError,
        rag_rerank.MissingDependencyError,
        rag_rerank.BudgetError,
        rag_rerank.CacheMissError,
    ):
        assert issubclass(cls, rag_rerank.RerankError)
    # an embedder's server failing is a backend failure (exit 3), so `except BackendError` catches it
    assert issubclass(rag_rerank.EmbedderError, rag_rerank.BackendError)
    assert issubclass(rag_rerank.RerankError, Exception)


def test_version_matches_the_distribution() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = Path(rag_rerank.__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.is_file():
        assert (
            tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"]
            == rag_rerank.__version__
        )


def test_the_option_types_of_rerank_are_exported() -> None:
    """`policy=RetryPolicy(...)` and `limits=Limits(...)` are documented options of `rerank`: a user
    must not have to know which submodule defines them (issue 15)."""
    from rag_rerank import Limits, RetryPolicy
    from rag_rerank.guard.limits import Limits as GuardLimits
    from rag_rerank.retry import RetryPolicy as RetryRetryPolicy

    assert RetryPolicy is RetryRetryPolicy and Limits is GuardLimits


def test_every_top_level_import_in_the_docs_resolves() -> None:
    """Each `from rag_rerank import a, b` in README.md or docs/*.md names an exported object."""
    import re

    root = Path(rag_rerank.__file__).resolve().parent.parent
    pages = [root / "README.md", *sorted((root / "docs").glob("**/*.md"))]
    named: set[str] = set()
    for page in (p for p in pages if p.is_file()):
        text = page.read_text(encoding="utf-8")
        for found in re.finditer(r"from rag_rerank import (\([^)]*\)|[^\n#]+)", text):
            names = found.group(1).strip("()").replace("\n", ",").split(",")
            named |= {n.split(" as ")[0].strip() for n in names if n.strip()}
    assert named, "no top-level import found in the docs"
    import importlib.util

    modules = {n for n in named if importlib.util.find_spec(f"rag_rerank.{n}") is not None}
    assert named - modules <= set(rag_rerank.__all__), sorted(named - modules - set(rag_rerank.__all__))


def test_importing_the_package_loads_no_heavy_dependency(repo_root: Path) -> None:
    """A web app or a worker imports rag_rerank at start-up: models, frameworks, Ray and the LLM
    SDKs load on first use, never at import (time it with `python bench/production.py`)."""
    import os
    import subprocess
    import sys

    heavy = ("torch", "sentence_transformers", "transformers", "langchain_core", "llama_index", "haystack",
             "ray", "mcp", "openai", "anthropic", "httpx", "model2vec")
    code = f"import sys, rag_rerank; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    run = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(repo_root)}, timeout=120)
    assert (run.returncode, run.stdout.strip(), run.stderr) == (0, "[]", "")
