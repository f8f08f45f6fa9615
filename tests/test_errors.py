"""Error types (rag_rerank/errors.py): what a caller and the CLI can rely on."""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

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


ROOT = Path(__file__).resolve().parent.parent


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    path = ROOT / "pyproject.toml"
    if not path.is_file():
        pytest.skip("pyproject.toml is not shipped in this layout")
    return tomllib.loads(path.read_text(encoding="utf-8"))


def test_every_missing_dependency_error_names_an_extra_that_exists() -> None:
    """`pip install 'rag-rerank[X]'` for an X pyproject.toml does not define only warns; a core
    dependency (extra None) is named by its requirement as pyproject.toml spells it."""
    project = _pyproject()["project"]
    extras, core = set(project["optional-dependencies"]), set(project["dependencies"])
    calls = []
    for path in sorted((ROOT / "rag_rerank").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "MissingDependencyError":
                extra, module = node.args[1], node.args[2]
                assert isinstance(extra, ast.Constant), f"{path.name}:{node.lineno}: extra is not a literal"
                calls.append((f"{path.name}:{node.lineno}", extra.value,
                              module.value if isinstance(module, ast.Constant) else None))
    assert len(calls) >= 8
    bad = [c for c in calls if (c[1] not in extras if c[1] is not None else c[2] not in core)]
    assert bad == []


@pytest.mark.parametrize(("backend", "module"), [("openai", "openai"), ("anthropic", "anthropic")])
def test_a_missing_core_sdk_says_pip_install_it_not_a_nonexistent_extra(backend: str, module: str) -> None:
    code = (
        "import sys\n"
        f"sys.modules[{module!r}] = None\n"  # import fails as for a package that is not installed
        "from rag_rerank import MissingDependencyError\n"
        f"from rag_rerank.backends.{backend} import _sdk\n"  # what the backend calls before any request
        "try:\n"
        "    _sdk()\n"
        "except MissingDependencyError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert f"pip install '{module}>=" in done.stdout and "rag-rerank[" not in done.stdout


def test_backend_error_names_a_run_of_identical_attempts_once() -> None:
    """Regression: six retries of the same HTTP 501 error page repeated the page six times in the
    one-line message."""
    page = "HTTP 501 from http://127.0.0.1:8765/v1/rerank: <html>Unsupported method ('POST')</html>"
    attempts = [*(Attempt(i, "transient", page) for i in range(1, 6)), Attempt(6, "fatal", "HTTP 401")]
    assert str(BackendError("rerank-api failed", attempts)) == (
        f"rerank-api failed [#1-#5 transient: {page}; #6 fatal: HTTP 401]")


# --- errors cross process boundaries ----------------------------------------------------------
# A worker pool (multiprocessing, concurrent.futures, Ray) pickles an exception in the worker and
# re-raises the unpickled copy in the parent; frameworks deep-copy components and what they hold.

def _every_error() -> list[Exception]:
    import threading

    from rag_rerank.errors import ConfigError, EmbedderError

    vs = [Violation("chunks[2].id", "duplicate id", value={"id": "c1"}, line=3, id="c1"),
          Violation("top_k", "must be at least 1", value=0)]
    return [
        InputError(vs),
        InputError(vs[:1], headline="invalid batch line"),
        # a value that cannot be pickled (a lock passed where chunks go) must not stop the error
        InputError([Violation("chunks", "not JSONL, a list or a Path", value=threading.Lock())]),
        OutputError(vs, raw='{"ranked": []}'),
        BackendError("openai: no valid answer", [Attempt(1, "transient", "HTTP 429", wait_s=1.5),
                                                 Attempt(2, "invalid_output", "bad", violations=tuple(vs))],
                     usage={"total_tokens": 12}),
        EmbedderError("the openai embedder failed", [Attempt(1, "fatal", "HTTP 404")]),
        ConfigError("openai: no API key"),
        MissingDependencyError("the sentence-transformers embedder", "st", "sentence-transformers"),
        MissingDependencyError("the openai backend", None, "openai>=1.40"),
    ]


def _data(err: Exception) -> dict[str, object]:
    keep = ("headline", "raw", "attempts", "usage", "message", "feature", "extra", "module")
    data: dict[str, object] = {k: getattr(err, k) for k in keep if hasattr(err, k)}
    if hasattr(err, "violations"):
        data["violations"] = [(v.path, v.message, v.line, v.id, str(v.value)[:20]) for v in err.violations]
    return {"type": type(err), "text": str(err), **data}


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_every_error_survives_pickle_and_deepcopy_with_its_data(how: str) -> None:
    """Exception's default rebuilt an `InputError` as `InputError(message)`: its text became one
    'problem' per character of the message, and a `MissingDependencyError` could not be rebuilt at all."""
    import copy
    import pickle

    for err in _every_error():
        err.add_note("request 7")
        copied = pickle.loads(pickle.dumps(err)) if how == "pickle" else copy.deepcopy(err)
        assert _data(copied) == _data(err)
        assert copied.__notes__ == ["request 7"]  # type: ignore[attr-defined]


def _raise_missing(_: int) -> None:
    raise MissingDependencyError("the sentence-transformers embedder", "st", "sentence-transformers")


def _raise_input(_: int) -> None:
    from rag_rerank import rerank

    rerank("", [{"id": "a", "text": "x"}], top_k=0)


def test_a_process_pool_re_raises_our_errors_in_the_parent() -> None:
    """A `MissingDependencyError` raised in a `multiprocessing.Pool` worker killed the pool's
    result thread (the parent waited forever); an `InputError` arrived with a garbled text."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(1) as pool:
        with pytest.raises(MissingDependencyError) as missing:
            pool.map_async(_raise_missing, [1]).get(timeout=60)
        with pytest.raises(InputError) as bad:
            pool.map_async(_raise_input, [1]).get(timeout=60)
    assert missing.value.extra == "st" and "rag-rerank[st]" in str(missing.value)
    assert {v.path for v in bad.value.violations} >= {"query", "top_k"}
    assert str(bad.value).startswith(f"invalid input ({len(bad.value.violations)} problems)\n  - ")
