"""A minimal, fast OpenAI-compatible server for the speed benches, in its own process.

Why not `tests/support/fake_llm.py`: that one is built for tests (a script of replies, every
request recorded, Python's `http.server` with a thread per connection) and costs the server a
millisecond or more per call, which a bench of client-side costs of about that size cannot
afford. Here one asyncio protocol answers `POST .../chat/completions` with HTTP/1.1 keep-alive,
and each distinct request body is answered once: the answer's bytes are kept under the body, so a
repeated request costs the server a hash and a dictionary lookup (the benches warm every request
once before timing).

It recognises who is calling from the request itself and answers what that caller parses:

* rag-rerank (`response_format` json_schema named `rerank_result`, or a `<task>` prompt): the card's
  object from `tests/support/quoting_ranker.answer_for` (reasons quote each chunk's opening words);
* Haystack `LLMRanker` (schema `document_ranking`, or its prompt): `{"documents": [{"index": i}]}`;
* LlamaIndex `StructuredLLMRerank` (a tool named `DocumentRelevanceList`): a tool call with
  `{"documents": [{"document_number": i, "relevance": r}]}`;
* LangChain `LLMListwiseRerank` (schema or tool `RankDocuments`): `{"ranked_document_ids": [...]}`.

Anything else is a 400 naming what was not recognised, so a bench never times a wrong answer.
`GET /recorded` returns the rag-rerank request bodies seen so far (a bench replays them with the
bare `openai` SDK: our exact request), `GET /stats` the counts per caller.

Run:  python bench/fast_llm.py [--latency SECONDS]   (prints its base URL, serves until stdin closes)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.quoting_ranker import answer_for  # noqa: E402

_HAYSTACK_DOC = re.compile(r"^Document (\d+):\ncontent: ", re.MULTILINE)
_LLAMA_DOC = re.compile(r"^Document (\d+):\n", re.MULTILINE)
_LANGCHAIN_DOC = re.compile(r"^Document ID: (\d+)\n", re.MULTILINE)


def _text(body: dict[str, Any]) -> str:
    """Every message's text, joined: the prompt whoever wrote it and in whichever role."""
    parts = []
    for msg in body.get("messages") or []:
        content = msg.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [str(p.get("text", "")) for p in content if isinstance(p, dict)]
    return "\n".join(parts)


def _user_prompt(body: dict[str, Any]) -> str:
    for msg in body.get("messages") or []:
        if msg.get("role") == "user" and isinstance(msg.get("content"), str):
            return str(msg["content"])
    return ""


def _count(pattern: re.Pattern[str], text: str) -> int:
    return len(pattern.findall(text))


def _haystack(body: dict[str, Any]) -> dict[str, Any]:
    n = _count(_HAYSTACK_DOC, _text(body))
    return {"documents": [{"index": i} for i in range(1, min(n, 10) + 1)]}


