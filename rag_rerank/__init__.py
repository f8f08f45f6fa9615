"""rag-rerank: a trustworthy LLM second-stage reranker for retrieval-augmented generation."""

from __future__ import annotations

import logging as _logging

from .api import arerank, arerank_many, plan, rerank
from .backends.factory import make_backend
from .cache import ResponseCache
from .cost import Budget, CostPlan, Prices
from .errors import (
    Attempt,
    BackendError,
    BudgetError,
    CacheMissError,
    ConfigError,
    EmbedderError,
    InputError,
    MissingDependencyError,
    OutputError,
    RerankError,
    Violation,
)
from .guard import Limits, check_output, parse_chunks, repair_output, validate_request
from .models import Chunk, Dropped, Ranked, RerankRequest, RerankResult, RunMeta
from .render import render
from .retry import RetryPolicy
from .router import Router, route
from .session import Reranker
from .skill import SkillCard, load_skill

__version__ = "0.1.0"

# A library reports through loggers named `rag_rerank.*` and leaves output to the application: without
# this handler, Python's last-resort handler would print a WARNING record (a fallback) to stderr of a
# program that configured no logging, which `rag-rerank rerank` keeps for its one-line errors.
_logging.getLogger(__name__).addHandler(_logging.NullHandler())

# Resolved on first use: importing rag_rerank.tools here would make `python -m rag_rerank.tools`
# (which regenerates guard/tools/) warn that the module was imported before it ran.
_LAZY = {"anthropic_tool": "tools", "call_tool": "tools", "openai_tool": "tools"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from importlib import import_module

        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
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
