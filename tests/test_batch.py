"""Batch reranking: input order, bounded concurrency, per-line errors, resume without loss or repeats."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from rag_rerank import arerank_many, rerank
from rag_rerank.batchfile import MAX_MESSAGE_VIOLATIONS, exit_code, parse_input, read_done
from rag_rerank.cli import main
from rag_rerank.embed.lexical import LexicalEmbedder
from rag_rerank.errors import InputError
from rag_rerank.models import RerankResult
from rag_rerank.skill import load_skill
from tests.support.fake_llm import FakeLLM, InFlight, RecordedRequest, Reply, auto_ranker
from tests.support.quoting_ranker import quoting_ranker

QUERY = "When should I prefer IVF over HNSW for vector search?"
HAPPY = load_skill().example("happy-path").chunks
ADVERSARIAL = load_skill().example("adversarial").chunks
SECRET = "sk-batch-SECRET-0123456789abcdef"


def _line(**kw: object) -> str:
    return json.dumps(kw)


def _queries(n: int) -> list[dict]:
    """n distinct requests: the happy path with its chunks in a different order each time."""
    rows = HAPPY.splitlines()
    out = []
    for i in range(n):
        k = i % len(rows)
        out.append(
            {
                "query": QUERY,
                "chunks": "\n".join(rows[k:] + rows[:k]),
                "top_k": 1 + i % 3,
                "query_id": f"q{i}",
            }
        )
    return out


def test_arerank_many_keeps_input_order_and_isolates_failures() -> None:
    reqs = _queries(5)
    reqs.insert(2, {"query": "", "chunks": HAPPY})  # empty query: an InputError in its own slot
    reqs.append(("not", "a mapping"))  # type: ignore[arg-type]
    seen: list[tuple[int, int]] = []
    out = asyncio.run(arerank_many(reqs, concurrency=2, progress=lambda d, t: seen.append((d, t))))
    assert len(out) == 7
    assert isinstance(out[2], InputError) and isinstance(out[6], InputError)
    assert "mapping" in str(out[6])
    for i, r in enumerate(out):
        if i in (2, 6):
            continue
        assert isinstance(r, RerankResult)
        assert len(r.ranked) <= reqs[i]["top_k"]
        # each slot holds exactly what rerank gives for its own request (chunk order differs per slot)
        assert r.to_dict() == rerank(reqs[i]["query"], reqs[i]["chunks"], reqs[i]["top_k"]).to_dict()
    assert seen[-1] == (7, 7) and [d for d, _ in seen] == list(range(1, 8))


def test_arerank_many_bounds_concurrency_and_shares_one_backend() -> None:
    slow = InFlight(quoting_ranker(), delay=0.25)

    with FakeLLM(handler=slow) as srv:
        out = asyncio.run(
            arerank_many(
                _queries(9), concurrency=3, backend="openai", base_url=srv.openai_url, api_key="x", model="m"
            )
        )
        assert len(srv.requests) == 9
    assert all(isinstance(r, RerankResult) for r in out)
    assert all(r.meta.backend == "openai" for r in out if isinstance(r, RerankResult))
    assert 2 <= slow.max <= 3


class _WaitingForTheNextRequest:
    """A caller's embedder (so the post-pass runs in a worker thread) whose first post-pass waits
    until the server has the batch's second request: it can only arrive while the first request is
    in its post-pass if the first handed its slot on when its answer came."""

    name = "waits-for-the-next"
    duplicate_threshold = 0.9

    def __init__(self, second_arrived: threading.Event) -> None:
        self.second_arrived = second_arrived
        self.saw_it: bool | None = None

    def embed(self, texts: list[str]) -> np.ndarray:
        if self.saw_it is None:
            self.saw_it = self.second_arrived.wait(timeout=10)
        return LexicalEmbedder().embed(texts)


def test_arerank_many_sends_the_next_request_while_a_post_pass_runs() -> None:
    """At concurrency 1 the second request is on the server while the first one's post-pass runs
    (its calls are done, its slot handed on), and there is never more than one call in flight."""
    second = threading.Event()
    inner = InFlight(quoting_ranker(), delay=0.05)

    def handler(req: RecordedRequest) -> Reply:
        if len(srv.requests) >= 2:  # this one is recorded before the handler runs
            second.set()
        return inner(req)

    probe = _WaitingForTheNextRequest(second)
    with FakeLLM(handler=handler) as srv:
        out = asyncio.run(arerank_many(_queries(3), concurrency=1, backend="openai", base_url=srv.openai_url,
                                       api_key="x", model="m", embedder=probe))
    assert all(isinstance(r, RerankResult) for r in out)
    assert probe.saw_it is True
    assert inner.max == 1


def test_arerank_many_rejects_zero_concurrency() -> None:
    with pytest.raises(InputError):
        asyncio.run(arerank_many(_queries(1), concurrency=0))


@pytest.mark.parametrize("concurrency", ["2", 1.5, True])
def test_arerank_many_rejects_a_non_integer_concurrency(concurrency: object) -> None:
    """Regression: concurrency="2" raised a bare TypeError from the comparison."""
    with pytest.raises(InputError) as info:
        asyncio.run(arerank_many(_queries(1), concurrency=concurrency))
    assert info.value.violations[0].path == "concurrency"


def test_parse_input_reports_bad_lines_by_number() -> None:
    text = "\n".join(
        [
            _line(query=QUERY, chunks=HAPPY),
            "{oops",
            "[1, 2]",
            _line(query=QUERY),
            _line(query=QUERY, chunks=HAPPY, topk=3),
            "",
            _line(query=QUERY, chunks=HAPPY, qid="x"),
        ]
    )
    lines = parse_input("\ufeff" + text.replace("\n", "\r\n"))  # a BOM and CRLF line ends are tolerated
    assert [ln.number for ln in lines] == [1, 2, 3, 4, 5, 7]
    assert isinstance(lines[0].item, dict) and isinstance(lines[5].item, dict) and lines[5].query_id == "x"
    for ln in lines[1:5]:
        assert isinstance(ln.item, InputError) and ln.item.violations[0].line == ln.number
    assert "chunks" in str(lines[3].item) and "topk" in str(lines[4].item)
    assert "unknown key 'topk'; did you mean 'top_k'? (allowed:" in str(lines[4].item)


def _write_input(path: Path, rows: list[str]) -> None:
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def _read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def test_batch_cli_writes_every_line_in_order_and_exits_2_on_bad_input(tmp_path: Path, capsys) -> None:
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    rows = [json.dumps(q) for q in _queries(4)]
    rows.insert(1, '{"query": "x", "chunks": "{\\"id\\": \\"a\\"}"}')  # chunk without text
    rows.insert(3, _line(query=QUERY, chunks=ADVERSARIAL, top_k=3))
    _write_input(inp, rows)
    code = main(["batch", "--input", str(inp), "--output", str(out), "--concurrency", "3", "--no-progress"])
    assert code == 2
    recs = _read(out)
    assert [r["line"] for r in recs] == [1, 2, 3, 4, 5, 6]
    assert recs[1]["error"]["kind"] == "input" and "text" in recs[1]["error"]["message"]
    q0 = _queries(1)[0]
    assert recs[0]["query_id"] == "q0"
    assert recs[0]["result"] == rerank(q0["query"], q0["chunks"], q0["top_k"]).to_dict()
    assert recs[3]["result"]["ranked"] == [] and len(recs[3]["result"]["dropped"]) == 3
    assert set(recs[0]) == {"line", "query_id", "result", "meta", "config"}
    assert set(recs[1]) == {"line", "error", "config"}
    assert recs[0]["config"]["backend"] == "local" and recs[0]["config"]["embedder"] == "lexical"
    assert set(recs[0]["result"]) == {"ranked", "dropped"}
    err = capsys.readouterr().err
    assert "line 2: input error" in err and "5 ok, 1 failed" in err


def test_batch_summary_counts_the_lines_the_local_fallback_answered(tmp_path: Path, capsys) -> None:
    """`batch --fallback local` said '2 ok, 0 failed' when the model had failed on one line and the
    local backend had answered it: the count of fallback answers is now in the summary."""
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(2)])
    refusal = Reply.openai_error(400, "this model cannot do that")
    with FakeLLM([refusal], handler=quoting_ranker()) as srv:
        code = main(["batch", "-i", str(inp), "-o", str(out), "--backend", "openai", "--base-url",
                     srv.openai_url, "-m", "m", "--fallback", "local", "--concurrency", "1", "--no-progress"])
    assert code == 0
    assert [r["meta"]["fallback"] for r in _read(out)] == ["local", None]
    err = capsys.readouterr().err
    # (meta.status: the summary counts every status but ok, and says who answered instead)
    summary = "batch: 2 ok (1 fallback: ranked by local after openai failed), 0 failed"
    assert summary in err


def test_batch_summary_counts_the_lines_answered_on_lexical_vectors(tmp_path: Path, capsys) -> None:
    """A server that chats but has no embeddings endpoint, with --embedder openai --fallback local:
    every line is answered (the LLM's ranking, lexical vectors) and the summary says how many."""
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(2)])
    rank = quoting_ranker()

    def answer(req):
        return Reply(404, {"detail": "Not Found"}) if req.api == "embeddings" else rank(req)

    with FakeLLM(handler=answer) as srv:
        code = main(["batch", "-i", str(inp), "-o", str(out), "--backend", "openai", "--base-url",
                     srv.openai_url, "-m", "m", "--embedder", "openai", "--fallback", "local",
                     "--no-progress"])
    assert code == 0
    fell = [(r["meta"]["fallback"], r["meta"]["embedder_fallback"]) for r in _read(out)]
    assert fell == [(None, "lexical")] * 2
    summary = "batch: 2 ok (2 fallback: lexical vectors after the openai embedder failed), 0 failed"
    assert summary in capsys.readouterr().err


