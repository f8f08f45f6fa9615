"""The OpenAI Chat Completions backend, also for any OpenAI-compatible server (vLLM, llama.cpp
server, Ollama, LM Studio) through `base_url`.

Structured output is negotiated, not assumed: it asks for `response_format: json_schema` (strict,
ids as an enum of the input ids); a server that rejects that (llama.cpp answers 500, others 400 or
422 naming response_format) is asked again with `{"type": "json_object", "schema": ...}`, then plain
`json_object`, then no response_format at all. The first mode a server accepts is remembered per
base_url for the life of the process, so the negotiation costs extra requests once, not per call.
Those downgrades are a capability probe inside one call, not retries: retries belong to `retry.py`
(the SDK runs with max_retries=0).

**Log-probability scoring** (`scoring="logprobs"`, for servers that return token log-probabilities:
llama.cpp server, vLLM). Instead of one listwise prompt, each chunk gets its own yes/no question
(`prompts/rag-chunk-relevance.xml.j2`: the query and that one chunk), asked for one token with
`logprobs: true, top_logprobs: 5`; the chunk's score is p(yes) / (p(yes) + p(no)) over the first
token's most likely alternatives ("yes", " Yes", "YES" all count). The questions go out at once (at
most `LOGPROB_CONCURRENCY` in flight; on a thread pool for the sync path). The answer is then built
as the scored backends build theirs (`backends/scored.py`: reasons quoting the chunk, the minimum
score honoured), so it passes the output guard by construction, and the backend declares
`scored = True` (never re-asked). Why: one chunk per question cannot favour a position (there is
none), and the score is a probability the model assigns rather than a number it writes. A chunk
with neither yes nor no among the top tokens is left unscored (`not_selected: not scored ...`).

It is negotiated like the response format: a server that refuses `logprobs` or answers without
them is, with `scoring="logprobs"`, a fatal backend failure that says so; with `scoring="auto"`
the first call probes one chunk, and the mode that worked (log-probabilities, or else the listwise
prompt) is remembered per base_url for the life of the process. `scoring="listwise"` (the default)
never asks for them.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import math
import threading
import time
from collections.abc import Generator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from .. import reasons
from ..errors import (
    BackendFailure,
    FatalFailure,
    InputError,
    MissingDependencyError,
    TransientFailure,
    Violation,
)
from ..models import Chunk, RerankRequest, add_usage
from ..redaction import display_url, scrub, secrets_of
from ..render import render_relevance
from .base import Capabilities, Completion
from .common import (
    DATA_NOTICE,
    ClosableBackend,
    SDKClients,
    classify_sdk_error,
    error_message,
    feedback_text,
    field,
    http_client,
    http_violations,
    is_transient_status,
    request_timeout,
    resolve_credentials,
    strict_schema,
    usage_dict,
)
from .scored import SCORE_DECIMALS, answer, labelled

DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
SCHEMA_NAME = "rerank_result"
_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")

# Structured-output modes, most constrained first.
MODES = ("json_schema", "json_object_schema", "json_object", "text")
_FORMAT_MEMORY: dict[str, str] = {}
_FORMAT_LOCK = threading.Lock()
_REJECT_STATUSES = frozenset({400, 422, 500, 501})
_REJECT_WORDS = ("response_format", "response format", "json_schema", "json schema", "schema")

# How chunks are scored: one listwise prompt (the card's task), or one yes/no question per chunk
# scored by the log-probability of "yes" (module docstring); "auto" probes, then remembers.
SCORINGS = ("listwise", "logprobs", "auto")
LOGPROB_CONCURRENCY = 8  # yes/no questions in flight at once for one call
TOP_LOGPROBS = 5
LOGPROB_REASON = labelled("p(yes)")
NOT_SCORED = reasons.reason(reasons.NOT_SELECTED,
                            "not scored (neither yes nor no among the model's most likely first tokens)")
_SCORING_MEMORY: dict[str, str] = {}
_TOKEN_EDGES = " \t\n\u2581\u0120.,;:!?\"'`"  # spaces, SentencePiece / BPE space marks, punctuation


def remembered_mode(base_url: str) -> str | None:
    """The structured-output mode this process learned for `base_url` (None before the first call)."""
    with _FORMAT_LOCK:
        return _FORMAT_MEMORY.get(base_url)


def forget_modes() -> None:
    """Clear what was learned, response_format modes and scoring modes (tests; or after a server
    upgrade in a long-lived process)."""
    with _FORMAT_LOCK:
        _FORMAT_MEMORY.clear()
        _SCORING_MEMORY.clear()


def remembered_scoring(base_url: str) -> str | None:
    """What `scoring="auto"` learned for `base_url`: "logprobs", "listwise", or None before its
    first call."""
    with _FORMAT_LOCK:
        return _SCORING_MEMORY.get(base_url)


def _remember_scoring(base_url: str, mode: str) -> None:
    with _FORMAT_LOCK:
        _SCORING_MEMORY[base_url] = mode


class _NoLogprobs(Exception):
    """The server does not return token log-probabilities (refused them, or answered without)."""


def _plain(value: Any) -> Any:
    """An SDK object as plain data (extra fields a server sent, such as llama.cpp's, kept)."""
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return value


def yes_probability(logprobs: Any) -> float | None:
    """p(yes) / (p(yes) + p(no)) from an answer's first-token log-probabilities, or None when
    neither word is among them. Reads the Chat Completions form (`content[0].top_logprobs`) and
    the completions form some servers send in chat answers (`top_logprobs[0]` as a token ->
    logprob mapping, `tokens` / `token_logprobs`); a token counts whatever its case, spacing or
    trailing punctuation (" Yes", "yes.", "YES")."""
    data = _plain(logprobs)
    if not isinstance(data, Mapping):
        return None
    found: dict[str, float] = {}

    def add(token: Any, logprob: Any) -> None:
        if isinstance(token, str) and isinstance(logprob, (int, float)) and not isinstance(logprob, bool) \
                and math.isfinite(logprob):
            found[token] = float(logprob)

    content = data.get("content")
    if isinstance(content, list) and content and isinstance(content[0], Mapping):
        first = content[0]
        for alt in first.get("top_logprobs") or []:
            if isinstance(alt, Mapping):
                add(alt.get("token"), alt.get("logprob"))
        add(first.get("token"), first.get("logprob"))
    legacy = data.get("top_logprobs")
    if isinstance(legacy, list) and legacy and isinstance(legacy[0], Mapping):
        for token, logprob in legacy[0].items():
            add(token, logprob)
    tokens, values = data.get("tokens"), data.get("token_logprobs")
    if isinstance(tokens, list) and tokens and isinstance(values, list) and values:
        add(tokens[0], values[0])
    p = {"yes": 0.0, "no": 0.0}
    for token, logprob in found.items():
        word = token.strip(_TOKEN_EDGES).lower()
        if word in p:
            p[word] += math.exp(logprob)
    total = p["yes"] + p["no"]
    return p["yes"] / total if total > 0 else None


def _remember(base_url: str, mode: str) -> None:
    with _FORMAT_LOCK:
        _FORMAT_MEMORY[base_url] = mode


def _sdk() -> Any:
    try:
        import openai
    except ImportError as exc:  # a core dependency, but say so clearly if it was removed
        raise MissingDependencyError("the openai backend", None, "openai>=1.40") from exc
    return openai


CHAT_PATH = "/chat/completions"
_CAPABILITIES = {scored: Capabilities(scored=scored, cacheable=True, timeout=True, closes=True,
                                      needs_key=True) for scored in (False, True)}


def request_options(sdk: Any, timeout: dict[str, Any]) -> dict[str, Any]:
    """The options `chat.completions.create` gives the SDK's `post`: bearer authentication (the
    SDKs that know per-request security) and a per-request timeout when one is given.

    Why `post` and not `create`: `create` first walks the request against the SDK's typed-dict
    annotations (`maybe_transform`), which changes nothing in a plain-JSON request like ours and
    cost about 0.4 ms a call, a third of the SDK's own cost at 20 passages. `post` is the SDK's
    documented way to send a request body as it is; the bytes on the wire are the same."""
    options: dict[str, Any] = dict(timeout)
    if "security" in getattr(getattr(sdk, "RequestOptions", None), "__annotations__", {}):
        options["security"] = {"bearer_auth": True}
    return options


def response_format_for(mode: str, request: RerankRequest) -> dict[str, Any] | None:
    if mode == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": SCHEMA_NAME, "strict": True,
                                                        "schema": strict_schema(request)}}
    if mode == "json_object_schema":
        return {"type": "json_object", "schema": strict_schema(request)}
    if mode == "json_object":
        return {"type": "json_object"}
    return None


