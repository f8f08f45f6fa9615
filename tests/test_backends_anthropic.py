"""AnthropicBackend with the real anthropic SDK over HTTP against the scripted server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json

import pytest

from rag_rerank.backends.anthropic import TOOL_NAME, AnthropicBackend
from rag_rerank.backends.common import DATA_NOTICE
from rag_rerank.errors import BackendError, ConfigError, FatalFailure, TransientFailure, Violation
from rag_rerank.guard import validate_request
from rag_rerank.render import render
from rag_rerank.skill import load_skill
from tests.support.fake_llm import FakeLLM, Reply

KEY = "sk-ant-test-SECRET-987654321"
ANSWER = {"ranked": [{"id": "c3", "score": 0.9, "reason": "IVF when index memory is constrained",
                      "diversity_note": "the only memory-focused chunk"}],
          "dropped": [{"id": "c5", "reason": "risotto is off topic"}]}


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture()
def request_():
    ex = load_skill().example("happy-path")
    return validate_request(ex.query, ex.chunks, ex.top_k, ex.lambda_)


def test_forced_tool_answer_is_reserialised_as_the_raw_json(request_) -> None:
    with FakeLLM([Reply.anthropic_tool(ANSWER, usage={"input_tokens": 11, "output_tokens": 5})]) as srv:
        backend = AnthropicBackend(model="claude-x", base_url=srv.anthropic_url, api_key=KEY)
        out = backend.complete(render(request_), request_, max_tokens=400)
    assert json.loads(out.text) == ANSWER
    assert out.finish_reason == "stop" and out.model == "fake-claude"
    assert dict(out.usage) == {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}
    (req,) = srv.requests
    assert req.path == "/v1/messages"
    assert req.headers.get("x-stainless-retry-count") == "0"
    body = req.body
    assert body["model"] == "claude-x" and body["max_tokens"] == 400
    assert body["tool_choice"] == {"type": "tool", "name": TOOL_NAME}
    (tool,) = body["tools"]
    schema = tool["input_schema"]
    assert schema["type"] == "object" and schema["required"] == ["ranked"]
    assert schema["properties"]["ranked"]["items"]["properties"]["id"]["enum"] == list(request_.ids)
    assert "diversity_note" in schema["properties"]["ranked"]["items"]["properties"]
    assert body["messages"] == [{"role": "user", "content": render(request_)}]
    assert body["system"] == DATA_NOTICE  # chunk text is data, said outside the card's task


def test_reask_replays_the_tool_call_and_an_error_tool_result(request_) -> None:
    feedback = (Violation(path="$.ranked[0].id", message="'C3' is not an input id", id="C3"),)
    previous = json.dumps({"ranked": [{"id": "C3", "score": 0.9, "reason": "IVF memory"}]})
    with FakeLLM([Reply.anthropic_tool(ANSWER), Reply.anthropic_tool(ANSWER)]) as srv:
        backend = AnthropicBackend(base_url=srv.anthropic_url, api_key=KEY)
        backend.complete("P", request_, max_tokens=100, feedback=feedback, previous=previous)
        backend.complete("P", request_, max_tokens=100, feedback=feedback, previous="Sure! here you go")
    msgs = srv.requests[0].body["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    (call,) = msgs[1]["content"]
    assert call["type"] == "tool_use" and call["input"] == json.loads(previous)
    (result,) = msgs[2]["content"]
    assert result["type"] == "tool_result" and result["is_error"] is True
    assert result["tool_use_id"] == call["id"]
    assert f"- {json.dumps(str(feedback[0]))}" in result["content"].splitlines()
    plain = srv.requests[1].body["messages"]
    assert plain[1] == {"role": "assistant", "content": "Sure! here you go"}
    assert json.dumps(str(feedback[0])) in plain[2]["content"]


def test_max_tokens_stop_is_length_and_text_only_answer_goes_to_the_guard(request_) -> None:
    with FakeLLM([Reply.anthropic_tool({"ranked": []}, stop_reason="max_tokens"),
                  Reply.anthropic_text("I think c3 is best.")]) as srv:
        backend = AnthropicBackend(base_url=srv.anthropic_url, api_key=KEY)
        cut = backend.complete("P", request_, max_tokens=10)
        prose = backend.complete("P", request_, max_tokens=10)
    assert cut.finish_reason == "length"
    assert prose.text == "I think c3 is best." and prose.finish_reason == "stop"


def test_refusal_is_fatal(request_) -> None:
    with FakeLLM([Reply.anthropic_text("I can't help with that.", stop_reason="refusal")]) as srv:
        backend = AnthropicBackend(base_url=srv.anthropic_url, api_key=KEY)
        with pytest.raises(FatalFailure, match="refused: I can't help"):
            backend.complete("P", request_, max_tokens=10)


def test_overloaded_rate_limit_and_auth_are_classified(request_) -> None:
    script = [
        Reply.anthropic_error(529, "Overloaded", type_="overloaded_error"),
        Reply.anthropic_error(429, "rate limited", type_="rate_limit_error", headers={"retry-after": "3"}),
        Reply.anthropic_error(401, f"invalid x-api-key {KEY}", type_="authentication_error"),
    ]
    with FakeLLM(script) as srv:
        backend = AnthropicBackend(base_url=srv.anthropic_url, api_key=KEY)
        with pytest.raises(TransientFailure) as over:
            backend.complete("P", request_, max_tokens=10)
        with pytest.raises(TransientFailure) as limited:
            backend.complete("P", request_, max_tokens=10)
        with pytest.raises(FatalFailure) as auth:
            backend.complete("P", request_, max_tokens=10)
    assert over.value.status == 529 and over.value.retry_after is None
    assert limited.value.status == 429 and limited.value.retry_after == 3.0
    assert auth.value.status == 401 and KEY not in str(auth.value)
    assert len(srv.requests) == 3


def test_timeout_is_transient(request_) -> None:
    with FakeLLM([Reply.anthropic_tool(ANSWER, delay=2.0)]) as srv:
        backend = AnthropicBackend(base_url=srv.anthropic_url, api_key=KEY, timeout=0.3)
        with pytest.raises(TransientFailure, match="timed out"):
            backend.complete("P", request_, max_tokens=10)


def test_credentials(request_, monkeypatch) -> None:
    with FakeLLM([Reply.anthropic_tool(ANSWER)]) as srv:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", srv.anthropic_url)
        assert json.loads(AnthropicBackend().complete("P", request_, max_tokens=10).text) == ANSWER
    monkeypatch.delenv("ANTHROPIC_BASE_URL")
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicBackend()
    assert KEY not in repr(AnthropicBackend(api_key=KEY))


def test_async_complete(request_) -> None:
    with FakeLLM([Reply.anthropic_tool(ANSWER)]) as srv:
        backend = AnthropicBackend(base_url=srv.anthropic_url, api_key=KEY)
        out = asyncio.run(backend.acomplete("P", request_, max_tokens=10))
    assert json.loads(out.text) == ANSWER
    assert srv.requests[0].headers.get("x-stainless-async", "").startswith("async")


def test_malformed_json_body_is_a_fatal_failure_not_a_crash(request_) -> None:
    """Regression: a 200 JSON content-type body that is not JSON escaped as JSONDecodeError (exit 4)."""
    with FakeLLM([Reply(200, "{not json"), Reply(200, "{not json")]) as srv:
        backend = AnthropicBackend(model="claude-x", base_url=srv.anthropic_url, api_key=KEY)
        with pytest.raises(FatalFailure, match="not valid JSON"):
            backend.complete("P", request_, max_tokens=50)
        with pytest.raises(FatalFailure, match="not valid JSON"):
            asyncio.run(backend.acomplete("P", request_, max_tokens=50))


def test_an_openai_shaped_answer_is_a_protocol_error_not_three_re_asks(request_) -> None:
    """`--backend anthropic` pointed at an OpenAI-compatible server (issue 15)."""
    from rag_rerank.render import render
    from rag_rerank.retry import RetryPolicy, call_with_retries

    chat = Reply.openai_text(json.dumps(ANSWER))
    with FakeLLM([chat, chat, chat]) as srv:
        backend = AnthropicBackend(base_url=srv.anthropic_url, api_key=KEY)
        with pytest.raises(BackendError) as info:
            call_with_retries(backend, request_, render(request_), guard_top_k=3,
                              policy=RetryPolicy(sleep=lambda s: None))
    assert len(srv.requests) == 1 and [a.kind for a in info.value.attempts] == ["fatal"]
    assert "protocol error" in str(info.value) and "use the openai backend" in str(info.value)


def test_a_404_from_a_base_url_ending_in_v1_says_the_sdk_adds_it(request_) -> None:
    """By analogy with the openai backend a user writes --base-url http://host/v1; the anthropic
    SDK posts to /v1/v1/messages, and the failure read 'HTTP 404 NotFoundError: Error code: 404'."""
    with FakeLLM([Reply(404, {"detail": "Not Found"})]) as srv:
        url = srv.url
        backend = AnthropicBackend(base_url=f"{url}/v1", api_key=KEY)
        with pytest.raises(FatalFailure) as info:
            backend.complete("P", request_, max_tokens=50)
    assert str(info.value) == (f"anthropic: HTTP 404 NotFoundError: Not Found (POST {url}/v1/v1/messages; "
                               "the anthropic SDK adds /v1/messages itself: give the base URL without /v1)")


def test_tool_input_handed_on_as_a_string_is_judged_as_the_models_text(request_) -> None:
    """A proxy that could not parse the model's tool arguments passes them on as a string. Encoded
    once more, a valid answer became '"{\\"ranked\\"...' and every re-ask failed with "text before
    the JSON object: '\\"'"; a broken one never said it was truncated."""
    from rag_rerank.guard.output import judge
    from rag_rerank.retry import RetryPolicy, call_with_retries

    whole = json.dumps(ANSWER)
    with FakeLLM([Reply.anthropic_tool(whole), Reply.anthropic_tool(whole[:50])]) as srv:
        backend = AnthropicBackend(base_url=srv.anthropic_url, api_key=KEY)
        outcome = call_with_retries(backend, request_, render(request_), guard_top_k=3,
                                    policy=RetryPolicy(sleep=lambda s: None))
        assert outcome.obj == ANSWER and len(srv.requests) == 1
        cut = backend.complete("P", request_, max_tokens=50)
    assert cut.text == whole[:50]
    _, violations = judge(cut.text, request_.chunks, 3)
    assert "truncated or unterminated JSON" in str(violations[0])


