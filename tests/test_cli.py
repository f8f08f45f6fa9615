"""The console entry (rag_rerank/cli/) for render, check and golden, and the shared exit codes.

Bad input must give exit 2 and one line per problem on stderr naming the line / id / field, never a
traceback.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rag_rerank.cli import (
    EXIT_BAD_INPUT,
    EXIT_INVALID_OUTPUT,
    EXIT_OK,
    build_parser,
    main,
)
from rag_rerank.textio import MAX_SHOWN_VIOLATIONS

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
EXPECTED = ROOT / "golden" / "render" / "card-adversarial.expected.xml"
QUERY = "When should I prefer IVF over HNSW for vector search?"
VALID = json.dumps(
    {
        "ranked": [{"id": "c3", "score": 0.9, "reason": "IVF is preferred when memory is constrained"}],
        "dropped": [{"id": "c5", "reason": "below_min_score"}],
    }
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err.splitlines()


def write(tmp_path: Path, name: str, text: str | bytes) -> str:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return str(p)


# --- render --------------------------------------------------------------------------------------


def test_render_card_example_byte_for_byte(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys,
        "render",
        "--query",
        QUERY,
        "--chunks",
        str(EXAMPLES / "adversarial.jsonl"),
        "--top-k",
        "3",
        "--lambda",
        "0.7",
    )
    assert (code, err) == (EXIT_OK, [])
    assert out == EXPECTED.read_text(encoding="utf-8")


def test_render_from_stdin_through_the_real_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rag_rerank.cli", "render", "-q", QUERY, "-c", "-", "-k", "3"],
        input=(EXAMPLES / "adversarial.jsonl").read_bytes(),
        capture_output=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert (proc.returncode, proc.stderr) == (0, b"")
    assert proc.stdout == EXPECTED.read_bytes()


def test_render_shows_long_chunks_as_rerank_would(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Regression (QA): `render` refused a request over the context budget that `rerank` shortens,
    and had no --max-tokens-per-chunk, so the prompt actually sent could not be seen."""
    filler = " ".join(f"Filler sentence {i} says nothing about the subject." for i in range(400))
    records = [json.dumps({"id": f"d{i}", "text": filler + " The capital of Peru is Lima. " + filler})
               for i in range(12)]
    f = write(tmp_path, "long.jsonl", "\n".join(records) + "\n")
    code, out, err = run(capsys, "render", "-q", "capital of Peru", "-c", f, "-k", "3")
    assert (code, err) == (0, []) and out.count("[…]") >= 12 and "capital of Peru is Lima" in out
    code, capped, err = run(capsys, "render", "-q", "capital of Peru", "-c", f, "-k", "3",
                            "--max-tokens-per-chunk", "32")
    assert (code, err) == (0, []) and len(capped) < len(out) and capped.count("capital of Peru is Lima") == 12
    from rag_rerank import Reranker

    with Reranker() as session:
        sent = session.prompt("capital of Peru", (tmp_path / "long.jsonl").read_text(encoding="utf-8"), 3,
                              max_tokens_per_chunk=32)
    assert sent == capped