@functools.cache
def _response_class(sdk: Any) -> Any:
    """The Response class of the HTTP library the SDK is built on (httpx2 for openai 3, httpx
    before): what `cast_to` takes to hand back the response as it came."""
    for name in ("httpx2", "httpx"):
        try:
            lib = importlib.import_module(name)
        except ImportError:
            continue
        if issubclass(sdk.DefaultHttpxClient, lib.Client):
            return lib.Response
    raise MissingDependencyError("the openai backend", None, "openai>=1.40")  # its HTTP library is missing


def _json_of(response: Any) -> Any:
    """The answer as plain JSON data, read exactly as the SDK's typed parse reads a body, without
    building the typed `ChatCompletion` (about 0.25 ms a call, of which we read five fields): a
    JSON content type is parsed (invalid JSON raises `JSONDecodeError`, as the SDK raised it);
    any other is parsed when its bytes are JSON (encoding detected from the bytes, as `json.loads`
    does), else returned as text (a web page)."""
    try:
        return json.loads(response.content)
    except ValueError:
        if response.headers.get("content-type", "*").split(";")[0].endswith("json"):
            raise
        return response.text


def _content_text(content: Any) -> str:
    """The answer's text. Some servers send `content` as a list of parts (Mistral's reasoning
    models: a `thinking` part, then `text` parts); the text parts joined are the answer, the
    thinking is not. Left as a list it was judged 'output must be text, got list' and re-asked."""
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content
                       if isinstance(p, dict) and p.get("type", "text") == "text")
    return content or ""


