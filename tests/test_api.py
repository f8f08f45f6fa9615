"""The public API surface (rag_rerank/__init__.py) is pinned: adding or removing a name is a decision."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

import rag_rerank

PUBLIC = [
    "Attempt",
    "BackendError",
    "Chunk",
    "Dropped",
    "InputError",
    "MissingDependencyError",
    "OutputError",
    "Ranked",
    "RerankError",
    "RerankRequest",
    "RerankResult",
    "RunMeta",
    "SkillCard",
    "Violation",
    "__version__",
    "arerank",
    "arerank_many",
    "check_output",
    "load_skill",
    "make_backend",
    "parse_chunks",
    "render",
    "repair_output",
    "rerank",
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
    ):
        assert issubclass(cls, rag_rerank.RerankError)
    assert issubclass(rag_rerank.RerankError, Exception)


def test_version_matches_the_distribution() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = Path(rag_rerank.__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.is_file():
        assert (
            tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"]
            == rag_rerank.__version__
        )
