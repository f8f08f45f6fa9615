"""OpenAIBackend with the real openai SDK over HTTP against the scripted server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json

import pytest

from rag_rerank.backends.common import DATA_NOTICE
from rag_rerank.backends.openai import OpenAIBackend, forget_modes, remembered_mode
from rag_rerank.errors import (
    ConfigError,
    FatalFailure,
    InputError,
    TransientFailure,
    UnreachableFailure,
    Violation,
)
from rag_rerank.guard import validate_request
from rag_rerank.render import render
from rag_rerank.skill import load_skill
from tests.support.fake_llm import FakeLLM, RecordedRequest, Reply

KEY = "sk-test-SECRET-0123456789"


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    forget_modes()


@pytest.fixture()
def request_():
    ex = load_skill().example("happy-path")
    return validate_request(ex.query, ex.chunks, ex.top_k, ex.lambda_)


def _answer() -> str:
    return json.dumps({"ranked": [{"id": "c3", "score": 0.9, "reason": "IVF when index memory is tight"}],
                       "dropped": [{"id": "c5", "reason": "risotto is off topic"}]})


def test_valid_answer_and_strict_schema_with_id_enum(request_) -> None:
    with FakeLLM([Reply.openai_text(_answer(), usage={"prompt_tokens": 7, "completion_tokens": 3,
                                                      "total_tokens": 10})]) as srv:
        backend = OpenAIBackend(model="m1", base_url=srv.openai_url, api_key=KEY)
        out = backend.complete(render(request_), request_, max_tokens=321)
    assert out.text == _answer()
    assert out.finish_reason == "stop"
    assert dict(out.usage) == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    (req,) = srv.requests
    assert req.headers["authorization"] == f"Bearer {KEY}"
    assert req.headers.get("x-stainless-retry-count") == "0"
    body = req.body
    assert body["model"] == "m1" and body["max_tokens"] == 321 and body["temperature"] == 0.0
    assert body["messages"] == [{"role": "system", "content": DATA_NOTICE},
                                {"role": "user", "content": render(request_)}]
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    schema = fmt["json_schema"]["schema"]
    item = schema["properties"]["ranked"]["items"]
    assert item["properties"]["id"]["enum"] == ["c1", "c2", "c3", "c4", "c5"]
    assert sorted(item["required"]) == sorted(item["properties"]) == ["id", "reason", "score"]
    assert sorted(schema["required"]) == ["dropped", "ranked"]
    assert schema["additionalProperties"] is False and item["additionalProperties"] is False
    assert schema["properties"]["dropped"]["items"]["properties"]["id"]["enum"] == list(request_.ids)


def test_reask_sends_previous_answer_and_quoted_violations_without_mutating(request_) -> None:
    feedback = (Violation(path="$.ranked[0].id", message="'C3' is not an input id", id="C3"),
                Violation(path="$.ranked[0].reason", message='reason "x" cites nothing'))
    before = (request_, feedback)
    with FakeLLM([Reply.openai_text(_answer())]) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY)
        backend.complete("PROMPT", request_, max_tokens=100, feedback=feedback, previous='{"ranked": []}')
    msgs = srv.requests[0].body["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[2]["content"] == '{"ranked": []}'
    lines = msgs[3]["content"].splitlines()
    assert lines[1:3] == [f"- {json.dumps(str(v))}" for v in feedback]
    assert (request_, feedback) == before


def test_json_schema_rejected_falls_back_and_is_remembered(request_) -> None:
    script = [
        Reply.openai_error(500, "Unsupported response_format type: json_schema", type_="server_error"),
        Reply.openai_text(_answer()),
        Reply.openai_text(_answer()),
    ]
    with FakeLLM(script) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY)
        first = backend.complete("P", request_, max_tokens=50)
        assert remembered_mode(backend.base_url) == "json_object_schema"
        second = OpenAIBackend(base_url=srv.openai_url, api_key=KEY).complete("P", request_, max_tokens=50)
    formats = [r.body.get("response_format") for r in srv.requests]
    assert formats[0]["type"] == "json_schema"
    assert formats[1]["type"] == "json_object" and "enum" in json.dumps(formats[1]["schema"])
    assert formats[2] == formats[1]  # remembered: no second negotiation
    assert any("json_object_schema" in n for n in first.notes)
    assert second.notes == ()


def test_full_fallback_chain_down_to_plain_text(request_) -> None:
    script = [
        Reply.openai_error(400, "response_format json_schema is not supported"),
        Reply.openai_error(422, "Unknown field: response_format.schema"),
        Reply.openai_error(400, "'response_format' of type 'json_object' is not supported with this model."),
        Reply.openai_text(_answer()),
    ]
    with FakeLLM(script) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY)
        out = backend.complete("P", request_, max_tokens=50)
    assert out.text == _answer()
    sent = [r.body.get("response_format", {}).get("type") for r in srv.requests]
    assert sent == ["json_schema", "json_object", "json_object", None]
    assert "schema" not in srv.requests[2].body["response_format"]
    assert remembered_mode(backend.base_url) == "text"


def test_unrelated_400_is_not_a_format_rejection(request_) -> None:
    with FakeLLM([Reply.openai_error(400, "model 'nope' does not exist")]) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY)
        with pytest.raises(FatalFailure) as info:
            backend.complete("P", request_, max_tokens=50)
    assert info.value.status == 400 and len(srv.requests) == 1
    assert remembered_mode(backend.base_url) is None


def test_refusal_and_content_filter_are_fatal(request_) -> None:
    with FakeLLM([Reply.openai_text(None, refusal="I can't help with that."),
                  Reply.openai_text("", finish_reason="content_filter")]) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY)
        with pytest.raises(FatalFailure, match="refused"):
            backend.complete("P", request_, max_tokens=50)
        with pytest.raises(FatalFailure, match="content filter"):
            backend.complete("P", request_, max_tokens=50)


def test_truncation_is_reported_as_length(request_) -> None:
    with FakeLLM([Reply.openai_text('{"ranked": [{"id": "c3", "sc', finish_reason="length")]) as srv:
        out = OpenAIBackend(base_url=srv.openai_url, api_key=KEY).complete("P", request_, max_tokens=5)
    assert out.finish_reason == "length"


def test_status_codes_are_classified_and_the_key_is_scrubbed(request_) -> None:
    script = [
        Reply.openai_error(429, "slow down", type_="rate_limit", headers={"Retry-After": "7"}),
        Reply.openai_error(503, "busy", headers={"retry-after-ms": "1500"}),
        # a misbehaving server echoing the key back must not put it into our errors
        Reply.openai_error(401, f"Incorrect API key provided: {KEY}"),
    ]
    with FakeLLM(script) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY)
        with pytest.raises(TransientFailure) as e429:
            backend.complete("P", request_, max_tokens=50)
        with pytest.raises(TransientFailure) as e503:
            backend.complete("P", request_, max_tokens=50)
        with pytest.raises(FatalFailure) as e401:
            backend.complete("P", request_, max_tokens=50)
    assert (e429.value.status, e429.value.retry_after) == (429, 7.0)
    assert (e503.value.status, e503.value.retry_after) == (503, 1.5)
    assert e401.value.status == 401
    assert KEY not in str(e401.value) and "***" in str(e401.value)
    assert KEY not in repr(backend)
    assert len(srv.requests) == 3  # SDK max_retries=0: one request per call


def test_a_timeout_is_transient_and_a_refused_connection_fatal(request_) -> None:
    """A server that is slow is there (worth a retry); once it is gone, nothing listens on its port
    and retrying cannot help (tests/test_unreachable.py has the pipeline's side)."""
    with FakeLLM([Reply.openai_text(_answer(), delay=2.0)]) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY, timeout=0.3)
        with pytest.raises(TransientFailure, match="timed out"):
            backend.complete("P", request_, max_tokens=50)
        url = srv.openai_url
    refused = r"connection refused at 127\.0\.0\.1:\d+: nothing listens there"
    with pytest.raises(UnreachableFailure, match=refused):
        OpenAIBackend(base_url=url, api_key=KEY, timeout=2).complete("P", request_, max_tokens=50)