def _reasoning_chars(message: Any) -> int:
    """Length of the reasoning a server returns beside the answer: `reasoning_content` (vLLM,
    DeepSeek, LM Studio, llama.cpp) or `reasoning` (Ollama, OpenRouter)."""
    for name in ("reasoning_content", "reasoning"):
        value = field(message, name)
        if isinstance(value, str) and value:
            return len(value)
    return 0


def build_messages(prompt: str, feedback: Sequence[Violation], previous: str | None,
                   system: bool = True) -> list[dict[str, str]]:
    """The conversation: the data notice and the task; on a re-ask also the rejected answer and the
    quoted violations. `system=False` (a chat template without a system role, e.g. Gemma's) puts
    the notice at the head of the first user turn instead."""
    if system:
        messages = [{"role": "system", "content": DATA_NOTICE}, {"role": "user", "content": prompt}]
    else:
        messages = [{"role": "user", "content": f"{DATA_NOTICE}\n\n{prompt}"}]
    if feedback or previous is not None:
        messages.append({"role": "assistant", "content": previous or ""})
        messages.append({"role": "user", "content": feedback_text(feedback)})
    return messages


class OpenAIBackend(ClosableBackend):
    """Chat Completions with negotiated structured output. Construct once, call many times."""

    name = "openai"

    def __init__(
        self,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        *,
        temperature: float | None = 0.0,
        response_format: str = "auto",
        scoring: str = "listwise",
        seed: int | None = None,
        http: str = "httpx",
    ) -> None:
        bad = http_violations(http, "openai")
        if response_format != "auto" and response_format not in MODES:
            bad.append(Violation(path="response_format", value=response_format,
                                 message=f"must be 'auto' or one of {', '.join(MODES)}"))
        if scoring not in SCORINGS:
            bad.append(Violation(path="scoring", value=scoring,
                                 message=f"must be one of {', '.join(SCORINGS)}, got {scoring!r}"))
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            bad.append(Violation(path="seed", value=repr(seed), message="must be None or an int"))
        if bad:
            raise InputError(bad, headline="invalid openai options")
        self.scoring = scoring
        self.http = http
        url, key = resolve_credentials("openai", base_url, api_key, url_env="OPENAI_BASE_URL",
                                       key_env="OPENAI_API_KEY")
        self.model = model or DEFAULT_MODEL
        self.base_url = (url or DEFAULT_BASE_URL).rstrip("/")
        self.timeout = float(timeout)
        self.temperature = temperature
        self.seed = seed  # sent when set: some servers (vLLM, llama.cpp, OpenAI) then sample reproducibly
        # Reasoning models (o-series, gpt-5) refuse any temperature but their default: learned on
        # the first refusal, then the parameter is left out for this backend's calls.
        self._send_temperature = True
        # Chat templates without a system role (Gemma's) answer 400: learned once, then the notice
        # rides in the user turn.
        self._send_system = True
        self.forced_mode = None if response_format == "auto" else response_format
        self._key = key
        self._hidden = secrets_of(key, urls=[self.base_url])  # what every message is scrubbed of
        self._official = self.base_url.startswith("https://api.openai.com")
        # Bound methods, not lambdas: a backend pickles (worker processes, framework copies).
        self._clients = SDKClients(self._make_sync, self._make_async)

    def __repr__(self) -> str:  # never show the key
        return f"OpenAIBackend(model={self.model!r}, base_url={display_url(self.base_url)!r})"

    @property
    def capabilities(self) -> Capabilities:
        """An LLM server's (cacheable, timeout, clients to close, a key), scored while `scored`
        (one of two frozen values: a call reads them three times)."""
        return _CAPABILITIES[self.scored]

    @property
    def scored(self) -> bool:
        """True while chunks are scored by log-probabilities: the answer is built by
        `backends/scored.py`, valid by construction, and never re-asked (`retry.py`)."""
        return self._scoring_now() == "logprobs"

    def _scoring_now(self) -> str:
        """"listwise", "logprobs", or "probe" (`auto` before its first call to this server)."""
        if self.scoring != "auto":
            return self.scoring
        return remembered_scoring(self.base_url) or "probe"

    # --- clients -----------------------------------------------------------------------------
    def _make_sync(self) -> Any:
        sdk = _sdk()
        return sdk.OpenAI(**self._client_kwargs(), http_client=http_client(sdk))

    def _make_async(self) -> Any:
        sdk = _sdk()
        return sdk.AsyncOpenAI(**self._client_kwargs(),
                               http_client=http_client(sdk, asynchronous=True, transport=self.http))

    def _client_kwargs(self) -> dict[str, Any]:
        return {"api_key": self._key, "base_url": self.base_url, "timeout": self.timeout, "max_retries": 0}

    # --- one call ----------------------------------------------------------------------------
    def cache_identity(self, prompt: str, request: RerankRequest, max_tokens: int) -> dict[str, Any]:
        """What decides this call's answer, for the response cache's key (`cache.py`): the server
        (credentials masked), the model, the first attempt's messages, the response format asked
        for (not the one negotiated, so a downgrade learned later does not change the key), the
        ids the schema allows, temperature, max tokens, seed and the scoring asked for (listwise,
        logprobs or auto: a log-probability answer is never replayed for a listwise request)."""
        return {"backend": self.name, "base_url": display_url(self.base_url), "model": self.model,
                "messages": build_messages(prompt, (), None), "response_format": self.forced_mode or "auto",
                "ids": list(request.ids), "temperature": self.temperature, "max_tokens": int(max_tokens),
                "seed": self.seed, "scoring": self.scoring}

    def _modes(self) -> tuple[str, ...]:
        if self.forced_mode:
            return (self.forced_mode,)
        start = remembered_mode(self.base_url) or MODES[0]
        return MODES[MODES.index(start):]

    def _kwargs(self, mode: str, prompt: str, request: RerankRequest, max_tokens: int,
                feedback: Sequence[Violation], previous: str | None) -> dict[str, Any]:
        messages = build_messages(prompt, feedback, previous, system=self._send_system)
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages}
        # api.openai.com wants max_completion_tokens (reasoning models reject max_tokens); compatible
        # servers (llama.cpp, older vLLM) only know max_tokens.
        kwargs["max_completion_tokens" if self._official else "max_tokens"] = int(max_tokens)
        fmt = response_format_for(mode, request)
        if fmt is not None:
            kwargs["response_format"] = fmt
        if self.seed is not None:
            kwargs["seed"] = self.seed
        if self.temperature is not None and self._send_temperature:
            kwargs["temperature"] = self.temperature
        return kwargs  # in the order `chat.completions.create` writes the body: the same bytes

    def _refuses_temperature(self, exc: Exception, sdk: Any, downgraded: list[str]) -> bool:
        """True (and temperature is dropped from now on) when a 400 names the temperature we sent:
        `Unsupported value: 'temperature' does not support 0 with this model`. Every call to such a
        model failed fatally, and the CLI has no flag to leave the parameter out."""
        if not self._send_temperature or self.temperature is None or not isinstance(exc, sdk.APIStatusError):
            return False
        if int(exc.status_code) not in (400, 422):
            return False
        body = getattr(exc, "body", None)
        err = body.get("error", body) if isinstance(body, dict) else None
        param = err.get("param") if isinstance(err, dict) else None
        if param != "temperature" and "temperature" not in error_message(exc).lower():
            return False
        self._send_temperature = False
        downgraded.append(f"openai: the server refused temperature={self.temperature:g} "
                          f"({scrub(error_message(exc), self._hidden)[:100]}); sent without it")
        return True

    def _refuses_system(self, exc: Exception, sdk: Any, downgraded: list[str]) -> bool:
        """True (and the data notice moves into the user turn from now on) when a 400 / 422 says
        the server's chat template has no system role ("System role not supported")."""
        if not self._send_system or not isinstance(exc, sdk.APIStatusError):
            return False
        text = error_message(exc).lower()
        if int(exc.status_code) not in (400, 422) or "system" not in text or "role" not in text:
            return False
        self._send_system = False
        said = scrub(error_message(exc), self._hidden)[:100]
        downgraded.append(f"openai: no system role ({said}); the data notice went in the user turn")
        return True

    def _rejects_format(self, exc: Exception, mode: str, last: bool) -> bool:
        sdk = _sdk()
        if last or mode == "text" or not isinstance(exc, sdk.APIStatusError):
            return False
        if int(exc.status_code) not in _REJECT_STATUSES:
            return False
        text = error_message(exc).lower()
        return any(word in text for word in _REJECT_WORDS)

    def _completion(self, resp: Any, mode: str, downgraded: list[str]) -> Completion:
        if isinstance(resp, (str, bytes)) or not isinstance(field(resp, "choices"), list):
            error = None if isinstance(resp, (str, bytes)) else field(resp, "error")
            if isinstance(error, dict):
                raise self._error_body(error)
            raise FatalFailure(self._protocol_error(resp))
        choices = field(resp, "choices")
        if not choices:
            raise FatalFailure("openai: response has no choices")
        choice = choices[0]
        message = field(choice, "message")
        if message is None:
            # The SDK does not validate: a choice without a message (a legacy text completion's
            # `text`, or `message: null`) was an AttributeError, an internal error in the CLI.
            legacy = isinstance(field(choice, "text"), str)
            what = ("it is a text completion (choices[0].text), not a chat completion" if legacy
                    else "choices[0] has no message")
            raise FatalFailure(f"openai: protocol error: the server's answer is not a Chat Completions "
                               f"response ({what})")
        refusal = field(message, "refusal")
        if refusal:
            raise FatalFailure(f"openai: the model refused: {scrub(str(refusal), self._hidden)[:200]}")
        finish = field(choice, "finish_reason") or "stop"
        if finish == "content_filter":
            raise FatalFailure("openai: the answer was withheld by the content filter (refusal)")
        notes = tuple(downgraded)
        if downgraded and any("response_format" in note for note in downgraded):  # seldom any
            notes += (f"openai: {display_url(self.base_url)} uses response_format mode {mode!r}",)
        return Completion(
            text=_content_text(field(message, "content")),
            finish_reason="length" if finish == "length" else finish,
            reasoning_chars=_reasoning_chars(message),
            model=field(resp, "model") or self.model,
            usage=usage_dict(field(resp, "usage"), _USAGE_FIELDS),
            notes=notes,
        )

    def _error_body(self, error: dict[str, Any]) -> BackendFailure:
        """An `{"error": {...}}` body sent with HTTP 200 (OpenRouter and other proxies relay an
        upstream failure that way): its own words, retried when its code is a retryable status."""
        code = error.get("code")
        status = int(code) if isinstance(code, int) or (isinstance(code, str) and code.isdigit()) else None
        said = f"{error.get('type') or code or 'error'}: {error.get('message')}"
        detail = scrub(f"openai: the server answered HTTP 200 with an error: {said}", self._hidden)[:300]
        if status is not None and is_transient_status(status):
            return TransientFailure(detail, status=status)
        return FatalFailure(detail, status=status)

    def _protocol_error(self, resp: Any) -> str:
        """Why a 200 answer is not a Chat Completions response at all. The SDK hands back a web
        page as a str and builds a ChatCompletion from any JSON without validating it, so both
        read as 'no choices'; the usual cause is a --base-url that is not the OpenAI API root."""
        head = "openai: protocol error: the server's answer is not a Chat Completions response"
        root = (f"; is {display_url(self.base_url)} the server's OpenAI-compatible API root "
                "(usually ending in /v1)?")
        if isinstance(resp, (str, bytes)):
            text = resp.decode("utf-8", "replace") if isinstance(resp, bytes) else resp
            shown = scrub(" ".join(text.split()), self._hidden)[:60]
            return f"{head} but text: {shown!r}{root}"
        if field(resp, "type") == "message" and field(resp, "content") is not None:
            return f"{head} (it looks like an Anthropic Messages response); for it use the anthropic backend"
        if field(resp, "choices") is not None:
            return f"{head} ('choices' is not a list){root}"
        return f"{head} (no 'choices' in the JSON){root}"

    def _after_error(self, exc: Exception, sdk: Any, modes: Sequence[str], i: int,
                     downgraded: list[str]) -> int:
        """The index of the mode to try next after a failed call (`complete` and `acomplete` alike):
        the same mode again without temperature when that is what the server refused, the next
        response_format mode when it refused the format, else the failure is raised classified."""
        if self._refuses_temperature(exc, sdk, downgraded) or self._refuses_system(exc, sdk, downgraded):
            return i
        self._downgrade_or_raise(exc, sdk, modes[i], i == len(modes) - 1, downgraded)
        return i + 1

    def _downgrade_or_raise(
        self, exc: Exception, sdk: Any, mode: str, last: bool, downgraded: list[str]
    ) -> None:
        """Note a response_format rejection (the caller moves to the next mode), else raise it classified."""
        if not self._rejects_format(exc, mode, last):
            raise classify_sdk_error(exc, sdk, self._hidden, "openai") from None
        downgraded.append(f"openai: server rejected response_format {mode!r}: "
                          f"{scrub(error_message(exc), self._hidden)[:120]}")

    def _negotiation(self, prompt: str, request: RerankRequest, max_tokens: int,
                     feedback: Sequence[Violation], previous: str | None
                     ) -> Generator[dict[str, Any], Any, Completion]:
        """The call's decisions, for both drivers: yields the keywords of each request to send (one
        per response_format mode tried) and receives its response or the SDK's exception."""
        sdk = _sdk()
        modes = self._modes()
        downgraded: list[str] = []
        i = 0
        while i < len(modes):
            mode = modes[i]
            answer = yield self._kwargs(mode, prompt, request, max_tokens, feedback, previous)
            if isinstance(answer, sdk.OpenAIError):
                i = self._after_error(answer, sdk, modes, i, downgraded)
                continue
            if isinstance(answer, json.JSONDecodeError):  # the SDK parses a JSON content-type body itself
                raise FatalFailure(f"openai: the server's answer is not valid JSON ({answer})") from None
            if not self.forced_mode:
                _remember(self.base_url, mode)
            return self._completion(answer, mode, downgraded)
        # unreachable: "text" is the last mode and is never treated as a rejection
        raise FatalFailure("openai: the server rejected every response_format mode")

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
        if self._scoring_now() != "listwise":
            try:
                return self._logprob_completion(request, ends)
            except _NoLogprobs as exc:
                note = self._without_logprobs(exc)
            done = self._listwise(prompt, request, max_tokens, feedback, previous, ends)
            return replace(done, notes=(note, *done.notes))
        return self._listwise(prompt, request, max_tokens, feedback, previous, ends)

    async def acomplete(
        self,
        prompt: str,
        request: RerankRequest,
        *,
        max_tokens: int,
        feedback: Sequence[Violation] = (),
        previous: str | None = None,
    ) -> Completion:
        if self._scoring_now() != "listwise":
            try:
                return await self._alogprob_completion(request)
            except _NoLogprobs as exc:
                note = self._without_logprobs(exc)
            done = await self._alistwise(prompt, request, max_tokens, feedback, previous)
            return replace(done, notes=(note, *done.notes))
        return await self._alistwise(prompt, request, max_tokens, feedback, previous)

    # --- listwise: the card's task in one prompt ---------------------------------------------
    def _listwise(self, prompt: str, request: RerankRequest, max_tokens: int, feedback: Sequence[Violation],
                  previous: str | None, ends: float | None) -> Completion:
        sdk = _sdk()
        client = self._clients.sync()
        steps = self._negotiation(prompt, request, max_tokens, feedback, previous)
        kwargs = next(steps)
        while True:
            left = None if ends is None else ends - time.monotonic()
            try:
                answer: Any = _json_of(client.post(
                    CHAT_PATH, cast_to=_response_class(sdk), body=kwargs,
                    options=request_options(sdk, request_timeout(self.timeout, left))))
            except (sdk.OpenAIError, json.JSONDecodeError) as exc:
                answer = exc
            try:
                kwargs = steps.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]

    async def _alistwise(self, prompt: str, request: RerankRequest, max_tokens: int,
                         feedback: Sequence[Violation], previous: str | None) -> Completion:
        sdk = _sdk()
        client = self._clients.for_running_loop()
        steps = self._negotiation(prompt, request, max_tokens, feedback, previous)
        kwargs = next(steps)
        while True:
            try:
                answer: Any = _json_of(await client.post(CHAT_PATH, cast_to=_response_class(sdk), body=kwargs,
                                                         options=request_options(sdk, {})))
            except (sdk.OpenAIError, json.JSONDecodeError) as exc:
                answer = exc
            try:
                kwargs = steps.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]

    # --- log-probabilities: one yes/no question per chunk ------------------------------------
    def _without_logprobs(self, exc: _NoLogprobs) -> str:
        """After a server showed it returns no log-probabilities: a fatal failure saying so when
        they were asked for, else (`auto`) the listwise prompt from now on, and the note why."""
        where = display_url(self.base_url)
        if self.scoring == "logprobs":
            raise FatalFailure(f"openai: scoring='logprobs' needs token log-probabilities, and the server at "
                               f"{where} {exc}; use a server that returns them (llama.cpp server, vLLM) or "
                               "scoring='listwise' (or 'auto', which falls back to it)") from None
        _remember_scoring(self.base_url, "listwise")
        return f"openai: {where} {exc}; scoring='auto' uses the listwise prompt for it"

    def _logprob_kwargs(self, request: RerankRequest, chunk: Chunk) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.model, "logprobs": True, "top_logprobs": TOP_LOGPROBS,
                                  "messages": build_messages(render_relevance(request.query, chunk), (), None,
                                                             system=self._send_system)}
        kwargs["max_completion_tokens" if self._official else "max_tokens"] = 1
        if self.temperature is not None and self._send_temperature:
            kwargs["temperature"] = self.temperature
        if self.seed is not None:
            kwargs["seed"] = self.seed
        return kwargs

    def _rejects_logprobs(self, exc: Exception, sdk: Any) -> bool:
        return (isinstance(exc, sdk.APIStatusError) and int(exc.status_code) in _REJECT_STATUSES
                and "logprob" in error_message(exc).lower())

    def _judging(self, request: RerankRequest, chunk: Chunk, notes: list[str]
                 ) -> Generator[dict[str, Any], Any, tuple[float | None, Any]]:
        """One chunk's question, for both drivers: yields the keywords of each request to send and
        receives its response or the SDK's exception; returns (p(yes) or None, the response)."""
        sdk = _sdk()
        for _ in range(3):  # at most: the question, again without temperature, again without a system turn
            answer_ = yield self._logprob_kwargs(request, chunk)
            if isinstance(answer_, sdk.OpenAIError):
                if (self._refuses_temperature(answer_, sdk, notes)
                        or self._refuses_system(answer_, sdk, notes)):
                    continue
                if self._rejects_logprobs(answer_, sdk):
                    said = scrub(error_message(answer_), self._hidden)[:120]
                    raise _NoLogprobs(f"refused them (HTTP {answer_.status_code}: {said})")
                raise classify_sdk_error(answer_, sdk, self._hidden, "openai") from None
            if isinstance(answer_, json.JSONDecodeError):
                raise FatalFailure(f"openai: the server's answer is not valid JSON ({answer_})") from None
            choices = getattr(answer_, "choices", None)
            if isinstance(answer_, (str, bytes)) or not isinstance(choices, list):
                raise FatalFailure(self._protocol_error(answer_))
            if not choices:
                raise FatalFailure("openai: response has no choices")
            logprobs = getattr(choices[0], "logprobs", None)
            if logprobs is None:
                raise _NoLogprobs("answered without them (no 'logprobs' in its answer)")
            return yes_probability(logprobs), answer_
        raise FatalFailure("openai: the server kept refusing the relevance question")

    def _scored_completion(self, request: RerankRequest, judged: Sequence[tuple[float | None, Any]],
                           notes: list[str]) -> Completion:
        """The card's answer from the chunks' p(yes), built as the scored backends build theirs."""
        if self.scoring == "auto":
            _remember_scoring(self.base_url, "logprobs")
        scores = [p for p, _ in judged]
        missing = sum(p is None for p in scores)
        if missing:
            notes.append(f"openai: {missing} of {len(scores)} chunks had neither yes nor no among the top "
                         f"{TOP_LOGPROBS} first tokens: not scored")
        obj = answer(request, scores, LOGPROB_REASON, decimals=SCORE_DECIMALS, unscored_reason=NOT_SCORED)
        usage = add_usage(*(usage_dict(getattr(resp, "usage", None), _USAGE_FIELDS) for _, resp in judged))
        models = [getattr(resp, "model", None) for _, resp in judged]
        model = next((m for m in models if isinstance(m, str) and m), None)
        return Completion(text=json.dumps(obj, ensure_ascii=False), model=model or self.model, usage=usage,
                          notes=tuple(dict.fromkeys(notes)))

    def _logprob_completion(self, request: RerankRequest, ends: float | None) -> Completion:
        sdk = _sdk()
        client = self._clients.sync()
        notes: list[str] = []

        def one(chunk: Chunk) -> tuple[float | None, Any]:
            steps = self._judging(request, chunk, notes)
            kwargs = next(steps)
            while True:
                left = None if ends is None else ends - time.monotonic()
                try:
                    answer_: Any = client.chat.completions.create(**kwargs,
                                                                  **request_timeout(self.timeout, left))
                except (sdk.OpenAIError, json.JSONDecodeError) as exc:
                    answer_ = exc
                try:
                    kwargs = steps.send(answer_)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]

        chunks = list(request.chunks)
        # Probing (`auto`, first call): one question alone, so a server without log-probabilities
        # costs one request before the listwise prompt, not one per chunk.
        judged = [one(chunks[0])] if self._scoring_now() == "probe" else []
        rest = chunks[len(judged):]
        if len(rest) <= 1:
            judged += [one(c) for c in rest]
        else:
            with ThreadPoolExecutor(max_workers=min(LOGPROB_CONCURRENCY, len(rest)),
                                    thread_name_prefix="rag-rerank-logprobs") as pool:
                judged += list(pool.map(one, rest))
        return self._scored_completion(request, judged, notes)

    async def _alogprob_completion(self, request: RerankRequest) -> Completion:
        sdk = _sdk()
        client = self._clients.for_running_loop()
        notes: list[str] = []
        slots = asyncio.Semaphore(LOGPROB_CONCURRENCY)

        async def one(chunk: Chunk) -> tuple[float | None, Any]:
            async with slots:
                steps = self._judging(request, chunk, notes)
                kwargs = next(steps)
                while True:
                    try:
                        answer_: Any = await client.chat.completions.create(**kwargs)
                    except (sdk.OpenAIError, json.JSONDecodeError) as exc:
                        answer_ = exc
                    try:
                        kwargs = steps.send(answer_)
                    except StopIteration as done:
                        return done.value  # type: ignore[no-any-return]

        chunks = list(request.chunks)
        judged = [await one(chunks[0])] if self._scoring_now() == "probe" else []
        outcomes = await asyncio.gather(*(one(c) for c in chunks[len(judged):]), return_exceptions=True)
        for outcome in outcomes:  # every question finished; the first failure is the call's
            if isinstance(outcome, BaseException):
                raise outcome
        judged += [o for o in outcomes if not isinstance(o, BaseException)]
        return self._scored_completion(request, judged, notes)
