"""`rag-rerank rerank`: stdout is exactly the schema object, --meta goes to stderr, exit codes 0 / 2 / 3."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rag_rerank import rerank
from rag_rerank.cli import main
from rag_rerank.skill import load_skill
from tests.support.fake_llm import FakeLLM, RecordedRequest, Reply, auto_ranker
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
    assert obj == rerank(QUERY, load_skill().example("happy-path").chunks, 3).to_dict()
    assert "c3" in [r["id"] for r in obj["ranked"]] and "c5" not in [r["id"] for r in obj["ranked"]]
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
    assert json.loads(proc.stdout) == rerank(QUERY, text).to_dict()
    assert "c3" in [r["id"] for r in ranked] and "c5" not in [r["id"] for r in ranked]


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
    assert json.loads(cap.out) == rerank(QUERY, load_skill().example("happy-path").chunks).to_dict()
    meta = json.loads(cap.err)
    assert meta["fallback"] == "local" and SECRET not in cap.err


def test_a_fallback_answer_says_so_on_stderr_without_meta(tmp_path: Path, capsys) -> None:
    """`--fallback local` without `--meta`: exit 0 and a schema object on stdout, like the LLM's
    own ranking; nothing told the user that every attempt had failed (a model inventing ids, here).
    One warning line now names the backend and why; with --meta stderr stays one JSON object."""
    chunks = str(_happy(tmp_path))
    answer = {"ranked": [{"id": "c99", "score": 0.9, "reason": "IVF memory"}]}
    invented = Reply.openai_text(json.dumps(answer))
    with FakeLLM([invented] * 3) as srv:
        args = ["rerank", "-q", QUERY, "-c", chunks, "--backend", "openai", "--base-url", srv.openai_url,
                "-m", "m", "--fallback", "local"]
        assert main(args) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out) == rerank(QUERY, load_skill().example("happy-path").chunks).to_dict()
    (line,) = cap.err.splitlines()
    assert line.startswith("rag-rerank: warning: the result is ranked by the local backend "
                           "(--fallback local): openai failed after 3 attempts: ")
    assert "'c99' is not an input id" in line


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


# --- where an `openai` embedder sends its requests -----------------------------------------------


def _ranks_and_embeds(req: RecordedRequest) -> Reply:
    """Valid rankings for chat / messages calls, hashed vectors for embeddings calls."""
    return (auto_ranker() if req.api == "embeddings" else quoting_ranker())(req)


def _apis(srv: FakeLLM) -> set[str]:
    return {r.api for r in srv.requests}


def _command(command: str, tmp_path: Path, backend_args: list[str]) -> list[str]:
    chunks = load_skill().example("happy-path").chunks
    if command == "rerank":
        return ["rerank", "-q", QUERY, "-c", str(_happy(tmp_path)), *backend_args]
    if command == "batch":
        inp = tmp_path / "q.jsonl"
        inp.write_text(json.dumps({"query": QUERY, "chunks": chunks, "top_k": 2}) + "\n", encoding="utf-8")
        return ["batch", "-i", str(inp), "-o", str(tmp_path / "out.jsonl"), "--no-progress", *backend_args]
    cands, qrels = tmp_path / "c.jsonl", tmp_path / "q.txt"
    records = [json.loads(line) for line in chunks.splitlines() if line.strip()]
    cands.write_text(json.dumps({"qid": "1", "query": QUERY, "chunks": records}) + "\n", encoding="utf-8")
    qrels.write_text("1 0 c3 1\n", encoding="utf-8")
    return ["eval", "--candidates", str(cands), "--qrels", str(qrels), "--k", "3", "--no-progress",
            *backend_args]


@pytest.fixture
def decoy(monkeypatch: pytest.MonkeyPatch):
    """A second server named by OPENAI_BASE_URL: where the embedder went before --base-url reached it
    (and a stand-in for api.openai.com, so a regression fails here instead of going online)."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeLLM(handler=_ranks_and_embeds) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.openai_url)
        yield srv


