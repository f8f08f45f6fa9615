"""`batch --workers N` on the local engine: worker processes write what one process writes, in
input order, and a worker that dies or fails loses no line (each gets an error record)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_rerank.batchfile import parse_input
from rag_rerank.cli import main
from rag_rerank.processes import run_processes
from tests.support.fake_llm import FakeLLM
from tests.support.quoting_ranker import quoting_ranker
from tests.support.shared_data import data_dir, need

DL19 = data_dir() / "trec-dl19" / "bm25-top100.json"


def _dl19_lines(n: int, chunks: int = 12) -> list[str]:
    """`n` batch lines of real passages (TREC DL19 BM25 hits), with one bad line in the middle."""
    src = json.loads(need(DL19).read_text(encoding="utf-8"))
    lines = []
    for i in range(n):
        q = src[i % len(src)]
        hits = [{"id": str(h["docid"]), "text": h["content"]} for h in q["hits"][i % 3:i % 3 + chunks]]
        lines.append(json.dumps({"query_id": f"q{i}", "query": q["query"], "chunks": hits, "top_k": 3}))
    lines.insert(n // 2, json.dumps({"query_id": "bad", "query": "", "chunks": []}))
    return lines


def _records(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        rec.get("meta", {}).pop("latency_ms", None)  # time, not the answer
        out.append(rec)
    return out


def test_workers_write_exactly_what_one_process_writes(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(_dl19_lines(9)) + "\n", encoding="utf-8")
    one, three = tmp_path / "one.jsonl", tmp_path / "three.jsonl"
    assert main(["batch", "-i", str(inp), "-o", str(one), "--no-progress"]) == 2  # the bad line
    assert main(["batch", "-i", str(inp), "-o", str(three), "--no-progress", "--workers", "3"]) == 2
    a, b = _records(one), _records(three)
    assert [r["line"] for r in b] == list(range(1, 11))  # every line, in input order
    assert a == b
    assert b[4]["error"]["kind"] == "input"
    assert "9 ok, 1 failed" in capsys.readouterr().err


def test_workers_call_a_server_over_http_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The openai backend from worker processes (each its own SDK client) against a local server;
    a resumed run with workers asks only for the lines left and ends as a one-process run does."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-workers-SECRET")
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(_dl19_lines(6)) + "\n", encoding="utf-8")
    whole, out = tmp_path / "whole.jsonl", tmp_path / "out.jsonl"
    with FakeLLM(handler=quoting_ranker()) as srv:
        args = ["batch", "-i", str(inp), "--no-progress", "--backend", "openai", "--base-url", srv.openai_url,
                "--model", "fake-gpt"]
        assert main([*args, "-o", str(whole)]) == 2  # the bad line
        first = whole.read_text(encoding="utf-8").splitlines()[:3]
        out.write_text("\n".join(first) + "\n", encoding="utf-8")
        before = len(srv.requests)
        assert main([*args, "-o", str(out), "--workers", "2", "--concurrency", "2", "--resume"]) == 2
        asked = len(srv.requests) - before
    assert asked == 3  # lines 4 to 7 less the bad one, which never reaches a worker
    assert _records(out) == _records(whole)
    assert "SECRET" not in out.read_text(encoding="utf-8")


class _DyingEmbedder:
    """A caller's embedder that ends its process on one text: a worker exiting (DIE) or killed
    (KILL, as the OOM killer does) mid-batch."""

    name = "dying"
    duplicate_threshold = 0.9

    def embed(self, texts: list[str]) -> np.ndarray:
        if any("DIE" in t for t in texts):
            os._exit(7)
        if any("KILL" in t for t in texts):
            os.kill(os.getpid(), signal.SIGKILL)
        if any("QUIT" in t for t in texts):
            raise SystemExit("the embedder gave up")  # escapes the batch: the worker itself fails
        rows = np.ones((len(texts), 2))
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _lines(texts: list[str]) -> list[Any]:
    text = "\n".join(json.dumps({"query": "q", "query_id": f"q{i}",
                                 "chunks": [{"id": "a", "text": t}, {"id": "b", "text": t + " too"}]})
                     for i, t in enumerate(texts))
    return parse_input(text)


def test_a_worker_that_dies_loses_no_line() -> None:
    lines = _lines(["cats purr when content", "DIE here", "QUIT here", "KILL here", "owls hoot", "bats fly"])
    got: dict[int, dict[str, Any]] = {}
    run_processes(lines, workers=3, concurrency=1, options={"embedder": _DyingEmbedder()}, secrets=[],
                  scores=False, on_record=lambda i, rec: got.__setitem__(i, rec))
    assert sorted(got) == [0, 1, 2, 3, 4, 5]
    assert "result" in got[0]
    # Lines dealt round-robin: worker 0 answered line 0 and was killed on line 3; worker 1 exited on
    # line 1 (and never answered line 4); worker 2 failed on line 2 (and never answered line 5).
    said = {i: got[i]["error"]["message"] for i in (1, 2, 3, 4, 5)}
    assert all(got[i]["error"]["kind"] == "internal" for i in said)
    head = r"RuntimeError: worker process {} \(pid \d+\) {} before answering this line"
    assert re.match(head.format(1, "exited with code 7") + ";", said[1]) and said[4] == said[1]
    assert re.match(head.format(2, "exited with code 1") + r" \(SystemExit: the embedder gave up\);", said[2])
    assert said[5] == said[2]
    assert re.match(head.format(0, r"was killed by signal 9 \(SIGKILL\)") + ";", said[3])  # no other's reason
    assert all("delete this record from the output and run the batch again with --resume" in m
               for m in said.values())


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_every_start_method_writes_what_one_process_writes(tmp_path: Path, start_method: str) -> None:
    """A context variable (the batch's PATH_HINT: no Python advice in a batch line's message) did not
    reach a forkserver or spawn worker, whose records then differed from one process's."""
    from rag_rerank.guard.input import PATH_HINT

    text = "\n".join([json.dumps({"query": "q", "chunks": "docs/chunks.jsonl"}),
                      json.dumps({"query": "q", "chunks": [{"id": "a", "text": "cats purr"}]}),
                      json.dumps({"query": "q", "chunks": [{"id": "b", "text": "dogs bark"}]})])
    lines = parse_input(text)
    got: dict[int, dict[str, Any]] = {}
    hint = PATH_HINT.set("")
    try:
        run_processes(lines, workers=2, concurrency=1, options={}, secrets=[], scores=False,
                      on_record=lambda i, rec: got.__setitem__(i, rec), start_method=start_method)
    finally:
        PATH_HINT.reset(hint)
    assert sorted(got) == [0, 1, 2]
    assert "pathlib" not in got[0]["error"]["message"] and "docs/chunks.jsonl" in got[0]["error"]["message"]
    assert "result" in got[1] and "result" in got[2]