def test_no_key_is_fine_for_a_local_server_but_not_for_a_remote_one(request_, monkeypatch) -> None:
    with FakeLLM([Reply.openai_text(_answer())]) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.openai_url)
        backend = OpenAIBackend()
        assert backend.complete("P", request_, max_tokens=50).text == _answer()
    assert srv.requests[0].headers["authorization"].startswith("Bearer ")
    monkeypatch.delenv("OPENAI_BASE_URL")
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIBackend()
    with pytest.raises(ConfigError, match="no API key"):
        OpenAIBackend(base_url="https://llm.example.com/v1")


def test_official_api_gets_max_completion_tokens(request_, monkeypatch) -> None:
    backend = OpenAIBackend(api_key=KEY)  # constructing makes no request
    kwargs = backend._kwargs("json_schema", "P", request_, 99, (), None)
    assert kwargs["max_completion_tokens"] == 99 and "max_tokens" not in kwargs


def test_bad_response_format_option_is_an_input_error() -> None:
    with pytest.raises(InputError, match="response_format"):
        OpenAIBackend(base_url="http://127.0.0.1:9/v1", response_format="yaml")


def test_async_complete_and_forced_mode(request_) -> None:
    with FakeLLM([Reply.openai_text(_answer()), Reply.openai_text(_answer())]) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY, response_format="json_object")

        async def both():
            return await asyncio.gather(backend.acomplete("P", request_, max_tokens=50),
                                        backend.acomplete("P", request_, max_tokens=50))

        outs = asyncio.run(both())
    assert [o.text for o in outs] == [_answer(), _answer()]
    assert [r.body["response_format"] for r in srv.requests] == [{"type": "json_object"}] * 2
    assert remembered_mode(backend.base_url) is None  # a forced mode is not "learned"


