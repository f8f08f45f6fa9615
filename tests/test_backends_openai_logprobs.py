"""Log-probability scoring (`OpenAIBackend(scoring=...)`) with the real openai SDK over HTTP against
the scripted server on 127.0.0.1: what is asked per chunk, how p(yes) becomes the score, the answer
passing the output guard by construction, and the negotiation with a server without logprobs."""

from __future__ import annotations

import asyncio
import json
import math
import re

import pytest

from rag_rerank import Reranker
from rag_rerank.backends.openai import (
    NOT_SCORED,
    TOP_LOGPROBS,
    OpenAIBackend,
    forget_modes,
    remembered_scoring,
    yes_probability,
)
from rag_rerank.cli import main
from rag_rerank.errors import BackendError, InputError
from rag_rerank.guard import check_output, validate_request
from rag_rerank.render import render, render_relevance
from rag_rerank.skill import load_skill
from tests.support.fake_llm import FakeLLM, RecordedRequest, Reply

# p(yes) the scripted model gives each chunk of the card's happy-path example
P_YES = {"c1": 0.30, "c2": 0.70, "c3": 0.95, "c4": 0.60, "c5": 0.02}


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    forget_modes()


@pytest.fixture()
def request_():
    ex = load_skill().example("happy-path")
    return validate_request(ex.query, ex.chunks, ex.top_k, ex.lambda_)


def _chunk_id(req: RecordedRequest) -> str:
    found = re.search(r"<passage>(.*?)</passage>", req.prompt, re.DOTALL)
    assert found, req.prompt
    return str(json.loads(found.group(1))["id"])


def judge(p_yes: dict[str, float], *, legacy: bool = False):
    """A handler answering each yes/no question with the chunk's p(yes) as log-probabilities
    (" Yes" and "no" among other tokens, as a real tokenizer spells them)."""

    def handle(req: RecordedRequest) -> Reply:
        p = p_yes[_chunk_id(req)]
        return Reply.openai_logprobs({" Yes": math.log(p * 0.9), "yes": math.log(p * 0.1),
                                      "no": math.log((1 - p) * 0.95), "The": math.log(0.01)}, legacy=legacy)

    return handle


def test_one_yes_no_question_per_chunk_and_p_yes_is_the_score(request_) -> None:
    with FakeLLM(handler=judge(P_YES)) as srv:
        backend = OpenAIBackend(model="m", base_url=srv.openai_url, scoring="logprobs")
        out = backend.complete(render(request_), request_, max_tokens=512)
    assert len(srv.requests) == len(request_.chunks)
    assert sorted(_chunk_id(r) for r in srv.requests) == sorted(request_.ids)
    for req in srv.requests:
        body = req.body
        assert body["max_tokens"] == 1 and body["logprobs"] is True and body["top_logprobs"] == TOP_LOGPROBS
        assert body["temperature"] == 0.0 and "response_format" not in body
        chunk = next(c for c in request_.chunks if c.id == _chunk_id(req))
        assert req.prompt == render_relevance(request_.query, chunk)
    obj = check_output(out.text, request_.chunks, request_.top_k, query=request_.query)  # guard-valid
    scores = {r["id"]: r["score"] for r in obj["ranked"]}
    # p(yes) = (0.9p + 0.1p) / (p + 0.95(1-p)) for each chunk: the yes tokens summed, then normalised
    for cid, score in scores.items():
        p = P_YES[cid]
        assert score == pytest.approx(p / (p + 0.95 * (1 - p)), abs=1e-6)
    assert [r["id"] for r in obj["ranked"]] == ["c3", "c2", "c4"]
    assert {d["id"]: d["reason"] for d in obj["dropped"]}["c5"].startswith("below_min_score: ")
    assert all("p(yes)" in r["reason"] for r in obj["ranked"])
    assert backend.scored is True
    assert out.usage["completion_tokens"] == len(request_.chunks)


