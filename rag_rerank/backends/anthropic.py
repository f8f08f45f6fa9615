"""The Anthropic Messages backend: one forced tool whose input_schema is the output schema.

Forcing the tool (tool_choice {"type": "tool", "name": ...}) makes the model answer with a JSON
object instead of prose; its input is re-serialised as the raw text the output guard judges, so
Anthropic answers go through exactly the same contract checks as any other backend. A re-ask is
sent the way the protocol expects: the rejected tool call, then a `tool_result` marked `is_error`
carrying the guard's violations.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from ..errors import (
    BackendFailure,
    FatalFailure,
    InputError,
    MissingDependencyError,
    TransientFailure,
    Violation,
)
from ..models import RerankRequest
from ..redaction import display_url, scrub, secrets_of
from .base import Capabilities, Completion
from .common import (
    DATA_NOTICE,
    ClosableBackend,
    SDKClients,
    classify_sdk_error,
    feedback_text,
    generation_schema,
    http_client,
    http_violations,
    request_timeout,
    resolve_credentials,
    usage_dict,
)

DEFAULT_MODEL = "claude-haiku-4-5"
DEFAULT_BASE_URL = "https://api.anthropic.com"
TOOL_NAME = "submit_ranking"
_REASK_TOOL_ID = "toolu_rejected_answer"


def _sdk() -> Any:
    try:
        import anthropic
    except ImportError as exc:
        raise MissingDependencyError("the anthropic backend", None, "anthropic>=0.34") from exc
    return anthropic


def _text(block: Any) -> str:
    """A text block's text; a block whose `text` is null or not a string counts as empty (the SDK
    does not validate: `"text": null` made the join raise TypeError, an internal error)."""
    text = getattr(block, "text", None)
    return text if isinstance(text, str) else ""


# Error types the Messages API uses for a condition that passes (its 429 / 5xx / 529 statuses).
_TRANSIENT_ERRORS = frozenset({"overloaded_error", "rate_limit_error", "api_error", "timeout_error"})


def _error_body(error: Any, key: Sequence[str]) -> BackendFailure:
    """An Anthropic error object sent with HTTP 200 (some proxies do): its own words, and a retry
    when its type is one the API itself would have sent as 429 / 5xx."""
    kind = error.get("type") if isinstance(error, dict) else getattr(error, "type", None)
    said = error.get("message") if isinstance(error, dict) else getattr(error, "message", None)
    detail = scrub(f"anthropic: the server answered HTTP 200 with an error: {kind}: {said}", key)[:300]
    if kind in _TRANSIENT_ERRORS:
        return TransientFailure(detail)
    return FatalFailure(detail)


def tool_definition(request: RerankRequest) -> dict[str, Any]:
    return {
        "name": TOOL_NAME,
        "description": "Submit the reranked chunks: ranked (at most top_k, best first) and dropped, "
                       "using the input ids verbatim.",
        "input_schema": generation_schema(request),
    }


def build_messages(prompt: str, feedback: Sequence[Violation], previous: str | None) -> list[dict[str, Any]]:
    """The task; on a re-ask also the rejected answer and the violations as an error tool_result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    if not feedback and previous is None:
        return messages
    text = feedback_text(feedback)
    try:
        parsed = json.loads(previous) if previous else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        messages.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": _REASK_TOOL_ID, "name": TOOL_NAME, "input": parsed}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": _REASK_TOOL_ID, "is_error": True, "content": text}]})
    else:  # the previous answer was not a tool call (or not JSON): plain turns
        messages.append({"role": "assistant", "content": previous or "(empty answer)"})
        messages.append({"role": "user", "content": text})
    return messages