def test_batch_cli_caps_one_requests_violations_in_its_error_line(tmp_path: Path, capsys) -> None:
    """One stderr line per bad request stays one readable line however many chunks it breaks;
    the output record still carries every violation."""
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    bad_lines = ["not json"] * 3
    _write_input(inp, [_line(query=QUERY, chunks=list(range(300))), json.dumps(_queries(1)[0]), *bad_lines])
    assert main(["batch", "-i", str(inp), "-o", str(out), "--no-progress"]) == 2
    recs = _read(out)
    assert "result" in recs[1]
    error = recs[0]["error"]
    total = len(error["violations"])
    assert total >= 300
    message = error["message"]
    # The size limit, which explains the rest, comes first; then the first records; then the count.
    assert message.startswith("chunks: 300 chunks is over the limit of 50 (max_chunks)")
    assert message.count("chunks[") == MAX_MESSAGE_VIOLATIONS - 1
    assert "chunks[0]: a chunk must be a JSON object, got number" in message
    assert message.endswith(f"; ... and {total - MAX_MESSAGE_VIOLATIONS} more violations ({total} total)")
    err = capsys.readouterr().err.splitlines()
    # per input line, one error line: the long request's is capped, the junk lines each get theirs
    assert err[1:] == [
        f"rag-rerank: line 1: input error: {error['message']}",
        *(f"rag-rerank: line {n}: input error: {recs[n - 1]['error']['message']}" for n in (3, 4, 5)),
    ]


