"""Tool definitions generated from the card, the committed copies, and `call_tool`.

The round trips use the real `openai` and `anthropic` SDKs against the local fake server on
127.0.0.1: the SDK must send our definition intact, and the tool call it parses from the
server's answer must run through `call_tool`.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import anthropic
import openai
import pytest
from jsonschema import Draft202012Validator

from rag_rerank.errors import InputError
from rag_rerank.guard.limits import load_limits
from rag_rerank.paths import guard_dir
from rag_rerank.skill import SkillCard
from rag_rerank.tools import (
    MAX_VIOLATIONS,
    TOOL_FILES,
    anthropic_tool,
    call_tool,
    dumps,
    generated,
    main,
    openai_tool,
    parameters_schema,
    write_tool_files,
)
from tests.support.fake_llm import FakeLLM, Reply


def _args(card: SkillCard, name: str = "happy-path", *, strict: bool = False) -> dict[str, Any]:
    """An example's arguments; `strict` adds null for every other input, as OpenAI strict mode sends."""
    ex = card.example(name)
    chunks = [json.loads(line) for line in ex.chunks.splitlines() if line.strip()]
    args = {"query": ex.query, "chunks": chunks, "top_k": ex.top_k, "lambda": ex.lambda_}
    return {**{spec.name: None for spec in card.inputs}, **args} if strict else args


def _objects(schema: Any) -> list[dict[str, Any]]:
    """Every sub-schema of type object, recursively."""
    out = []
    if isinstance(schema, dict):
        types = schema.get("type")
        if types == "object" or (isinstance(types, list) and "object" in types):
            out.append(schema)
        for value in schema.values():
            out += _objects(value)
    elif isinstance(schema, list):
        for value in schema:
            out += _objects(value)
    return out


# --- generation from the card -------------------------------------------------------------------


def test_committed_definitions_match_the_card() -> None:
    """No drift: guard/tools/*.json is exactly what the card generates today."""
    for kind, definition in generated().items():
        path = guard_dir() / "tools" / TOOL_FILES[kind]
        assert path.is_file(), f"{path} missing: run python -m rag_rerank.tools --write"
        assert path.read_text(encoding="utf-8") == dumps(definition), (
            f"{path} is stale: run python -m rag_rerank.tools --write"
        )
    assert main(["--check"]) == 0


