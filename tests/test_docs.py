"""The docs site says what the code does: its examples run, its commands parse, its output is real.

tests/test_readme.py keeps the README and the list of flags honest; this file covers the pages under
docs/ the way a new user reads them: a Python block marked `<!-- example: NAME -->` runs as written
from the checkout (a `expr  # LITERAL` line must evaluate to that literal), a `rag-rerank` command
followed by a `# {...}` line prints exactly that JSON, every `rag-rerank` command in a code block
parses with the real parser, every code fence is closed, and the API reference renders every name
of `rag_rerank.__all__` (the mkdocs build itself is `mkdocs build --strict` in .ci/run).
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pytest

import rag_rerank
from rag_rerank.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# Pages whose marked examples another test runs (they need a framework installed).
RUN_ELSEWHERE = {"integrations.md": "tests/test_integrations.py"}


def pages() -> list[Path]:
    if not DOCS.is_dir():
        pytest.skip("docs/ is not shipped in this layout")
    return sorted(DOCS.rglob("*.md"))


def fenced_blocks(text: str) -> list[tuple[str, str, str]]:
    """(info string, body, the line before the fence) for each fenced block, read line by line as
    CommonMark does: a fence closes only on a line holding nothing but the fence."""
    blocks: list[tuple[str, str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = re.match(r"^(\s*)(`{3,})(.*)$", lines[i])
        if not opening:
            i += 1
            continue
        fence, info = opening.group(2), opening.group(3).strip()
        before = lines[i - 1] if i else ""
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            body.append(lines[i])
            i += 1
        blocks.append((info, "\n".join(body), before))
        i += 1
    return blocks


def examples() -> list[tuple[str, str]]:
    found = []
    for path in pages():
        if path.name in RUN_ELSEWHERE:
            continue
        for info, body, before in fenced_blocks(path.read_text(encoding="utf-8")):
            marker = re.fullmatch(r"<!-- example: ([\w-]+) -->", before.strip())
            if marker and info == "python":
                found.append((f"{path.relative_to(DOCS)}:{marker.group(1)}", body))
    return found


def test_every_code_fence_is_closed() -> None:
    """A closing fence with text after it ("``` The check only...") is no fence: the rest of the
    page renders as code. Each page has an even number of fence lines, and none closes with text."""
    for path in [ROOT / "README.md", *pages()]:
        lines = path.read_text(encoding="utf-8").splitlines()
        fences = [(n, line) for n, line in enumerate(lines, 1) if line.lstrip().startswith("```")]
        closing = fences[1::2]
        numbers = [n for n, _ in fences]
        assert len(fences) % 2 == 0, f"{path.name}: an unclosed code fence (fence lines {numbers})"
        bad = [n for n, line in closing if line.strip() != "```"]
        assert not bad, f"{path.name}: a closing fence with text after it at line(s) {bad}"


def test_the_marked_examples_are_the_ones_expected() -> None:
    """A marker lost in an edit would silently stop an example from running."""
    names = sorted(name for name, _ in examples())
    assert names == ["dropped-reasons.md:reasons", "library.md:library", "library.md:session",
                     "postpass.md:postpass", "scorers.md:embed_meta_fields", "windows.md:window-progress",
                     "windows.md:windows"], names


def _literal_comment(comment: str) -> tuple[bool, object]:
    """The literal a `# ...` comment starts with (`6`, `'redundant_with'`, `None: not in the
    grammar`, `5, in two round trips`), or (False, None) when it is prose."""
    comment = comment.strip()
    for candidate in (comment, comment.split(",")[0], comment.split(":")[0], comment.split(" ")[0]):
        try:
            return True, ast.literal_eval(candidate.strip())
        except (ValueError, SyntaxError):
            continue
    return False, None


def _is_expression(source: str) -> bool:
    """`result.meta.calls` or `f(x=1)`, not `result = f(...)` nor the first line of a statement."""
    try:
        body = ast.parse(source.strip()).body
    except SyntaxError:
        return False
    return len(body) == 1 and isinstance(body[0], ast.Expr)


@pytest.mark.parametrize(("name", "code"), examples(), ids=[n for n, _ in examples()])
def test_docs_examples_run_and_their_comments_hold(name: str, code: str, monkeypatch, capsys) -> None:
    monkeypatch.chdir(ROOT)  # examples name files relative to the checkout (examples/happy-path.jsonl)
    namespace: dict[str, object] = {}
    exec(compile(code, name, "exec"), namespace)
    checked = 0
    for line in code.splitlines():
        expr, sep, comment = line.partition("  #")
        if not sep or line.startswith((" ", "#")) or not _is_expression(expr):
            continue
        is_literal, expected = _literal_comment(comment)
        if not is_literal:
            continue
        assert eval(expr.strip(), namespace) == expected, f"{name}: {line.strip()}"
        checked += 1
    capsys.readouterr()
    if name != "library.md:library":  # its comments describe types, not values
        assert checked, f"{name}: no `expr  # value` line was checked"


def _commands(text: str) -> list[tuple[list[str], str | None]]:
    """Each `rag-rerank ...` command of a shell block (continuation lines joined, comments and
    environment assignments dropped), with the `# {...}` line right after it, if any."""
    found: list[tuple[list[str], str | None]] = []
    for info, body, _ in fenced_blocks(text):
        if info not in ("bash", "sh", ""):
            continue
        lines = body.replace("\\\n", " ").splitlines()
        for n, line in enumerate(lines):
            following = lines[n + 1].strip() if n + 1 < len(lines) else ""
            shown = following[1:].strip() if following.startswith("# {") else None
            for segment in re.split(r"\|\||&&|\|", line):
                try:
                    tokens = shlex.split(segment, comments=True)
                except ValueError:
                    continue
                while tokens and re.match(r"^[A-Z_]+=", tokens[0]):
                    tokens = tokens[1:]
                if tokens and tokens[0].endswith("rag-rerank"):
                    found.append((tokens[1:], shown))
    return found


def _synopsis(argv: list[str]) -> bool:
    """`rag-rerank COMMAND [options]`, `[--resume]`: a usage line, not a command to run."""
    return any(t.startswith("[") or t.isupper() for t in argv) or argv[:1] == ["COMMAND"]


def test_every_documented_command_parses(capsys) -> None:
    """Every `rag-rerank` command in a code block of the docs or the README uses commands, flags and
    choices that exist."""
    seen = 0
    for path in [*pages(), ROOT / "README.md"]:
        for argv, _ in _commands(path.read_text(encoding="utf-8")):
            if _synopsis(argv):
                continue
            try:
                build_parser().parse_args(argv)
            except SystemExit:
                pytest.fail(f"{path.name}: rag-rerank {shlex.join(argv)}: {capsys.readouterr().err.strip()}")
            seen += 1
    assert seen >= 15, seen


def test_commands_shown_with_their_output_print_it(capsys, monkeypatch) -> None:
    """A command followed by `# {...}` (the routing examples) prints exactly that JSON object."""
    monkeypatch.chdir(ROOT)
    shown = [(path.name, argv, out) for path in pages()
             for argv, out in _commands(path.read_text(encoding="utf-8")) if out is not None]
    assert len(shown) >= 4, shown
    for page, argv, expected in shown:
        capsys.readouterr()
        assert main(argv) == 0, (page, argv)
        assert json.loads(capsys.readouterr().out) == json.loads(expected), (page, argv)


def test_offline_commands_in_the_docs_run(capsys, monkeypatch) -> None:
    """The `rag-rerank` commands a reader can paste as they are (local backend, files that ship in
    the checkout) exit 0."""
    monkeypatch.chdir(ROOT)
    ran = []
    for path in pages():
        for argv, _ in _commands(path.read_text(encoding="utf-8")):
            if _synopsis(argv) or argv[:1] not in (["rerank"], ["render"], ["golden"], ["route"]):
                continue
            if {"--backend", "-b", "--base-url"} & set(argv):
                continue
            files = [a for a in argv if a.endswith((".jsonl", ".json")) or "/" in a]
            if not all((ROOT / f).exists() for f in files):
                continue
            capsys.readouterr()
            assert main(argv) == 0, (path.name, argv, capsys.readouterr().err)
            ran.append(argv[0])
    assert {"rerank", "render", "golden", "route"} <= set(ran), ran


def test_the_api_reference_renders_every_public_name(tmp_path: Path, monkeypatch) -> None:
    """Build the site (strict) and find an entry for each name of `rag_rerank.__all__`: on the
    package page, or, for a name a submodule of the same name hides there (`rerank`, `render`) and
    the lazily imported tool helpers, on its module's page."""
    pytest.importorskip("mkdocstrings_handlers.python")
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    monkeypatch.chdir(ROOT)  # mkdocstrings' `paths: [.]` is relative to the working directory
    config = load_config(str(ROOT / "mkdocs.yml"), site_dir=str(tmp_path / "site"), strict=True)
    build(config)
    html = "\n".join(p.read_text(encoding="utf-8") for p in (tmp_path / "site" / "api").rglob("*.html"))
    anchors = set(re.findall(r'id="(rag_rerank[\w.]*)"', html))
    missing = []
    for name in rag_rerank.__all__:
        if name.startswith("_"):  # `__version__`: the site hides private and dunder names (mkdocs.yml)
            continue
        obj = getattr(rag_rerank, name)
        module = getattr(obj, "__module__", None)
        if f"rag_rerank.{name}" not in anchors and f"{module}.{name}" not in anchors:
            missing.append(name)
    assert not missing, f"public names with no entry in the API reference: {missing}"
    components = ["rag_rerank.integrations.langchain.RagRerankCompressor",
                  "rag_rerank.integrations.llama_index.RagRerankPostprocessor",
                  "rag_rerank.integrations.haystack.RagRerankRanker",
                  "rag_rerank.integrations.ray.rerank_dataset"]
    assert not [c for c in components if c not in anchors], "an integration entry point has no API entry"