def test_the_completions_form_of_logprobs_is_read_too(request_) -> None:
    with FakeLLM(handler=judge(P_YES, legacy=True)) as srv:
        backend = OpenAIBackend(model="m", base_url=srv.openai_url, scoring="logprobs")
        out = backend.complete(render(request_), request_, max_tokens=512)
    ranked = json.loads(out.text)["ranked"]
    assert [r["id"] for r in ranked] == ["c3", "c2", "c4"]


def test_async_path_asks_the_same_questions(request_) -> None:
    with FakeLLM(handler=judge(P_YES)) as srv:
        backend = OpenAIBackend(model="m", base_url=srv.openai_url, scoring="logprobs")

        async def run() -> str:
            try:
                return (await backend.acomplete(render(request_), request_, max_tokens=512)).text
            finally:
                await backend.aclose()

        text = asyncio.run(run())
        sync_text = backend.complete(render(request_), request_, max_tokens=512).text
    assert text == sync_text
    assert len(srv.requests) == 2 * len(request_.chunks)


def test_a_chunk_without_yes_or_no_among_the_top_tokens_is_left_unscored(request_) -> None:
    def handle(req: RecordedRequest) -> Reply:
        if _chunk_id(req) == "c3":
            return Reply.openai_logprobs({"The": -0.1, "IVF": -2.5})
        return judge(P_YES)(req)

    with FakeLLM(handler=handle) as srv:
        backend = OpenAIBackend(model="m", base_url=srv.openai_url, scoring="logprobs")
        out = backend.complete(render(request_), request_, max_tokens=512)
    obj = check_output(out.text, request_.chunks, request_.top_k)
    assert {d["id"]: d["reason"] for d in obj["dropped"]}["c3"] == NOT_SCORED
    assert any("1 of 5 chunks had neither yes nor no" in n for n in out.notes)


def test_a_server_without_logprobs_is_a_clear_fatal_failure_when_they_were_asked_for(request_) -> None:
    with (FakeLLM(handler=lambda req: Reply.openai_text("yes")) as srv,
          Reranker(backend="openai", base_url=srv.openai_url, model="m",
                   backend_options={"scoring": "logprobs"}) as reranker,
          pytest.raises(BackendError) as info):
        reranker.rerank(request_.query, list(request_.chunks), top_k=3)
    message = str(info.value)
    assert "scoring='logprobs' needs token log-probabilities" in message
    assert "answered without them" in message and "scoring='listwise'" in message
    assert len(info.value.attempts) == 1  # fatal: not retried


def test_a_server_refusing_logprobs_is_named_too(request_) -> None:
    refusal = Reply.openai_error(400, "logprobs is not supported by this model")
    with FakeLLM(handler=lambda req: refusal) as srv:
        backend = OpenAIBackend(model="m", base_url=srv.openai_url, scoring="logprobs")
        with pytest.raises(Exception, match=r"refused them \(HTTP 400: logprobs is not supported"):
            backend.complete(render(request_), request_, max_tokens=512)


def listwise_or_plain(req: RecordedRequest) -> Reply:
    """A server without logprobs: it answers the listwise task, and a yes/no question with a word."""
    if "<passage>" in req.prompt:
        return Reply.openai_text("yes")
    return Reply.openai_text(json.dumps({"ranked": [{"id": "c3", "score": 0.9, "reason": "IVF when index "
                                                     "memory is constrained"}], "dropped": []}))


@pytest.mark.parametrize("refusal", [False, True])
def test_auto_probes_once_then_falls_back_to_the_listwise_prompt_and_remembers(request_, refusal: bool
                                                                                ) -> None:
    def handle(req: RecordedRequest) -> Reply:
        if refusal and req.body.get("logprobs"):
            return Reply.openai_error(422, "unsupported parameter: logprobs")
        return listwise_or_plain(req)

    with FakeLLM(handler=handle) as srv:
        backend = OpenAIBackend(model="m", base_url=srv.openai_url, scoring="auto")
        first = backend.complete(render(request_), request_, max_tokens=512)
        # one probe, then the listwise prompt
        assert [bool(r.body.get("logprobs")) for r in srv.requests] == [True, False]
        assert remembered_scoring(backend.base_url) == "listwise" and backend.scored is False
        assert any("scoring='auto' uses the listwise prompt" in n for n in first.notes)
        second = backend.complete(render(request_), request_, max_tokens=512)
    assert [bool(r.body.get("logprobs")) for r in srv.requests] == [True, False, False]  # no probe again
    assert json.loads(second.text)["ranked"][0]["id"] == "c3"