def test_batch_cli_resume_skips_done_lines_and_repairs_a_torn_last_line(tmp_path: Path, capsys) -> None:
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(6)])
    assert main(["batch", "-i", str(inp), "-o", str(out), "--no-progress"]) == 0
    full = out.read_text(encoding="utf-8").splitlines(keepends=True)
    # a crash after line 3 was written and while line 4 was half written
    out.write_text("".join(full[:3]) + full[3][: len(full[3]) // 2], encoding="utf-8")
    done, valid_end = read_done(out)
    assert sorted(done) == [1, 2, 3] and valid_end == len("".join(full[:3]).encode())
    assert main(["batch", "-i", str(inp), "-o", str(out), "--resume", "--no-progress"]) == 0
    recs = _read(out)
    assert [r["line"] for r in recs] == [1, 2, 3, 4, 5, 6]
    assert [r["result"] for r in recs] == [json.loads(x)["result"] for x in full]
    assert "3 already done" in capsys.readouterr().err
    # resuming a finished file does nothing and repeats nothing
    before = out.read_bytes()
    assert main(["batch", "-i", str(inp), "-o", str(out), "--resume", "--no-progress"]) == 0
    assert out.read_bytes() == before


def test_batch_cli_backend_failure_exits_3_without_leaking_the_key(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(2)])
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    err = Reply.openai_error(401, f"Incorrect API key provided: {SECRET}", type_="authentication_error")
    with FakeLLM([err, err]) as srv:
        code = main(
            [
                "batch",
                "-i",
                str(inp),
                "-o",
                str(out),
                "--backend",
                "openai",
                "--base-url",
                srv.openai_url,
                "--model",
                "m",
                "--no-progress",
                "--concurrency",
                "1",
            ]
        )
    assert code == 3
    recs = _read(out)
    assert [r["error"]["kind"] for r in recs] == ["backend", "backend"]
    assert recs[0]["error"]["attempts"][0]["kind"] == "fatal"
    text = out.read_text(encoding="utf-8") + capsys.readouterr().err
    assert SECRET not in text and "***" in text


def test_batch_cli_usage_errors(tmp_path: Path, capsys) -> None:
    inp = tmp_path / "q.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(1)])
    assert main(["batch", "-i", str(inp), "--resume"]) == 2
    assert "--resume needs --output" in capsys.readouterr().err
    assert main(["batch", "-i", str(inp), "--concurrency", "0"]) == 2
    assert main(["batch", "-i", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_batch_cli_to_stdout(tmp_path: Path, capsys) -> None:
    inp = tmp_path / "q.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(3)])
    assert main(["batch", "-i", str(inp), "--no-progress"]) == 0
    recs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["line"] for r in recs] == [1, 2, 3]


def test_exit_code_precedence() -> None:
    ok, bad, down = {"result": {}}, {"error": {"kind": "input"}}, {"error": {"kind": "backend"}}
    assert exit_code([ok, ok]) == 0
    assert exit_code([ok, bad]) == 2
    assert exit_code([bad, down, ok]) == 3


def test_resume_refuses_a_file_that_is_not_a_batch_output(tmp_path: Path, capsys) -> None:
    inp, out = tmp_path / "q.jsonl", tmp_path / "notes.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(2)])
    out.write_text(
        '{"line": 1, "result": {"ranked": [], "dropped": []}}\n{"note": "mine"}\n', encoding="utf-8"
    )
    before = out.read_bytes()
    assert main(["batch", "-i", str(inp), "-o", str(out), "--resume", "--no-progress"]) == 2
    assert out.read_bytes() == before  # nothing truncated, nothing appended
    assert "line 2" in capsys.readouterr().err


def _run_batch_subprocess(inp: Path, out: Path, *, tty: bool, extra: tuple[str, ...] = ()) -> str:
    """stderr of `rag-rerank batch` run with stderr on a pseudo-terminal (tty=True) or a pipe."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "rag_rerank.cli", "batch", "-i", str(inp), "-o", str(out), *extra]
    if not tty:
        return subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=60).stderr
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0 x 0
    try:
        proc = subprocess.run(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=slave, timeout=60)
        assert proc.returncode == 0
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the other end is closed and drained
                break
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(master)


def test_progress_bar_only_on_a_terminal(tmp_path: Path) -> None:
    pytest.importorskip("tqdm")
    inp = tmp_path / "q.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(3)])
    on_tty = _run_batch_subprocess(inp, tmp_path / "a.jsonl", tty=True)
    assert "3/3" in on_tty and "query" in on_tty
    piped = _run_batch_subprocess(inp, tmp_path / "b.jsonl", tty=False)
    assert "3/3" not in piped and "3 ok, 0 failed" in piped
    quiet = _run_batch_subprocess(inp, tmp_path / "c.jsonl", tty=True, extra=("--no-progress",))
    assert "3/3" not in quiet and "3 ok, 0 failed" in quiet


def test_batch_cli_unwritable_output_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    """Regression: `-o DIR`, `--resume -o DIR` and a device that refuses writes were internal
    errors (exit 4)."""
    inp = tmp_path / "q.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(2)])
    for extra in ([], ["--resume"]):
        assert main(["batch", "-i", str(inp), "-o", str(tmp_path), "--no-progress", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--output" in err and "is a directory" in err
    if Path("/dev/full").exists():  # every write fails with ENOSPC: a full disk
        assert main(["batch", "-i", str(inp), "-o", "/dev/full", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot write /dev/full" in err and "internal" not in err


def test_batch_cli_refuses_to_overwrite_its_input(tmp_path: Path, capsys) -> None:
    """Regression: `batch -i F -o F` replaced the requests in F with their results (input lost)."""
    inp = tmp_path / "q.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(2)])
    before = inp.read_bytes()
    assert main(["batch", "-i", str(inp), "-o", str(tmp_path / "." / "q.jsonl"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is the --input file" in err
    assert inp.read_bytes() == before


# --- issue 15 -------------------------------------------------------------------------------------------


def test_a_backend_failure_line_names_its_cause(tmp_path: Path, capsys, monkeypatch) -> None:
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    _write_input(inp, [json.dumps(_queries(1)[0])])
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    err = Reply.openai_error(401, f"Incorrect API key provided: {SECRET}", type_="authentication_error")
    with FakeLLM([err]) as srv:
        code = main(["batch", "-i", str(inp), "-o", str(out), "--backend", "openai", "--base-url",
                     srv.openai_url, "--no-progress"])
    assert code == 3
    message = _read(out)[0]["error"]["message"]
    assert "HTTP 401" in message and SECRET not in message
    assert "HTTP 401" in capsys.readouterr().err


def test_one_line_numbering_in_batch_messages(tmp_path: Path, capsys) -> None:
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    rows = [json.dumps(q) for q in _queries(5)]
    rows.append(_line(query=QUERY, chunks='{"id": "a", "text": "IVF"}\nnot json'))
    _write_input(inp, rows)
    assert main(["batch", "-i", str(inp), "-o", str(out), "--no-progress"]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if "input error" in x]
    assert err == ["rag-rerank: line 6: input error: chunks[1]: not valid JSON "
                   "(Expecting value at column 1): 'not json'"]
    assert all("line" not in v for v in _read(out)[5]["error"]["violations"])


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_an_empty_input_is_an_error(tmp_path: Path, capsys, text: str) -> None:
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    inp.write_text(text, encoding="utf-8")
    assert main(["batch", "-i", str(inp), "-o", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "holds no requests" in err and "0 ok" not in err


def test_duplicate_keys_in_a_batch_line_are_refused_naming_line_and_key(tmp_path: Path, capsys) -> None:
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    _write_input(inp, [json.dumps(_queries(1)[0]),
                       '{"query": "ivf", "chunks": [{"id": "a", "id": "b", "text": "IVF"}]}',
                       '{"query": "ivf", "query": "hnsw", "chunks": [{"id": "a", "text": "IVF"}]}'])
    assert main(["batch", "-i", str(inp), "-o", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "line 2: input error: $: duplicate key 'id'" in err
    assert "line 3: input error: $: duplicate key 'query'" in err
    assert "result" in _read(out)[0] and "error" in _read(out)[1]


def test_a_path_as_chunks_gets_no_python_hint_and_no_existence_oracle(tmp_path: Path, capsys) -> None:
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    real = tmp_path / "real.jsonl"
    real.write_text(HAPPY, encoding="utf-8")
    _write_input(inp, [_line(query=QUERY, chunks=str(real)), _line(query=QUERY, chunks=str(tmp_path / "no"))])
    assert main(["batch", "-i", str(inp), "-o", str(out), "--no-progress"]) == 2
    messages = [r["error"]["message"] for r in _read(out)]
    assert "pathlib" not in "".join(messages) and "file name" not in "".join(messages)
    assert messages[0].replace(str(real), "P") == messages[1].replace(str(tmp_path / "no"), "P")


def test_resume_refuses_records_for_lines_beyond_the_input(tmp_path: Path, capsys) -> None:
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(2)])
    out.write_text(json.dumps({"line": 9, "result": {"ranked": [], "dropped": []}}) + "\n", encoding="utf-8")
    assert main(["batch", "-i", str(inp), "-o", str(out), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "input line 9" in err and "another input" in err
    assert len(_read(out)) == 1  # nothing appended to a foreign file


def test_batch_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    """`rag-rerank batch | head -1`: the reader leaves early; no 'Broken pipe' on stderr, exit 0."""
    import subprocess
    import sys

    inp = tmp_path / "q.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(200)])
    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "rag_rerank.cli", "batch", "-i", str(inp), "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # what `head -1` does after its line
    err = proc.stderr.read().decode("utf-8", "replace")
    assert proc.wait(timeout=120) == 0, err
    assert json.loads(first)["line"] == 1
    assert "Broken pipe" not in err and "BrokenPipeError" not in err and "Traceback" not in err


def test_arerank_many_passes_per_request_options_to_arerank() -> None:
    """Keys beyond the basics are `arerank` keywords (so a new one needs no change in batch.py);
    one that arerank does not take, or that is set for the whole run, is an input error naming it."""
    from rag_rerank import rerank

    reqs = [
        {"query": QUERY, "chunks": HAPPY, "layout": "lost_in_the_middle"},
        {"query": QUERY, "chunks": HAPPY, "colour": "red"},
        {"query": QUERY, "chunks": HAPPY, "strict": True},  # set for the run below
        {"query": QUERY, "chunks": HAPPY, "backend": "openai"},  # built once per run
        {"query": QUERY, "chunks": HAPPY, "fallback": "sometimes"},  # reaches arerank, which refuses it
    ]
    out = asyncio.run(arerank_many(reqs, strict=False))
    assert isinstance(out[0], RerankResult)
    assert out[0].ids == rerank(QUERY, HAPPY, layout="lost_in_the_middle").ids
    assert isinstance(out[4], InputError) and "unknown fallback step 'sometimes'" in str(out[4])
    for i, key in ((1, "colour"), (2, "strict"), (3, "backend")):
        assert isinstance(out[i], InputError) and repr(key) in str(out[i])
    assert "set for the whole run" in str(out[2]) and "set for the whole run" in str(out[3])


def test_arerank_many_names_a_misspelt_request_key_as_a_typo() -> None:
    """`topk` is not an option that "cannot be set per request": it is an unknown key, and the
    message says which key was meant."""
    out = asyncio.run(arerank_many([{"query": QUERY, "chunks": HAPPY, "topk": 3},
                                    {"query": QUERY, "chunks": HAPPY, "zzzqqq": 1}]))
    assert isinstance(out[0], InputError) and isinstance(out[1], InputError)
    assert "unknown key 'topk'; did you mean 'top_k'?" in str(out[0]) and "per request" not in str(out[0])
    assert "unknown key 'zzzqqq' (a request takes:" in str(out[1])


def test_arerank_many_names_a_request_without_query_or_chunks_as_missing_them() -> None:
    """Regression: a request without `chunks` (or a Ray dataset without that column) was told
    "chunks must be JSONL text, a path or a list, got null", a null the caller never wrote; a
    batch file's line says "missing required field"."""
    requests = [{"query": QUERY}, {"chunks": HAPPY}, {}, {"query": QUERY, "chunks": None}]
    out = asyncio.run(arerank_many(requests))
    assert all(isinstance(o, InputError) for o in out)
    assert [[(v.path, v.message) for v in o.violations] for o in out[:3]] == [
        [("chunks", "missing required field 'chunks'")],
        [("query", "missing required field 'query'")],
        [("query", "missing required field 'query'"), ("chunks", "missing required field 'chunks'")]]
    assert "got null" in str(out[3])  # a null the caller did write is named as such


def test_arerank_many_closes_the_backend_it_built_from_a_name() -> None:
    """The run's shared backend, built from `backend="openai"`, was never closed: its connections
    were left for the garbage collector (a ResourceWarning each) after every batch. A backend
    instance the caller passes stays open for the caller's next batch."""
    import gc
    import warnings

    from rag_rerank import make_backend

    requests = [{"query": f"IVF memory {i}", "chunks": [{"id": f"c{j}", "text": f"IVF saves index memory {j}"}
                                                      for j in range(6)], "top_k": 2} for i in range(6)]
    with FakeLLM(handler=quoting_ranker()) as srv:
        opts = {"model": "m", "base_url": srv.openai_url, "api_key": "sk-test"}
        gc.collect()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            out = asyncio.run(arerank_many(requests, concurrency=3, backend="openai", **opts))
            gc.collect()
        assert all(isinstance(r, RerankResult) for r in out)
        assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []

        async def twice(backend: object) -> list[object]:
            first = await arerank_many(requests[:2], backend=backend)
            return [*first, *await arerank_many(requests[2:], backend=backend)]  # same pool, still open

        async def shared() -> list[object]:
            async with make_backend("openai", **opts) as backend:
                return await twice(backend)

        assert all(isinstance(r, RerankResult) for r in asyncio.run(shared()))


# --- an existing output is neither truncated silently nor continued with other settings ---------------


def test_an_existing_output_is_refused_without_resume_or_overwrite(tmp_path: Path, capsys) -> None:
    """Regression: `batch -o results.jsonl` without --resume truncated an earlier run's results."""
    inp, out = tmp_path / "q.jsonl", tmp_path / "results.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(2)])
    out.write_text('{"line": 1, "result": {"ranked": [], "dropped": []}}\n', encoding="utf-8")
    before = out.read_bytes()
    assert main(["batch", "-i", str(inp), "-o", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == (f"rag-rerank: error: --output: {out} already exists and is not empty; pass --resume to "
                   "continue it or --overwrite to replace it\n")
    assert out.read_bytes() == before
    # --overwrite replaces it
    assert main(["batch", "-i", str(inp), "-o", str(out), "--no-progress", "--overwrite"]) == 0
    assert [r["line"] for r in _read(out)] == [1, 2] and all("result" in r for r in _read(out))
    # an empty file (`mktemp`) is no earlier run: written without either flag
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    assert main(["batch", "-i", str(inp), "-o", str(empty), "--no-progress"]) == 0
    assert len(_read(empty)) == 2


def test_overwrite_needs_an_output_file_and_excludes_resume(tmp_path: Path, capsys) -> None:
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(1)])
    assert main(["batch", "-i", str(inp), "-o", str(out), "--resume", "--overwrite", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume and --overwrite exclude each other" in err
    assert main(["batch", "-i", str(inp), "--overwrite", "--no-progress"]) == 2
    assert "--overwrite needs --output FILE" in capsys.readouterr().err
    assert not out.exists()


def _half_done(tmp_path: Path, n: int = 4, extra: tuple[str, ...] = ()) -> tuple[Path, Path, bytes]:
    """An input of n requests and an output holding the first two records, written by the local
    backend with the flags `extra`; and that output's bytes."""
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(n)])
    assert main(["batch", "-i", str(inp), "-o", str(out), "--no-progress", *extra]) == 0
    half = "".join(out.read_text(encoding="utf-8").splitlines(keepends=True)[:2])
    out.write_text(half, encoding="utf-8")
    return inp, out, out.read_bytes()


def test_resume_refuses_an_output_written_by_another_backend(tmp_path: Path, capsys) -> None:
    """Regression: `--resume --backend openai` on a file the local backend half wrote appended the
    model's results after the local ones, one file, two systems, no word said."""
    inp, out, before = _half_done(tmp_path)
    capsys.readouterr()
    with FakeLLM(handler=quoting_ranker()) as srv:
        url = srv.openai_url
        code = main(["batch", "-i", str(inp), "-o", str(out), "--resume", "--no-progress",
                     "--backend", "openai", "--base-url", url, "-m", "m"])
        assert srv.requests == []  # refused before any request
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"--resume: {out} was written with another configuration (record of input line 1: " in err
    assert "backend: file 'local', now 'openai'" in err and "model: file None, now 'm'" in err
    assert f"base_url: file None, now '{url}'" in err
    assert "--overwrite" in err and "Traceback" not in err
    assert out.read_bytes() == before


@pytest.mark.parametrize(
    ("first", "then", "named"),
    [
        ((), ("--embedder", "static"), "embedder: file 'lexical', now 'static'"),
        ((), ("--layout", "diversity"), "layout: file 'mmr', now 'diversity'"),
        ((), ("--strict",), "strict: file False, now True"),
        (("--window-size", "5"), ("--window-size", "10"), "window_size: file 5, now 10"),
        ((), ("--meta-field", "published"), "meta_field: file None, now 'published'"),
        (("--max-tokens", "600"), (), "max_tokens: file 600, now None"),
        # Regression (QA): a run resumed without the cap mixed shortened and whole chunks silently.
        (("--max-tokens-per-chunk", "16"), (), "max_tokens_per_chunk: file 16, now None"),
    ],
)
def test_resume_refuses_an_output_written_with_other_settings(
    tmp_path: Path, capsys, first: tuple[str, ...], then: tuple[str, ...], named: str
) -> None:
    inp, out, before = _half_done(tmp_path, extra=first)
    capsys.readouterr()
    assert main(["batch", "-i", str(inp), "-o", str(out), "--resume", "--no-progress", *then]) == 2
    err = capsys.readouterr().err
    assert "written with another configuration" in err and named in err, err
    assert out.read_bytes() == before


def test_resume_accepts_changes_that_decide_only_speed(tmp_path: Path, capsys) -> None:
    """Concurrency, the deadline and the progress bar do not change a line's result: a resumed run
    may change them (a longer deadline is how to finish a run whose calls timed out)."""
    inp, out, _ = _half_done(tmp_path, extra=("--concurrency", "1"))
    assert main(["batch", "-i", str(inp), "-o", str(out), "--resume", "--no-progress",
                 "--concurrency", "3", "--deadline", "300"]) == 0
    assert [r["line"] for r in _read(out)] == [1, 2, 3, 4]
    assert "2 already done" in capsys.readouterr().err


def test_batch_over_the_aiohttp_transport_resumes_over_httpx(tmp_path: Path, capsys) -> None:
    """`--http aiohttp` (the async client's transport) decides only speed: a file it half wrote is
    finished over httpx, every line answered once; the flag is refused for a backend without HTTP."""
    pytest.importorskip("aiohttp")
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(4)])
    with FakeLLM(handler=quoting_ranker()) as srv:
        args = ["batch", "-i", str(inp), "-o", str(out), "--no-progress", "--backend", "openai",
                "--base-url", srv.openai_url, "-m", "m"]
        assert main([*args, "--http", "aiohttp", "--concurrency", "4"]) == 0
        whole = _read(out)
        half = out.read_text(encoding="utf-8").splitlines(keepends=True)[:2]
        out.write_text("".join(half), encoding="utf-8")
        assert main([*args, "--resume"]) == 0
    assert len(srv.requests) == 6
    assert [r["line"] for r in _read(out)] == [1, 2, 3, 4]
    assert [r["result"] for r in _read(out)] == [r["result"] for r in whole]
    assert "backend_options" not in whole[0]["config"]  # the transport is not recorded
    capsys.readouterr()
    assert main(["batch", "-i", str(inp), "-o", str(tmp_path / "x.jsonl"), "--http", "aiohttp"]) == 2
    assert "--http applies to --backend openai or anthropic only" in capsys.readouterr().err