def test_check_detects_a_stale_file(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import rag_rerank.tools as tools

    (tmp_path / "tools").mkdir()
    written = write_tool_files(tmp_path / "tools")
    assert {p.name for p in written} == set(TOOL_FILES.values())
    written[0].write_text(written[0].read_text().replace("rerank_chunks", "rerank_chunkz"))
    monkeypatch.setattr(tools, "guard_dir", lambda: tmp_path)
    assert main(["--check"]) == 1


def test_names_descriptions_and_defaults_come_from_the_card(card: SkillCard) -> None:
    oa, an = openai_tool(card), anthropic_tool(card)
    assert oa["function"]["name"] == an["name"] == card.tool_name
    assert oa["function"]["description"] == an["description"] == card.description
    for spec in card.inputs:
        assert spec.name in oa["function"]["parameters"]["properties"]
        prop = an["input_schema"]["properties"][spec.name]
        assert spec.description.split()[0] in prop["description"]
        if spec.default is not None:
            assert prop["default"] == spec.default
            assert (
                f"default, {spec.default}"
                in oa["function"]["parameters"]["properties"][spec.name]["description"]
            )
    assert an["input_schema"]["required"] == [s.name for s in card.inputs if s.required]
    # more than max_chunks only with window_size, which the input guard checks
    assert an["input_schema"]["properties"]["chunks"]["maxItems"] == load_limits().max_total_chunks
    assert an["input_schema"]["properties"]["window_size"]["maximum"] == load_limits().max_chunks


def test_definitions_are_valid_json_schema(card: SkillCard) -> None:
    for strict, schema in ((True, openai_tool(card)["function"]["parameters"]),
                           (False, anthropic_tool(card)["input_schema"])):
        Draft202012Validator.check_schema(schema)
        validator = Draft202012Validator(schema)
        assert validator.is_valid(_args(card, strict=strict))
        assert not validator.is_valid({**_args(card, strict=strict), "extra": 1})
        assert not validator.is_valid({**_args(card, strict=strict), "chunks": [{"id": "a"}]})
    loose = anthropic_tool(card)["input_schema"]
    assert Draft202012Validator(loose).is_valid({**_args(card), "window_size": 20})
    assert not Draft202012Validator(loose).is_valid({**_args(card), "window_size": 51})


def test_openai_definition_is_strict_mode_compatible(card: SkillCard) -> None:
    """Strict mode: every object closed, every property required, optional ones nullable."""
    fn = openai_tool(card)["function"]
    assert fn["strict"] is True
    objects = _objects(fn["parameters"])
    assert len(objects) >= 2  # the arguments and a chunk record
    for obj in objects:
        assert obj["additionalProperties"] is False
        assert sorted(obj["required"]) == sorted(obj["properties"])
    props = fn["parameters"]["properties"]
    for spec in card.inputs:
        nullable = isinstance(props[spec.name]["type"], list) and "null" in props[spec.name]["type"]
        assert nullable == (not spec.required), spec.name
    # Strict mode with nulls: the defaults still apply.
    assert Draft202012Validator(fn["parameters"]).is_valid(
        {**_args(card, strict=True), "top_k": None, "lambda": None})
    # A closed choice stays closed in strict mode: null or one of the card's values.
    assert not Draft202012Validator(fn["parameters"]).is_valid(
        {**_args(card, strict=True), "missing_meta": "sideways"})


def test_anthropic_schema_states_the_ranges(card: SkillCard) -> None:
    props = anthropic_tool(card)["input_schema"]["properties"]
    v = Draft202012Validator(anthropic_tool(card)["input_schema"])
    assert not v.is_valid({**_args(card), "top_k": 0})
    assert not v.is_valid({**_args(card), "lambda": 1.5})
    assert not v.is_valid({**_args(card), "chunks": []})
    assert props["lambda"]["minimum"] == 0 and props["lambda"]["maximum"] == 1


def test_strict_false_lets_optional_arguments_be_omitted(card: SkillCard) -> None:
    schema = parameters_schema(card, strict=False)
    args = _args(card)
    del args["top_k"], args["lambda"]
    assert Draft202012Validator(schema).is_valid(args)


# --- call_tool -------------------------------------------------------------------------------


def _violations(result: dict[str, Any]) -> list[dict[str, Any]]:
    assert set(result) == {"error"}, result
    assert result["error"]["type"] == "invalid_input"
    return result["error"]["violations"]


def test_call_tool_happy_path_returns_the_result_object(card: SkillCard) -> None:
    args = _args(card)
    result = call_tool(args)
    assert set(result) == {"ranked", "dropped"}
    ids = [c["id"] for c in args["chunks"]]
    assert sorted([r["id"] for r in result["ranked"]] + [d["id"] for d in result["dropped"]]) == sorted(ids)
    assert 1 <= len(result["ranked"]) <= args["top_k"]
    assert all(0.0 <= r["score"] <= 1.0 and r["reason"] for r in result["ranked"])
    # A JSON string (what a model emits) and nulls for the optional arguments work the same way.
    same = call_tool(json.dumps({**args, "top_k": None, "lambda": None}))
    assert "error" not in same and len(same["ranked"]) <= card.default("top_k")


@pytest.mark.parametrize(
    ("arguments", "paths"),
    [
        ("{not json", ["arguments"]),
        ("[1, 2]", ["arguments"]),
        (42, ["arguments"]),
        ({"chunks": [{"id": "a", "text": "x"}]}, ["query"]),
        ({"query": "q"}, ["chunks"]),
        ({"query": "q", "chunks": "{}", "colour": "red"}, ["colour"]),
        ({"query": "q", "chunks": {"id": "a"}}, ["chunks"]),
        ({"query": "q", "chunks": [{"id": "a", "text": "x"}], "top_k": 0}, ["top_k"]),
        ({"query": "q", "chunks": [{"id": "a", "text": "x"}], "lambda": 2}, ["lambda"]),
        ({"query": "  ", "chunks": [{"id": "a", "text": "x"}]}, ["query"]),
        ({"query": "q", "chunks": [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]}, ["chunks"]),
        ({"query": "q", "chunks": [{"id": "a"}]}, ["chunks[0].text"]),
        ({"query": "q", "chunks": [{"id": "", "text": "x"}]}, ["chunks[0].id"]),
    ],
)
def test_call_tool_names_the_field_and_never_raises(arguments: Any, paths: list[str]) -> None:
    got = [v["path"] for v in _violations(call_tool(arguments))]
    for p in paths:
        assert any(g.startswith(p) for g in got), (p, got)
    for v in _violations(call_tool(arguments)):
        assert v["message"]


def test_call_tool_over_the_chunk_limit_names_the_limit() -> None:
    n = load_limits().max_chunks + 1
    chunks = [{"id": f"c{i}", "text": f"text {i}"} for i in range(n)]
    (v,) = [v for v in _violations(call_tool({"query": "q", "chunks": chunks})) if v["path"] == "chunks"]
    assert str(n) in v["message"] and "max_chunks" in v["message"]


def test_call_tool_reports_a_backend_failure_as_an_error_object(card: SkillCard) -> None:
    with FakeLLM(handler=lambda req: Reply.openai_error(401, "bad key", type_="authentication_error")) as srv:
        result = call_tool(
            _args(card), backend="openai", base_url=srv.openai_url, api_key="sk-test-secret", model="fake-gpt"
        )
    assert result["error"]["type"] == "backend_failure"
    assert "sk-test-secret" not in json.dumps(result)


# --- round trips through the real SDKs ----------------------------------------------------------


def _openai_tool_call_reply(arguments: str) -> Reply:
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "fake-gpt",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "rerank_chunks", "arguments": arguments},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
    }
    return Reply(200, body)


