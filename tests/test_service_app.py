"""The rerank service answers Cohere's rerank API to clients we did not write, over real HTTP.

Each test starts the real app on uvicorn on 127.0.0.1 (`tests/support/service.py`) and calls it
with the `cohere` SDK (ClientV2 and the v1 Client), LiteLLM, LangChain's, LlamaIndex's and
Haystack's Cohere rerank components, and our own `rerank-api` backend. An LLM-backed model talks to
the local fake LLM server (`tests/support/fake_llm.py`); nothing leaves 127.0.0.1.

What is checked is what a client relies on: the result indexes and scores are exactly what a
`Reranker` session gives for the same request (the service translates, it does not rank), `meta`
carries the real token usage, our extras sit under `rag_rerank`, and every refusal has its status,
a Cohere-style body naming the field, index or limit, and no stack trace or key.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

from rag_rerank import Reranker  # noqa: E402
from rag_rerank.service.app import create_app  # noqa: E402
from rag_rerank.service.config import parse_config  # noqa: E402
from tests.support.fake_llm import FakeLLM, Reply, auto_ranker  # noqa: E402
from tests.support.service import openai_model, running  # noqa: E402

pytestmark = pytest.mark.timeout(120)
# Haystack reports usage to its servers unless told not to (read when haystack is imported).
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

QUERY = "What is the capital of the United States?"
DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "The Commonwealth of the Northern Mariana Islands is a group of islands in the Pacific Ocean. "
    "Its capital is Saipan.",
    "Capitalization in English grammar is the use of a capital letter at the start of a word.",
    "Washington, D.C. (also known as simply Washington or D.C.) is the capital of the United States. "
    "It is a federal district.",
    "Capital punishment has existed in the United States since before the United States was a country.",
]
KEY = "sk-test-service-key-0123"


def _expected(top_n: int, **session: Any) -> list[tuple[int, float]]:
    """(index, score) in order, from a `Reranker` session given the same request in process."""
    with Reranker(**session) as reranker:
        result = reranker.rerank(
            QUERY, [{"id": str(i), "text": t} for i, t in enumerate(DOCS)], top_n, window_size=50
        )
    return [(int(r.id), r.score) for r in result.ranked]


@pytest.fixture(scope="module")
def local_url() -> Iterator[str]:
    """The service with no config: the offline default under the model name `local`, no keys."""
    with running(create_app()) as url:
        yield url


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeLLM]:
    with FakeLLM(handler=auto_ranker()) as srv:
        yield srv


@pytest.fixture(scope="module")
def llm_url(llm: FakeLLM) -> Iterator[str]:
    """Two models: `local`, and `llm` (the openai backend against the fake LLM server), behind a key."""
    os.environ["SERVICE_TEST_UPSTREAM_KEY"] = "sk-upstream-secret-9876"
    config = parse_config(
        {
            "models": {
                "local": {},
                "llm": openai_model(llm.openai_url, "SERVICE_TEST_UPSTREAM_KEY"),
            },
            "keys": [{"key": KEY, "name": "tests"}],
        }
    )
    with running(create_app(config)) as url:
        yield url


# --------------------------------------------------------------------------- the cohere SDK


def test_cohere_client_v2_gets_the_sessions_ranking(local_url: str) -> None:
    cohere = pytest.importorskip("cohere")
    client = cohere.ClientV2(api_key="any", base_url=local_url)
    response = client.rerank(model="local", query=QUERY, documents=DOCS, top_n=3)
    assert [(r.index, r.relevance_score) for r in response.results] == _expected(3)
    assert response.results[0].index == 3  # Washington, D.C.
    assert response.meta.api_version.version == "2"
    # Cohere's unit: one search per query of up to 100 documents, whoever scored (RerankResult.to_cohere)
    assert response.meta.billed_units.search_units == 1
    assert response.meta.billed_units.input_tokens == 0  # the local backend sends no request
    assert response.meta.tokens.input_tokens == 0 and response.meta.tokens.output_tokens == 0
    ours = response.model_extra["rag_rerank"]  # our extras: one key the SDK keeps aside
    kept, dropped = {r["index"] for r in ours["ranked"]}, {d["index"] for d in ours["dropped"]}
    assert kept == {r.index for r in response.results} and kept | dropped == set(range(len(DOCS)))
    assert not kept & dropped and all(d["reason"] for d in ours["dropped"])
    assert ours["status"] == "ok" and ours["calls"] == 1


def test_cohere_v1_client_with_document_objects_and_return_documents(local_url: str) -> None:
    cohere = pytest.importorskip("cohere")
    client = cohere.Client(api_key="any", base_url=local_url)
    docs = [{"text": t, "source": f"s{i}"} for i, t in enumerate(DOCS)]
    response = client.rerank(query=QUERY, documents=docs, top_n=2, return_documents=True)  # no model: default
    assert [(r.index, r.relevance_score) for r in response.results] == _expected(2)
    assert response.results[0].document.text == DOCS[response.results[0].index]
    assert response.results[0].document.model_extra == {"source": f"s{response.results[0].index}"}
    assert response.meta.api_version.version == "1"


def test_llm_model_reports_real_token_usage(llm: FakeLLM, llm_url: str) -> None:
    cohere = pytest.importorskip("cohere")
    client = cohere.ClientV2(api_key=KEY, base_url=llm_url)
    before = len(llm.requests)
    response = client.rerank(model="llm", query=QUERY, documents=DOCS, top_n=2)
    calls = llm.requests[before:]
    assert len(calls) == 1 and calls[0].headers["authorization"] == "Bearer sk-upstream-secret-9876"
    # the fake server reports 100 prompt and 20 completion tokens per answer
    assert response.meta.tokens.input_tokens == 100 and response.meta.tokens.output_tokens == 20
    assert response.meta.billed_units.search_units == 1
    assert len(response.results) <= 2 and response.results[0].index == 3
    ours = response.model_extra["rag_rerank"]
    assert ours["backend"] == "openai" and all(r["reason"] for r in ours["ranked"])


# --------------------------------------------------------------------------- other clients


def test_litellm_rerank(local_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # LiteLLM fetches a model price map from the internet at import unless told not to.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = pytest.importorskip("litellm")
    response = litellm.rerank(
        model="cohere/local", query=QUERY, documents=DOCS, top_n=3, api_base=local_url, api_key="any"
    )
    assert [(r["index"], r["relevance_score"]) for r in response.results] == _expected(3)


def test_langchain_cohere_rerank(local_url: str) -> None:
    rerank = pytest.importorskip("langchain_cohere.rerank")
    from langchain_core.documents import Document

    compressor = rerank.CohereRerank(model="local", base_url=local_url, cohere_api_key="any", top_n=2)
    out = compressor.compress_documents(
        [Document(page_content=t, metadata={"i": i}) for i, t in enumerate(DOCS)], QUERY
    )
    expected = _expected(2)
    assert [(d.metadata["i"], d.metadata["relevance_score"]) for d in out] == expected


def test_llama_index_cohere_rerank(local_url: str) -> None:
    base = pytest.importorskip("llama_index.postprocessor.cohere_rerank")
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    reranker = base.CohereRerank(model="local", top_n=2, api_key="any", base_url=local_url)
    nodes = [NodeWithScore(node=TextNode(text=t, id_=str(i)), score=0.0) for i, t in enumerate(DOCS)]
    out = reranker.postprocess_nodes(nodes, QueryBundle(QUERY))
    assert [(int(n.node.node_id), n.score) for n in out] == _expected(2)


def test_haystack_cohere_ranker(local_url: str) -> None:
    ranker_module = pytest.importorskip("haystack_integrations.components.rankers.cohere")
    from haystack import Document
    from haystack.utils import Secret

    ranker = ranker_module.CohereRanker(
        model="local", top_k=2, api_key=Secret.from_token("any"), api_base_url=local_url
    )
    ranker.warm_up()
    out = ranker.run(query=QUERY, documents=[Document(content=t, meta={"i": i}) for i, t in enumerate(DOCS)])
    assert [(d.meta["i"], d.score) for d in out["documents"]] == _expected(2)


def test_our_rerank_api_backend(llm_url: str) -> None:
    # The service is itself a /v1/rerank server: our own rerank-api backend can rank through it.
    with Reranker("rerank-api", model="local", base_url=f"{llm_url}/v1", api_key=KEY) as reranker:
        result = reranker.rerank(QUERY, [{"id": f"d{i}", "text": t} for i, t in enumerate(DOCS)], 2)
    assert result.ids[0] == "d3" and result.meta.backend == "rerank-api"


# --------------------------------------------------------------------------- the endpoints


def test_models_health_ready_metrics_openapi(llm_url: str) -> None:
    with httpx.Client(base_url=llm_url, headers={"Authorization": f"Bearer {KEY}"}) as client:
        models = client.get("/v1/models").json()
        assert [m["name"] for m in models["models"]] == ["local", "llm"]
        assert "sk-upstream" not in json.dumps(models) and "127.0.0.1" not in json.dumps(models)
        assert client.get("/health").json() == {"status": "ok"}
        assert client.get("/ready").status_code == 200
        client.post("/v2/rerank", json={"model": "local", "query": QUERY, "documents": DOCS})
        metrics = client.get("/metrics").text
        assert 'rag_rerank_requests_total{model="local",route="/v2/rerank",status="200"}' in metrics
        assert "rag_rerank_request_seconds_bucket" in metrics
        assert 'rag_rerank_results_total{model="local",status="ok"}' in metrics
        spec = client.get("/openapi.json").json()
        assert {"/v1/rerank", "/v2/rerank", "/v1/models"} <= set(spec["paths"])
        body = spec["paths"]["/v2/rerank"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert {"model", "query", "documents"} <= set(body["required"])


def test_unknown_model_is_404_listing_the_configured_names(llm_url: str) -> None:
    r = httpx.post(
        f"{llm_url}/v2/rerank",
        json={"model": "gpt-9", "query": QUERY, "documents": DOCS},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert r.status_code == 404
    assert "'gpt-9' not found" in r.json()["message"] and r.json()["rag_rerank"]["models"] == ["local", "llm"]


def test_keys_401_and_never_echoed_or_logged(
    llm_url: str, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"model": "local", "query": QUERY, "documents": DOCS}
    caplog.set_level(logging.DEBUG)
    wrong = "sk-wrong-key-should-never-appear"
    for headers in ({}, {"Authorization": f"Bearer {wrong}"}, {"Authorization": f"Basic {KEY}"}):
        r = httpx.post(f"{llm_url}/v2/rerank", json=body, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert wrong not in r.text and KEY not in r.text
    assert httpx.get(f"{llm_url}/v1/models").status_code == 401
    assert (
        httpx.post(f"{llm_url}/v2/rerank", json=body, headers={"Authorization": f"Bearer {KEY}"}).status_code
        == 200
    )
    assert wrong not in caplog.text and KEY not in caplog.text


def test_keys_file_takes_a_key_or_its_sha256(tmp_path: Any) -> None:
    from rag_rerank.service.config import default_config, read_keys_file

    digest = hashlib.sha256(b"second-key").hexdigest()
    path = tmp_path / "keys.txt"
    path.write_text(f"# comment\nfirst-key\n\nsha256:{digest}\n", encoding="utf-8")
    config = default_config().with_keys(read_keys_file(path))
    with running(create_app(config)) as url:
        body = {"model": "local", "query": QUERY, "documents": DOCS[:2]}
        codes = [
            httpx.post(f"{url}/v2/rerank", json=body, headers={"Authorization": f"Bearer {k}"}).status_code
            for k in ("first-key", "second-key", digest, "third-key")
        ]
    assert codes == [200, 200, 401, 401]  # a digest is not itself a key


def test_limits_413_and_400_name_the_index_and_the_limit() -> None:
    config = parse_config({"limits": {"max_body_bytes": 5000, "max_documents": 4, "max_document_chars": 100}})
    with running(create_app(config)) as url:
        big = httpx.post(f"{url}/v2/rerank", json={"model": "local", "query": "q", "documents": ["x" * 6000]})
        assert big.status_code == 413 and "5000 bytes" in big.json()["message"]
        many = httpx.post(f"{url}/v2/rerank", json={"model": "local", "query": "q", "documents": ["a"] * 5})
        assert many.status_code == 400 and "5 documents is over the limit of 4" in many.json()["message"]
        long = httpx.post(
            f"{url}/v2/rerank", json={"model": "local", "query": "q", "documents": ["ok", "y" * 101]}
        )
        assert long.status_code == 400
        assert long.json()["rag_rerank"]["errors"] == [
            {
                "path": "documents[1]",
                "message": "101 characters is over the limit of 100 (max_document_chars)",
            }
        ]
        bad = httpx.post(
            f"{url}/v2/rerank", json={"model": "local", "query": "q", "documents": ["ok", 7, ""]}
        )
        assert bad.status_code == 400
        assert [e["path"] for e in bad.json()["rag_rerank"]["errors"]] == ["documents[1]", "documents[2]"]
        junk = httpx.post(
            f"{url}/v2/rerank", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert junk.status_code == 400 and "not JSON" in junk.json()["message"]
        for r in (big, many, long, bad, junk):
            assert "Traceback" not in r.text and set(r.json()) >= {"id", "message"}


def test_the_library_judges_the_query_and_options_with_the_service_limits() -> None:
    """The query, `top_n` and `max_tokens_per_doc` are judged by the library's rules with the
    service's configured limits, and refused in the client's words: a configured max_query_chars
    over the library's default is the one applied, and a max_tokens_per_doc the library refuses
    names max_tokens_per_doc (the field the client sent), not the library's max_tokens_per_chunk."""
    config = parse_config({"limits": {"max_query_chars": 5000, "max_documents": 3}})
    with running(create_app(config)) as url:
        ask = {"model": "local", "documents": DOCS[:2]}
        long_query = httpx.post(f"{url}/v2/rerank", json={**ask, "query": "q " * 2250})
        assert long_query.status_code == 200, long_query.text
        over = httpx.post(f"{url}/v2/rerank", json={**ask, "query": "q" * 5001})
        assert over.status_code == 400
        assert "over the limit of 5000 (max_query_chars)" in over.json()["message"]
        small = httpx.post(f"{url}/v2/rerank", json={**ask, "query": "q", "max_tokens_per_doc": 8})
        assert small.status_code == 400
        [error] = small.json()["rag_rerank"]["errors"]
        assert error["path"] == "max_tokens_per_doc" and "at least 16" in error["message"], error
        assert "max_tokens_per_chunk" not in small.text
        many = httpx.post(f"{url}/v2/rerank", json={"model": "local", "query": "q", "documents": DOCS[:4]})
        assert many.status_code == 400
        [error] = many.json()["rag_rerank"]["errors"]
        assert error["path"] == "documents"
        assert "4 documents is over the limit of 3 (max_documents)" in error["message"]
        surrogate = httpx.post(
            f"{url}/v2/rerank",
            content=b'{"model": "local", "query": "q\\ud800", "top_n": 0, "documents": ["a"]}',
            headers={"content-type": "application/json"},
        )
        assert surrogate.status_code == 400
        assert [e["path"] for e in surrogate.json()["rag_rerank"]["errors"]] == ["query", "top_n"]