def test_auto_keeps_logprobs_when_the_server_returns_them(request_) -> None:
    with FakeLLM(handler=judge(P_YES)) as srv:
        backend = OpenAIBackend(model="m", base_url=srv.openai_url, scoring="auto")
        assert backend.scored is False  # not known before the first call
        backend.complete(render(request_), request_, max_tokens=512)
        assert remembered_scoring(backend.base_url) == "logprobs" and backend.scored is True
    assert len(srv.requests) == len(request_.chunks)  # the probe is the first chunk's own question


def test_listwise_is_the_default_and_never_asks_for_logprobs(request_) -> None:
    with FakeLLM(handler=listwise_or_plain) as srv:
        backend = OpenAIBackend(model="m", base_url=srv.openai_url)
        backend.complete(render(request_), request_, max_tokens=512)
    assert backend.scoring == "listwise" and backend.scored is False
    assert [bool(r.body.get("logprobs")) for r in srv.requests] == [False]


def test_through_a_session_the_result_keeps_the_contract(request_) -> None:
    with (FakeLLM(handler=judge(P_YES)) as srv,
          Reranker(backend="openai", base_url=srv.openai_url, model="m",
                   backend_options={"scoring": "logprobs"}) as reranker):
        result = reranker.rerank(request_.query, list(request_.chunks), top_k=2)
        again = asyncio.run(reranker.arerank(request_.query, list(request_.chunks), top_k=2))
    assert result.to_dict() == again.to_dict()
    assert result.meta.attempts == 1
    ids = [r.id for r in result.ranked] + [d.id for d in result.dropped]
    assert sorted(ids) == sorted(request_.ids) and len(result.ranked) == 2


def test_bad_scoring_value_is_an_input_error() -> None:
    with pytest.raises(InputError, match="scoring: must be one of listwise, logprobs, auto"):
        OpenAIBackend(model="m", base_url="http://127.0.0.1:9/v1", scoring="yes-no")


def test_yes_probability_reads_the_token_variants() -> None:
    lp = {"content": [{"token": "Yes", "logprob": math.log(0.5),
                       "top_logprobs": [{"token": "Yes", "logprob": math.log(0.5)},
                                        {"token": " yes.", "logprob": math.log(0.1)},
                                        {"token": "NO", "logprob": math.log(0.2)},
                                        {"token": "Maybe", "logprob": math.log(0.2)}]}]}
    assert yes_probability(lp) == pytest.approx(0.6 / 0.8)
    assert yes_probability({"top_logprobs": [{"no": -0.1, "x": -3.0}]}) == pytest.approx(0.0)
    assert yes_probability({"content": [{"token": "The", "logprob": -0.1, "top_logprobs": []}]}) is None
    assert yes_probability(None) is None


def test_the_cli_flag_reaches_the_backend_and_is_refused_for_other_backends(capsys, tmp_path) -> None:
    chunks = tmp_path / "c.jsonl"
    chunks.write_text("\n".join(json.dumps({"id": c.id, "text": c.text})
                                for c in validate_request("q", load_skill().example("happy-path").chunks, 3,
                                                          0.7).chunks), encoding="utf-8")
    query = load_skill().example("happy-path").query
    with FakeLLM(handler=judge(P_YES)) as srv:
        code = main(["rerank", "-q", query, "-c", str(chunks), "-k", "2", "--backend", "openai",
                     "--base-url", srv.openai_url, "--model", "m", "--scoring", "logprobs"])
    assert code == 0, capsys.readouterr().err
    assert all(r.body.get("logprobs") for r in srv.requests)
    assert [r["id"] for r in json.loads(capsys.readouterr().out)["ranked"]] == ["c3", "c2"]
    assert main(["rerank", "-q", "x", "-c", str(chunks), "--scoring", "logprobs"]) == 2
    assert "--scoring applies to --backend openai only" in capsys.readouterr().err
