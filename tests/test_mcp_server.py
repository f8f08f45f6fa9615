"""The MCP server, driven by the real MCP client of the same SDK over stdio.

The server runs as a subprocess exactly as an MCP host would start it (`python -m
rag_rerank.cli mcp`), so these tests cover the CLI entry, the stdio transport, the tool
registration generated from the card, and the isError contract for bad input.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")
anyio = pytest.importorskip("anyio")

from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

from rag_rerank.errors import InputError, MissingDependencyError  # noqa: E402
from rag_rerank.mcp_server import options_from_env  # noqa: E402
from rag_rerank.skill import load_skill  # noqa: E402
from rag_rerank.tools import anthropic_tool  # noqa: E402
from tests.support.fake_llm import FakeLLM, RecordedRequest, Reply  # noqa: E402
from tests.support.quoting_ranker import quoting_ranker  # noqa: E402

pytestmark = pytest.mark.mcp
ROOT = Path(__file__).resolve().parent.parent


def _params(**extra: str) -> StdioServerParameters:
    env = {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "HF_HUB_OFFLINE": "1",
           **extra}
    return StdioServerParameters(
        command=sys.executable, args=["-m", "rag_rerank.cli", "mcp"], env=env, cwd=str(ROOT)
    )


async def _session_do(calls: list[tuple[str, dict[str, Any] | None]],
                      env: dict[str, str] | None = None) -> tuple[Any, list[Any]]:
    """List the tools, then make each call, in one server session (with `env` added to its environment)."""
    with open(os.devnull, "w") as devnull:
        async with (
            stdio_client(_params(**(env or {})), errlog=devnull) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            listed = await session.list_tools()
            results: list[Any] = []
            for name, args in calls:
                try:
                    results.append(await session.call_tool(name, args))
                except MCPError as exc:  # a protocol-level error answer, kept for the assertions
                    results.append(exc)
    return listed, results


def _run(calls: list[tuple[str, dict[str, Any] | None]]) -> tuple[Any, list[Any]]:
    return anyio.run(_session_do, calls)


def _happy_args() -> dict[str, Any]:
    ex = load_skill().example("happy-path")
    chunks = [json.loads(line) for line in ex.chunks.splitlines() if line.strip()]
    return {"query": ex.query, "chunks": chunks, "top_k": ex.top_k, "lambda": ex.lambda_}


@pytest.fixture(scope="module")
def session_results() -> tuple[Any, list[Any]]:
    bad = {"query": "", "chunks": [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}], "top_k": 0}
    return _run(
        [("rerank_chunks", _happy_args()), ("rerank_chunks", bad), ("rerank_chunks", {"chunks": "nope"})]
    )


def test_lists_the_card_tool_with_the_generated_schema(session_results: tuple[Any, list[Any]]) -> None:
    listed, _ = session_results
    assert [t.name for t in listed.tools] == [load_skill().tool_name]
    tool = listed.tools[0]
    expected = anthropic_tool()
    assert tool.description == expected["description"]
    assert tool.input_schema == expected["input_schema"]


def test_happy_path_returns_the_result_object(session_results: tuple[Any, list[Any]]) -> None:
    _, (ok, _, _) = session_results
    assert ok.is_error is False, ok.content[0].text
    result = json.loads(ok.content[0].text)
    assert result == ok.structured_content
    args = _happy_args()
    ids = [c["id"] for c in args["chunks"]]
    seen = [r["id"] for r in result["ranked"]] + [d["id"] for d in result["dropped"]]
    assert sorted(seen) == sorted(ids)  # every id exactly once, verbatim
    assert 1 <= len(result["ranked"]) <= args["top_k"]
    assert "c5" not in [r["id"] for r in result["ranked"]]  # the risotto chunk is off-topic
    assert "fallback" not in result and len(ok.content) == 1  # no fallback: the result object alone


def test_bad_input_is_a_tool_error_naming_each_field(session_results: tuple[Any, list[Any]]) -> None:
    _, (_, bad, not_array) = session_results
    assert bad.is_error is True
    err = json.loads(bad.content[0].text)["error"]
    assert err["type"] == "invalid_input"
    paths = " ".join(v["path"] for v in err["violations"])
    messages = " ".join(v["message"] for v in err["violations"])
    assert "query" in paths and "top_k" in paths
    assert "duplicate" in messages
    assert not_array.is_error is True
    err2 = json.loads(not_array.content[0].text)["error"]
    assert any(v["path"] == "query" for v in err2["violations"])  # missing required argument


def test_over_the_chunk_limit_advises_the_tools_window_size_argument_not_a_cli_flag() -> None:
    """Regression: an MCP caller was told "(CLI --window-size N ...)", a flag it cannot pass."""
    chunks = [{"id": f"c{i}", "text": f"text {i}"} for i in range(51)]
    _, (answer,) = _run([("rerank_chunks", {"query": "q", "chunks": chunks})])
    assert answer.is_error
    (message,) = [v["message"] for v in json.loads(answer.content[0].text)["error"]["violations"]
                  if v["path"] == "chunks"]
    assert "window_size" in message and "--window-size" not in message and "CLI" not in message


def test_the_tool_takes_max_tokens_per_chunk() -> None:
    """The long-chunk budget is an argument of the MCP tool (issue 34): a long chunk is ranked from
    its evidence, ids intact; a budget below the minimum is a tool error naming the argument."""
    sentences = [f"The harbour froze in the winter of {k}, and ships waited at anchor." for k in range(80)]
    sentences[40] = "IVF partitions the vectors into cells and probes the nearest ones."
    chunks = [{"id": "long", "text": " ".join(sentences)}, {"id": "short", "text": "HNSW builds a graph."}]
    listed, (ok, bad) = _run([("rerank_chunks", {"query": "how does IVF probe cells", "chunks": chunks,
                                                 "max_tokens_per_chunk": 48}),
                              ("rerank_chunks", {"query": "q", "chunks": chunks, "max_tokens_per_chunk": 3})])
    assert "max_tokens_per_chunk" in listed.tools[0].input_schema["properties"]
    assert ok.is_error is False, ok.content[0].text
    result = json.loads(ok.content[0].text)
    assert result["ranked"][0]["id"] == "long"
    seen = [r["id"] for r in result["ranked"]] + [d["id"] for d in result["dropped"]]
    assert sorted(seen) == ["long", "short"]
    assert bad.is_error is True
    violations = json.loads(bad.content[0].text)["error"]["violations"]
    assert any(v["path"] == "max_tokens_per_chunk" for v in violations)


def test_unknown_tool_is_a_protocol_error() -> None:
    _, (answer,) = _run([("no_such_tool", {})])
    assert isinstance(answer, MCPError)
    assert "rerank_chunks" in str(answer)


def test_a_missing_api_key_names_the_servers_own_variable() -> None:
    """RAG_RERANK_BACKEND=openai and no key: the tool error tells an MCP operator what to set, not
    only the Python argument and the CLI flag the server's user cannot pass."""
    _, (answer,) = anyio.run(_session_do, [("rerank_chunks", _happy_args())],
                             {"RAG_RERANK_BACKEND": "openai"})
    assert answer.is_error
    message = json.loads(answer.content[0].text)["error"]["message"]
    assert "OPENAI_API_KEY" in message and "RAG_RERANK_BASE_URL" in message


