"""The README and the docs site stay true.

CI runs exactly the README's test command; the README stays a newcomer's page (at most 400 lines,
its examples run, its links resolve); docs/cli.md lists every CLI command and flag; the docs
document the exit codes and every error family, and every page is in the MkDocs nav.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from rag_rerank.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MKDOCS = ROOT / "mkdocs.yml"
CI = ROOT / ".ci" / "run"


def readme() -> str:
    if not README.is_file():
        pytest.skip("README.md is not shipped in this layout")
    return README.read_text(encoding="utf-8")


def docs() -> str:
    """Every page of the docs site, one after the other."""
    if not DOCS.is_dir():
        pytest.skip("docs/ is not shipped in this layout")
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(DOCS.rglob("*.md")))


def page(name: str) -> str:
    path = DOCS / name
    if not path.is_file():
        pytest.skip(f"docs/{name} is not shipped in this layout")
    return path.read_text(encoding="utf-8")


def code_block_after(text: str, heading: str, lang: str = "bash") -> str:
    start = text.index(heading)
    block = re.search(rf"```{lang}\n(.*?)\n```", text[start:], re.DOTALL)
    assert block, f"no {lang} block after {heading!r}"
    return block.group(1).strip()


def test_ci_runs_exactly_the_readme_test_command() -> None:
    if not CI.is_file():
        pytest.skip(".ci/run is not shipped in this layout")
    command = code_block_after(readme(), "## Run the tests")
    ci = CI.read_text(encoding="utf-8")
    body = ci[ci.index("# --- the README's test command") : ci.index("# ---------")]
    lines = [line for line in body.splitlines()[1:] if line.strip()]
    assert lines == [command]
    assert "pytest" in command and command.count("&&") >= 2


def test_readme_shows_the_run_and_test_set_up_commands() -> None:
    text = readme()
    run = code_block_after(text, "## Quick start")
    assert "pip install ." in run and "rag-rerank rerank" in run
    assert "python -m pytest" in code_block_after(text, "## Run the tests")


def subcommands() -> dict[str, list[str]]:
    """Every option string (long and short) of every subcommand, from the real parser."""
    action = next(a for a in build_parser()._actions if a.dest == "command")
    return {
        name: sorted({opt for a in sub._actions for opt in a.option_strings if opt not in ("-h", "--help")})
        for name, sub in action.choices.items()
    }


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_subcommand_and_flag_is_in_the_cli_page(command: str) -> None:
    """docs/cli.md is the one page listing the whole command line: each flag as a whole word there,
    not merely somewhere in the docs site."""
    text = page("cli.md")
    assert f"rag-rerank {command}" in text, command
    whole = r"(?<![\w-]){}(?![\w-])"
    missing = [flag for flag in subcommands()[command] if not re.search(whole.format(re.escape(flag)), text)]
    assert not missing, f"rag-rerank {command}: flags not in docs/cli.md: {missing}"


def test_exit_codes_and_own_sections_are_documented() -> None:
    for name, file in (("contract", "contract.md"), ("cli", "cli.md"), ("errors", "errors.md")):
        text = page(file)
        start, end = f"<!-- section:{name} -->", f"<!-- /section:{name} -->"
        assert text.count(start) == text.count(end) == 1, name
        assert len(text[text.index(start) : text.index(end)].strip()) > 500, f"section {name} is empty"
    for code in ("**0**", "**1**", "**2**", "**3**"):
        assert code in page("cli.md")


def test_every_input_error_family_is_documented() -> None:
    """Messages the input guard can emit (their fixed parts) all appear in the errors page."""
    text = page("errors.md")
    section = text[text.index("<!-- section:errors -->") : text.index("<!-- /section:errors -->")]
    for fragment in (
        "not valid JSON",
        "a chunk must be a JSON object",
        "not JSONL",
        "missing required field",
        "must not be empty",
        "score must be a finite number",
        "lone surrogate",
        "duplicate ids",
        "(max_chunks)",
        "(max_context_tokens)",
        "embeddings have different dimensions",
        "no chunks",
        "query is empty",
        "top_k must be a positive integer",
        "lambda must be a number in [0, 1]",
        "is not an input id",
        "appears twice",
        "is more than top_k",
        "is not above the minimum",
        "cites nothing concrete",
        "must name a ranked id",
        "unknown key(s)",
        "truncated",
        "code fence",
        "<think>",
        "text before the JSON object",
        "text after the JSON object",
        "duplicate keys",
    ):
        assert fragment in section, fragment


# --------------------------------------------------------------------------- the README as a newcomer's page


def test_readme_is_a_newcomers_page() -> None:
    text = readme()
    assert len(text.splitlines()) <= 400
    for heading in ("## Quick start", "## Run the tests", "## A tour", "## Documentation"):
        assert heading in text, heading


def test_readme_links_resolve() -> None:
    """Relative links (to docs pages, to files) point at something in the checkout; anchors exist."""
    text = readme()
    headings = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", text, re.MULTILINE)}
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        if link.startswith("#"):
            assert link[1:] in headings, link
        else:
            assert (ROOT / link.split("#")[0]).exists(), link


def test_readme_python_tour_runs_offline(capsys: pytest.CaptureFixture[str]) -> None:
    """The tour's library example runs as written (local backend, no network) and keeps the contract."""
    block = code_block_after(readme(), "## A tour", lang="python")
    capsys.readouterr()
    exec(compile(block, "README.md", "exec"), {})
    out = json.loads(capsys.readouterr().out)
    ids = [r["id"] for r in out["ranked"]] + [d["id"] for d in out["dropped"]]
    assert sorted(ids) == ["c1", "c3"]