def _llama(body: dict[str, Any]) -> dict[str, Any]:
    n = _count(_LLAMA_DOC, _text(body))
    return {"documents": [{"document_number": i, "relevance": max(1, 10 - i // 3)} for i in range(1, n + 1)]}


def _langchain(body: dict[str, Any]) -> dict[str, Any]:
    n = _count(_LANGCHAIN_DOC, _text(body))
    return {"ranked_document_ids": list(range(n))}


def _ours(body: dict[str, Any]) -> dict[str, Any]:
    return answer_for(_user_prompt(body))


ANSWERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "rerank_result": _ours, "document_ranking": _haystack, "DocumentRelevanceList": _llama,
    "RankDocuments": _langchain,
}
CALLERS = {"rerank_result": "rag-rerank", "document_ranking": "haystack",
           "DocumentRelevanceList": "llamaindex", "RankDocuments": "langchain"}


def recognise(body: dict[str, Any]) -> tuple[str, bool]:
    """(the answer's name in `ANSWERS`, whether it goes in a tool call) for a request body."""
    tools = body.get("tools") or []
    if tools:
        name = str(((tools[0] or {}).get("function") or {}).get("name", ""))
        if name in ANSWERS:
            return name, True
        raise LookupError(f"unknown tool {name!r}")
    fmt = body.get("response_format") or {}
    name = str((fmt.get("json_schema") or {}).get("name", ""))
    if name in ANSWERS:
        return name, False
    text = _text(body)
    if "<task>" in text and "<chunks>" in text:
        return "rerank_result", False
    if "You are ranking retrieved documents" in text:
        return "document_ranking", False
    raise LookupError(f"unrecognised request (response_format {fmt.get('type')!r}, no known prompt)")


def completion(body: dict[str, Any]) -> dict[str, Any]:
    """The Chat Completions response for one request body."""
    name, as_tool = recognise(body)
    answer = json.dumps(ANSWERS[name](body))
    if as_tool:
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_bench", "type": "function", "function": {"name": name, "arguments": answer}}]}
        finish = "tool_calls"
    else:
        message, finish = {"role": "assistant", "content": answer}, "stop"
    return {"id": "chatcmpl-bench", "object": "chat.completion", "created": 0,
            "model": str(body.get("model")),
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}


def _response(status: int, payload: bytes) -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n\r\n")
    return head.encode("ascii") + payload


class Server:
    """The answers kept per request body, what was recorded, and the counts per caller."""

    def __init__(self, latency: float = 0.0) -> None:
        self.latency = latency
        self.answers: dict[bytes, bytes] = {}
        self.recorded: dict[bytes, None] = {}  # rag-rerank's request bodies, first-seen order
        self.calls: Counter[str] = Counter()
        self.callers: dict[bytes, str] = {}

    def answer(self, method: str, path: str, body: bytes) -> bytes:
        if method == "GET" and path.startswith("/recorded"):
            return _response(200, json.dumps([json.loads(b) for b in self.recorded]).encode())
        if method == "GET" and path.startswith("/stats"):
            return _response(200, json.dumps(self.calls).encode())
        if method != "POST" or not path.endswith("/chat/completions"):
            return _response(404, b'{"error": {"message": "only POST .../chat/completions", '
                                  b'"type": "bench"}}')
        cached = self.answers.get(body)
        if cached is not None:
            self.calls[self.callers[body]] += 1
            return cached
        try:
            request = json.loads(body)
            name, _ = recognise(request)
            out = _response(200, json.dumps(completion(request)).encode())
        except (LookupError, ValueError) as exc:
            message = json.dumps({"error": {"message": f"fast_llm: {exc}", "type": "bench"}})
            return _response(400, message.encode())
        if name == "rerank_result":
            self.recorded[body] = None
        self.answers[body] = out
        self.callers[body] = CALLERS[name]
        self.calls[CALLERS[name]] += 1
        return out


class _Protocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive: a request line, headers with Content-Length, a body."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4:end + 4 + length])
            del self.buffer[:end + 4 + length]
            method, path, _ = head[0].split(" ", 2)
            out = self.server.answer(method, path, body)
            transport = self.transport
            assert transport is not None
            if self.server.latency > 0:
                asyncio.get_running_loop().call_later(self.server.latency, _write, transport, out)
            else:
                transport.write(out)


def _write(transport: asyncio.Transport, data: bytes) -> None:
    if not transport.is_closing():
        transport.write(data)


async def serve(latency: float, ready: Callable[[str], None], stop: asyncio.Event) -> None:
    server = Server(latency)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: _Protocol(server), "127.0.0.1", 0, backlog=1024)
    port = listener.sockets[0].getsockname()[1]
    ready(f"http://127.0.0.1:{port}/v1")
    async with listener:
        await stop.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=0.0, help="seconds before each answer is sent")
    args = ap.parse_args()

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def wait_stdin() -> None:
            sys.stdin.read()  # serve until the parent closes our stdin
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=wait_stdin, daemon=True).start()
        await serve(args.latency, lambda url: print(url, flush=True), stop)

    asyncio.run(run())


if __name__ == "__main__":
    main()