def test_max_tokens_per_doc_is_reported_when_not_applied(local_url: str) -> None:
    from rag_rerank.options import REQUEST_OPTIONS
    from rag_rerank.service.protocol import TRUNCATION_OPTION

    r = httpx.post(
        f"{local_url}/v2/rerank",
        json={"model": "local", "query": QUERY, "documents": DOCS, "max_tokens_per_doc": 64},
    )
    assert r.status_code == 200
    note = r.json()["rag_rerank"]["max_tokens_per_doc"]
    assert note["applied"] is (TRUNCATION_OPTION in REQUEST_OPTIONS) and note["value"] == 64


def test_more_than_one_prompt_of_documents_is_ranked_in_windows(local_url: str) -> None:
    docs = [f"document {i} about the capital of a country number {i}" for i in range(70)]
    r = httpx.post(
        f"{local_url}/v2/rerank",
        json={"model": "local", "query": QUERY, "documents": docs, "top_n": 4},
        timeout=60,
    )
    ours = r.json()["rag_rerank"]
    assert r.status_code == 200 and ours["calls"] == 3  # two windows and the final pass
    assert len(r.json()["results"]) == 4 and len(ours["ranked"]) + len(ours["dropped"]) == 70


def test_cors_is_off_unless_configured(local_url: str) -> None:
    headers = {"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST"}
    assert (
        "access-control-allow-origin" not in httpx.options(f"{local_url}/v2/rerank", headers=headers).headers
    )
    config = parse_config({"cors": {"allow_origins": ["https://app.example.com"]}})
    with running(create_app(config)) as url:
        r = httpx.options(f"{url}/v2/rerank", headers=headers)
    assert r.headers["access-control-allow-origin"] == "https://app.example.com"


