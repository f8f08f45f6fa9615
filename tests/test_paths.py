"""Data folders (rag_rerank/paths.py) are found from a checkout and from an installed wheel.

`pip install .` into a fresh venv is slow, so the wheel is built with hatchling (the project's
build backend) and unpacked: that is exactly the file layout pip would install.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from rag_rerank import paths

ROOT = Path(__file__).resolve().parent.parent
DATA_FILES = [
    "skills/rag-chunk-reranker/SKILL.md",
    "prompts/rag-chunk-reranker.xml.j2",
    "prompts/rag-chunk-relevance.xml.j2",
    "guard/chunk.schema.json",
    "guard/output.schema.json",
    "guard/limits.json",
    "golden/render/card-adversarial.json",
    "golden/render/card-adversarial.expected.xml",
    "golden/check/minted-id.json",
]


def test_checkout_layout() -> None:
    assert paths.data_root() == ROOT
    assert paths.skills_dir() == ROOT / "skills"
    assert paths.prompts_dir() == ROOT / "prompts"
    assert paths.guard_dir() == ROOT / "guard"
    assert paths.golden_dir() == ROOT / "golden"
    for rel in DATA_FILES:
        assert (paths.data_root() / rel).is_file(), rel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("hatchling")
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    (whl,) = out.glob("rag_rerank-*.whl")
    return whl


def test_wheel_holds_the_data_folders_and_the_console_script(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    for rel in DATA_FILES:
        assert f"rag_rerank/_data/{rel}" in names, rel
    assert "rag-rerank = rag_rerank.cli:main" in entry_points
    assert "rag_rerank/report.html.j2" in names  # the --html reports' template, beside report.py
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert not [
        n for n in names if n.split("/")[0] in ("tests", "bench", "skills", "guard", "prompts", "golden")
    ]


def test_wheel_marks_the_package_typed(wheel: Path) -> None:
    """PEP 561: without py.typed, mypy / pyright ignore the annotations of an installed rag_rerank
    ("module is installed, but missing library stubs or py.typed marker")."""
    with zipfile.ZipFile(wheel) as z:
        assert "rag_rerank/py.typed" in z.namelist()


def test_wheel_ships_only_the_golden_cases_the_package_runs(wheel: Path) -> None:
    """golden/judged and golden/router are bench/ evaluation data: `rag-rerank golden` reads KINDS only."""
    from rag_rerank.golden import KINDS

    with zipfile.ZipFile(wheel) as z:
        shipped = {n.split("/")[3] for n in z.namelist() if n.startswith("rag_rerank/_data/golden/")}
    assert shipped == set(KINDS)


def test_installed_layout_finds_its_data(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    script = (
        "import json, rag_rerank, rag_rerank.paths as p\n"
        "from rag_rerank import load_skill, render, validate_request\n"
        "from rag_rerank.golden import discover\n"
        "ex = load_skill().example('adversarial')\n"
        "prompt = render(validate_request(ex.query, ex.chunks, ex.top_k, ex.lambda_))\n"
        "exp_file = p.golden_dir() / 'render' / 'card-adversarial.expected.xml'\n"
        "expected = exp_file.read_text(encoding='utf-8')\n"
        "cases = [f'{k}/{f.name}' for k, f in discover(p.golden_dir())]\n"
        "print(json.dumps({'module': rag_rerank.__file__, 'root': str(p.data_root()),\n"
        "                  'render_ok': prompt == expected, 'cases': cases}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["module"].startswith(str(site))
    assert got["root"] == str(site / "rag_rerank" / "_data")
    assert got["render_ok"] is True
    from rag_rerank.golden import discover

    assert got["cases"] == [f"{k}/{f.name}" for k, f in discover(ROOT / "golden")]


def test_sdist_holds_the_examples_and_scripts_the_readme_docs_and_tests_use(tmp_path: Path) -> None:
    """The quick start and the tests read examples/*.jsonl; docs/quality.md runs
    scripts/build_static_table.py."""
    pytest.importorskip("hatchling")
    if not (ROOT / "examples").is_dir():
        pytest.skip("examples/ is not shipped in this layout")
    proc = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    (sdist,) = tmp_path.glob("rag_rerank-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    wanted = [p.relative_to(ROOT).as_posix() for d in ("examples", "scripts") for p in (ROOT / d).glob("*.*")]
    assert "examples/happy-path.jsonl" in wanted
    assert [w for w in wanted if w not in names] == []
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