def test_resume_refuses_records_that_do_not_say_their_configuration(tmp_path: Path, capsys) -> None:
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(2)])
    out.write_text(json.dumps({"line": 1, "result": {"ranked": [], "dropped": []}}) + "\n", encoding="utf-8")
    before = out.read_bytes()
    assert main(["batch", "-i", str(inp), "-o", str(out), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "record of input line 1 does not say which configuration wrote it" in err
    assert "--overwrite" in err and out.read_bytes() == before


def test_resume_compares_the_embedders_server_too(tmp_path: Path, capsys) -> None:
    """The same embedder name on another server gives other vectors: eval's resume header records
    the server, and so does every batch record."""
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(3)])
    with FakeLLM() as one, FakeLLM() as two:
        assert main(["batch", "-i", str(inp), "-o", str(out), "--no-progress", "-e", "openai:emb",
                     "--embed-base-url", one.openai_url]) == 0
        assert _read(out)[0]["config"]["embed_base_url"] == one.openai_url
        out.write_text(out.read_text(encoding="utf-8").splitlines(keepends=True)[0], encoding="utf-8")
        capsys.readouterr()
        assert main(["batch", "-i", str(inp), "-o", str(out), "--resume", "--no-progress", "-e",
                     "openai:emb", "--embed-base-url", two.openai_url]) == 2
        err = capsys.readouterr().err
        assert f"embed_base_url: file '{one.openai_url}', now '{two.openai_url}'" in err
        assert main(["batch", "-i", str(inp), "-o", str(out), "--resume", "--no-progress", "-e",
                     "openai:emb", "--embed-base-url", one.openai_url]) == 0
    assert [r["line"] for r in _read(out)] == [1, 2, 3]