# --------------------------------------------------------------------------- budgets, load, upstream


def test_per_key_daily_budget_is_429(tmp_path: Any, llm: FakeLLM) -> None:
    config = parse_config(
        {
            "models": {
                "local": {},
                "llm": openai_model(llm.openai_url, "SERVICE_TEST_UPSTREAM_KEY"),
            },
            "keys": [
                {"key": "small", "budget": {"max_requests": 2}},
                {"key": "tokens", "budget": {"max_tokens": 1}},
            ],
            "ledger": str(tmp_path / "ledger.sqlite3"),
        }
    )
    os.environ.setdefault("SERVICE_TEST_UPSTREAM_KEY", "x")
    with running(create_app(config)) as url:
        body = {"model": "local", "query": QUERY, "documents": DOCS}
        codes = [
            httpx.post(f"{url}/v2/rerank", json=body, headers={"Authorization": "Bearer small"}).status_code
            for _ in range(3)
        ]
        assert codes == [200, 200, 429]
        before = len(llm.requests)
        r = httpx.post(
            f"{url}/v2/rerank", json={**body, "model": "llm"}, headers={"Authorization": "Bearer tokens"}
        )
        assert r.status_code == 429 and "max_tokens=1" in r.json()["message"] and len(llm.requests) == before
        # the local model makes no request and spends no token: within a token budget
        assert (
            httpx.post(f"{url}/v2/rerank", json=body, headers={"Authorization": "Bearer tokens"}).status_code
            == 200
        )