def test_malformed_json_body_is_a_fatal_failure_not_a_crash(request_) -> None:
    """Regression: a 200 with `Content-Type: application/json` and a body that is not JSON made the
    SDK raise JSONDecodeError straight through (CLI: internal error, exit 4)."""
    with FakeLLM([Reply(200, "{not json"), Reply(200, "{not json")]) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY, response_format="json_object")
        with pytest.raises(FatalFailure, match="not valid JSON"):
            backend.complete("P", request_, max_tokens=50)
        with pytest.raises(FatalFailure, match="not valid JSON"):
            asyncio.run(backend.acomplete("P", request_, max_tokens=50))


def test_an_answer_that_is_not_a_chat_completion_is_a_protocol_error_naming_it(request_) -> None:
    """--base-url at a web page (a UI answering every path with HTML), an Anthropic server or
    Ollama's native /api/chat: the SDK returns the page as a str and builds a ChatCompletion from
    any JSON, which read as 'response has no choices'. The failure now says what came back."""
    from rag_rerank.backends.common import LOCAL_DUMMY_KEY

    page = Reply(200, "<html>\n <body>Open WebUI</body></html>", headers={"Content-Type": "text/html"})
    native = Reply(200, {"model": "llama3", "message": {"role": "assistant", "content": "{}"}, "done": True})
    with FakeLLM([page, Reply.anthropic_tool({"ranked": []}), native, page]) as srv:
        url = srv.url
        backend = OpenAIBackend(base_url=url, api_key=LOCAL_DUMMY_KEY, response_format="json_object")
        with pytest.raises(FatalFailure) as html:
            backend.complete("P", request_, max_tokens=50)
        with pytest.raises(FatalFailure) as anthropic:
            backend.complete("P", request_, max_tokens=50)
        with pytest.raises(FatalFailure) as ollama:
            backend.complete("P", request_, max_tokens=50)
        with pytest.raises(FatalFailure) as async_html:
            asyncio.run(backend.acomplete("P", request_, max_tokens=50))
    for info in (html, async_html):
        assert str(info.value) == (
            "openai: protocol error: the server's answer is not a Chat Completions response but text: "
            f"'<html> <body>Open WebUI</body></html>'; is {url} the server's OpenAI-compatible API "
            "root (usually ending in /v1)?")
    assert "looks like an Anthropic Messages response" in str(anthropic.value)
    assert "use the anthropic backend" in str(anthropic.value)
    assert "no 'choices' in the JSON" in str(ollama.value) and "ending in /v1" in str(ollama.value)


