"""The package's layering: the library never depends on the CLI, and there is one MMR.

`cli.py` is a thin layer on top of the library (argument parsing, exit codes). If a library module
imported it, `batch`/`evaluate` -> `cli` -> `batch` would be a circle again and the library would
drag argparse and the CLI's process-level choices into every caller. Checked statically (every
import statement of every module, wherever it sits, including function-local ones) and at run time
(importing each module in a fresh interpreter does not load `rag_rerank.cli`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rag_rerank"
ALLOWED = {"rag_rerank/cli.py", "rag_rerank/__main__.py"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_modules(path: Path) -> set[str]:
    """Absolute names of every module an import statement in `path` can load."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)  # `from . import cli`
    return names


LIBRARY_MODULES = sorted(p for p in PACKAGE.rglob("*.py") if str(p.relative_to(ROOT)) not in ALLOWED)


def test_the_scan_sees_the_whole_package_and_resolves_relative_imports() -> None:
    # guards the test itself: a scan that found no modules, or read `from .cli import x` as
    # something else, would pass for any code
    assert len(LIBRARY_MODULES) > 20
    cli_imports = _imported_modules(PACKAGE / "cli.py")
    assert {"rag_rerank.batch", "rag_rerank.textio", "rag_rerank.errors"} <= cli_imports
    backend = next(p for p in PACKAGE.glob("backends/*.py") if p.name != "__init__.py")
    assert any(name.startswith("rag_rerank.") for name in _imported_modules(backend))


@pytest.mark.parametrize("path", LIBRARY_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_library_module_does_not_import_the_cli(path: Path) -> None:
    offending = {name for name in _imported_modules(path)
                 if name == "rag_rerank.cli" or name.startswith("rag_rerank.cli.")}
    assert not offending, f"{path.relative_to(ROOT)} imports {sorted(offending)}; move it below cli.py"


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