@pytest.mark.parametrize("command", ["rerank", "batch", "eval"])
def test_openai_embedder_follows_base_url_of_an_openai_backend(
    command: str, tmp_path: Path, capsys, decoy: FakeLLM
) -> None:
    if command == "eval":
        pytest.importorskip("ir_measures")  # the eval extra
    with FakeLLM(handler=_ranks_and_embeds) as srv:
        argv = _command(command, tmp_path, ["--backend", "openai", "--base-url", srv.openai_url,
                                            "-m", "m", "-e", "openai:fake-embed"])
        assert main(argv) == 0, capsys.readouterr().err
    embeds = [r for r in srv.requests if r.api == "embeddings"]
    assert embeds and all(r.path == "/v1/embeddings" and r.body["model"] == "fake-embed" for r in embeds)
    assert "openai" in _apis(srv)
    assert decoy.requests == []


def test_embed_base_url_sends_embeddings_to_their_own_server(tmp_path: Path, capsys, decoy: FakeLLM) -> None:
    with FakeLLM(handler=_ranks_and_embeds) as llm, FakeLLM(handler=_ranks_and_embeds) as embeddings:
        argv = _command("rerank", tmp_path, ["--backend", "openai", "--base-url", llm.openai_url, "-m", "m",
                                             "-e", "openai", "--embed-base-url", embeddings.openai_url,
                                             "--meta"])
        assert main(argv) == 0
    assert _apis(llm) == {"openai"} and _apis(embeddings) == {"embeddings"}
    assert json.loads(capsys.readouterr().err)["embedder"] == "openai:text-embedding-3-small"
    assert decoy.requests == []


def test_embed_base_url_with_the_local_backend(tmp_path: Path, capsys, decoy: FakeLLM) -> None:
    with FakeLLM(handler=_ranks_and_embeds) as embeddings:
        argv = _command("rerank", tmp_path,
                        ["-e", "openai:fake-embed", "--embed-base-url", embeddings.openai_url])
        assert main(argv) == 0
    assert _apis(embeddings) == {"embeddings"} and decoy.requests == []


def test_an_anthropic_base_url_is_not_an_embeddings_server(tmp_path: Path, capsys, decoy: FakeLLM) -> None:
    """Only an openai backend's server is borrowed; otherwise the embedder keeps OPENAI_BASE_URL."""
    with FakeLLM(handler=_ranks_and_embeds) as claude:
        argv = _command("rerank", tmp_path, ["--backend", "anthropic", "--base-url", claude.anthropic_url,
                                             "-m", "m", "-e", "openai:fake-embed"])
        assert main(argv) == 0, capsys.readouterr().err
    assert _apis(claude) == {"anthropic"} and _apis(decoy) == {"embeddings"}


def test_embed_base_url_without_an_openai_embedder_is_a_usage_error(tmp_path: Path, capsys) -> None:
    argv = _command("rerank", tmp_path, ["--embed-base-url", "http://127.0.0.1:1/v1"])
    assert main(argv) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.splitlines() == [
        "rag-rerank: error: --embed-base-url applies only to --embedder openai[:MODEL], not 'lexical'"
    ]


def test_the_library_follows_an_openai_backends_base_url_too(decoy: FakeLLM) -> None:
    """The rule lives in `rerank()`, so Python callers, the MCP server and `call_tool` get it as
    well as the CLI."""
    from rag_rerank import rerank
    from rag_rerank.tools import call_tool

    chunks = load_skill().example("happy-path").chunks
    with FakeLLM(handler=_ranks_and_embeds) as srv:
        rerank(QUERY, chunks, 2, backend="openai", base_url=srv.openai_url, model="m", embedder="openai")
        records = [json.loads(line) for line in chunks.splitlines() if line.strip()]
        out = call_tool({"query": QUERY, "chunks": records, "top_k": 2, "lambda": None},
                        backend="openai", base_url=srv.openai_url, model="m", embedder="openai")
        assert "ranked" in out, out
    assert [r.api for r in srv.requests].count("embeddings") >= 2
    assert decoy.requests == []