def test_a_chat_completion_served_as_text_plain_is_still_read(request_) -> None:
    """The listwise answer is read as plain JSON (no typed ChatCompletion) exactly as the SDK's typed
    parse read a body: a proxy that labels the JSON `text/plain` (even with a wrong charset, a BOM,
    or UTF-16) is read from its bytes, sync and async, with usage and model; a JSON body that is a
    string stays a protocol error."""
    import dataclasses

    good = Reply.openai_text("café ANSWER", model="served-model",
                             usage={"prompt_tokens": 7, "completion_tokens": 3})
    text = json.dumps(good.body, ensure_ascii=False)
    bodies = [(text, "text/plain"), (text.encode("utf-8"), "text/plain; charset=iso-8859-1"),
              (b"\xef\xbb\xbf" + text.encode("utf-8"), "text/plain"), (text.encode("utf-16"), "text/plain")]
    replies = [dataclasses.replace(good, body=b, headers={"Content-Type": t}) for b, t in bodies]
    with FakeLLM([*replies, replies[0]]) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY, response_format="json_object")
        done = [backend.complete("P", request_, max_tokens=50) for _ in bodies]
        done.append(asyncio.run(backend.acomplete("P", request_, max_tokens=50)))
    for c in done:
        assert c.text == "café ANSWER" and c.model == "served-model"
        assert c.usage == {"prompt_tokens": 7, "completion_tokens": 3}
    with FakeLLM([Reply(200, json.dumps(text))]) as srv:  # application/json holding a JSON string
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY, response_format="json_object")
        with pytest.raises(FatalFailure, match="not a Chat Completions response but text"):
            backend.complete("P", request_, max_tokens=50)


def test_an_empty_choices_list_still_says_no_choices(request_) -> None:
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}
    with FakeLLM([Reply(200, body)]) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY, response_format="json_object")
        with pytest.raises(FatalFailure, match=r"^openai: response has no choices$"):
            backend.complete("P", request_, max_tokens=50)


def test_a_404_quotes_the_servers_body_and_the_url_posted_to(request_) -> None:
    """A base URL without /v1 against vLLM ({"detail": "Not Found"}) or a Go server (a text body)
    read 'HTTP 404 NotFoundError: Error code: 404': neither the server's words nor the URL."""
    from rag_rerank.backends.common import LOCAL_DUMMY_KEY

    unknown_model = Reply.openai_error(404, "The model `gpt-9` does not exist")
    with FakeLLM([Reply(404, {"detail": "Not Found"}),
                  Reply(404, "404 page not found", headers={"Content-Type": "text/plain"}),
                  unknown_model]) as srv:
        url = srv.url
        backend = OpenAIBackend(base_url=url, api_key=LOCAL_DUMMY_KEY, response_format="json_object")
        failures = []
        for _ in range(3):
            with pytest.raises(FatalFailure) as info:
                backend.complete("P", request_, max_tokens=50)
            failures.append(str(info.value))
    hint = (f"(POST {url}/chat/completions; OpenAI-compatible servers serve under /v1: is the base URL "
            "the API root, ending in /v1?)")
    assert failures[0] == f"openai: HTTP 404 NotFoundError: Not Found {hint}"
    assert failures[1] == f"openai: HTTP 404 NotFoundError: 404 page not found {hint}"
    # the endpoint exists, the model does not: no question about the URL
    assert failures[2] == ("openai: HTTP 404 NotFoundError: The model `gpt-9` does not exist "
                           f"(POST {url}/chat/completions)")


def test_content_sent_as_a_list_of_parts_is_the_text_parts_joined(request_) -> None:
    """Mistral's reasoning models answer `content: [{"type": "thinking", ...}, {"type": "text", ...}]`;
    the backend handed the list on and the guard re-asked three times: 'output must be text, got list'."""
    reply = Reply.openai_text("placeholder")
    reply.body["choices"][0]["message"]["content"] = [
        {"type": "thinking", "thinking": [{"type": "text", "text": "c3 is about memory"}]},
        {"type": "text", "text": _answer()[:20]}, {"type": "text", "text": _answer()[20:]}]
    with FakeLLM([reply]) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY, response_format="json_object")
        out = backend.complete("P", request_, max_tokens=50)
    assert out.text == _answer()


def test_a_choice_without_a_message_is_a_protocol_error_not_an_attribute_error(request_) -> None:
    """The SDK builds a ChatCompletion from any JSON without validating it: a legacy text
    completion (`choices[0].text`), `message: null` or `choices` as an object raised AttributeError /
    KeyError out of the backend (CLI: 'internal error', exit 4)."""
    def body(choices: object) -> dict:
        return {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": choices}

    replies = [Reply(200, body([{"index": 0, "text": "{}", "finish_reason": "stop"}])),
               Reply(200, body([{"index": 0, "message": None, "finish_reason": "stop"}])),
               Reply(200, body({"0": {"message": {"content": "{}"}}}))]
    with FakeLLM(replies) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY, response_format="json_object")
        seen = []
        for _ in replies:
            with pytest.raises(FatalFailure) as info:
                backend.complete("P", request_, max_tokens=50)
            seen.append(str(info.value))
    head = "openai: protocol error: the server's answer is not a Chat Completions response"
    assert seen[0] == f"{head} (it is a text completion (choices[0].text), not a chat completion)"
    assert seen[1] == f"{head} (choices[0] has no message)"
    assert seen[2].startswith(f"{head} ('choices' is not a list)")


