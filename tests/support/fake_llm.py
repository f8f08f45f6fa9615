"""A scripted LLM server on 127.0.0.1 speaking the OpenAI and Anthropic wire formats.

Why it exists: the backends and the retry policy must be tested with the real `openai` and
`anthropic` SDKs doing real HTTP (headers, status codes, Retry-After, timeouts, connection reuse),
yet no test may touch the internet. This server replays a script of responses in order, or answers
through a callable, and records every request so tests can assert what the SDKs actually sent.

Endpoints:
  POST /v1/chat/completions   OpenAI Chat Completions (also /chat/completions)
  POST /v1/messages           Anthropic Messages
  POST /v1/embeddings         OpenAI embeddings (deterministic hashed bag of words unless scripted)

Usage::

    with FakeLLM([Reply.openai_text('{"ranked": []}')]) as srv:
        client = openai.OpenAI(base_url=srv.openai_url, api_key="x", max_retries=0)

A script entry is a `Reply`, or a callable `(RecordedRequest) -> Reply`. When the script is used up,
the `handler` (if any) answers; otherwise the server answers 400 "script exhausted" so a test that
makes more calls than it expected fails loudly instead of hanging.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeLLM", "RecordedRequest", "Reply", "auto_ranker", "hashed_embedding"]


@dataclass(frozen=True)
class RecordedRequest:
    """What a client sent: method, path, headers (lower-cased names), parsed JSON body, arrival time."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    received_at: float

    @property
    def api(self) -> str:
        """'openai', 'anthropic' or 'embeddings', from the path."""
        if self.path.endswith("/messages"):
            return "anthropic"
        if self.path.endswith("/embeddings"):
            return "embeddings"
        return "openai"

    @property
    def prompt(self) -> str:
        """The text of the first user message (the rendered task), whatever the wire format."""
        for msg in (self.body or {}).get("messages", []):
            if msg.get("role") == "user":
                return _content_text(msg.get("content"))
        return ""

    @property
    def last_user_text(self) -> str:
        """The text of the last user turn: on a re-ask, the feedback with the guard's violations."""
        msgs = [m for m in (self.body or {}).get("messages", []) if m.get("role") == "user"]
        return _content_text(msgs[-1].get("content")) if msgs else ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if isinstance(block, Mapping):
            if block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif block.get("type") == "tool_result":
                parts.append(_content_text(block.get("content")))
    return "\n".join(parts)


@dataclass(frozen=True)
class Reply:
    """One scripted HTTP response. `body` is JSON-encoded unless it is already `str`/`bytes`."""

    status: int = 200
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering (latency, or a timeout when > the client's)

    # --- OpenAI Chat Completions -------------------------------------------------------------
    @classmethod
    def openai_text(cls, content: str | None, *, finish_reason: str = "stop", refusal: str | None = None,
                    model: str = "fake-gpt", usage: Mapping[str, int] | None = None, delay: float = 0.0
                    ) -> Reply:
        body = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": refusal},
                "finish_reason": finish_reason,
                "logprobs": None,
            }],
            "usage": dict(usage or {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}),
        }
        return cls(200, body, delay=delay)

    @classmethod
    def openai_logprobs(cls, top: Mapping[str, float], *, model: str = "fake-gpt", legacy: bool = False,
                        delay: float = 0.0) -> Reply:
        """A one-token answer with its top log-probabilities (`top`: token -> logprob), the most
        likely token as the content: the Chat Completions form (`logprobs.content`), or with
        `legacy` the completions form some servers put in chat answers (`top_logprobs[0]` a mapping)."""
        ranked = sorted(top.items(), key=lambda t: -t[1])
        if legacy:
            logprobs: Any = {"tokens": [ranked[0][0]], "token_logprobs": [ranked[0][1]],
                             "top_logprobs": [dict(ranked)], "text_offset": [0]}
        else:
            alts = [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in ranked]
            logprobs = {"content": [{**alts[0], "top_logprobs": alts}], "refusal": None}
        body = {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ranked[0][0]},
                         "finish_reason": "length", "logprobs": logprobs}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 1, "total_tokens": 51},
        }
        return cls(200, body, delay=delay)

    @classmethod
    def openai_error(cls, status: int, message: str, *, type_: str = "invalid_request_error",
                     param: str | None = None, headers: Mapping[str, str] | None = None, delay: float = 0.0
                     ) -> Reply:
        body = {"error": {"message": message, "type": type_, "param": param, "code": None}}
        return cls(status, body, headers=dict(headers or {}), delay=delay)

    # --- Anthropic Messages ------------------------------------------------------------------
    @classmethod
    def anthropic_tool(cls, tool_input: Any, *, name: str = "submit_ranking", stop_reason: str = "tool_use",
                       model: str = "fake-claude", usage: Mapping[str, int] | None = None, delay: float = 0.0
                       ) -> Reply:
        block = {"type": "tool_use", "id": "toolu_fake01", "name": name, "input": tool_input}
        return cls(200, _anthropic_body([block], stop_reason, model, usage), delay=delay)

    @classmethod
    def anthropic_text(cls, text: str, *, stop_reason: str = "end_turn", model: str = "fake-claude",
                       usage: Mapping[str, int] | None = None, delay: float = 0.0) -> Reply:
        block = {"type": "text", "text": text}
        return cls(200, _anthropic_body([block] if text else [], stop_reason, model, usage), delay=delay)

    @classmethod
    def anthropic_error(cls, status: int, message: str, *, type_: str = "invalid_request_error",
                        headers: Mapping[str, str] | None = None, delay: float = 0.0) -> Reply:
        body = {"type": "error", "error": {"type": type_, "message": message}}
        return cls(status, body, headers=dict(headers or {}), delay=delay)


