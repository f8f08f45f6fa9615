"""The package's layering, checked on every import statement of every module, wherever it sits
(function-local ones included):

* the library never depends on the CLI: `cli/` is a thin layer on top of it (argument parsing,
  exit codes); at run time too, importing each module in a fresh interpreter does not load it;
* no import circle between the package's modules: a circle hidden by an import placed inside a
  function is still a circle (two modules that each need the other's insides);
* no private name (`_Plan`, `_run`) imported from another module: what a module shares, it names
  publicly, so a reader knows what may be relied on;
* one MMR.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rag_rerank"
ALLOWED = {"rag_rerank/__main__.py", *(str(p.relative_to(ROOT)) for p in (PACKAGE / "cli").glob("*.py"))}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _from_imports(path: Path) -> list[tuple[str, str]]:
    """(absolute module, imported name) of every `from M import name` in `path`, wherever it sits."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            out.extend((module, alias.name) for alias in node.names)
    return out


def _imported_modules(path: Path) -> set[str]:
    """Absolute names of every module an import statement in `path` can load."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                       for alias in node.names}
    for module, name in _from_imports(path):
        names.add(module)
        names.add(f"{module}.{name}")  # `from . import cli`
    return names


PACKAGE_MODULES = {_module_name(p) for p in PACKAGE.rglob("*.py")}


def _dependencies(path: Path) -> set[str]:
    """The package's modules that `path` imports: `from P import name` counts as importing the
    submodule P.name when there is one (then P is its package, loaded anyway), else P itself."""
    deps: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            deps.update(alias.name for alias in node.names if alias.name in PACKAGE_MODULES)
    for module, name in _from_imports(path):
        if f"{module}.{name}" in PACKAGE_MODULES:
            deps.add(f"{module}.{name}")
        elif module in PACKAGE_MODULES:
            deps.add(module)
    deps.discard(_module_name(path))
    return deps


LIBRARY_MODULES = sorted(p for p in PACKAGE.rglob("*.py") if str(p.relative_to(ROOT)) not in ALLOWED)


def test_the_scan_sees_the_whole_package_and_resolves_relative_imports() -> None:
    # guards the test itself: a scan that found no modules, or read `from .cli import x` as
    # something else, would pass for any code
    assert len(LIBRARY_MODULES) > 20
    cli_imports = _imported_modules(PACKAGE / "cli" / "batch.py")
    assert {"rag_rerank.batchfile", "rag_rerank.textio", "rag_rerank.errors",
            "rag_rerank.cli.common"} <= cli_imports
    assert "rag_rerank.cli.common" in _dependencies(PACKAGE / "cli" / "batch.py")
    backend = next(p for p in PACKAGE.glob("backends/*.py") if p.name != "__init__.py")
    assert any(name.startswith("rag_rerank.") for name in _imported_modules(backend))


@pytest.mark.parametrize("path", LIBRARY_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_library_module_does_not_import_the_cli(path: Path) -> None:
    offending = {name for name in _imported_modules(path)
                 if name == "rag_rerank.cli" or name.startswith("rag_rerank.cli.")}
    assert not offending, f"{path.relative_to(ROOT)} imports {sorted(offending)}; move it below cli/"


def test_importing_the_library_does_not_load_the_cli() -> None:
    modules = [_module_name(p) for p in LIBRARY_MODULES]
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except ImportError:\n"  # an optional extra that is not installed
            "        pass\n"
            "print('rag_rerank.cli' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_one_mmr_implementation() -> None:
    # the pipeline's greedy selection (postpass.select) is the only MMR; a second copy drifts
    import rag_rerank.postpass as postpass

    assert not hasattr(postpass, "mmr")
    defined = [node.name for p in PACKAGE.rglob("*.py")
               for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
               if isinstance(node, ast.FunctionDef) and "mmr" in node.name.lower()]
    assert defined == [], defined


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_the_cycle_finder_finds_a_cycle() -> None:
    # guards the test below: a finder that never reports would pass for any code
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_between_the_packages_modules() -> None:
    """The package `__init__` files are left out as targets: `rag_rerank/__init__.py` is the public
    facade that re-exports the library, and every submodule's import loads it first anyway."""
    graph = {_module_name(p): _dependencies(p) - {"rag_rerank"} for p in PACKAGE.rglob("*.py")}
    cycles = _cycles(graph)
    assert not cycles, "import circles (imports inside functions count): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_no_private_name_is_imported_from_another_module() -> None:
    crossings = sorted(
        f"{_module_name(p)} imports {name} from {module}"
        for p in PACKAGE.rglob("*.py")
        for module, name in _from_imports(p)
        if module.startswith("rag_rerank") and name.startswith("_") and not name.startswith("__")
        and f"{module}.{name}" not in PACKAGE_MODULES  # a package-private module (`integrations._common`)
    )
    assert not crossings, crossings
