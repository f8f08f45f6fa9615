"""Error types (rag_rerank/errors.py): what a caller and the CLI can rely on."""

from __future__ import annotations

import dataclasses

import pytest

from rag_rerank.errors import (
    Attempt,
    BackendError,
    InputError,
    MissingDependencyError,
    OutputError,
    Violation,
)


def test_violation_text_names_line_path_and_id() -> None:
    assert (
        str(Violation("chunks[2].id", "missing", line=3, id="x")) == "line 3: chunks[2].id: id 'x': missing"
    )
    assert str(Violation("$.ranked", "too many")) == "$.ranked: too many"
    assert str(Violation("", "bare")) == "bare"
    assert Violation("p", "m", value=1, line=2, id="i").to_dict() == {
        "path": "p",
        "message": "m",
        "line": 2,
        "id": "i",
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        Violation("p", "m").path = "q"  # type: ignore[misc]


def test_guard_errors_carry_every_violation() -> None:
    vs = [Violation("query", "query is empty"), Violation("top_k", "bad")]
    err = InputError(vs)
    assert err.violations == tuple(vs)
    assert str(err) == "invalid input (2 problems)\n  - query: query is empty\n  - top_k: bad"
    out = OutputError(vs[:1], raw="{}")
    assert (out.raw, str(out)) == ("{}", "invalid LLM output (1 problem)\n  - query: query is empty")


def test_backend_error_keeps_every_attempt() -> None:
    attempts = [Attempt(1, "transient", "HTTP 429", wait_s=1.0), Attempt(2, "fatal", "HTTP 401")]
    err = BackendError("openai failed", attempts)
    assert err.attempts == tuple(attempts)
    assert str(err) == "openai failed [#1 transient: HTTP 429; #2 fatal: HTTP 401]"


def test_missing_dependency_says_what_to_install() -> None:
    err = MissingDependencyError("the MCP server", "mcp", "mcp")
    assert str(err) == ("the MCP server needs the optional package 'mcp': pip install 'rag-rerank[mcp]' "
                        "(from a source checkout: pip install '.[mcp]')")


def test_backend_error_names_a_run_of_identical_attempts_once() -> None:
    """Regression: six retries of the same HTTP 501 error page repeated the page six times in the
    one-line message."""
    page = "HTTP 501 from http://127.0.0.1:8765/v1/rerank: <html>Unsupported method ('POST')</html>"
    attempts = [*(Attempt(i, "transient", page) for i in range(1, 6)), Attempt(6, "fatal", "HTTP 401")]
    assert str(BackendError("rerank-api failed", attempts)) == (
        f"rerank-api failed [#1-#5 transient: {page}; #6 fatal: HTTP 401]")