class _ForkingEmbedder:
    """A caller's embedder that starts a child process of its own (a pool, a model server)."""

    name = "forking"
    duplicate_threshold = 0.9

    def embed(self, texts: list[str]) -> np.ndarray:
        import multiprocessing

        child = multiprocessing.get_context("fork").Process(target=int)
        child.start()
        child.join()
        rows = np.ones((len(texts), 2))
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_a_worker_may_start_processes_of_its_own() -> None:
    got: dict[int, dict[str, Any]] = {}
    run_processes(_lines(["cats purr", "dogs bark"]), workers=2, concurrency=1,
                  options={"embedder": _ForkingEmbedder()}, secrets=[], scores=False,
                  on_record=lambda i, rec: got.__setitem__(i, rec))
    assert all("result" in rec for rec in got.values()), got


def test_a_worker_that_fails_says_why_on_each_line() -> None:
    lines = _lines(["cats purr", "dogs bark"])
    got: dict[int, dict[str, Any]] = {}
    run_processes(lines, workers=2, concurrency=1, options={"backend": "no-such-backend"}, secrets=[],
                  scores=False, on_record=lambda i, rec: got.__setitem__(i, rec))
    assert sorted(got) == [0, 1]
    for rec in got.values():
        message = rec["error"]["message"]
        assert "exited with code 1" in message and "no-such-backend" in message


