"""rag-rerank: a trustworthy LLM second-stage reranker for retrieval-augmented generation."""

from __future__ import annotations

from .batch import arerank_many
from .errors import (
    Attempt,
    BackendError,
    InputError,
    MissingDependencyError,
    OutputError,
    RerankError,
    Violation,
)
from .guard import check_output, parse_chunks, repair_output, validate_request
from .models import Chunk, Dropped, Ranked, RerankRequest, RerankResult, RunMeta
from .render import render
from .rerank import arerank, make_backend, rerank
from .skill import SkillCard, load_skill

__version__ = "0.1.0"

__all__ = [
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