def test_an_error_object_sent_with_http_200_is_quoted_and_retried_when_transient(request_) -> None:
    """OpenRouter and other proxies relay an upstream failure as HTTP 200 with {"error": {...}}: it
    read as a protocol error asking whether the base URL was right. It is now the server's own words,
    retried when its code is a retryable status."""
    from rag_rerank.retry import RetryPolicy, call_with_retries

    upstream = Reply(200, {"error": {"message": "Provider returned error", "code": 502}})
    invalid = Reply(200, {"error": {"message": "Invalid model", "code": 400,
                                    "type": "invalid_request_error"}})
    with FakeLLM([upstream, Reply.openai_text(_answer()), invalid]) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY, response_format="json_object")
        outcome = call_with_retries(backend, request_, render(request_), guard_top_k=3,
                                    policy=RetryPolicy(sleep=lambda s: None))
        with pytest.raises(FatalFailure) as info:
            backend.complete("P", request_, max_tokens=50)
    assert [a.kind for a in outcome.attempts] == ["transient", "ok"]
    assert outcome.attempts[0].detail == ("openai: the server answered HTTP 200 with an error: 502: "
                                          "Provider returned error")
    assert str(info.value) == ("openai: the server answered HTTP 200 with an error: invalid_request_error: "
                               "Invalid model")


def test_a_model_that_refuses_temperature_is_asked_again_without_it(request_) -> None:
    """api.openai.com's reasoning models (o-series, gpt-5) answer 400 "Unsupported value:
    'temperature' does not support 0 with this model": every call failed fatally, and the CLI has
    no flag to leave the parameter out. The same call is sent again without it, once, and later
    calls of this backend leave it out."""
    refused = Reply.openai_error(400, "Unsupported value: 'temperature' does not support 0.0 with this "
                                 "model. Only the default (1) value is supported.", param="temperature")
    with FakeLLM([refused, Reply.openai_text(_answer()), Reply.openai_text(_answer()), refused]) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY, response_format="json_object")
        first = backend.complete("P", request_, max_tokens=50)
        second = asyncio.run(backend.acomplete("P", request_, max_tokens=50))
        bodies = [r.body for r in srv.requests]
        other = OpenAIBackend(base_url=srv.openai_url, api_key=KEY, response_format="json_object",
                              temperature=None)
        with pytest.raises(FatalFailure, match="temperature"):  # nothing to leave out: no loop
            other.complete("P", request_, max_tokens=50)
    assert first.text == second.text == _answer()
    assert [b.get("temperature") for b in bodies] == [0.0, None, None]
    assert [b["response_format"] for b in bodies] == [{"type": "json_object"}] * 3
    (note,) = first.notes
    assert note.startswith("openai: the server refused temperature=0 (Unsupported value: 'temperature' ")
    assert note.endswith("); sent without it")
    assert second.notes == ()


def test_a_template_without_a_system_role_gets_the_data_notice_in_the_user_turn(request_) -> None:
    """Gemma's chat template (vLLM, llama.cpp) answers 400 to a system message: the notice then rides
    at the head of the user turn, learned once per backend, and meta's notes say so."""
    def gemma(req: RecordedRequest) -> Reply:
        if any(m["role"] == "system" for m in req.body["messages"]):
            return Reply.openai_error(400, "System role not supported")
        return Reply.openai_text(_answer())

    with FakeLLM(handler=gemma) as srv:
        backend = OpenAIBackend(base_url=srv.openai_url, api_key=KEY, response_format="text")
        first = backend.complete(render(request_), request_, max_tokens=100)
        backend.complete(render(request_), request_, max_tokens=100)
    assert first.text == _answer() and any("no system role" in n for n in first.notes)
    assert len(srv.requests) == 3  # refused once, then both calls without a system message
    (turn,) = srv.requests[1].body["messages"]
    assert turn == {"role": "user", "content": f"{DATA_NOTICE}\n\n{render(request_)}"}