def test_backend_options_come_from_the_environment() -> None:
    env = {
        "RAG_RERANK_BACKEND": "openai",
        "RAG_RERANK_BASE_URL": "http://127.0.0.1:1/v1",
        "RAG_RERANK_MODEL": "",
    }
    assert options_from_env(env) == {"backend": "openai", "base_url": "http://127.0.0.1:1/v1"}


def test_missing_sdk_raises_missing_dependency(monkeypatch: pytest.MonkeyPatch) -> None:
    import rag_rerank.mcp_server as srv

    monkeypatch.setitem(
        sys.modules, "mcp.server.lowlevel", None
    )  # makes `import` fail like an absent package
    with pytest.raises(MissingDependencyError, match=r"rag-rerank\[mcp\]"):
        srv.build_server()


# --- configuration errors stop the server at start-up ---------------------------------------------

EMBEDDERS = "lexical, static, sentence-transformers[:MODEL_OR_PATH], openai[:MODEL], caller"


def _start(settings: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`rag-rerank mcp` as a host starts it, with stdin at end of file: a server that got past its
    configuration check would serve, see the client go away, and exit 0."""
    env = {**_params().env, **settings}  # type: ignore[dict-item]
    return subprocess.run([sys.executable, "-m", "rag_rerank.cli", "mcp"], env=env, cwd=ROOT, input="",
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    "variable, value, allowed",
    [
        ("RAG_RERANK_BACKEND", "nonsense", "choose one of local, openai, anthropic"),
        ("RAG_RERANK_EMBEDDER", "bogus", f"choose one of {EMBEDDERS}"),
    ],
)
def test_a_bad_setting_exits_2_at_start_up_naming_the_variable(
    variable: str, value: str, allowed: str
) -> None:
    proc = _start({variable: value})
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""  # nothing was served
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"rag-rerank: error: {variable}: ") and repr(value) in line and allowed in line


def test_valid_settings_start_without_loading_a_model_or_calling_a_server() -> None:
    """Names are checked, nothing more: a model path that does not exist and a closed port are only
    a problem when a tool call uses them."""
    proc = _start({"RAG_RERANK_BACKEND": "openai", "RAG_RERANK_BASE_URL": "http://127.0.0.1:1/v1",
                   "RAG_RERANK_EMBEDDER": "sentence-transformers:/no/such/model",
                   "RAG_RERANK_FALLBACK": "local"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


@pytest.mark.parametrize(
    "variable, value, fragment",
    [
        ("RAG_RERANK_BACKEND", "OpenAI", "choose one of local, openai, anthropic"),
        ("RAG_RERANK_EMBEDDER", "lexical:big", f"choose one of {EMBEDDERS}"),
        ("RAG_RERANK_FALLBACK", "remote", "unknown fallback step 'remote'"),
        ("RAG_RERANK_BASE_URL", "127.0.0.1:8000/v1", "give an http:// or https:// URL"),
    ],
)
def test_options_from_env_names_each_bad_variable(variable: str, value: str, fragment: str) -> None:
    with pytest.raises(InputError) as exc:
        options_from_env({variable: value})
    [violation] = exc.value.violations
    assert violation.path == variable and violation.value == value and fragment in violation.message


@pytest.mark.parametrize(
    "settings, variable",
    [({"RAG_RERANK_BACKEND": "cross-encoder"}, "RAG_RERANK_MODEL"),
     ({"RAG_RERANK_BACKEND": "rerank-api"}, "RAG_RERANK_BASE_URL")],
)
def test_a_backend_without_its_required_setting_exits_2_naming_the_variable(
    settings: dict[str, str], variable: str
) -> None:
    """Regression: the server started, then every tool call failed with "needs a model ... (CLI
    --model PATH)" or "pass base_url (CLI --base-url)", flags an MCP operator cannot pass."""
    proc = _start({**settings, "RERANK_BASE_URL": ""})
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"rag-rerank: error: {variable}: ") and "CLI" not in line