def test_the_recorded_configuration_holds_no_credentials(tmp_path: Path, capsys, monkeypatch) -> None:
    """A base URL's password (and the Basic header's base64 of it) and the API key stay out of the
    file; a resumed run with another password (credentials decide no result) continues it."""
    import base64

    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(3)])
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    password = "pw-SECRET-0123456789"
    rank = quoting_ranker()

    def answer(req: RecordedRequest) -> Reply:  # rankings, and hashed vectors for the embedder
        return auto_ranker()(req) if req.api == "embeddings" else rank(req)

    with FakeLLM(handler=answer) as srv:
        url = srv.openai_url.replace("http://", f"http://user:{password}@")
        argv = ["batch", "-i", str(inp), "-o", str(out), "--no-progress", "--backend", "openai", "-m", "m",
                "-e", "openai", "--base-url", url]
        assert main(argv) == 0
        text = out.read_text(encoding="utf-8")
        for secret in (SECRET, password, base64.b64encode(f"user:{password}".encode()).decode()):
            assert secret not in text
        config = _read(out)[0]["config"]
        shown = srv.openai_url.replace("http://", "http://user:***@")
        assert config["base_url"] == shown and config["embed_base_url"] == shown
        out.write_text(text.splitlines(keepends=True)[0], encoding="utf-8")
        other = url.replace(password, "pw-OTHER-9876543210")
        assert main([*argv[:-1], other, "--resume"]) == 0
    assert [r["line"] for r in _read(out)] == [1, 2, 3]
    assert SECRET not in out.read_text(encoding="utf-8") + capsys.readouterr().err


