"""Runs as `compare` reads them: TREC run files in trec_eval's order, batch outputs and eval resume
files, completed by the candidates; every bad line named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rag_rerank.errors import InputError
from rag_rerank.judgments import CandidateQuery
from rag_rerank.runfiles import SPEC_KEYS, complete, read_run, rerank_spec


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_trec_run_is_ordered_by_score_then_docid_descending_whatever_the_rank_column(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path, "a.run", "q1 Q0 d1 1 1.0 t\nq1 Q0 d3 2 2.5 t\nq1 Q0 d2 3 2.5 t\n\nq2 Q0 x 1 -3 t\n"
    )
    run = read_run(path)
    assert run.format == "trec"
    assert run.orders == {"q1": ("d3", "d2", "d1"), "q2": ("x",)}


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("q1 Q0 d1 1 0.5", "6 columns"),
        ("q1 Q0 d1 1 high t", "score (column 5)"),
        ("q1 Q0 d1 1 nan t", "score (column 5)"),
        ("q1 Q0 d0 1 0.9 t", "lists document d0 twice"),
    ],
)
def test_a_bad_trec_line_is_named_by_its_number(tmp_path: Path, line: str, needle: str) -> None:
    path = write(tmp_path, "bad.run", f"q1 Q0 d0 1 1.0 t\n\n{line}\n")
    with pytest.raises(InputError) as info:
        read_run(path)
    [problem] = info.value.violations
    assert problem.line == 3 and needle in problem.message and problem.path == str(path)


def test_every_bad_line_is_named_up_to_a_bound(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.run", "".join(f"q{i} Q0 d 1\n" for i in range(50)))
    with pytest.raises(InputError) as info:
        read_run(path)
    assert [v.line for v in info.value.violations] == list(range(1, 21))


def batch_record(line: int, qid: object, ids: list[str], usage: dict | None = None) -> str:
    record = {
        "line": line,
        "query_id": qid,
        "result": {"ranked": [{"id": i, "score": 0.5, "reason": "r"} for i in ids], "dropped": []},
        "meta": {"usage": usage or {}},
        "config": {"backend": "openai"},
    }
    return json.dumps(record) + "\n"


def test_a_batch_output_gives_ranked_ids_failures_and_usage(tmp_path: Path) -> None:
    error = {"line": 3, "query_id": "q3", "error": {"kind": "backend", "message": "timed out"}}
    path = write(
        tmp_path,
        "out.jsonl",
        batch_record(1, "q1", ["a", "b"], {"prompt_tokens": 100, "completion_tokens": 20})
        + batch_record(2, 7, ["c"])
        + json.dumps(error)
        + "\n",
    )
    run = read_run(path)
    assert run.format == "batch" and run.orders == {"q1": ("a", "b"), "7": ("c",)}
    assert run.failed == {"q3": "timed out"}
    assert run.usage == {"q1": {"prompt_tokens": 100, "completion_tokens": 20}}
    assert run.config == {"backend": "openai"}


def test_a_batch_record_without_a_query_id_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "out.jsonl", batch_record(1, "q1", ["a"]) + batch_record(2, None, ["b"]))
    with pytest.raises(InputError) as info:
        read_run(path)
    [problem] = info.value.violations
    assert problem.line == 2 and "query_id" in problem.message


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"line": 1, "query_id": "q1", "result": {"ranked": [{"id": "a"}]}}\n{not json\n', "not valid JSON"),
        ('{"line": 1, "query_id": "q1", "result": {"ranked": "a"}}\n', "expected 'result'"),
        ('{"line": 1, "query_id": "q1", "result": {"ranked": [{"id": "a"}, {"id": "a"}]}}\n', "twice"),
        (
            '{"line": 1, "query_id": "q1", "result": {"ranked": [{"id": "a"}]}}\n'
            '{"line": 2, "query_id": "q1", "result": {"ranked": [{"id": "b"}]}}\n',
            "appears twice",
        ),
        ('{"config": {}}\n[1, 2]\n', "JSON object"),
    ],
)
def test_bad_json_lines_are_named(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(InputError) as info:
        read_run(write(tmp_path, "x.jsonl", text))
    assert any(needle in v.message and v.line is not None for v in info.value.violations), info.value


def test_an_eval_resume_file_is_read_with_its_header(tmp_path: Path) -> None:
    text = (
        json.dumps({"config": {"backend": "local", "k": 10}})
        + "\n"
        + json.dumps({"qid": "q1", "ranked": ["b", "a"]})
        + "\n"
        + json.dumps({"qid": "q2", "error": "BackendError: down", "kind": "backend"})
        + "\n"
    )
    run = read_run(write(tmp_path, "resume.jsonl", text))
    assert (
        run.format == "eval"
        and run.orders == {"q1": ("b", "a")}
        and run.failed == {"q2": "BackendError: down"}
    )
    assert run.config == {"backend": "local", "k": 10}


def test_candidates_complete_each_order_as_eval_does_and_give_failures_the_input_order(
    tmp_path: Path,
) -> None:
    text = json.dumps({"qid": "q1", "ranked": ["c"]}) + "\n" + json.dumps({"qid": "q2", "error": "x"}) + "\n"
    cands = [
        CandidateQuery("q1", "?", tuple({"id": i, "text": i} for i in "abcd")),
        CandidateQuery("q2", "?", tuple({"id": i, "text": i} for i in "xy")),
    ]
    run = read_run(write(tmp_path, "resume.jsonl", text), candidates=cands)
    assert run.orders == {"q1": ("c", "a", "b", "d"), "q2": ("x", "y")}
    assert complete(run, cands).orders == run.orders


@pytest.mark.parametrize(
    ("content", "needle"), [(b"", "is empty"), (b"\xff\xfeq\x001", "not UTF-8"), (b"\n\n", "is empty")]
)
def test_an_unreadable_run_file_is_bad_input(tmp_path: Path, content: bytes, needle: str) -> None:
    path = tmp_path / "r.run"
    path.write_bytes(content)
    with pytest.raises(InputError, match=needle):
        read_run(path)
    with pytest.raises(InputError, match="directory"):
        read_run(tmp_path)
    with pytest.raises(InputError, match="cannot read"):
        read_run(tmp_path / "missing.run")


def test_a_rerank_spec_is_read_as_options() -> None:
    assert rerank_spec("runs/a.run") is None
    assert rerank_spec("rerank:lambda=0.5,backend=local,window-size=20,model=null") == {
        "lambda_": 0.5,
        "backend": "local",
        "window_size": 20,
        "model": None,
    }
    assert rerank_spec("rerank:") == {}
    with pytest.raises(InputError, match="KEY=VALUE"):
        rerank_spec("rerank:lambda")


def test_a_misspelt_rerank_spec_key_is_named_as_the_docs_spell_keys() -> None:
    """Regression (QA): `rerank:lamda=0.3` suggested the library's `lambda_` and listed `api_key`,
    which the command line refuses; now the docs' spellings, every bad key at once."""
    with pytest.raises(InputError) as caught:
        rerank_spec("rerank:lamda=0.3,window_sise=3,api-key=sk-x")
    lamda, window, key = (v.message for v in caught.value.violations)
    assert "did you mean 'lambda'?" in lamda and "lambda_" not in lamda and "api-key" not in lamda
    assert "did you mean 'window-size'?" in window
    assert "not taken on the command line" in key and "sk-x" not in key


