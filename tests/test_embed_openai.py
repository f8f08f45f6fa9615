"""The openai embedder: the real openai SDK over HTTP to a local server (tests/support/fake_llm.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rag_rerank.embed import get_embedder
from rag_rerank.embed.openai import OpenAIEmbedder
from rag_rerank.errors import BackendError, EmbedderError, InputError
from rag_rerank.guard import validate_request
from rag_rerank.models import Ranked
from rag_rerank.postpass import postpass
from tests.support.fake_llm import FakeLLM, Reply, hashed_embedding

TEXTS = [
    "IVF partitions vectors into Voronoi cells.",
    "HNSW builds a proximity graph.",
    "Risotto needs stock.",
]


def _embedder(srv: FakeLLM, **kw) -> OpenAIEmbedder:
    return get_embedder("openai:fake-embed", base_url=srv.openai_url, api_key="sk-test", max_retries=0, **kw)


def test_vectors_come_back_in_input_order_as_unit_float32():
    with FakeLLM() as srv:
        emb = _embedder(srv)
        m = emb.embed(TEXTS)
    expected = np.array([hashed_embedding(t) for t in TEXTS], dtype=np.float32)
    assert m.shape == (3, 64) and m.dtype == np.float32
    assert np.allclose(m, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-6)
    body = srv.requests[0].body
    assert body["model"] == "fake-embed" and body["input"] == TEXTS and body["encoding_format"] == "float"
    assert srv.requests[0].headers["authorization"] == "Bearer sk-test"
    assert emb.name == "openai:fake-embed"


def test_batches_and_out_of_order_indices():
    def shuffled(req):
        inputs = req.body["input"]
        data = [
            {"object": "embedding", "index": i, "embedding": hashed_embedding(t)}
            for i, t in enumerate(inputs)
        ]
        return Reply(
            200,
            {
                "object": "list",
                "data": data[::-1],
                "model": "m",
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
            },
        )

    with FakeLLM(handler=shuffled) as srv:
        m = _embedder(srv, batch_size=2).embed(TEXTS)
    assert [len(r.body["input"]) for r in srv.requests] == [2, 1]
    assert np.allclose(m[2] @ np.array(hashed_embedding(TEXTS[2]), dtype=np.float32), 1.0, atol=1e-5)


def test_server_errors_become_backend_errors():
    with (
        FakeLLM([Reply.openai_error(400, "model not found")]) as srv,
        pytest.raises(BackendError, match="model not found") as exc,
    ):
        _embedder(srv).embed(TEXTS)
    assert exc.value.attempts[0].kind == "fatal"
    with FakeLLM([Reply.openai_error(503, "overloaded")]) as srv, pytest.raises(BackendError) as exc:
        _embedder(srv).embed(TEXTS)
    assert exc.value.attempts[0].kind == "transient"


@pytest.mark.parametrize(
    "data, problem",
    [
        ([{"object": "embedding", "index": 0, "embedding": [1.0, 0.0]}], "1 vector for 3 texts"),
        ([{"object": "embedding", "index": i, "embedding": [1.0] * (i + 1)} for i in range(3)], "different"),
    ],
)
def test_unusable_answers_are_refused(data, problem):
    reply = Reply(
        200, {"object": "list", "data": data, "model": "m", "usage": {"prompt_tokens": 1, "total_tokens": 1}}
    )
    with FakeLLM([reply]) as srv, pytest.raises(BackendError, match=problem):
        _embedder(srv).embed(TEXTS)


def test_nan_in_an_answer_is_refused():
    rows = ",".join(f'{{"object":"embedding","index":{i},"embedding":[NaN,1.0]}}' for i in range(3))
    raw = '{"object":"list","data":[' + rows + '],"model":"m","usage":{"prompt_tokens":1,"total_tokens":1}}'
    with FakeLLM([Reply(200, raw)]) as srv, pytest.raises(BackendError, match="NaN"):
        _embedder(srv).embed(TEXTS)


def test_no_key_without_a_local_server_is_an_input_error(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(InputError, match="API key"):
        OpenAIEmbedder().embed(["x"])


def test_post_pass_with_openai_embeddings():
    chunks = [
        {"id": "a", "text": TEXTS[0]},
        {"id": "b", "text": TEXTS[0] + " "},
        {"id": "c", "text": TEXTS[1]},
    ]
    request = validate_request("ivf", chunks, 3, 0.7)
    with FakeLLM() as srv:
        result = postpass(
            request,
            [Ranked("b", 0.9, "Voronoi"), Ranked("a", 0.8, "Voronoi"), Ranked("c", 0.5, "graph")],
            embedder=_embedder(srv),
        )
    # same words, same length once whitespace is normalised: the more relevant copy is kept
    assert [r.id for r in result.ranked] == ["b", "c"]
    assert [(d.id, d.reason) for d in result.dropped] == [("a", "redundant_with:b")]
    assert result.meta.embedder == "openai:fake-embed"
    assert json.loads(result.to_json())["ranked"][0]["score"] == 0.9


@pytest.mark.parametrize(
    "reply, problem",
    [
        (Reply(200, "{not json"), "not valid JSON"),
        (Reply(200, "<html>a login page</html>", headers={"Content-Type": "text/html"}),
         "without a 'data' list"),
        (Reply(200, [1, 2]), "without a 'data' list"),
        (Reply(200, {"object": "list"}), "without a 'data' list"),
        (Reply(200, {"data": [{"object": "embedding"}] * 3}), "without a 'data' list"),
    ],
)
def test_an_answer_that_is_not_an_embeddings_response_is_a_backend_error(reply, problem):
    """Regression: these crashed with JSONDecodeError / AttributeError / TypeError (CLI exit 4)."""
    with FakeLLM([reply]) as srv, pytest.raises(BackendError, match=problem):
        _embedder(srv).embed(TEXTS)


# --- a server without an embeddings endpoint (QA leftover) ----------------------------------------

LLAMA_CPP = "This server does not support embeddings. Start it with `--embeddings`"


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (Reply(404, {"detail": "Not Found"}), "answered HTTP 404: Not Found"),  # vLLM / FastAPI
        (Reply(501, {"error": {"code": 501, "type": "not_supported_error", "message": LLAMA_CPP}}),
         f"answered HTTP 501: {LLAMA_CPP}"),  # llama.cpp started without --embeddings
        (Reply(405, "Method Not Allowed", headers={"Content-Type": "text/plain"}),
         "answered HTTP 405: Method Not Allowed"),
    ],
)
def test_a_server_without_an_embeddings_endpoint_is_named_with_its_url_and_answer(reply: Reply,
                                                                                    said: str) -> None:
    """Regression: the error was "openai:text-embedding-3-small embeddings failed [#1 fatal:
    NotFoundError: Error code: 404]": no URL, nothing of what the server said, no way out."""
    with FakeLLM(handler=lambda req: reply) as srv, pytest.raises(EmbedderError) as exc:
        url = f"{srv.openai_url}/embeddings"
        _embedder(srv).embed(TEXTS)
    text = str(exc.value)
    assert isinstance(exc.value, BackendError)  # CLI exit 3, caught by every `except BackendError`
    assert text.startswith(f"the openai embedder (model 'fake-embed') at {url} {said}; ")
    assert "does this server serve embeddings" in text and "lexical" in text and "fallback local" in text