class AnthropicBackend(ClosableBackend):
    """Messages API with a forced tool. Construct once, call many times."""

    name = "anthropic"
    # An LLM server: listwise, cacheable (it says what it sends), a timeout, clients to close, a key.
    capabilities = Capabilities(cacheable=True, timeout=True, closes=True, needs_key=True)

    def __init__(
        self,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        *,
        temperature: float | None = None,
        http: str = "httpx",
    ) -> None:
        bad = http_violations(http, "anthropic")
        if bad:
            raise InputError(bad, headline="invalid anthropic options")
        self.http = http
        url, key = resolve_credentials("anthropic", base_url, api_key, url_env="ANTHROPIC_BASE_URL",
                                       key_env="ANTHROPIC_API_KEY")
        self.model = model or DEFAULT_MODEL
        self.base_url = url.rstrip("/") if url else None
        self.timeout = float(timeout)
        self.temperature = temperature
        self._key = key
        # Bound methods, not lambdas: a backend pickles (worker processes, framework copies).
        self._clients = SDKClients(self._make_sync, self._make_async)
        self._hidden = secrets_of(key, urls=[url])  # what every message is scrubbed of

    def __repr__(self) -> str:  # never show the key
        return f"AnthropicBackend(model={self.model!r}, base_url={display_url(self.base_url)!r})"

    def _make_sync(self) -> Any:
        sdk = _sdk()
        return sdk.Anthropic(**self._client_kwargs(), http_client=http_client(sdk))

    def _make_async(self) -> Any:
        sdk = _sdk()
        return sdk.AsyncAnthropic(**self._client_kwargs(),
                                  http_client=http_client(sdk, asynchronous=True, transport=self.http))

    def _client_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"api_key": self._key, "timeout": self.timeout, "max_retries": 0}
        if self.base_url:
            kw["base_url"] = self.base_url
        return kw

    def cache_identity(self, prompt: str, request: RerankRequest, max_tokens: int) -> dict[str, Any]:
        """What decides this call's answer, for the response cache's key (`cache.py`): the server
        (credentials masked), and the first attempt's request body (model, system, messages, the
        forced tool with its schema, max tokens, temperature)."""
        return {"backend": self.name, "base_url": display_url(self.base_url or DEFAULT_BASE_URL),
                **self._kwargs(prompt, request, max_tokens, (), None)}

    def _kwargs(self, prompt: str, request: RerankRequest, max_tokens: int, feedback: Sequence[Violation],
                previous: str | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": int(max_tokens),
            "system": DATA_NOTICE,
            "messages": build_messages(prompt, feedback, previous),
            "tools": [tool_definition(request)],
            "tool_choice": {"type": "tool", "name": TOOL_NAME},
        }
        if self.temperature is not None:
            # Recent SDKs no longer list `temperature` (newer models fix it); send it only when asked.
            kwargs["extra_body"] = {"temperature": self.temperature}
        return kwargs

    def _completion(self, resp: Any) -> Completion:
        if getattr(resp, "type", None) != "message" or not isinstance(getattr(resp, "content", None), list):
            # The SDK builds its Message without validating, so another protocol's JSON (an
            # OpenAI-compatible server's chat.completion) would read as an empty answer and be
            # re-asked in vain: it is a wrong server, not a wrong answer.
            shape = getattr(resp, "object", None) or getattr(resp, "type", None)
            if shape == "error":
                raise _error_body(getattr(resp, "error", None), self._hidden)
            seen = f" (it looks like {shape!r})" if isinstance(shape, str) else ""
            if shape == "message":
                seen = " (a message whose content is not a list of blocks)"
            hint = ""
            if shape == "chat.completion":
                hint = "; for an OpenAI-compatible server use the openai backend"
            raise FatalFailure("anthropic: protocol error: the server's answer is not an Anthropic "
                               f"Messages response{seen}{hint}")
        stop = getattr(resp, "stop_reason", None) or "end_turn"
        blocks = list(getattr(resp, "content", None) or [])
        if stop == "refusal":
            said = " ".join(_text(b) for b in blocks if getattr(b, "type", "") == "text")
            said = scrub(said.strip(), self._hidden)[:200]
            raise FatalFailure("anthropic: the model refused" + (f": {said}" if said else ""))
        tool = next((b for b in blocks if getattr(b, "type", "") == "tool_use"
                     and getattr(b, "name", "") == TOOL_NAME), None)
        if tool is not None and isinstance(tool.input, str):
            # An Anthropic-compatible server or proxy that could not parse the model's arguments
            # hands them on as a string: that string is the model's answer. Serialised again it
            # read `"{\"ranked\"...` and the guard said only `text before the JSON object: '"'`.
            text = tool.input
        elif tool is not None:
            text = json.dumps(tool.input, ensure_ascii=False)
        else:  # no tool call: hand the prose to the guard, which will say what is wrong
            text = "".join(_text(b) for b in blocks if getattr(b, "type", "") == "text")
        raw_usage = usage_dict(getattr(resp, "usage", None), ("input_tokens", "output_tokens"))
        usage: dict[str, int] = {}
        if raw_usage:  # the same keys as the openai backend, so meta.usage means one thing
            usage["prompt_tokens"] = raw_usage.get("input_tokens", 0)
            usage["completion_tokens"] = raw_usage.get("output_tokens", 0)
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return Completion(
            text=text,
            finish_reason="length" if stop == "max_tokens" else "stop",
            model=getattr(resp, "model", None) or self.model,
            usage=usage,
        )

    def complete(
        self,
        prompt: str,
        request: RerankRequest,
        *,
        max_tokens: int,
        feedback: Sequence[Violation] = (),
        previous: str | None = None,
        timeout: float | None = None,
    ) -> Completion:
        ends = None if timeout is None else time.monotonic() + timeout  # before the SDK's first import
        sdk = _sdk()
        try:
            kwargs = self._kwargs(prompt, request, max_tokens, feedback, previous)
            client = self._clients.sync()
            kwargs.update(request_timeout(self.timeout, None if ends is None else ends - time.monotonic()))
            resp = client.messages.create(**kwargs)
        except sdk.AnthropicError as exc:
            raise classify_sdk_error(exc, sdk, self._hidden, "anthropic") from None
        except json.JSONDecodeError as exc:  # the SDK parses a JSON content-type body itself
            raise FatalFailure(f"anthropic: the server's answer is not valid JSON ({exc})") from None
        return self._completion(resp)

    async def acomplete(
        self,
        prompt: str,
        request: RerankRequest,
        *,
        max_tokens: int,
        feedback: Sequence[Violation] = (),
        previous: str | None = None,
    ) -> Completion:
        sdk = _sdk()
        try:
            kwargs = self._kwargs(prompt, request, max_tokens, feedback, previous)
            resp = await self._clients.for_running_loop().messages.create(**kwargs)
        except sdk.AnthropicError as exc:
            raise classify_sdk_error(exc, sdk, self._hidden, "anthropic") from None
        except json.JSONDecodeError as exc:  # the SDK parses a JSON content-type body itself
            raise FatalFailure(f"anthropic: the server's answer is not valid JSON ({exc})") from None
        return self._completion(resp)
