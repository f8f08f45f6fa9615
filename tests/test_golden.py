"""The golden runner (rag_rerank/golden.py): every shipped case passes, and regressions are caught."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from rag_rerank.golden import KINDS, CaseFormatError, discover, load_case, run_all, run_case, run_golden
from rag_rerank.paths import golden_dir

CASES = discover(golden_dir())


@pytest.mark.parametrize(("kind", "path"), CASES, ids=[f"{k}/{p.stem}" for k, p in CASES])
def test_shipped_case(kind: str, path: Path) -> None:
    result = run_case(load_case(path, kind))
    if result.skipped:
        pytest.skip(result.skipped)
    assert result.ok, result.failures


def test_enough_cases_of_each_contract_kind() -> None:
    kinds = [k for k, _ in CASES]
    assert kinds.count("render") >= 15 and kinds.count("check") >= 30
    names = {p.stem for _, p in CASES}
    assert {"card-adversarial", "card-happy-path", "card-happy-path-valid", "card-adversarial-valid"} <= names


def test_every_case_has_a_description() -> None:
    for kind, path in CASES:
        assert load_case(path, kind).data["description"].strip()


def run(root: Path) -> tuple[int, str, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    code = run_golden(root, out=out, err=err)
    return code, out.getvalue(), err.getvalue().splitlines()


def test_run_golden_passes_on_the_shipped_folder() -> None:
    code, out, err = run(golden_dir())
    assert (code, err) == (0, [])
    assert out.startswith(f"golden: {len(CASES)} passed, 0 failed")


def copy_case(tmp_path: Path, kind: str, name: str) -> dict[str, object]:
    (tmp_path / kind).mkdir(parents=True, exist_ok=True)
    src = golden_dir() / kind / f"{name}.json"
    shutil.copy(src, tmp_path / kind / src.name)
    data: dict[str, object] = json.loads(src.read_text(encoding="utf-8"))
    return data


def save(tmp_path: Path, kind: str, name: str, data: dict[str, object]) -> None:
    (tmp_path / kind).mkdir(parents=True, exist_ok=True)
    (tmp_path / kind / f"{name}.json").write_text(json.dumps(data), encoding="utf-8")


def test_byte_for_byte_render_regression_is_caught(tmp_path: Path) -> None:
    copy_case(tmp_path, "render", "card-adversarial")
    expected = (golden_dir() / "render" / "card-adversarial.expected.xml").read_text(encoding="utf-8")
    (tmp_path / "render" / "card-adversarial.expected.xml").write_text(
        expected.replace("</task>\n", "</task>"), encoding="utf-8"
    )
    code, _, err = run(tmp_path)
    assert code == 1 and len(err) == 1
    assert err[0].startswith(
        "FAIL render/card-adversarial: prompt differs from card-adversarial.expected.xml at char"
    )


@pytest.mark.parametrize(
    ("kind", "name", "change", "message"),
    [
        ("check", "minted-id", {"expect": "valid"}, "expected valid, got 1 violation"),
        ("check", "card-happy-path-valid", {"expect": "invalid"}, "expected invalid, but the guard accepted"),
        (
            "check",
            "over-top-k",
            {"expect_violations": ["no such message"]},
            "no violation mentions 'no such message'",
        ),
        ("check", "fence-repaired", {"expect_repairs": ["removed a <think> block"]}, "repair did not report"),
        (
            "check",
            "truncated-not-salvaged",
            {"raw": '```\n{"ranked": []}\n```', "expect": "invalid"},
            "expected no repair, but repair reported",
        ),
        ("render", "hostile-jinja", {"expect_contains": ["49"]}, "prompt lacks '49'"),
        ("render", "hostile-query", {"expect_not_contains": ["&lt;"]}, "prompt contains '&lt;'"),
        (
            "render",
            "reject-duplicate-ids",
            {"chunks": '{"id": "a", "text": "t"}'},
            "but the request was accepted",
        ),
        ("render", "ids-casing", {"top_k": 0}, "input rejected: top_k"),
        (
            "check",
            "minted-id",
            {"surprise": 1},
            "bad case file: unknown key(s) for a check case: ['surprise']",
        ),
        ("check", "minted-id", {"expect": "maybe"}, "bad case file: 'expect' must be"),
        # Regressions: these crashed inside the runner ("crashed: TypeError ...") or, for a
        # misspelt or empty `expect`, passed while checking nothing.
        ("check", "minted-id", {"top_k": "3"}, "bad case file: 'top_k' must be an integer"),
        ("rerank", "odd-ids", {"expect": {"ranked": ["a"]}}, "bad case file: 'expect' takes"),
        ("rerank", "odd-ids", {"expect": {}}, "bad case file: 'expect' takes"),
        ("rerank", "odd-ids", {"expect": {"dropped": ["a"]}}, "bad case file: 'expect.dropped' must be"),
        ("rerank", "odd-ids", {"options": "x"}, "bad case file: 'options' must be an object"),
    ],
)
def test_regressions_and_broken_cases_are_reported(
    tmp_path: Path, kind: str, name: str, change: dict[str, object], message: str
) -> None:
    data = copy_case(tmp_path, kind, name)
    save(tmp_path, kind, name, {**data, **change})
    code, out, err = run(tmp_path)
    assert code == 1 and "1 failed" in out
    assert len(err) == 1 and err[0].startswith(f"FAIL {kind}/{name}: ") and message in err[0], err


def test_unreadable_and_incomplete_case_files_fail_without_crashing(tmp_path: Path) -> None:
    (tmp_path / "check").mkdir()
    (tmp_path / "check" / "broken.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "check" / "list.json").write_text("[]", encoding="utf-8")
    save(tmp_path, "render", "incomplete", {"description": "no query"})
    code, out, err = run(tmp_path)
    assert code == 1 and "3 failed" in out
    assert [e.split(":")[0] for e in err] == [
        "FAIL render/incomplete",
        "FAIL check/broken",
        "FAIL check/list",
    ]
    assert all("bad case file" in e for e in err)


def test_rerank_cases_run_through_the_pipeline(tmp_path: Path) -> None:
    pytest.importorskip("rag_rerank.api")
    case = {
        "description": "adversarial: nothing relevant, all dropped",
        "query": "When should I prefer IVF over HNSW for vector search?",
        "chunks": '{"id": "n1", "text": "Risotto needs constant stirring and warm stock."}\n',
        "top_k": 3,
        "expect": {"ranked_ids": ["n1"]},
    }
    save(tmp_path, "rerank", "wrong", case)
    code, _, err = run(tmp_path)
    assert code == 1 and err[0].startswith("FAIL rerank/wrong: ranked ids [] != expected ['n1']")


def test_missing_or_empty_folder_is_exit_2(tmp_path: Path) -> None:
    assert run(tmp_path / "nope")[0] == 2
    code, _, err = run(tmp_path)
    assert code == 2 and "no cases" in err[0]


def test_other_folders_are_not_cases(tmp_path: Path) -> None:
    (tmp_path / "router").mkdir()
    (tmp_path / "router" / "x.json").write_text("{}", encoding="utf-8")
    copy_case(tmp_path, "check", "minted-id")
    assert [r.label for r in run_all(tmp_path)] == ["check/minted-id"]
    assert KINDS == ("render", "check", "rerank")


def test_verbose_lists_every_case(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    copy_case(tmp_path, "check", "minted-id")
    copy_case(tmp_path, "render", "defaults")
    assert run_golden(tmp_path, verbose=True) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["ok   render/defaults", "ok   check/minted-id"]


@pytest.mark.parametrize(("kind", "key"), [("render", "expect_contains"), ("check", "expect_violations")])
def test_a_bare_string_where_a_list_is_expected_is_a_bad_case(tmp_path: Path, kind: str, key: str) -> None:
    """Regression: `"expect_contains": "abc"` was checked letter by letter, so it passed on almost
    any prompt; such a case is now a bad case file."""
    case = {"description": "d", "query": "q", "chunks": '{"id": "a", "text": "b"}', key: "abc"}
    if kind == "check":
        del case["query"]
        case.update(top_k=1, raw="{}", expect="invalid")
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps(case), encoding="utf-8")
    with pytest.raises(CaseFormatError, match=f"'{key}' must be a list of strings"):
        load_case(path, kind)


def test_a_case_file_with_a_utf8_bom_is_read(tmp_path: Path) -> None:
    """Regression: a case saved by a Windows editor (UTF-8 with BOM) was a bad case file."""
    data = copy_case(tmp_path, "check", "minted-id")
    path = tmp_path / "check" / "minted-id.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(data).encode("utf-8"))
    assert load_case(path, "check").data == data
