"""The README stays true: CI runs exactly its test command, and it documents every CLI command and flag."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rag_rerank.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CI = ROOT / ".ci" / "run"


def readme() -> str:
    if not README.is_file():
        pytest.skip("README.md is not shipped in this layout")
    return README.read_text(encoding="utf-8")


def documentation() -> str:
    """The README and the reference pages under docs/ (the reference is moving to the MkDocs site)."""
    pages = sorted((ROOT / "docs").glob("*.md"))
    return "\n".join([readme(), *(page.read_text(encoding="utf-8") for page in pages)])


def code_block_after(text: str, heading: str) -> str:
    start = text.index(heading)
    block = re.search(r"```bash\n(.*?)\n```", text[start:], re.DOTALL)
    assert block, f"no bash block after {heading!r}"
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
    action = next(a for a in build_parser()._actions if a.dest == "command")
    return {
        name: sorted(
            {
                opt
                for a in sub._actions
                for opt in a.option_strings
                if opt.startswith("--") and opt != "--help"
            }
        )
        for name, sub in action.choices.items()
    }


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_subcommand_and_flag_is_documented(command: str) -> None:
    text = documentation()
    assert f"rag-rerank {command}" in text, command
    # The reference moves to the docs site (docs/*.md): a flag documented there counts too.
    docs = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("**/*.md")))
    missing = [flag for flag in subcommands()[command]
               if not re.search(re.escape(flag) + r"(?![\w-])", text + "\n" + docs)]
    assert not missing, f"rag-rerank {command}: flags not in README or docs/: {missing}"


def test_exit_codes_and_own_sections_are_documented() -> None:
    text = readme()
    for name in ("contract", "cli", "errors"):
        start, end = f"<!-- section:{name} -->", f"<!-- /section:{name} -->"
        assert text.count(start) == text.count(end) == 1, name
        assert len(text[text.index(start) : text.index(end)].strip()) > 500, f"section {name} is empty"
    for code in ("**0**", "**1**", "**2**", "**3**"):
        assert code in text


def test_every_input_error_family_is_documented() -> None:
    """Messages the input guard can emit (their fixed parts) all appear in the errors section."""
    text = readme()
    section = text[text.index("<!-- section:errors -->") : text.index("<!-- /section:errors -->")]
    for fragment in (
        "not valid JSON",
        "a chunk must be a JSON object",
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