def test_a_rerank_api_url_from_its_own_variable_is_enough() -> None:
    env = {"RAG_RERANK_BACKEND": "rerank-api", "RERANK_BASE_URL": "http://127.0.0.1:1"}
    assert options_from_env(env) == {"backend": "rerank-api"}
    env = {"RAG_RERANK_BACKEND": "cross-encoder", "RAG_RERANK_MODEL": "/models/ce"}
    assert options_from_env(env)["model"] == "/models/ce"


def test_options_from_env_reports_every_bad_variable_at_once() -> None:
    with pytest.raises(InputError) as exc:
        options_from_env({"RAG_RERANK_BACKEND": "x", "RAG_RERANK_EMBEDDER": "y", "RAG_RERANK_MODEL": "any"})
    assert [v.path for v in exc.value.violations] == ["RAG_RERANK_BACKEND", "RAG_RERANK_EMBEDDER"]


def test_a_malformed_base_url_exits_2_not_4() -> None:
    """Was `internal error: ValueError: Invalid IPv6 URL` and exit 4, from urlsplit itself."""
    proc = _start({"RAG_RERANK_BASE_URL": "http://[::1"})
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("rag-rerank: error: RAG_RERANK_BASE_URL: ") and "not a URL" in line


@pytest.mark.parametrize("value", ["http://[::1", "http://127.0.0.1:99999/v1", "http://:8000/v1", ""])
def test_options_from_env_refuses_urls_no_call_could_use(value: str) -> None:
    env = {"RAG_RERANK_BASE_URL": value, "RAG_RERANK_BACKEND": "openai"}
    if not value:  # empty counts as unset, as documented
        assert options_from_env(env) == {"backend": "openai"}
        return
    with pytest.raises(InputError) as exc:
        options_from_env(env)
    [violation] = exc.value.violations
    assert violation.path == "RAG_RERANK_BASE_URL" and "not a URL" in violation.message


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("RAG_RERANK_EMBEDER", "RAG_RERANK_EMBEDDER"),
        ("RAG_RERANK_BASEURL", "RAG_RERANK_BASE_URL"),
        ("rag_rerank_backend", "RAG_RERANK_BACKEND"),
        ("RAG_RERANK_FALLBAK", "RAG_RERANK_FALLBACK"),
    ],
)
def test_a_misspelt_variable_name_is_refused_with_the_name_meant(variable: str, meant: str) -> None:
    """Was silently ignored: the server ran on the defaults the user had meant to change."""
    with pytest.raises(InputError) as exc:
        options_from_env({variable: "sentence-transformers"})
    [violation] = exc.value.violations
    assert violation.path == variable and violation.message.endswith(f"did you mean {meant}?")