@pytest.mark.parametrize("command", ["rerank", "batch", "eval"])
@pytest.mark.parametrize(
    ("flags", "option"),
    [
        (["--backend", "openai", "-m", "m", "--base-url", "http://[::1"], "--base-url"),
        (["--backend", "openai", "-m", "m", "--base-url", "http://127.0.0.1:99999/v1"], "--base-url"),
        (["--backend", "openai", "-m", "m", "--base-url", ""], "--base-url"),
        (["-e", "openai", "--embed-base-url", "http://[::1"], "--embed-base-url"),
        (["-e", "openai", "--embed-base-url", "127.0.0.1:8000/v1"], "--embed-base-url"),
        (["-e", "openai", "--embed-base-url", ""], "--embed-base-url"),
    ],
    ids=["ipv6 unclosed", "port out of range", "empty", "embed ipv6 unclosed", "no scheme", "embed empty"],
)
def test_a_url_no_request_could_use_is_a_usage_error(
    command: str, flags: list[str], option: str, tmp_path: Path, capsys, decoy: FakeLLM
) -> None:
    """Was exit 4 (ValueError / InvalidURL from inside the SDK), exit 3 ("connection error", an
    API-key complaint), or for an empty URL (an unset shell variable) a request to
    OPENAI_BASE_URL / api.openai.com instead of the local server meant."""
    assert main(_command(command, tmp_path, flags)) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"rag-rerank: error: {option}: ") and "not a URL" in err[0]
    assert decoy.requests == []
    if command == "batch":
        assert not (tmp_path / "out.jsonl").exists() or (tmp_path / "out.jsonl").read_text() == ""


def test_the_library_refuses_a_malformed_base_url_as_input() -> None:
    from rag_rerank import rerank
    from rag_rerank.errors import InputError

    with pytest.raises(InputError) as info:
        rerank(QUERY, load_skill().example("happy-path").chunks, 2, backend="openai", base_url="http://[::1")
    assert [v.path for v in info.value.violations] == ["base_url"]


def test_a_base_url_for_the_local_backend_is_a_usage_error(tmp_path: Path, capsys) -> None:
    """The local backend calls no server: a --base-url given to it used to be silently ignored."""
    argv = _command("rerank", tmp_path, ["--base-url", "http://127.0.0.1:1/v1"])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # The library's own check of an option a backend would ignore, worded with the flags (issue 31:
    # the CLI had a second copy of it, with its own words).
    assert len(err) == 1 and "--base-url" in err[0] and "local backend takes no base_url" in err[0]
    assert "--embed-base-url" in err[0]


# --- issue 15: --deadline ------------------------------------------------------------------------------


def test_deadline_option_bounds_a_server_that_never_answers(tmp_path: Path, capsys, monkeypatch) -> None:
    import time

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeLLM([Reply.openai_text("{}", delay=90.0)]) as srv:
        start = time.monotonic()
        code = main(["rerank", "-q", QUERY, "-c", str(_happy(tmp_path)), "--backend", "openai",
                     "--base-url", srv.openai_url, "--deadline", "1.5"])
        took = time.monotonic() - start
        cap = capsys.readouterr()
    assert code == 3, cap.err
    assert "the deadline of 1.5s was crossed" in cap.err and len(srv.requests) == 1
    assert took < 30.0  # loose: without the bound this is the client's 60 s timeout


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf", "soon"])
def test_a_bad_deadline_is_a_usage_error(tmp_path: Path, capsys, value: str) -> None:
    assert main(["rerank", "-q", QUERY, "-c", str(_happy(tmp_path)), "--deadline", value]) == 2
    err = capsys.readouterr().err
    assert "--deadline" in err and "Traceback" not in err


def test_a_reasoning_model_out_of_budget_is_told_how_to_give_it_more(tmp_path: Path, capsys) -> None:
    """A reasoning model (vLLM --reasoning-parser, Ollama, LM Studio) spent the output budget on
    `reasoning_content` and every call failed 'truncated at max_tokens=512, 1024 (0 characters
    received)', with no way from the shell to raise the budget. The error now says where the budget
    went and names --max-tokens, which sets the first ask (and leaves room for one doubling)."""
    def thinking(req: RecordedRequest) -> Reply:
        reply = Reply.openai_text(None, finish_reason="length")
        reply.body["choices"][0]["message"]["reasoning_content"] = "Let me compare HNSW and IVF. " * 40
        return reply

    argv = ["rerank", "-q", QUERY, "-c", str(_happy(tmp_path)), "--backend", "openai"]
    with FakeLLM(handler=thinking) as srv:
        assert main([*argv, "--base-url", srv.openai_url]) == 3
        err = capsys.readouterr().err
        assert "after 1160 characters of reasoning" in err
        assert ("the model's reasoning used the budget: give it more with RetryPolicy(max_tokens=N) "
                "(CLI --max-tokens N)") in err
        assert main([*argv, "--base-url", srv.openai_url, "--max-tokens", "6000"]) == 3
        assert [r.body["max_tokens"] for r in srv.requests] == [512, 1024, 6000, 12000]
    assert main([*argv, "--max-tokens", "8"]) == 2
    assert "--max-tokens must be at least 16, got 8" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["rerank", "batch", "eval"])