def _anthropic_body(content: list[dict[str, Any]], stop_reason: str, model: str,
                    usage: Mapping[str, int] | None) -> dict[str, Any]:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": dict(usage or {"input_tokens": 100, "output_tokens": 20}),
    }


Script = Iterable["Reply | Callable[[RecordedRequest], Reply]"]


class FakeLLM:
    """The server. Start with `with FakeLLM(script) as srv:` or `start()` / `stop()`."""

    def __init__(self, script: Script = (), *, handler: Callable[[RecordedRequest], Reply] | None = None,
                 latency: float = 0.0) -> None:
        self._script: list[Reply | Callable[[RecordedRequest], Reply]] = list(script)
        self.handler = handler
        self.latency = latency  # added to every answer, scripted or not
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> FakeLLM:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # TCP_NODELAY: headers and body go out in separate writes; with Nagle on, the body
            # waits for the client's delayed ACK and every answer gains ~40 ms.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                return

            def do_POST(self) -> None:
                server._handle(self)

            def do_GET(self) -> None:
                server._handle(self)

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        httpd.block_on_close = False  # a deliberately slow answer must not hold up the test's exit
        self._httpd = httpd
        # a short poll interval: shutdown() waits for it, once per test
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="fake-llm", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- addresses ---------------------------------------------------------------------------
    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        """base_url for the openai SDK (it appends /chat/completions)."""
        return f"{self.url}/v1"

    @property
    def anthropic_url(self) -> str:
        """base_url for the anthropic SDK (it appends /v1/messages)."""
        return self.url

    # --- script ------------------------------------------------------------------------------
    def add(self, *replies: Reply | Callable[[RecordedRequest], Reply]) -> None:
        with self._lock:
            self._script.extend(replies)

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._script)

    def _next_reply(self, req: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(req)
            entry = self._script.pop(0) if self._script else None
        if entry is None:
            if req.api == "embeddings" and self.handler is None:
                return _embeddings_reply(req)
            if self.handler is None:
                return Reply.openai_error(400, "fake_llm: script exhausted (more calls than scripted)")
            entry = self.handler
        return entry(req) if callable(entry) else entry

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        req = RecordedRequest(
            method=h.command,
            path=h.path.split("?", 1)[0],
            headers={k.lower(): v for k, v in h.headers.items()},
            body=body,
            received_at=time.monotonic(),
        )
        reply = self._next_reply(req)
        wait = reply.delay + self.latency
        if wait > 0:
            time.sleep(wait)
        payload = reply.body
        if isinstance(payload, bytes):
            data = payload
        elif isinstance(payload, str):
            data = payload.encode("utf-8")
        else:
            data = json.dumps(payload if payload is not None else {}).encode("utf-8")
        try:
            h.send_response(reply.status)
            headers = {"Content-Type": "application/json", **dict(reply.headers)}
            for k, v in headers.items():
                h.send_header(k, v)
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test); nothing to answer


# --- embeddings ------------------------------------------------------------------------------

_WORD = re.compile(r"\w+", re.UNICODE)