@given(st.text(), st.sampled_from(["", "{", "q1 Q0 d 1 1.0 t\n"]))
@example("q1 Q0 \u0301 1 1e309 t", "")
@example('{"line": 1, "query_id": "\ud800", "result": {"ranked": [{"id": 1}]}}', "")
@example('{"qid": "q", "ranked": [true]}', "")
@settings(max_examples=150, deadline=None, derandomize=True)
def test_any_text_is_a_run_or_an_input_error_naming_the_problem(text: str, prefix: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "run.txt"
        path.write_text(prefix + text, encoding="utf-8", errors="surrogatepass")
        try:
            run = read_run(path)
        except InputError as exc:
            assert exc.violations and all(v.message for v in exc.violations)
        else:
            assert all(isinstance(d, str) for ids in run.orders.values() for d in ids)
            assert all(isinstance(q, str) for q in run.orders)


@given(st.text())
@example("rerank:a=!!python/object:os.system")
@example("rerank:lambda=[1, 2")
@settings(max_examples=100, deadline=None, derandomize=True)
def test_any_spec_is_options_or_an_input_error(text: str) -> None:
    try:
        options = rerank_spec("rerank:" + text)
    except InputError as exc:
        assert all(("KEY=VALUE" in v.message or "unknown key" in v.message or "API key" in v.message)
                   for v in exc.violations), exc
    else:
        assert isinstance(options, dict) and set(options) <= set(SPEC_KEYS.values())