def test_overload_is_429_with_retry_after_and_the_deadline_is_504() -> None:
    os.environ.setdefault("SERVICE_TEST_UPSTREAM_KEY", "x")
    with FakeLLM(handler=auto_ranker(latency=1.5)) as slow:
        model = openai_model(slow.openai_url, "SERVICE_TEST_UPSTREAM_KEY", "m")
        body = {"model": "llm", "query": QUERY, "documents": DOCS}
        config = parse_config(
            {"models": {"llm": model}, "limits": {"max_in_flight": 1, "max_queue": 0, "retry_after_s": 2}}
        )
        with running(create_app(config)) as url:
            results: list[httpx.Response] = []
            first = threading.Thread(
                target=lambda: results.append(httpx.post(f"{url}/v2/rerank", json=body, timeout=60))
            )
            first.start()
            deadline = time.monotonic() + 30
            while not slow.requests and time.monotonic() < deadline:  # the first holds the only slot
                time.sleep(0.02)
            second = httpx.post(f"{url}/v2/rerank", json=body, timeout=60)
            first.join(timeout=60)
            metrics = httpx.get(f"{url}/metrics").text
        assert second.status_code == 429 and second.headers["retry-after"] == "2"
        assert "capacity" in second.json()["message"] and results[0].status_code == 200
        assert 'rag_rerank_refusals_total{reason="overload"} 1.0' in metrics
        config = parse_config({"models": {"llm": model}, "limits": {"deadline_s": 0.5}})
        with running(create_app(config)) as url:
            # the 504 may come late: cancelling waits for what the call runs in a thread (the openai
            # SDK's first request reads the platform there); no timing is asserted
            late = httpx.post(f"{url}/v2/rerank", json=body, timeout=60)
    assert late.status_code == 504 and "deadline of 0.5s" in late.json()["message"]