def test_render_bad_input_lists_every_problem(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = write(
        tmp_path, "c.jsonl", '{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\nnot json\n{"id": 3}\n'
    )
    code, out, err = run(capsys, "render", "-q", " ", "-c", f, "-k", "0", "--lambda", "2")
    assert code == EXIT_BAD_INPUT and out == ""
    assert err == [
        "rag-rerank: error: query: query is empty",
        "rag-rerank: error: top_k: top_k must be a positive integer, got 0",
        "rag-rerank: error: lambda: lambda must be a number in [0, 1], got 2.0",
        "rag-rerank: error: line 3: chunks[2]: not valid JSON (Expecting value at column 1): "
        "'not json'",
        "rag-rerank: error: line 4: chunks[3].id: field 'id' must be a string, got number (ids come back "
        'byte for byte, so they must be strings: write "3")',
        "rag-rerank: error: line 4: chunks[3].text: missing required field 'text'",
        "rag-rerank: error: chunks: duplicate ids (ids must be unique): 'a' at line 1, line 2",
    ]


# --- long violation lists -----------------------------------------------------------------------

SUMMARY = re.compile(r"rag-rerank: (error|invalid): \.\.\. and (\d+) more violations? \((\d+) total\)")


def junk_file(tmp_path: Path, n: int) -> str:
    return write(tmp_path, f"junk{n}.jsonl", "".join(f"junk {i}\n" for i in range(n)))


def test_many_copies_of_a_few_ids_make_a_short_duplicate_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Regression: the list was capped at 50 lines, but one of them named every line of every
    copy: 5,000 copies of three ids printed a 54,000-character line."""
    records = "".join(json.dumps({"id": f"d{i % 12}", "text": "x"}) + "\n" for i in range(5000))
    code, _, err = run(capsys, "render", "-q", QUERY, "-c", write(tmp_path, "dups.jsonl", records))
    assert code == EXIT_BAD_INPUT
    [dupes] = [line for line in err if "duplicate ids" in line]
    assert len(dupes) < 500
    assert "'d0' at line 1, line 13, line 25, line 37, line 49 and 412 more;" in dupes
    assert dupes.endswith("; and 7 more duplicated ids") and "'d5'" not in dupes


@pytest.mark.parametrize("command", ["render", "check"])
def test_a_100000_line_junk_file_prints_the_first_violations_and_the_total(
    command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Regression: every violation got its own stderr line, 100,001 lines for this file."""
    junk = junk_file(tmp_path, 100_000)
    if command == "render":
        argv = ["render", "-q", QUERY, "-c", junk]
    else:
        argv = ["check", "-c", junk, "-k", "3", write(tmp_path, "out.json", VALID)]
    code, out, err = run(capsys, *argv)
    assert code == EXIT_BAD_INPUT and out == ""
    assert len(err) == MAX_SHOWN_VIOLATIONS + 1
    # The one line that explains them all comes first when the list is cut, then the records.
    assert "100000 chunks is over the limit of 50 (max_chunks)" in err[0]
    assert err[1].startswith("rag-rerank: error: line 1: chunks[0]: not valid JSON")
    last = MAX_SHOWN_VIOLATIONS - 1
    assert err[last].startswith(f"rag-rerank: error: line {last}: chunks[{last - 1}]: not valid JSON")
    summary = SUMMARY.fullmatch(err[-1])
    assert summary, err[-1]
    hidden, total = int(summary.group(2)), int(summary.group(3))
    assert total >= 100_000 and hidden == total - MAX_SHOWN_VIOLATIONS


def test_a_list_at_the_cap_is_printed_whole_and_one_over_says_violation(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    junk = junk_file(tmp_path, MAX_SHOWN_VIOLATIONS)
    code, _, err = run(capsys, "render", "-q", QUERY, "-c", junk)
    assert code == EXIT_BAD_INPUT
    assert len(err) == MAX_SHOWN_VIOLATIONS
    assert [line.split(": ")[2] for line in err] == [f"line {i}" for i in range(1, MAX_SHOWN_VIOLATIONS + 1)]
    code, _, err = run(capsys, "render", "-q", " ", "-c", junk)  # the empty query is one more
    assert code == EXIT_BAD_INPUT
    assert err[0] == "rag-rerank: error: query: query is empty"
    assert err[-1] == f"rag-rerank: error: ... and 1 more violation ({MAX_SHOWN_VIOLATIONS + 1} total)"
    assert len(err) == MAX_SHOWN_VIOLATIONS + 1


def test_check_caps_the_violations_of_a_huge_llm_output(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ranked = [{"id": f"x{i}", "score": 0.9, "reason": "IVF"} for i in range(500)]
    o = write(tmp_path, "out.json", json.dumps({"ranked": ranked, "dropped": []}))
    code, out, err = run(capsys, "check", "-c", str(EXAMPLES / "happy-path.jsonl"), "-k", "3", o)
    assert code == EXIT_INVALID_OUTPUT and out == ""
    assert len(err) == MAX_SHOWN_VIOLATIONS + 1
    assert all(line.startswith("rag-rerank: invalid: $") for line in err[:-1])
    summary = SUMMARY.fullmatch(err[-1])
    assert summary and summary.group(1) == "invalid", err[-1]
    hidden, total = int(summary.group(2)), int(summary.group(3))
    assert total >= 500 and hidden == total - MAX_SHOWN_VIOLATIONS


# --- check ---------------------------------------------------------------------------------------


def test_check_valid_output_exits_0(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    o = write(tmp_path, "out.json", VALID)
    assert run(capsys, "check", "--chunks", str(EXAMPLES / "happy-path.jsonl"), "--top-k", "3", o) == (
        EXIT_OK,
        "valid\n",
        [],
    )


def test_check_invalid_output_exits_1_one_violation_per_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = {
        "ranked": [
            {"id": "C3", "score": 1.5, "reason": "IVF"},
            {"id": "c1", "score": 0.5, "reason": "relevant"},
        ],
        "dropped": [{"id": "c5", "reason": "redundant_with:c4"}],
        "extra": True,
    }
    o = write(tmp_path, "out.json", json.dumps(bad))
    code, out, err = run(capsys, "check", "-c", str(EXAMPLES / "happy-path.jsonl"), "-k", "1", o)
    assert code == EXIT_INVALID_OUTPUT and out == ""
    assert all(line.startswith("rag-rerank: invalid: $") for line in err)
    assert [line.split(": ")[2] for line in err] == [
        "$",
        "$.ranked[0].score",
        "$.ranked[0].id",
        "$.ranked[1].reason",
        "$.dropped[0].reason",
        "$.ranked",
    ]


def test_check_reads_output_from_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(("```json\n" + VALID + "\n```").encode())))
    code, _, err = run(capsys, "check", "-c", str(EXAMPLES / "happy-path.jsonl"), "-k", "3", "-")
    assert code == EXIT_INVALID_OUTPUT and "code fence" in err[0]


def test_check_repair_reports_each_repair(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    o = write(tmp_path, "out.txt", "<think>c3</think>\nHere:\n```json\n" + VALID + "\n```")
    code, out, err = run(capsys, "check", "-c", str(EXAMPLES / "happy-path.jsonl"), "-k", "3", "--repair", o)
    assert (code, out) == (EXIT_OK, "valid\n")
    assert err == [
        "rag-rerank: repair: removed a <think> block",
        "rag-rerank: repair: removed a Markdown code fence inside prose",
        "rag-rerank: repair: removed 13 characters of text before the JSON object",
        "rag-rerank: repair: removed 3 characters of text after the JSON object",
    ]


def test_check_is_strict_without_repair(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    o = write(tmp_path, "out.txt", "Here: " + VALID)
    code, _, err = run(capsys, "check", "-c", str(EXAMPLES / "happy-path.jsonl"), "-k", "3", o)
    assert code == EXIT_INVALID_OUTPUT and err == [
        "rag-rerank: invalid: $: text before the JSON object: 'Here: '"
    ]


# --- golden --------------------------------------------------------------------------------------


def test_golden_command_passes_on_the_shipped_cases(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "golden")
    assert code == EXIT_OK, err
    assert out.startswith("golden: ") and " 0 failed" in out


def test_golden_command_fails_on_a_regression(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "check").mkdir()
    case = {
        "description": "wrongly expects valid",
        "chunks": '{"id": "a", "text": "t"}',
        "top_k": 1,
        "raw": '{"ranked": [{"id": "A", "score": 0.5, "reason": "t"}]}',
        "expect": "valid",
    }
    (tmp_path / "check" / "wrong.json").write_text(json.dumps(case), encoding="utf-8")
    code, out, err = run(capsys, "golden", str(tmp_path))
    assert code == 1 and len(err) == 1 and err[0].startswith("FAIL check/wrong: expected valid")
    assert "1 failed" in out
    assert run(capsys, "golden", str(tmp_path / "missing"))[0] == EXIT_BAD_INPUT


# --- bad input and usage never produce a traceback -----------------------------------------------


BAD_CALLS = [
    ["render", "-q", "q"],  # missing --chunks
    ["render", "-q", "q", "-c", "{missing}"],
    ["render", "-q", "q", "-c", "{dir}"],
    ["render", "-q", "q", "-c", "{latin1}"],
    ["render", "-q", "q", "-c", "{empty}"],
    ["render", "-q", "q", "-c", "{surrogate}"],
    ["render", "-q", "q", "-c", "{ok}", "-k", "x"],
    ["render", "-q", "q", "-c", "{ok}", "-k", "-3"],
    ["render", "-q", "q", "-c", "{ok}", "--lambda", "nan"],
    ["render", "-q", "q", "-c", "{ok}", "--lambda", "inf"],
    ["render", "-q", "q\udcff", "-c", "{ok}"],
    ["render", "-q", "x" * 5000, "-c", "{ok}"],
    ["render", "-q", "q", "-c", "{deep}"],
    ["render", "-q", "q", "-c", "{many}"],
    ["check", "-c", "{ok}", "-k", "0", "{out}"],
    ["check", "-c", "{ok}", "-k", "1", "{missing}"],
    ["check", "-c", "{missing}", "-k", "1", "{out}"],
    ["check", "-c", "{latin1}", "-k", "1", "{out}"],
    ["check", "-c", "-", "-k", "1", "-"],
    ["check", "-c", "{ok}", "{out}"],  # missing --top-k
    ["check", "-c", "{ok}", "-k", "1", "{latin1}"],
    ["golden", "{missing}"],
    ["golden", "{emptydir}"],
    ["nosuchcommand"],
    [],
    ["render", "--bogus"],
]


@pytest.mark.parametrize("argv", BAD_CALLS, ids=lambda a: " ".join(a)[:40] or "no-args")
def test_bad_input_exits_2_with_one_line_errors(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "emptydir").mkdir()
    files = {
        "missing": str(tmp_path / "missing.jsonl"),
        "dir": str(tmp_path),
        "emptydir": str(tmp_path / "emptydir"),
        "latin1": write(tmp_path, "latin1.jsonl", '{"id": "é", "text": "t"}'.encode("latin-1")),
        "empty": write(tmp_path, "empty.jsonl", "\n\n"),
        "surrogate": write(tmp_path, "s.jsonl", '{"id": "a\\udc80", "text": "t"}\n'),
        "ok": write(tmp_path, "ok.jsonl", '{"id": "a", "text": "t"}\n'),
        "out": write(tmp_path, "out.json", '{"ranked": []}'),
        "deep": write(tmp_path, "deep.jsonl", "[" * 100_000),
        "many": write(tmp_path, "many.jsonl", "".join(f'{{"id": "{i}", "text": "t"}}\n' for i in range(60))),
    }
    code, out, err = run(capsys, *[a.format(**files) if "{" in a and "}" in a else a for a in argv])
    assert code == EXIT_BAD_INPUT, err
    assert out == "" and err
    for line in err:
        assert line.startswith("rag-rerank"), line
        assert "Traceback" not in line and "internal error" not in line


def test_usage_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "check", "-c", "x")
    assert code == EXIT_BAD_INPUT
    assert err == [
        "rag-rerank: check: error: the following arguments are required: --top-k/-k "
        "(see rag-rerank check --help)"
    ]


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == EXIT_OK and "render" in out and "check" in out and "golden" in out


COMMANDS = ["rerank", "render", "check", "route", "golden", "batch", "eval", "compare", "bias", "calibrate",
            "mcp", "cache", "serve"]


def test_every_subcommand_is_declared() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_subcommand_help_says_what_it_does_and_explains_each_option(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rag-rerank NAME --help` is where a newcomer looks: it describes the command and every
    option and argument has a line of help (batch --concurrency, eval --lambda had none)."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    summary = next(a.help for a in sub._choices_actions if a.dest == name)
    actions = sub.choices[name]._actions
    undocumented = [a.option_strings or a.dest for a in actions if not (a.help or "").strip()]
    assert undocumented == []
    code, out, _ = run(capsys, name, "--help")
    assert code == EXIT_OK
    assert " ".join(summary.split()[:4]).lower() in " ".join(out.split()).lower()


def test_every_option_with_a_default_value_names_it_in_its_help() -> None:
    """docs/cli.md gives each default; `--help` must too (eval --k said nothing of its 10)."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    silent = [(name, a.option_strings[0], a.default) for name, parser in sub.choices.items()
              for a in parser._actions
              if a.option_strings and a.default not in (None, False, "-", argparse.SUPPRESS)
              and str(a.default) not in (a.help or "")]
    assert silent == []


@pytest.mark.parametrize(("argv", "extras"), [
    (["--help"], {"eval", "mcp", "serve"}),
    (["rerank", "--help"], {"st", "cross-encoder"}),
    (["eval", "--help"], {"eval", "st", "cross-encoder"}),
    (["route", "--help"], {"st"}),
    (["batch", "--help"], {"ray", "st", "cross-encoder"}),
])
def test_help_names_the_extra_each_optional_feature_needs(
    argv: list[str], extras: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A user with only the core installed learns from --help, not from a failed run, which extra
    a feature needs; and every extra named there exists in pyproject.toml."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    if not (ROOT / "pyproject.toml").is_file():
        pytest.skip("pyproject.toml is not shipped in this layout")
    defined = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
                  ["project"]["optional-dependencies"])
    code, out, _ = run(capsys, *argv)
    named = set(re.findall(r"rag-rerank\[([a-z-]+)\]", re.sub(r"-\s+", "-", out)))
    assert code == EXIT_OK and extras <= named and named <= defined


def test_mcp_help_names_the_extra_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mcp", "--help")
    assert code == EXIT_OK and "pip install 'rag-rerank[mcp]'" in out


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_output_on_a_full_disk_and_a_closed_stdin_are_one_line_exit_2() -> None:
    """Regression: `render ... > /dev/full` and `-c - <&-` were internal errors (exit 4)."""
    argv = [sys.executable, "-m", "rag_rerank.cli", "render", "-q", QUERY, "-k", "3"]
    with open("/dev/full", "wb") as full:
        proc = subprocess.run([*argv, "-c", str(EXAMPLES / "adversarial.jsonl")], stdout=full,
                              stderr=subprocess.PIPE, cwd=ROOT, timeout=60, check=False)
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr.decode().splitlines() == ["rag-rerank: error: I/O error: No space left on device"]
    proc = subprocess.run([*argv, "-c", "-"], stdin=None, capture_output=True, cwd=ROOT, timeout=60,
                          check=False, preexec_fn=lambda: os.close(0))  # as `<&-` does
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr.decode().splitlines() == [
        "rag-rerank: error: --chunks: '-' reads stdin, but stdin is closed"]


def test_files_saved_with_a_utf8_bom_are_read(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    chunks = tmp_path / "chunks.jsonl"
    chunks.write_bytes(b'\xef\xbb\xbf{"id": "c1", "text": "IVF partitions vectors into cells."}\n')
    answer = tmp_path / "answer.json"
    answer.write_bytes(b'\xef\xbb\xbf{"ranked": [{"id": "c1", "score": 0.9, "reason": "IVF partitions"}]}')
    assert main(["check", "-c", str(chunks), "-k", "1", str(answer)]) == EXIT_OK
    assert capsys.readouterr().out.strip() == "valid"



# --- issue 15 -------------------------------------------------------------------------------------------


def test_help_describes_the_product_and_its_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == EXIT_OK
    assert "argument parsing" not in out  # the module docstring is not a description
    assert "Rerank retrieved chunks for a query" in out and "exit codes: 0 ok" in out
    # every code docs/cli.md lists, golden's 1 and the internal error's 4 included
    assert all(s in " ".join(out.split()) for s in ("1 invalid LLM output (check) or a golden regression",
                                                     "4 internal error", "130 interrupted")), out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import rag_rerank

    code, out, _ = run(capsys, "--version")
    assert (code, out) == (EXIT_OK, f"rag-rerank {rag_rerank.__version__}\n")


@pytest.mark.parametrize("command", ["rerank", "render"])
def test_an_integral_float_top_k_is_accepted(capsys: pytest.CaptureFixture[str], command: str) -> None:
    args = [command, "-q", "When should I prefer IVF over HNSW?", "-c", str(EXAMPLES / "happy-path.jsonl")]
    assert run(capsys, *args, "-k", "3.0")[:2] == run(capsys, *args, "-k", "3")[:2]
    assert run(capsys, *args, "-k", "3.0")[0] == EXIT_OK


def test_check_takes_an_integral_float_top_k_and_refuses_a_fraction(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    o, chunks = write(tmp_path, "out.json", VALID), str(EXAMPLES / "happy-path.jsonl")
    assert run(capsys, "check", "-c", chunks, "-k", "3.0", o)[:2] == (EXIT_OK, "valid\n")
    code, _, err = run(capsys, "check", "-c", chunks, "-k", "2.5", o)
    assert code == EXIT_BAD_INPUT and "expected a whole number, got '2.5'" in err[0]


@pytest.mark.parametrize("backend", ["openai", "anthropic"])
def test_a_missing_api_key_is_a_usage_error_not_a_backend_failure(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    code, out, err = run(capsys, "rerank", "-q", "q", "-c", str(EXAMPLES / "happy-path.jsonl"),
                         "--backend", backend)
    assert code == EXIT_BAD_INPUT and out == ""
    assert len(err) == 1 and "no API key" in err[0] and "backend failure" not in err[0]


def test_check_lists_each_violation_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chunks = write(tmp_path, "c.jsonl", '{"id":"a","text":"IVF is good"}\n{"id":"b","text":"HNSW"}\n')
    out = write(tmp_path, "o.json", '{"ranked":[{"id":"a","score":0.9,"reason":""}],'
                '"dropped":[{"id":"b","reason":""}]}')
    code, _, err = run(capsys, "check", "-c", chunks, "-k", "1", out)
    assert code == EXIT_INVALID_OUTPUT
    assert len(err) == len(set(err)) and sum("non-empty string" in line for line in err) == 2, err


def test_negative_indent_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Regression: json.dumps read --indent -5 as 0 and printed newline-separated JSON, exit 0.
    chunks = str(EXAMPLES / "happy-path.jsonl")
    code, _, err = run(capsys, "rerank", "-q", QUERY, "-c", chunks, "--indent", "-5")
    assert code == EXIT_BAD_INPUT and "--indent" in err[-1] and "-5" in err[-1]
    code, out, _ = run(capsys, "rerank", "-q", QUERY, "-c", chunks, "--indent", "2")
    assert code == EXIT_OK and out.startswith('{\n  "ranked"')


def test_a_meta_option_without_meta_field_says_needs(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "rerank", "-q", QUERY, "-c", str(EXAMPLES / "happy-path.jsonl"),
                       "--meta-weight", "2")
    assert code == EXIT_BAD_INPUT and "--meta-weight needs --meta-field KEY" in err[-1]


def test_python_m_rag_rerank_is_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Regression: there was no rag_rerank/__main__.py, so `python -m rag_rerank` failed.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = ["rerank", "-q", QUERY, "-c", str(EXAMPLES / "happy-path.jsonl"), "-k", "2"]
    done = subprocess.run([sys.executable, "-m", "rag_rerank", *argv], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    code, out, _ = run(capsys, *argv)
    assert code == EXIT_OK and json.loads(done.stdout) == json.loads(out)
    bad = subprocess.run([sys.executable, "-m", "rag_rerank", "rerank", "-q", QUERY, "-c", "/no/such/file"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False)
    assert bad.returncode == EXIT_BAD_INPUT and bad.stderr.startswith("rag-rerank")



def test_a_file_name_piped_as_chunks_gets_command_line_advice(monkeypatch, capsys) -> None:
    """`echo chunks.jsonl | rag-rerank rerank -c -` was told to "pass pathlib.Path(...)": advice
    for Python callers. The CLI names its own way to read a file."""
    import io

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"chunks.jsonl\n")))
    assert main(["rerank", "-q", "x", "-c", "-"]) == 2
    err = capsys.readouterr().err
    assert "-c FILE" in err and "pathlib" not in err


@pytest.mark.parametrize("command", ["render", "check"])
def test_over_max_chunks_render_and_check_do_not_advise_a_flag_they_refuse(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`render` and `check` take one prompt's chunks and have no --window-size: their advice over 50
    chunks is to split or pre-filter, naming the commands that take --window-size; `rerank` still
    advises --window-size."""
    lines = "".join(json.dumps({"id": f"c{i}", "text": "t"}) + "\n" for i in range(60))
    chunks = write(tmp_path, "c.jsonl", lines)
    answer = write(tmp_path, "a.json", VALID)
    argv = (["render", "-q", QUERY, "-c", chunks] if command == "render"
            else ["check", "-c", chunks, "-k", "3", answer])
    code, out, err = run(capsys, *argv)
    assert code == EXIT_BAD_INPUT and out == ""
    assert err == [f"rag-rerank: error: chunks: 60 chunks is over the limit of 50 (max_chunks); {command} "
                   "takes the chunks of one prompt: split the set or pre-filter it (--window-size is a "
                   "flag of rerank, batch and eval)"]
    assert "unrecognized" in " ".join(run(capsys, command, "--window-size", "20", *argv[1:])[2])
    code, _, err = run(capsys, "rerank", "-q", QUERY, "-c", chunks)
    assert code == EXIT_BAD_INPUT and "pass window_size (CLI --window-size N" in err[0]


@pytest.mark.parametrize("encoding", ["ascii", "cp1252"])
def test_non_ascii_ids_reach_a_pipe_whose_encoding_cannot_carry_them(tmp_path: Path, encoding: str) -> None:
    """stdout piped with a narrow encoding (PYTHONIOENCODING=ascii, a Windows pipe in cp1252) ended the
    run with a UnicodeEncodeError, exit 4, after the work was done. JSON on a pipe is UTF-8."""
    chunks = write(tmp_path, "c.jsonl", '{"id": "café", "text": "le café à Paris"}\n'
                                        '{"id": "東京", "text": "東京は日本の首都です"}\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": encoding}
    done = subprocess.run([sys.executable, "-m", "rag_rerank", "rerank", "-q", "café Paris", "-c", chunks],
                          capture_output=True, env=env, cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == EXIT_OK, done.stderr
    result = json.loads(done.stdout.decode("utf-8"))
    ids = [r["id"] for r in result["ranked"]] + [d["id"] for d in result["dropped"]]
    assert sorted(ids) == ["café", "東京"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_chunks_from_a_pipe_path_are_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`-c <(jq -c '.[]' chunks.json)` hands over /dev/fd/N, a pipe, not a regular file: it was refused
    as "no such file". A named pipe stands for it here; a missing path is still refused."""
    import threading

    fifo = tmp_path / "chunks.pipe"
    os.mkfifo(fifo)
    text = (EXAMPLES / "happy-path.jsonl").read_bytes()
    writer = threading.Thread(target=lambda: fifo.write_bytes(text), daemon=True)
    writer.start()
    code, out, err = run(capsys, "rerank", "-q", QUERY, "-c", str(fifo), "-k", "2")
    writer.join(timeout=10)
    assert code == EXIT_OK, err
    assert sorted(r["id"] for r in [*json.loads(out)["ranked"], *json.loads(out)["dropped"]]) == [
        "c1", "c2", "c3", "c4", "c5"]
    missing = tmp_path / "missing.jsonl"
    code, _, err = run(capsys, "rerank", "-q", QUERY, "-c", str(missing))
    assert code == EXIT_BAD_INPUT and err == [f"rag-rerank: error: --chunks: no such file: {missing}"]


def test_a_utf16_file_is_named_as_utf16(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (EXAMPLES / "happy-path.jsonl").read_text(encoding="utf-8")
    chunks = write(tmp_path, "c.jsonl", text.encode("utf-16"))
    code, _, err = run(capsys, "rerank", "-q", QUERY, "-c", chunks)
    assert code == EXIT_BAD_INPUT
    assert err == [f"rag-rerank: error: {chunks}: line 1: not UTF-8 text (byte 0) (it looks like UTF-16; "
                   "save it as UTF-8)"]


def test_chunks_from_a_terminal_say_what_they_wait_for(monkeypatch, capsys) -> None:
    """`-c -` with nothing piped in used to wait in silence; on a terminal it says how to end the
    input. Piped stdin gets no such line."""
    import io

    class Terminal(io.TextIOWrapper):
        def isatty(self) -> bool:
            return True

    text = (EXAMPLES / "happy-path.jsonl").read_bytes()
    monkeypatch.setattr(sys, "stdin", Terminal(io.BytesIO(text)))
    code, out, err = run(capsys, "rerank", "-q", QUERY, "-c", "-", "-k", "2")
    assert code == EXIT_OK and json.loads(out)["ranked"]
    assert err == ["rag-rerank: reading --chunks from the terminal; paste it, then press Ctrl-D (Ctrl-Z "
                   "Enter on Windows)"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text)))
    code, _, err = run(capsys, "rerank", "-q", QUERY, "-c", "-", "-k", "2")
    assert code == EXIT_OK and err == []


@pytest.mark.parametrize("argv", [["rerank", "-q", "q", "-c", "x.jsonl"], ["render", "-q", "q", "-c", "x"],
                                  ["batch", "-i", "x.jsonl"], ["golden"], ["route", "rerank these"]])
def test_an_unknown_flag_is_the_subcommands_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """`rag-rerank rerank ... --bogus` read 'rag-rerank: usage: error: unrecognized arguments: --bogus
    (see rag-rerank --help)', a page that lists no flag of `rerank`; a usage error names the command
    and its own help, as docs/errors.md says."""
    assert main([*argv, "--bogus", "--zzz"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"rag-rerank: {argv[0]}: error: unrecognized arguments: --bogus --zzz "
                    f"(see rag-rerank {argv[0]} --help)")


@pytest.mark.parametrize("flag", [["--api-key", "sk-live-SECRET42"], ["--api-key=sk-live-SECRET42"],
                                  ["--api_key", "sk-live-SECRET42"]])
def test_an_api_key_flag_names_the_environment_variables_and_hides_the_key(
    flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`--api-key KEY` (the SDKs' spelling) was 'unrecognized arguments: --api-key sk-live-...': the
    key echoed to the terminal and no word on where keys go."""
    argv = ["rerank", "-q", "q", "-c", "x.jsonl", "--backend", "openai", *flag]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "SECRET42" not in line and "unrecognized arguments: --api" in line and "***" in line
    assert line.endswith("the CLI takes no API key flag: set OPENAI_API_KEY, ANTHROPIC_API_KEY or "
                         "RERANK_API_KEY (a server on 127.0.0.1 / localhost needs none)")
    assert main(["rerank", "-q", "q", "-c", "x.jsonl", "--bogus", "1"]) == 2
    assert "API key" not in capsys.readouterr().err


def test_check_with_the_query_accepts_a_reason_quoting_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    quoting = json.loads(VALID)
    quoting["ranked"][0]["reason"] = 'answers "when should I choose IVF": ' + quoting["ranked"][0]["reason"]
    o = write(tmp_path, "out.json", json.dumps(quoting))
    chunks = str(EXAMPLES / "happy-path.jsonl")
    code, _, err = run(capsys, "check", "--chunks", chunks, "--top-k", "3", o)
    assert code == EXIT_INVALID_OUTPUT and any("reason quotes 'when should I choose IVF'" in e for e in err)
    query = "When should I choose IVF over HNSW?"
    assert run(capsys, "check", "-c", chunks, "--top-k", "3", "-q", query, o) == (EXIT_OK, "valid\n", [])


@pytest.mark.parametrize(("field", "said"), [("page_content", " (a LangChain Document's text)"),
                                             ("content", " (a Haystack Document's text)"), ("body", "")])
def test_a_framework_shaped_chunk_file_is_told_to_rename_its_text_field(
    field: str, said: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`rag-rerank rerank` on documents exported from LangChain or Haystack: exit 2, one line per
    record naming the field to rename, no traceback."""
    f = write(tmp_path, "docs.jsonl", "".join(json.dumps({"id": i, field: f"text {i}"}) + "\n" for i in "ab"))
    code, out, err = run(capsys, "rerank", "-q", "IVF or HNSW?", "-c", f)
    assert code == EXIT_BAD_INPUT and out == ""
    assert err == [f"rag-rerank: error: line {n}: chunks[{n - 1}].text: id '{i}': missing required field "
                   f"'text'; this record has '{field}'{said}: rename it to 'text'"
                   for n, i in ((1, "a"), (2, "b"))]


def test_check_reports_the_fence_and_every_violation_inside_it(capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    """Without --repair a fenced answer was reported for its fence alone: its wrong-case id, its
    score 1.2 and its generic reason appeared only with --repair. Now every one, at once."""
    answer = {"ranked": [{"id": "C3", "score": 0.9, "reason": "IVF is preferred when memory is constrained"},
                         {"id": "c1", "score": 1.2, "reason": "HNSW is RAM-heavy"},
                         {"id": "c2", "score": 0.5, "reason": "relevant"}],
              "dropped": [{"id": "c4", "reason": "FAISS hosts both"},
                          {"id": "c5", "reason": "below_min_score"}]}
    o = write(tmp_path, "out.txt", "```json\n" + json.dumps(answer) + "\n```")
    code, out, err = run(capsys, "check", "-c", str(EXAMPLES / "happy-path.jsonl"), "-k", "3", o)
    _, _, repaired = run(capsys, "check", "-c", str(EXAMPLES / "happy-path.jsonl"), "-k", "3", "--repair", o)
    inside = [line.removeprefix("rag-rerank: invalid: ") for line in repaired if "invalid:" in line]
    assert code == EXIT_INVALID_OUTPUT and out == ""
    assert "code fence" in err[0]
    assert len(inside) >= 3 and len(err) == 1 + len(inside)
    for line, violation in zip(err[1:], inside, strict=True):
        assert line.startswith(f"rag-rerank: invalid: {violation}")
        assert "removed a Markdown code fence" in line
    shown = "\n".join(err)
    assert "C3" in shown and "1.2" in shown and "ranked[2].reason" in shown


def test_a_windowed_request_has_no_single_prompt() -> None:
    from rag_rerank import InputError, Reranker

    chunks = [{"id": f"c{i}", "text": f"text {i}"} for i in range(30)]
    with Reranker() as session:
        assert "text 29" in session.prompt("q", chunks, 3)
        with pytest.raises(InputError, match="one prompt per window"):
            session.prompt("q", chunks, 3, window_size=10)