# --- issue 31: a dry run that names bad lines, a refused run that writes nothing, -----------------
# --- a chunks file named as one, an interruption that says how to go on ----------------------------


def _openai(srv: FakeLLM) -> list[str]:
    return ["--backend", "openai", "-m", "m", "--base-url", srv.openai_url, "--no-progress"]


def test_a_dry_run_names_every_invalid_line_and_counts_waves_of_concurrency(
        tmp_path: Path, capsys, monkeypatch) -> None:
    """12 lines, 3 bad: the dry run said exit 0, "calls": 9, nothing on stderr, and round_trips 1
    whatever --concurrency. Each bad line is named (line and field) and the plan counts the waves
    a run makes, --concurrency requests at a time (docs/cost.md)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    rows = [json.dumps(q) for q in _queries(9)]
    rows.insert(2, '{"query": "x", "chunks": ')                      # line 3: not JSON
    rows.insert(5, _line(query=QUERY, chunks=HAPPY, topk=3))         # line 6: a misspelt key
    rows.insert(8, _line(query=QUERY, chunks=HAPPY, top_k=0))        # line 9: a bad value
    inp = tmp_path / "q.jsonl"
    _write_input(inp, rows)
    with FakeLLM(handler=auto_ranker()) as srv:
        base = ["batch", "-i", str(inp), *_openai(srv), "--dry-run"]
        waves = {}
        for concurrency in (1, 4, 9):
            assert main([*base, "--concurrency", str(concurrency)]) == 2
            cap = capsys.readouterr()
            planned = json.loads(cap.out)
            waves[concurrency] = planned["round_trips"]
            assert planned["calls"] == 9 and planned["requests_planned"] == 9
            assert planned["invalid_lines"] == [3, 6, 9]
            err = cap.err.splitlines()
            named = [e.split(":")[1].strip() for e in err if "input error" in e]
            assert named == ["line 3", "line 6", "line 9"]
            assert "not valid JSON" in err[0] and "'topk'" in err[1] and "top_k" in err[2]
        assert not srv.requests
    assert waves == {1: 9, 4: 3, 9: 1}


def test_a_batch_refused_by_its_budget_writes_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    """A refused run left an empty --output (and --overwrite had already emptied the old one)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    inp, out, kept = tmp_path / "q.jsonl", tmp_path / "out.jsonl", tmp_path / "kept.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(3)])
    earlier = '{"line": 1, "result": {"ranked": [], "dropped": []}}\n'
    kept.write_text(earlier, encoding="utf-8")
    with FakeLLM(handler=auto_ranker()) as srv:
        base = ["batch", "-i", str(inp), *_openai(srv), "--budget-calls", "2"]
        assert main([*base, "-o", str(out)]) == 2
        assert "would exceed its budget" in capsys.readouterr().err
        assert main([*base, "-o", str(kept), "--overwrite"]) == 2
        assert not srv.requests
    assert not out.exists()
    assert kept.read_text(encoding="utf-8") == earlier


