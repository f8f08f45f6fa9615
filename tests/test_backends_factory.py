"""The registry of backends (`rag_rerank/backends/factory.py`): each named backend declares its
capabilities in the `Backend` protocol's terms, the registry is the one place that reads them
(or infers them for a caller's own backend class), and no other module probes a backend."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pytest

from rag_rerank.backends.base import Capabilities, Completion
from rag_rerank.backends.factory import (
    BACKEND_OPTIONS,
    BACKENDS,
    REGISTRY,
    capabilities,
    make_backend,
    model_of,
)

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rag_rerank"
# The modules allowed to look a backend's abilities up by name: the registry, and the one way to
# close anything a session built (a backend or an embedder).
OWNERS = {PACKAGE / "backends" / "factory.py", PACKAGE / "lifecycle.py"}
CAPABILITY_NAMES = {"scored", "cache_identity", "close", "aclose", "release_loop", "complete", "acomplete",
                    "capabilities"}


def _probes(path: Path) -> list[str]:
    """Each getattr / hasattr of a backend (its argument's source names one, or the attribute is a
    capability's) and each inspect.signature in `path`, as `file:line: source`."""
    source = path.read_text(encoding="utf-8")
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        probing = False
        if func in ("getattr", "hasattr") and len(node.args) >= 2:
            target, attr = ast.unparse(node.args[0]), node.args[1]
            named = isinstance(attr, ast.Constant) and attr.value in CAPABILITY_NAMES
            probing = named or "backend" in target.lower()
        elif func in ("inspect.signature", "signature"):
            probing = True
        if probing:
            out.append(f"{path.name}:{node.lineno}: {ast.get_source_segment(source, node)}")
    return out


def test_no_module_outside_the_registry_probes_a_backend() -> None:
    found = [p for path in sorted(PACKAGE.rglob("*.py")) if path not in OWNERS for p in _probes(path)]
    assert not found, "read a backend's abilities through backends.factory.capabilities:\n" + "\n".join(found)


def test_the_probe_finder_finds_probing(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f(backend, x):\n"
                      "    return getattr(backend, 'model', None), hasattr(x, 'scored')\n", encoding="utf-8")
    assert len(_probes(sample)) == 2


EXPECTED = {
    "local": Capabilities(scored=True),
    "cross-encoder": Capabilities(scored=True),
    "openai": Capabilities(cacheable=True, timeout=True, closes=True, needs_key=True),
    "anthropic": Capabilities(cacheable=True, timeout=True, closes=True, needs_key=True),
    "rerank-api": Capabilities(scored=True, cacheable=True, closes=True, needs_key=True),
}


@pytest.mark.parametrize("name", BACKENDS)
def test_each_backend_declares_its_capabilities_and_takes_its_registered_options(name: str) -> None:
    spec = REGISTRY[name]
    cls = spec.load()
    declared = cls.capabilities
    if isinstance(declared, property):  # openai: scored follows its scoring
        assert name == "openai"
    else:
        assert declared == EXPECTED[name]
    params = inspect.signature(cls).parameters
    assert set(spec.options) | set(spec.connection) <= set(params), name
    assert BACKEND_OPTIONS[name] == spec.options
    if declared == EXPECTED[name] or name == "openai":
        caps = EXPECTED[name]
        closes = ("close", "aclose", "release_loop")
        assert all(callable(getattr(cls, m, None)) for m in closes) == caps.closes
        assert callable(getattr(cls, "cache_identity", None)) == caps.cacheable
        assert ("timeout" in inspect.signature(cls.complete).parameters) == caps.timeout


def test_a_built_openai_backend_reports_its_scoring() -> None:
    listwise = make_backend("openai", base_url="http://127.0.0.1:9/v1")
    logprobs = make_backend("openai", base_url="http://127.0.0.1:9/v1", scoring="logprobs")
    assert capabilities(listwise) == EXPECTED["openai"]
    assert capabilities(logprobs) == Capabilities(scored=True, cacheable=True, timeout=True, closes=True,
                                                  needs_key=True)
    assert capabilities(make_backend("local")) == EXPECTED["local"]


class _Older:
    """A caller's backend written before capabilities were declared."""

    name = "older"
    scored = True

    def complete(self, prompt: str, request: Any, *, max_tokens: int, timeout: float | None = None
                 ) -> Completion:
        return Completion(text="{}")

    async def acomplete(self, prompt: str, request: Any, **kw: Any) -> Completion:
        return self.complete(prompt, request, **kw)


class _Plain:
    def complete(self, prompt: str, request: Any, *, max_tokens: int) -> Completion:
        return Completion(text="{}")

    async def acomplete(self, prompt: str, request: Any, **kw: Any) -> Completion:
        return self.complete(prompt, request, **kw)


def test_an_undeclared_backend_is_read_once_from_what_it_has() -> None:
    assert capabilities(_Older()) == Capabilities(scored=True, timeout=True)
    assert capabilities(_Plain()) == Capabilities()
    assert not capabilities(_Plain()).scored and capabilities(_Plain()).makes_requests
    assert model_of(_Plain()) is None and model_of(_Plain(), "x") == "x"