def hashed_embedding(text: str, dim: int = 64) -> list[float]:
    """A deterministic, meaningful-enough vector: hashed bag of lower-cased words, L2-normalised."""
    vec = [0.0] * dim
    for word in _WORD.findall(text.lower()):
        h = int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=4).digest(), "big")
        vec[h % dim] += 1.0 if (h >> 16) & 1 else -1.0
    norm = sum(v * v for v in vec) ** 0.5 or 1.0
    return [v / norm for v in vec]


def _embeddings_reply(req: RecordedRequest) -> Reply:
    body = req.body if isinstance(req.body, Mapping) else {}
    inputs = body.get("input", [])
    if isinstance(inputs, str):
        inputs = [inputs]
    data = [{"object": "embedding", "index": i, "embedding": hashed_embedding(str(t))}
            for i, t in enumerate(inputs)]
    return Reply(200, {"object": "list", "data": data, "model": body.get("model", "fake-embed"),
                       "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)}})


# --- a dynamic answerer ----------------------------------------------------------------------

_CHUNKS = re.compile(r"<chunks>(.*?)</chunks>", re.DOTALL)
_QUERY = re.compile(r"<query>(.*?)</query>", re.DOTALL)
_TOP_K = re.compile(r"<top_k>(\d+)</top_k>")


def _rank_prompt(prompt: str) -> dict[str, Any]:
    """A contract-valid answer for a rendered task: word overlap with the query, reasons quoting the chunk."""
    import html

    query = html.unescape(m.group(1)) if (m := _QUERY.search(prompt)) else ""
    top_k = int(m.group(1)) if (m := _TOP_K.search(prompt)) else 5
    body = m.group(1) if (m := _CHUNKS.search(prompt)) else ""
    q_words = {w for w in _WORD.findall(query.lower()) if len(w) > 3}
    scored = []
    for line in body.split("\n"):
        if not line.strip():
            continue
        rec = json.loads(line)
        words = [w for w in _WORD.findall(rec["text"]) if w.lower() in q_words]
        score = min(1.0, 0.1 + 0.25 * len(set(w.lower() for w in words)))
        scored.append((score, rec["id"], words))
    scored.sort(key=lambda t: -t[0])
    ranked, dropped = [], []
    for score, cid, words in scored:
        if score > 0.2 and len(ranked) < top_k:
            reason = f"mentions {', '.join(dict.fromkeys(words))}"
            ranked.append({"id": cid, "score": round(score, 3), "reason": reason})
        else:
            dropped.append({"id": cid, "reason": "below threshold" if score <= 0.2 else "beyond top_k"})
    return {"ranked": ranked, "dropped": dropped}


def auto_ranker(latency: float = 0.0) -> Callable[[RecordedRequest], Reply]:
    """A handler answering any task with a valid ranking in the caller's wire format, after `latency` s.

    Used by throughput benchmarks (batch at concurrency 1/8/32) and by tests that need many valid calls.
    """

    def handle(req: RecordedRequest) -> Reply:
        if req.api == "embeddings":
            reply = _embeddings_reply(req)
            return Reply(reply.status, reply.body, delay=latency)
        return ranking_reply(req, _rank_prompt(req.prompt), latency)

    return handle


def ranking_reply(req: RecordedRequest, answer: dict[str, Any], latency: float = 0.0) -> Reply:
    """`answer` (a ranking) in the wire format `req` came in: an Anthropic tool call (named as the
    request's tool), else OpenAI message text; sent after `latency` s."""
    if req.api == "anthropic":
        tools = (req.body or {}).get("tools") or [{}]
        return Reply.anthropic_tool(answer, name=tools[0].get("name", "submit_ranking"), delay=latency)
    return Reply.openai_text(json.dumps(answer), delay=latency)


class InFlight:
    """A handler wrapper that holds each call for `delay` seconds and records the most calls the
    server had in flight at once: the observable proof that a client overlaps (or bounds) them."""

    def __init__(self, answer: Callable[[RecordedRequest], Reply], delay: float) -> None:
        self.answer, self.delay = answer, delay
        self.now = self.max = 0
        self._lock = threading.Lock()

    def __call__(self, req: RecordedRequest) -> Reply:
        with self._lock:
            self.now += 1
            self.max = max(self.max, self.now)
        time.sleep(self.delay)
        with self._lock:
            self.now -= 1
        return self.answer(req)