def test_an_unreachable_embeddings_server_is_named_with_its_url() -> None:
    with FakeLLM() as srv:
        url = srv.openai_url
    with pytest.raises(EmbedderError) as exc:  # the server is gone: connection refused
        get_embedder("openai", base_url=url, max_retries=0).embed(TEXTS)
    port = url.split(":")[2].split("/")[0]
    assert str(exc.value).startswith("the openai embedder (model 'text-embedding-3-small') at "
                                     f"{url}/embeddings could not be reached: connection refused at "
                                     f"127.0.0.1:{port}: nothing listens there")
    assert exc.value.attempts[0].kind == "fatal"  # nothing to retry against (a reset stays transient)


def test_a_dropped_connection_stays_transient_for_the_embedder() -> None:
    """A server that accepts and resets the connection is there: the SDK's own retries apply and the
    failure is transient, unlike a refused connection above."""
    from tests.support.sockets import Resetter

    with Resetter() as server, pytest.raises(EmbedderError) as exc:
        get_embedder("openai", base_url=f"http://127.0.0.1:{server.port}/v1", max_retries=0).embed(TEXTS)
    assert exc.value.attempts[0].kind == "transient" and "could not be reached (" in str(exc.value)


def test_a_used_embedder_pickles_and_deep_copies_with_a_client_of_its_own() -> None:
    """Its SDK client (a lock, open sockets) made a used embedder impossible to pickle or copy."""
    import copy
    import pickle

    with FakeLLM() as srv:
        emb = _embedder(srv)
        first = emb.embed(TEXTS)
        for copied in (pickle.loads(pickle.dumps(emb)), copy.deepcopy(emb)):
            assert copied == emb and copied.name == emb.name
            assert np.allclose(copied.embed(TEXTS), first)
            assert copied.client() is not emb.client()
            copied.close()
        emb.close()


def test_threads_share_one_client() -> None:
    """Concurrent requests embed in worker threads: one client (one connection pool), not one each."""
    from concurrent.futures import ThreadPoolExecutor

    with FakeLLM() as srv:
        emb = _embedder(srv)
        with ThreadPoolExecutor(8) as pool:
            clients = set(pool.map(lambda _: id(emb.client()), range(32)))
        emb.close()
    assert len(clients) == 1


def test_rerank_closes_the_embedder_it_built_from_a_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """`rerank(embedder="openai")` built an embedder (and a connection) per call and left the
    connection for the garbage collector: a ResourceWarning per call."""
    import gc
    import warnings

    from rag_rerank import rerank

    chunks = [{"id": f"c{i}", "text": t} for i, t in enumerate(TEXTS)]
    with FakeLLM() as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.openai_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        gc.collect()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            for _ in range(3):
                rerank("IVF cells", chunks, top_k=2, embedder="openai:fake-embed", backend="local")
            gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert sum(r.api == "embeddings" for r in srv.requests) >= 3  # it did embed through the server