def test_the_prefixs_other_variables_are_not_taken_for_typos() -> None:
    env = {"RAG_RERANK_CACHE_DIR": "off", "RAG_RERANK_DEBUG": "1", "RAG_RERANK_DATA": "/data",
           "RAG_RERANK_LLM_TESTS": "1", "RAG_RERANK_EMBEDDER": "lexical"}
    assert options_from_env(env) == {"embedder": "lexical"}


def test_an_existing_and_a_missing_server_path_get_the_same_answer(tmp_path: Path) -> None:
    """The MCP server runs call_tool: a client must not learn which files exist (issue 15)."""
    real = tmp_path / "secret.jsonl"
    real.write_text('{"id": "a", "text": "x"}\n', encoding="utf-8")
    paths = [str(real), str(tmp_path / "missing.jsonl")]
    _, results = _run([("rerank_chunks", {"query": "q", "chunks": p}) for p in paths])
    texts = [re.sub(r"'[^']*'", "'PATH'", r.content[0].text) for r in results]  # the echoed (cut) line
    assert all(r.is_error for r in results) and texts[0] == texts[1]
    assert "pathlib" not in texts[0] and "file name" not in texts[0]


def test_a_model_without_a_backend_that_takes_one_is_refused() -> None:
    """Regression: RAG_RERANK_MODEL=gpt-4o-mini without RAG_RERANK_BACKEND=openai served every call
    with the local scorer, silently."""
    with pytest.raises(InputError) as exc:
        options_from_env({"RAG_RERANK_MODEL": "gpt-4o-mini"})
    [violation] = exc.value.violations
    assert violation.path == "RAG_RERANK_MODEL" and "RAG_RERANK_BACKEND" in violation.message