def test_a_model_with_the_local_backend_is_a_usage_error(command: str, tmp_path: Path, capsys) -> None:
    """Regression: `-m gpt-4o-mini` without `--backend openai` ranked with the local scorer and said
    nothing (as `--base-url` with the local backend already did not)."""
    assert main(_command(command, tmp_path, ["-m", "gpt-4o-mini"])) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    [line] = cap.err.splitlines()
    # The library's check, worded with the flag (issue 31: the CLI had a second copy of it).
    assert "--model: the local backend takes no model" in line


def _no_embeddings(req: RecordedRequest) -> Reply:
    """A chat-only OpenAI-compatible server: /v1/embeddings is 404."""
    if req.api == "embeddings":
        return Reply(404, {"detail": "Not Found"})
    return quoting_ranker()(req)


def test_embedder_openai_against_a_server_without_embeddings_is_one_line_exit_3(tmp_path: Path,
                                                                                  capsys) -> None:
    """Regression: `--embedder openai` against a chat-only server said only "... embeddings failed
    [#1 fatal: NotFoundError: Error code: 404]": no URL, no server message, no way out."""
    chunks = str(_happy(tmp_path))
    with FakeLLM(handler=_no_embeddings) as srv:
        url = f"{srv.openai_url}/embeddings"
        args = ["rerank", "-q", QUERY, "-c", chunks, "--backend", "openai", "--base-url", srv.openai_url,
                "-m", "m", "--embedder", "openai"]
        assert main(args) == 3
    cap = capsys.readouterr()
    (line,) = cap.err.splitlines()
    assert cap.out == "" and "Traceback" not in cap.err
    assert line.startswith("rag-rerank: backend failure: the openai embedder (model "
                           f"'text-embedding-3-small') at {url} answered HTTP 404: Not Found; does this "
                           "server serve embeddings")


def test_with_fallback_local_the_embedder_failure_is_a_warning_and_every_id_kept(tmp_path: Path,
                                                                                   capsys) -> None:
    chunks = str(_happy(tmp_path))
    with FakeLLM(handler=_no_embeddings) as srv:
        args = ["rerank", "-q", QUERY, "-c", chunks, "--embedder", "openai", "--embed-base-url",
                srv.openai_url, "--fallback", "local"]
        assert main(args) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out) == rerank(QUERY, load_skill().example("happy-path").chunks).to_dict()
    (line,) = cap.err.splitlines()
    assert line.startswith("rag-rerank: warning: embedder openai:text-embedding-3-small failed, lexical "
                           "vectors used instead (--fallback local): the openai embedder ")