@pytest.mark.parametrize(
    ("reply", "status", "retry_after"),
    [
        (Reply(503, {"error": {"message": "overloaded"}}, headers={"Retry-After": "7"}), 503, "7"),
        (Reply(401, {"error": {"message": "bad key sk-upstream-secret-9876"}}), 502, None),
    ],
)
def test_upstream_failures_are_gateway_statuses(reply: Reply, status: int, retry_after: str | None) -> None:
    with FakeLLM(handler=lambda req: reply) as upstream:
        where = f"127.0.0.1:{upstream.port}"
        once = {"policy": {"max_attempts": 1}}
        model = openai_model(upstream.openai_url, "SERVICE_TEST_UPSTREAM_KEY", "m", options=once)
        config = parse_config({"models": {"llm": model}})
        os.environ["SERVICE_TEST_UPSTREAM_KEY"] = "sk-upstream-secret-9876"
        with running(create_app(config)) as url:
            r = httpx.post(f"{url}/v2/rerank", json={"model": "llm", "query": QUERY, "documents": DOCS})
    assert r.status_code == status and r.headers.get("retry-after") == retry_after
    assert "upstream" in r.json()["message"] and "sk-upstream" not in r.text and where not in r.text
    assert r.json()["rag_rerank"]["upstream_status"] == reply.status