def test_the_layout_page_names_every_module() -> None:
    """docs/layout.md's table of `rag_rerank/` names each module and subpackage, so a new one is
    not left for readers to discover."""
    text = (DOCS / "layout.md").read_text(encoding="utf-8")
    package = ROOT / "rag_rerank"
    names = [f"`{p.name}`" for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    names += [f"`{p.name}/`" for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    missing = [n for n in sorted(names) if n not in text]
    assert not missing, f"docs/layout.md does not name: {missing}"
    generated = {"site", "build", "dist", "node_modules"}
    folders = [p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
               and p.name not in generated and not p.name.endswith(".egg-info")]
    unnamed = [f for f in sorted(folders) if not re.search(rf"^{re.escape(f)}/", text, re.MULTILINE)]
    assert not unnamed, f"docs/layout.md's tree does not name the folder(s): {unnamed}"


def _resolve(dotted: str) -> object:
    """`rag_rerank.embed.get_embedder` -> the object: the longest importable module, then attributes."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_every_dotted_name_and_import_in_the_docs_exists() -> None:
    """`rag_rerank.windows.WINDOW_PROGRESS`, `from rag_rerank.backends.openai import OpenAIBackend`:
    each name the README and the docs give resolves (a rename cannot leave a page behind)."""
    from rag_rerank.errors import MissingDependencyError

    texts = {p.name: p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *pages()]}
    wanted = {(page, m) for page, text in texts.items()
              for m in re.findall(r"(?<![\w/])rag_rerank(?:\.\w+)+", text)}
    imports = re.compile(r"^from (rag_rerank[\w.]*) import ([\w, ]+?)\s*(?:#.*)?$", re.MULTILINE)
    wanted |= {(page, f"{module}.{name.strip()}") for page, text in texts.items()
               for module, names in imports.findall(text) for name in names.split(",") if name.strip()}
    assert len(wanted) > 50
    # Span and attribute names (`rag_rerank.cache.hits`, docs/observability.md) are names too: each
    # must be one observe.py declares (a renamed attribute cannot leave the page behind either).
    from rag_rerank import observe

    declared = {v for holder in (observe.Attr, observe) for k, v in vars(holder).items()
                if k.isupper() and isinstance(v, str) and v.startswith("rag_rerank.")}
    broken = []
    for page, dotted in sorted(wanted):
        if dotted in declared:
            continue
        try:
            _resolve(dotted)
        except MissingDependencyError:  # an integration whose framework is not installed here
            continue
        except (AttributeError, ModuleNotFoundError) as exc:
            broken.append(f"{page}: {dotted} ({exc})")
    assert not broken, broken