def test_openai_sdk_sends_the_definition_intact_and_the_call_runs(card: SkillCard) -> None:
    args = _args(card)
    tool = openai_tool(card)
    with FakeLLM([_openai_tool_call_reply(json.dumps(args))]) as srv:
        client = openai.OpenAI(base_url=srv.openai_url, api_key="x", max_retries=0)
        completion = client.chat.completions.create(
            model="fake-gpt",
            messages=[{"role": "user", "content": args["query"]}],
            tools=[tool],
            tool_choice={"type": "function", "function": {"name": card.tool_name}},
        )
        sent = srv.requests[0].body
    assert sent["tools"] == [tool]
    call = completion.choices[0].message.tool_calls[0]
    assert call.function.name == card.tool_name
    result = call_tool(call.function.arguments)
    assert "error" not in result
    assert {r["id"] for r in result["ranked"]} <= {c["id"] for c in args["chunks"]}


def test_openai_sdk_bad_tool_call_comes_back_as_fixable_error(card: SkillCard) -> None:
    bad = json.dumps({"query": "q", "chunks": [{"id": "a", "text": "x"}], "top_k": -1, "lambda": None})
    with FakeLLM([_openai_tool_call_reply(bad)]) as srv:
        client = openai.OpenAI(base_url=srv.openai_url, api_key="x", max_retries=0)
        completion = client.chat.completions.create(
            model="fake-gpt", messages=[{"role": "user", "content": "q"}], tools=[openai_tool(card)]
        )
    got = call_tool(completion.choices[0].message.tool_calls[0].function.arguments)
    assert [v["path"] for v in _violations(got)] == ["top_k"]


def test_anthropic_sdk_sends_the_definition_intact_and_the_call_runs(card: SkillCard) -> None:
    args = _args(card)
    tool = anthropic_tool(card)
    with FakeLLM([Reply.anthropic_tool(args, name=card.tool_name)]) as srv:
        client = anthropic.Anthropic(base_url=srv.anthropic_url, api_key="x", max_retries=0)
        message = client.messages.create(
            model="fake-claude",
            max_tokens=256,
            messages=[{"role": "user", "content": args["query"]}],
            tools=[tool],
            tool_choice={"type": "tool", "name": card.tool_name},
        )
        sent = srv.requests[0].body
    assert sent["tools"] == [tool]
    (block,) = [b for b in message.content if b.type == "tool_use"]
    assert block.name == card.tool_name
    result = call_tool(block.input)
    assert "error" not in result
    assert {r["id"] for r in result["ranked"]} <= {c["id"] for c in args["chunks"]}


def test_property_call_tool_never_raises_for_any_json_arguments() -> None:
    hypothesis = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")
    scalars = (
        st.none() | st.booleans() | st.integers(-3, 60) | st.floats(allow_nan=True) | st.text(max_size=8)
    )
    json_values = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_leaves=8,
    )
    chunk = st.fixed_dictionaries(
        {}, optional={"id": json_values | st.text(max_size=4), "text": json_values | st.text(max_size=30)}
    )
    arguments = st.fixed_dictionaries(
        {},
        optional={
            "query": json_values | st.text(max_size=20),
            "chunks": st.lists(chunk, max_size=4) | json_values,
            "top_k": json_values,
            "lambda": json_values,
            "extra": json_values,
        },
    )

    @hypothesis.settings(max_examples=100)
    @hypothesis.given(args=arguments | json_values, as_text=st.booleans())
    def check(args: Any, as_text: bool) -> None:
        result = call_tool(json.dumps(args) if as_text else args)
        assert isinstance(result, dict)
        assert set(result) in ({"ranked", "dropped"}, {"error"})
        if "error" in result and result["error"]["type"] == "invalid_input":
            assert all(v["path"] and v["message"] for v in result["error"]["violations"])

    check()


def test_call_tool_deeply_nested_json_string_is_an_error_not_a_crash() -> None:
    # A model (or an attacker) can emit a JSON string nested deeper than Python's recursion limit.
    deep = "[" * 100_000 + "]" * 100_000
    (v,) = _violations(call_tool(deep))
    assert v["path"] == "arguments" and "nested too deeply" in v["message"]