def _message(content: object, **fields: object) -> Reply:
    body = {"id": "msg_x", "type": "message", "role": "assistant", "model": "c", "content": content,
            "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1}}
    return Reply(200, {**body, **fields})


def test_malformed_messages_are_named_not_internal_errors(request_) -> None:
    """The SDK builds a Message from any JSON: a text block with `"text": null` raised TypeError in
    the join (CLI: internal error, exit 4); `content: null` was 'not an Anthropic Messages response
    (it looks like 'message')'; an error object sent with HTTP 200 (a proxy) was fatal and said only
    "it looks like 'error'", even for `overloaded_error`, which the API sends as a retryable 529."""
    from rag_rerank.retry import RetryPolicy, call_with_retries

    overloaded = Reply(200, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    denied = Reply(200, {"type": "error", "error": {"type": "permission_error", "message": "no access"}})
    with FakeLLM([_message([{"type": "text", "text": None}]), _message(None), denied, overloaded,
                  Reply.anthropic_tool(ANSWER)]) as srv:
        backend = AnthropicBackend(base_url=srv.anthropic_url, api_key=KEY)
        assert backend.complete("P", request_, max_tokens=50).text == ""  # the guard: 'output is empty'
        with pytest.raises(FatalFailure, match=r"not an Anthropic Messages response \(a message whose "
                                               r"content is not a list of blocks\)"):
            backend.complete("P", request_, max_tokens=50)
        with pytest.raises(FatalFailure) as info:
            backend.complete("P", request_, max_tokens=50)
        assert str(info.value) == ("anthropic: the server answered HTTP 200 with an error: permission_error: "
                                   "no access")
        outcome = call_with_retries(backend, request_, render(request_), guard_top_k=3,
                                    policy=RetryPolicy(sleep=lambda s: None))
    assert outcome.obj == ANSWER and [a.kind for a in outcome.attempts] == ["transient", "ok"]
    assert "overloaded_error: Overloaded" in outcome.attempts[0].detail