def test_framework_errors_have_coheres_error_body_and_no_page_loads_from_a_cdn(local_url: str) -> None:
    """QA findings #18 and #19: the router's 404 and 405 come in the same `{"id", "message"}` body
    as every other error (so the cohere SDK raises its typed error), and there is no /docs or /redoc
    page, whose scripts FastAPI loads from a CDN (blank offline); the schema is /openapi.json."""
    import cohere

    wrong_method = httpx.get(f"{local_url}/v2/rerank")
    unknown = httpx.post(f"{local_url}/v3/rerank", json={"model": "local"})
    pages = [httpx.get(f"{local_url}{page}") for page in ("/docs", "/redoc")]
    for r, status in ((wrong_method, 405), (unknown, 404), *((p, 404) for p in pages)):
        assert r.status_code == status and set(r.json()) == {"id", "message"}, r.text
    assert wrong_method.headers["allow"] == "POST" and "use POST" in wrong_method.json()["message"]
    assert "/v2/rerank" in unknown.json()["message"]  # what the service does answer
    schema = httpx.get(f"{local_url}/openapi.json")
    assert schema.status_code == 200 and "/v2/rerank" in schema.json()["paths"]
    client = cohere.ClientV2(api_key="k", base_url=f"{local_url}/nothing-here")
    with pytest.raises(cohere.errors.NotFoundError):
        client.rerank(model="local", query=QUERY, documents=DOCS)


