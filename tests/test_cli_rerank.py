"""`rag-rerank rerank`: stdout is exactly the schema object, --meta goes to stderr, exit codes 0 / 2 / 3."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rag_rerank.cli import main
from rag_rerank.skill import load_skill
from tests.support.fake_llm import FakeLLM, Reply
from tests.support.quoting_ranker import quoting_ranker

QUERY = "When should I prefer IVF over HNSW for vector search?"
ROOT = Path(__file__).resolve().parent.parent
SECRET = "sk-cli-SECRET-0123456789abcdef"


def _happy(tmp_path: Path) -> Path:
    path = tmp_path / "happy.jsonl"
    path.write_text(load_skill().example("happy-path").chunks, encoding="utf-8")
    return path


def test_rerank_prints_the_schema_object(tmp_path: Path, capsys) -> None:
    assert main(["rerank", "-q", QUERY, "-c", str(_happy(tmp_path)), "-k", "3"]) == 0
    cap = capsys.readouterr()
    obj = json.loads(cap.out)
    assert set(obj) == {"ranked", "dropped"}
    assert obj["ranked"][0]["id"] == "c3"
    assert "c5" not in [r["id"] for r in obj["ranked"]]
    assert sorted(r["id"] for r in obj["ranked"] + obj["dropped"]) == ["c1", "c2", "c3", "c4", "c5"]
    assert cap.err == ""


def test_meta_goes_to_stderr(tmp_path: Path, capsys) -> None:
    assert main(["rerank", "-q", QUERY, "-c", str(_happy(tmp_path)), "--meta", "--lambda", "0.5"]) == 0
    cap = capsys.readouterr()
    meta = json.loads(cap.err)
    assert meta["backend"] == "local" and meta["attempts"] == 1 and meta["embedder"] == "lexical"
    assert "backend" not in json.loads(cap.out)


def test_the_readme_quick_start_command_as_a_subprocess_from_stdin() -> None:
    """The installed entry point's code path, reading chunks from stdin."""
    text = (ROOT / "examples" / "happy-path.jsonl").read_text(encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "rag_rerank.cli", "rerank", "--query", QUERY, "--chunks", "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    ranked = json.loads(proc.stdout)["ranked"]
    assert ranked[0]["id"] == "c3" and "c5" not in [r["id"] for r in ranked]


def test_bad_input_exits_2_naming_the_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "ok"}\n{"id": "b", "text": 3}\n', encoding="utf-8")
    assert main(["rerank", "-q", QUERY, "-c", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "'text'" in err
    assert main(["rerank", "-q", QUERY, "-c", str(tmp_path / "nope.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["rerank", "-q", QUERY, "-c", str(_happy(tmp_path)), "-k", "0"]) == 2
    assert "top_k" in capsys.readouterr().err


def test_backend_failure_exits_3_and_fallback_exits_0(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    chunks = str(_happy(tmp_path))
    err = Reply.openai_error(401, f"Incorrect API key provided: {SECRET}", type_="authentication_error")
    with FakeLLM([err, err]) as srv:
        args = [
            "rerank",
            "-q",
            QUERY,
            "-c",
            chunks,
            "--backend",
            "openai",
            "--base-url",
            srv.openai_url,
            "-m",
            "m",
        ]
        assert main(args) == 3
        cap = capsys.readouterr()
        assert cap.out == "" and "backend failure" in cap.err and SECRET not in cap.err
        assert len(cap.err.strip().splitlines()) == 1
        assert main([*args, "--fallback", "local", "--meta"]) == 0
        cap = capsys.readouterr()
    assert json.loads(cap.out)["ranked"][0]["id"] == "c3"
    meta = json.loads(cap.err)
    assert meta["fallback"] == "local" and SECRET not in cap.err


def test_openai_compatible_server_through_the_cli(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # a loopback base_url needs no key
    with FakeLLM(handler=quoting_ranker()) as srv:
        args = [
            "rerank",
            "-q",
            QUERY,
            "-c",
            str(_happy(tmp_path)),
            "-k",
            "2",
            "--backend",
            "openai",
            "--base-url",
            srv.openai_url,
            "--model",
            "any",
            "--meta",
        ]
        assert main(args) == 0
        assert srv.requests[0].body["model"] == "any"
    cap = capsys.readouterr()
    obj = json.loads(cap.out)
    assert len(obj["ranked"]) <= 2
    assert sorted(r["id"] for r in obj["ranked"] + obj["dropped"]) == ["c1", "c2", "c3", "c4", "c5"]
    meta = json.loads(cap.err)
    assert meta["backend"] == "openai" and meta["attempts"] == 1 and meta["fallback"] is None