def test_readme_quick_start_and_tour_commands_run(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    """The `rag-rerank rerank` commands shown in the README run from the checkout and print the schema."""
    monkeypatch.chdir(ROOT)
    text = readme()
    commands = re.findall(r"(?:^|&& )(?:\.venv/bin/)?(rag-rerank rerank [^\n]*)", text, re.MULTILINE)
    assert len(commands) >= 2
    for command in commands:
        argv = shlex.split(command)[1:]
        capsys.readouterr()
        assert main(argv) == 0, command
        out = json.loads(capsys.readouterr().out)
        assert set(out) == {"ranked", "dropped"} and out["ranked"], command


# --------------------------------------------------------------------------- the docs site


def _nav_pages(entries: object) -> list[str]:
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [p for e in entries for p in _nav_pages(e)]
    if isinstance(entries, dict):
        return [p for v in entries.values() for p in _nav_pages(v)]
    return []


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    if not MKDOCS.is_file():
        pytest.skip("mkdocs.yml is not shipped in this layout")
    config = yaml.load(MKDOCS.read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    nav = _nav_pages(config["nav"])
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == on_disk
    for name in ("dropped-reasons.md", "integrations.md", "scorers.md", "windows.md", "ray.md", "quality.md"):
        assert name in nav, name
    assert config["theme"]["font"] == "false"  # no font download at build time: builds offline


def test_docs_name_no_machine_paths() -> None:
    """Docs, README and bench docstrings use relative paths; only RAG_RERANK_DATA points elsewhere."""
    texts = {"README.md": readme(), "docs": docs()}
    texts |= {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in (ROOT / "bench").glob("*.py")}
    texts |= {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("*.py")
              if p.name != "test_readme.py"}
    for name, text in texts.items():
        assert not re.search(r"(?<![\w.])/(work|home|Users|root|tmp/bash)/", text), name


def test_readme_cost_examples_do_what_their_comments_say(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """The tour's cost block, line by line, against a local OpenAI-compatible server (the SDK's
    OPENAI_BASE_URL): each line runs, and a line whose comment names an error raises it, with no
    request when the comment says "before any request". The budget example planned one call under
    a budget of three and succeeded, against its own comment."""
    from rag_rerank import errors, plan, rerank
    from tests.support.corpus import graded_chunks
    from tests.support.fake_llm import FakeLLM
    from tests.support.quoting_ranker import quoting_ranker

    text = readme()
    block = code_block_after(text[text.index("**Never pay twice"):], "```python", lang="python")
    tour = code_block_after(text, "## A tour", lang="python")
    with FakeLLM(handler=quoting_ranker()) as srv:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.openai_url)
        monkeypatch.setenv("RAG_RERANK_CACHE_DIR", str(tmp_path))
        names: dict[str, object] = {}
        exec(compile(tour.split("result =")[0], "README.md", "exec"), names)  # the tour's chunks
        names.update(rerank=rerank, plan=plan, query="When should I prefer IVF over HNSW?",
                     chunks_200=graded_chunks(200))
        raised = []
        lines = block.splitlines()
        for statement in ast.parse(block).body:
            code = "\n".join(lines[statement.lineno - 1:statement.end_lineno])
            comments = " ".join(line.partition("#")[2] for line in code.splitlines())
            named = re.search(r"\b([A-Z]\w*Error)\b", comments)
            before = len(srv.requests)
            if named is None:
                exec(compile(code, "README.md", "exec"), names)
                continue
            with pytest.raises(getattr(errors, named.group(1))):
                exec(compile(code, "README.md", "exec"), names)
            raised.append(named.group(1))
            if "before any request" in comments:
                assert len(srv.requests) == before, code
    assert raised == ["BudgetError"]