def test_max_tokens_per_doc_errors_and_schema_use_the_librarys_minimum(local_url: str) -> None:
    """QA finding #13: the refusal names the field sent, in no language's words (no None), and the
    OpenAPI schema's minimum is the library's (it said 1 while the library refused 1 to 15)."""
    from rag_rerank.evidence import MIN_TOKENS_PER_CHUNK

    ask = {"model": "local", "query": QUERY, "documents": DOCS}
    below = httpx.post(f"{local_url}/v2/rerank", json={**ask, "max_tokens_per_doc": MIN_TOKENS_PER_CHUNK - 1})
    at = httpx.post(f"{local_url}/v2/rerank", json={**ask, "max_tokens_per_doc": MIN_TOKENS_PER_CHUNK})
    assert below.status_code == 400 and at.status_code == 200, at.text
    message = below.json()["message"]
    assert "max_tokens_per_doc" in message and "max_tokens_per_chunk" not in message
    assert "None" not in message and f"at least {MIN_TOKENS_PER_CHUNK} tokens (or left unset)" in message
    schema = httpx.get(f"{local_url}/openapi.json").json()["paths"]
    for version in ("v1", "v2"):
        body = schema[f"/{version}/rerank"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        field = body["properties"]["max_tokens_per_doc"]
        assert {"type": "integer", "minimum": MIN_TOKENS_PER_CHUNK} in field["anyOf"], field


def test_shortened_documents_carry_their_evidence_by_document_index(local_url: str) -> None:
    """QA finding #11: with `max_tokens_per_doc`, the kept passages of each shortened document come
    back under `rag_rerank.evidence` (written by `RerankResult.to_cohere`), by the index the client
    knows, with offsets into the document's text: what the library's `meta.evidence` says."""
    filler = "The weather report mentions rain over the coast and a calm sea for sailors. " * 40
    documents = [
        "A short note about Paris.",
        filler + DOCS[3] + " " + filler,
        filler + DOCS[0],
    ]
    body = {"model": "local", "query": QUERY, "documents": documents, "top_n": 3, "max_tokens_per_doc": 64}
    answer = httpx.post(f"{local_url}/v2/rerank", json=body, timeout=60).json()
    with Reranker() as reranker:
        chunks = [{"id": str(i), "text": t} for i, t in enumerate(documents)]
        expected = reranker.rerank(QUERY, chunks, 3, window_size=50, max_tokens_per_chunk=64).meta.evidence
    evidence = answer["rag_rerank"]["evidence"]
    assert expected and [e["index"] for e in evidence] == sorted(int(cid) for cid in expected) == [1, 2]
    for entry in evidence:
        assert {k: v for k, v in entry.items() if k != "index"} == json.loads(
            json.dumps(expected[str(entry["index"])])
        )
        text = documents[entry["index"]]
        start, end = entry["best"]
        assert 0 <= start < end <= len(text)
    best_of_1 = evidence[0]["best"]
    assert "capital of the United States" in documents[1][best_of_1[0] : best_of_1[1]]
    short = httpx.post(f"{local_url}/v2/rerank", json={**body, "documents": DOCS}).json()
    assert "evidence" not in short["rag_rerank"]  # nothing was shortened


def test_the_docs_min_score_0_config_leaves_no_document_out_for_its_score(repo_root: Path) -> None:
    """QA finding #20: docs/service.md warns that `results` may hold fewer than Cohere's
    min(top_n, n) and shows a model config with `min_score: 0` for a stack that expects the count;
    that config, as printed, keeps every document the default drops for its score."""
    import re

    import yaml

    text = (repo_root / "docs" / "service.md").read_text(encoding="utf-8")
    section = text[text.index("## Point your stack at it") :]
    assert "min(top_n, number of documents)" in section
    snippet = re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1)  # type: ignore[union-attr]
    documents = [
        "Carson City is the capital of Nevada.",
        "Zebras graze on the savanna near Lake Victoria.",
        "Washington, D.C. is the capital of the United States.",
        "Saipan is the capital of the Northern Mariana Islands.",
    ]
    body = {"model": "local", "query": QUERY, "documents": documents, "top_n": 1000}
    answers = []
    for config in (parse_config(yaml.safe_load(snippet)), None):
        with running(create_app(config)) as url:
            answers.append(httpx.post(f"{url}/v2/rerank", json=body, timeout=60).json())
    zero, default = answers
    assert any(d["reason"].startswith("below_min_score") for d in default["rag_rerank"]["dropped"])
    assert not any(d["reason"].startswith("below_min_score") for d in zero["rag_rerank"]["dropped"])
    assert len(zero["results"]) == len(documents) > len(default["results"])