def test_a_server_url_for_a_backend_that_calls_none_is_refused_at_start_up() -> None:
    """Regression: RAG_RERANK_BASE_URL with the local backend passed the start-up check, then every
    tool call failed (rerank() refuses a base_url the backend would ignore)."""
    with pytest.raises(InputError) as exc:
        options_from_env({"RAG_RERANK_BASE_URL": "http://127.0.0.1:8000/v1"})
    [violation] = exc.value.violations
    assert violation.path == "RAG_RERANK_BASE_URL"
    assert "the local backend takes no base_url" in violation.message
    assert "RAG_RERANK_BACKEND" in violation.message


def test_the_calling_model_is_told_when_the_local_fallback_answered() -> None:
    """Regression: with RAG_RERANK_FALLBACK=local the tool result of a failed backend looked exactly
    like the backend's own ranking. The first call's chat request fails (HTTP 401) and the
    server has no embeddings endpoint (404): the local backend ranks, on lexical vectors. The
    second call's chat request succeeds: the LLM's ranking stands, the post-pass on lexical vectors."""
    rank = quoting_ranker()
    chats: list[int] = []

    def answer(req: RecordedRequest) -> Reply:
        if req.api == "embeddings":
            return Reply(404, {"detail": "Not Found"})
        chats.append(1)
        if len(chats) == 1:
            return Reply.openai_error(401, "Incorrect API key provided", type_="authentication_error")
        return rank(req)

    with FakeLLM(handler=answer) as srv:
        env = {"RAG_RERANK_BACKEND": "openai", "RAG_RERANK_BASE_URL": srv.openai_url,
               "RAG_RERANK_EMBEDDER": "openai", "RAG_RERANK_FALLBACK": "local"}
        _, (both, lexical) = anyio.run(_session_do, [("rerank_chunks", _happy_args())] * 2, env)
    ids = sorted(c["id"] for c in _happy_args()["chunks"])
    for answer_ in (both, lexical):
        assert answer_.is_error is False, answer_.content[0].text
        result = answer_.structured_content
        assert json.loads(answer_.content[0].text) == result
        assert sorted([r["id"] for r in result["ranked"]] + [d["id"] for d in result["dropped"]]) == ids
        assert answer_.content[1].text == f"warning: {result['fallback']['notice']}"
        assert "/v1/embeddings answered HTTP 404" in result["fallback"]["notice"]
        assert answer_.meta["rag-rerank/run"]["embedder_fallback"] == "lexical"
    assert both.structured_content["fallback"]["backend"] == "local"
    assert both.structured_content["fallback"]["embedder"] == "lexical"
    assert "ranked by the local backend (fallback local): openai failed after 1 attempt: " in (
        both.content[1].text)
    assert lexical.structured_content["fallback"]["backend"] is None, lexical.content[1].text
    assert lexical.meta["rag-rerank/run"]["fallback"] is None


def test_a_backend_failure_result_never_shows_the_base_urls_password_or_the_key() -> None:
    """RAG_RERANK_BASE_URL with a password, and a server that echoes the credentials it was sent
    (a misconfigured proxy): the tool result the calling model reads masks every one of them."""
    import base64

    password, key = "mcp-hunter2-pass", "sk-mcp-SECRET-0123456789"
    basic = base64.b64encode(f"user:{password}".encode()).decode()

    def echo(req: RecordedRequest) -> Reply:
        said = " ".join(f"{k}={v}" for k, v in req.headers.items() if k == "authorization")
        return Reply.openai_error(401, f"rejected {said} password={password}")

    with FakeLLM(handler=echo) as srv:
        env = {"RAG_RERANK_BACKEND": "openai", "RAG_RERANK_MODEL": "m", "OPENAI_API_KEY": key,
               "RAG_RERANK_BASE_URL": srv.openai_url.replace("http://", f"http://user:{password}@")}
        _, (answer,) = anyio.run(_session_do, [("rerank_chunks", _happy_args())], env)
        assert srv.requests, "the call reached the server"
    text = " ".join(c.text for c in answer.content) + json.dumps(answer.structured_content)
    assert answer.is_error and "backend_failure" in text and "***" in text
    assert password not in text and key not in text and basic not in text