def test_rerank_reads_chinese_chunks_and_quotes_the_shared_words(tmp_path: Path, capsys) -> None:
    path = tmp_path / "zh.jsonl"
    rows = [{"id": "答案", "text": "要找出哪个目录占用了最多的磁盘空间，可以运行 du -sh * 并按大小排序。"},
            {"id": "菜", "text": "红烧肉要先把五花肉焯水，再加冰糖炒出糖色。"}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert main(["rerank", "-q", "怎么查看磁盘空间", "-c", str(path), "-k", "2"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in obj["ranked"]] == ["答案"]
    assert "磁盘空间" in obj["ranked"][0]["reason"]
    assert obj["dropped"][0]["id"] == "菜" and obj["dropped"][0]["reason"].startswith("below_min_score")


def test_min_score_and_duplicate_threshold_flags(tmp_path: Path, capsys) -> None:
    """`--min-score` raises the bar (a chunk at or below it is dropped as below_min_score, as
    `limits={"min_score": x}` does) and `--duplicate-threshold` reaches the post-pass; a value
    outside [0, 1] is a usage error naming the flag."""
    path = _happy(tmp_path)
    assert main(["rerank", "-q", QUERY, "-c", str(path), "--min-score", "0.5"]) == 0
    out = json.loads(capsys.readouterr().out)
    lib = rerank(QUERY, path.read_text(encoding="utf-8"), limits={"min_score": 0.5})
    assert out == lib.to_dict() and all(r["score"] > 0.5 for r in out["ranked"])
    assert any(d["reason"].startswith("below_min_score") and float(d["reason"].split()[-1]) > 0.2
               for d in out["dropped"])
    copies = tmp_path / "copies.jsonl"
    copies.write_text('{"id": "a", "text": "IVF is preferred when index memory is constrained."}\n'
                      '{"id": "b", "text": "IVF is preferred when the index memory is constrained."}\n',
                      encoding="utf-8")
    assert main(["rerank", "-q", QUERY, "-c", str(copies)]) == 0
    dropped = json.loads(capsys.readouterr().out)["dropped"]
    assert any(d["reason"].startswith("redundant_with:") for d in dropped)
    assert main(["rerank", "-q", QUERY, "-c", str(copies), "--duplicate-threshold", "1.0"]) == 0
    assert len(json.loads(capsys.readouterr().out)["ranked"]) == 2
    for flag in ("--min-score", "--duplicate-threshold"):
        assert main(["rerank", "-q", QUERY, "-c", str(path), flag, "1.5"]) == 2
        assert f"{flag} must be a number in [0, 1], got 1.5" in capsys.readouterr().err


# --- meta.status on stderr and the fallback chain (issue 35) ------------------------------------


def test_a_reask_says_so_on_stderr(tmp_path: Path, capsys) -> None:
    """Any status but ok gets one stderr line: here the model was re-asked once."""
    with FakeLLM([Reply.openai_text("c1 is best")], handler=quoting_ranker()) as srv:
        assert main(["rerank", "-q", QUERY, "-c", str(_happy(tmp_path)), "--backend", "openai", "--base-url",
                     srv.openai_url, "-m", "m"]) == 0
    (line,) = capsys.readouterr().err.splitlines()
    assert line == ("rag-rerank: warning: the model was re-asked 1 time: the output guard refused its answer "
                    "(meta.status reasked)")


def test_an_ok_result_prints_nothing_on_stderr(tmp_path: Path, capsys) -> None:
    assert main(["rerank", "-q", QUERY, "-c", str(_happy(tmp_path))]) == 0
    assert capsys.readouterr().err == ""


def test_a_fallback_chain_from_the_command_line(tmp_path: Path, capsys) -> None:
    with FakeLLM([Reply.openai_error(401, "invalid api key")]) as srv:
        assert main(["rerank", "-q", QUERY, "-c", str(_happy(tmp_path)), "--backend", "openai", "--base-url",
                     srv.openai_url, "-m", "m", "--fallback", "input", "--meta"]) == 0
    cap = capsys.readouterr()
    meta = json.loads(cap.err)
    assert meta["status"] == "fallback" and meta["fallback"] == "input"
    assert meta["fallback_reason"] == "openai failed (fatal: 401)"
    assert [s["scorer"] for s in meta["fallback_steps"][0]["steps"]] == ["openai", "input"]
    with FakeLLM([Reply.openai_error(401, "invalid api key")]) as srv:
        assert main(["rerank", "-q", QUERY, "-c", str(_happy(tmp_path)), "--backend", "openai", "--base-url",
                     srv.openai_url, "-m", "m", "--fallback", "input"]) == 0
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("rag-rerank: warning: the result is ranked by the first-stage order "
                           "(--fallback input): openai failed after 1 attempt: ")


def test_a_bad_fallback_step_is_a_usage_error(tmp_path: Path, capsys) -> None:
    assert main(["rerank", "-q", QUERY, "-c", str(_happy(tmp_path)), "--fallback", "input,lcoal"]) == 2
    err = capsys.readouterr().err
    assert "unknown fallback step 'lcoal'; did you mean 'local'?" in err and "put it last" in err