def test_input_errors_are_recorded_without_a_worker() -> None:
    lines = parse_input('{"query": "q"}\nnot json\n')
    got: list[tuple[int, dict[str, Any]]] = []
    run_processes(lines, workers=4, concurrency=1, options={}, secrets=[], scores=False,
                  on_record=lambda i, rec: got.append((i, rec)))
    assert [i for i, _ in got] == [0, 1]
    assert all(rec["error"]["kind"] == "input" for _, rec in got)


def test_run_processes_refuses_a_budget_and_no_workers() -> None:
    with pytest.raises(ValueError, match="one process"):
        run_processes([], workers=2, concurrency=1, options={"budget": {"max_calls": 1}}, secrets=[],
                      scores=False, on_record=lambda i, rec: None)
    with pytest.raises(ValueError, match="at least 1"):
        run_processes([], workers=0, concurrency=1, options={}, secrets=[], scores=False,
                      on_record=lambda i, rec: None)
    with pytest.raises(ValueError, match="start_method 'teleport' is not available"):
        run_processes([], workers=1, concurrency=1, options={}, secrets=[], scores=False,
                      on_record=lambda i, rec: None, start_method="teleport")


def test_cli_workers_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(_dl19_lines(1)) + "\n", encoding="utf-8")
    assert main(["batch", "-i", str(inp), "--workers", "2", "--budget-calls", "5"]) == 2
    assert "one process" in capsys.readouterr().err
    assert main(["batch", "-i", str(inp), "--workers", "0"]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err
    assert main(["batch", "-i", str(inp), "--workers", "2", "--backend", "no-such-backend"]) == 2
    err = capsys.readouterr().err
    assert "no-such-backend" in err and "Traceback" not in err


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat", encoding="utf-8").read()  # noqa: SIM115
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _running(pid: int) -> bool:
    try:
        stat = open(f"/proc/{pid}/stat", encoding="utf-8").read()  # noqa: SIM115
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended, only not been reaped


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_end_when_their_parent_is_killed(tmp_path: Path) -> None:
    """A parent killed by SIGKILL (a supervisor, the OOM killer) left its forked workers blocked for
    ever on the result pipe, each holding its memory; now they notice and exit."""
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(_dl19_lines(40)) + "\n", encoding="utf-8")
    env = {**os.environ, "OPENAI_API_KEY": "sk-test-orphans"}
    with FakeLLM(handler=quoting_ranker(0.5)) as srv:
        parent = subprocess.Popen(
            [sys.executable, "-m", "rag_rerank", "batch", "-i", str(inp), "-o", str(tmp_path / "out.jsonl"),
             "--no-progress", "--workers", "2", "--concurrency", "1", "--backend", "openai",
             "--base-url", srv.openai_url, "-m", "m"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        workers: list[int] = []
        for _ in range(300):  # the workers start after the imports: up to 30 s on a busy machine
            workers = _children(parent.pid)
            if len(workers) == 2 or parent.poll() is not None:
                break
            time.sleep(0.1)
        assert len(workers) == 2, "the workers never started"
        parent.kill()
        parent.wait(timeout=10)
        for _ in range(100):
            if not any(_running(w) for w in workers):
                break
            time.sleep(0.1)
        left = [w for w in workers if _running(w)]
        for w in left:  # do not leave them behind for the rest of the suite
            os.kill(w, signal.SIGKILL)
        assert left == [], "workers outlived their parent"