def test_call_tool_caps_the_violation_list_and_keeps_the_limit_first() -> None:
    """Regression: 20,000 bad records came back as 40,001 violations (megabytes a calling model
    would have to read), with the one that matters, the chunk limit, last."""
    chunks = [{"id": i} for i in range(20_000)]
    got = _violations(call_tool({"query": "q", "chunks": chunks}))
    assert len(got) == MAX_VIOLATIONS
    assert "max_chunks" in got[0]["message"]
    assert got[-1]["path"] == "arguments" and str(40_001 - (MAX_VIOLATIONS - 1)) in got[-1]["message"]
    assert any(v["path"] == "chunks[0].id" for v in got)


# --- issue 15 -------------------------------------------------------------------------------------------


def test_anthropic_and_mcp_schema_accept_the_null_their_descriptions_promise(card: SkillCard) -> None:
    schema = anthropic_tool(card)["input_schema"]
    v = Draft202012Validator(schema)
    for name in ("top_k", "lambda"):
        assert "Null means the default" in schema["properties"][name]["description"]
        assert v.is_valid({**_args(card), name: None}), name
    assert not v.is_valid({**_args(card), "query": None})  # required: no null
    result = call_tool({**_args(card), "top_k": None, "lambda": None})
    assert "error" not in result and len(result["ranked"]) <= load_limits().default_top_k


def test_call_tool_answers_an_existing_and_a_missing_path_alike(tmp_path: Any) -> None:
    """No file-existence oracle, and no advice only a Python caller could follow."""
    from pathlib import Path

    real = Path(tmp_path) / "secret.jsonl"
    real.write_text('{"id": "a", "text": "x"}\n', encoding="utf-8")
    answers = []
    for path in (str(real), str(Path(tmp_path) / "missing.jsonl"), "/etc/shadow"):
        out = call_tool({"query": "q", "chunks": path})
        assert out["error"]["type"] == "invalid_input"
        answers.append(re.sub(r"'[^']*'", "'PATH'", json.dumps(out)))  # the echoed (cut) line
    assert answers[0] == answers[1] == answers[2]
    assert "pathlib" not in answers[0] and "file name" not in answers[0]


def test_call_tool_over_the_chunk_limit_advises_the_tools_own_argument_not_a_cli_flag() -> None:
    """Regression: a calling model was told "(CLI --window-size N ...)", a flag it cannot pass."""
    lim = load_limits()
    chunks = [{"id": f"c{i}", "text": f"text {i}"} for i in range(lim.max_chunks + 1)]
    (v,) = [v for v in _violations(call_tool({"query": "q", "chunks": chunks})) if v["path"] == "chunks"]
    assert "window_size" in v["message"] and f"at most {lim.max_chunks}" in v["message"]
    assert "CLI" not in v["message"] and "--" not in v["message"]
    # and the CLI wording is back for a Python caller afterwards
    from rag_rerank import rerank

    with pytest.raises(InputError) as err:
        rerank("q", chunks)
    assert "--window-size" in str(err.value)


def test_call_tool_takes_chunks_sent_as_the_json_text_of_an_array(card: SkillCard) -> None:
    """Regression: a model that JSON-encoded the chunks array as a string was told to "convert a
    file with jq -c '.[]'", advice for a command line, not for a tool call."""
    args = _args(card)
    as_text = call_tool({**args, "chunks": json.dumps(args["chunks"])})
    assert as_text == call_tool(args) and "ranked" in as_text
    # text that is not one array (or an array with a repeated key) is still judged by the guard
    (v,) = _violations(call_tool({**args, "chunks": '[{"id": "a", "id": "b", "text": "x"}]'}))
    assert v["path"].startswith("chunks")


@pytest.mark.parametrize(("options", "named"), [({"backend": "cross-encoder"}, "model"),
                                                 ({"backend": "rerank-api"}, "base_url"),
                                                 ({"embedder": "bogus"}, "embedder")])
def test_call_tool_reports_the_operators_options_as_a_misconfiguration_not_invalid_input(
    card: SkillCard, options: dict[str, Any], named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a missing cross-encoder model or rerank-API URL came back to the calling model as
    `invalid_input` on `model` / `base_url`, arguments it does not have, inviting it to retry."""
    monkeypatch.delenv("RERANK_BASE_URL", raising=False)
    result = call_tool(_args(card), **options)
    assert result["error"]["type"] == "error"
    assert "misconfigured" in result["error"]["message"] and f"{named}: " in result["error"]["message"]
    # the caller's own mistakes are still invalid_input, naming the argument
    bad = call_tool({**_args(card), "top_k": 0}, **options)
    assert bad["error"]["type"] == "invalid_input"
    assert [v["path"] for v in bad["error"]["violations"]] == ["top_k"]