def test_a_chunks_file_given_to_batch_is_named_as_one_once(tmp_path: Path, capsys) -> None:
    """`batch -i chunks.jsonl` printed "unknown key 'id'; did you mean 'qid'?" for every line."""
    inp, out = tmp_path / "chunks.jsonl", tmp_path / "out.jsonl"
    inp.write_text(HAPPY, encoding="utf-8")
    assert main(["batch", "-i", str(inp), "-o", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("looks like a chunks file") == 1 and "rerank -q QUERY -c" in err, err
    assert "did you mean" not in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_an_interrupted_batch_says_what_is_saved_and_that_resume_continues(tmp_path: Path) -> None:
    """Ctrl-C printed only "interrupted"; now: how many lines are saved, and `--resume` goes on
    (which it then does, to the end). A real SIGINT to a real batch process."""
    import os
    import signal
    import subprocess
    import sys
    import time

    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    _write_input(inp, [json.dumps(q) for q in _queries(8)])
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "OPENAI_API_KEY": "sk-test"}
    # As a terminal's Ctrl-C finds it: Python's own SIGINT handler, even when this test runs under a
    # shell that started it in the background (which then ignores SIGINT, and so would the batch).
    main = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "runpy.run_module('rag_rerank', run_name='__main__', alter_sys=True)")
    with FakeLLM(handler=InFlight(quoting_ranker(), delay=0.3)) as srv:
        argv = [sys.executable, "-c", main, "batch", "-i", str(inp), "-o", str(out), *_openai(srv),
                "--concurrency", "1"]
        proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (not out.exists() or len(_read(out)) < 2):
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        saved = len(_read(out))
        assert proc.returncode == 130 and 2 <= saved < 8
        assert f"interrupted: {saved} of 8 lines are saved in {out}" in err, err
        assert "--resume" in err
        resumed = subprocess.run([*argv, "--resume"], env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert [r["line"] for r in _read(out)] == list(range(1, 9))
    assert all("result" in r for r in _read(out))


def test_a_batch_line_may_set_its_own_max_tokens_per_chunk(tmp_path: Path, capsys) -> None:
    """Regression (QA): docs/long-chunks.md says a batch line may set `max_tokens_per_chunk`; the
    line was refused as an unknown key. A line's own cap wins over the run's, as its window_size does."""
    long = " ".join(f"Sentence {i} talks about topic {i % 7} at some length." for i in range(60))
    chunks = [{"id": "a", "text": long}, {"id": "b", "text": "x"}]
    lines = [{"query_id": "own", "query": "topic 3", "chunks": chunks, "max_tokens_per_chunk": 32},
             {"query_id": "run", "query": "topic 3", "chunks": chunks}]
    inp, out = tmp_path / "q.jsonl", tmp_path / "out.jsonl"
    _write_input(inp, [json.dumps(q) for q in lines])
    argv = ["batch", "-i", str(inp), "-o", str(out), "--no-progress", "--max-tokens-per-chunk", "64"]
    assert main(argv) == 0
    records = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    after = {r["query_id"]: r["meta"]["evidence"]["a"]["tokens_after"] for r in records}
    assert after["own"] <= 32 < after["run"] <= 64, after
    assert all(r["config"]["max_tokens_per_chunk"] == 64 for r in records)
