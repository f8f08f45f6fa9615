"""RagRerankRanker inside a real Haystack Pipeline: InMemoryDocumentStore + InMemoryBM25Retriever
-> the ranker, `Pipeline.run` and `Pipeline.run_async`, the `dumps()` / `loads()` YAML round trip;
the local backend and the openai backend against the scripted server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

pytest.importorskip("haystack")

from haystack import Document, Pipeline
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack.utils import Secret

from rag_rerank import InputError, rerank
from rag_rerank.guard.limits import Limits
from rag_rerank.integrations.haystack import RagRerankRanker
from rag_rerank.retry import RetryPolicy
from tests.support.corpus import (
    PASSAGES,
    QUERY,
    metadata,
    openai_calls_sync_then_async,
    openai_options,
)
from tests.support.fake_llm import FakeLLM, auto_ranker

TRUSTED = ["rag_rerank.integrations.haystack"]  # Haystack 3 loads only allow-listed modules


def _docs() -> list[Document]:
    return [Document(id=key, content=text, meta=metadata(i, key)) for i, (key, text) in enumerate(PASSAGES)]


def _pipeline(ranker: RagRerankRanker) -> Pipeline:
    store = InMemoryDocumentStore()
    store.write_documents(_docs())
    pipe = Pipeline()
    pipe.add_component("retriever", InMemoryBM25Retriever(store, top_k=len(PASSAGES)))
    pipe.add_component("ranker", ranker)
    pipe.connect("retriever.documents", "ranker.documents")
    return pipe


def _inputs(top_k: int | None = None) -> dict[str, Any]:
    ranker: dict[str, Any] = {"query": QUERY}
    if top_k is not None:
        ranker["top_k"] = top_k
    return {"retriever": {"query": QUERY}, "ranker": ranker}


SHOW = {"retriever"}  # Pipeline.run returns the retriever's output too, to compare against


def _check(out: dict[str, Any], ranker: RagRerankRanker, top_k: int) -> None:
    """Kept + dropped are exactly what the retriever found, as scored copies with the same meta."""
    result = ranker.last_result
    retrieved = out["retriever"]["documents"]
    assert len(retrieved) >= 4
    assert result is not None
    kept, dropped = out["ranker"]["documents"], out["ranker"]["dropped"]
    assert 1 <= len(kept) <= top_k
    assert [d.id for d in kept] == result.ids
    assert [d.score for d in kept] == [r.score for r in result.ranked]
    assert all(d.meta["rerank_reason"] for d in kept)
    assert [d.id for d in dropped] == [d.id for d in result.dropped]
    assert [d.meta["rerank_dropped_reason"] for d in dropped] == [d.reason for d in result.dropped]
    assert sorted(d.id for d in kept + dropped) == sorted(d.id for d in retrieved)
    originals = {d.id: d for d in retrieved}
    for doc in kept + dropped:
        src = originals[doc.id]
        assert doc.content == src.content
        for key, value in src.meta.items():
            # equal, same type (the Pipeline itself deep-copies values between components)
            assert doc.meta[key] == value and type(doc.meta[key]) is type(value)
        assert "rerank_reason" not in src.meta and "rerank_dropped_reason" not in src.meta
    assert kept[0].id in {"paris", "louvre"}
    assert "leaves" not in {d.id for d in kept}


@pytest.mark.parametrize("use_server", [False, True], ids=["local", "openai"])
def test_pipeline_run_run_async_and_yaml_round_trip(use_server: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_RERANK_TEST_KEY", "sk-test-from-env-0000")
    with FakeLLM(handler=auto_ranker()) as srv:
        options = openai_options(srv.openai_url) if use_server else {}
        if use_server:  # the local backend takes no key (an InputError: it would be ignored)
            options["api_key"] = Secret.from_env_var("RAG_RERANK_TEST_KEY")
        ranker = RagRerankRanker(top_k=3, policy=RetryPolicy(max_attempts=2), duplicate_threshold=0.9,
                                 **options)
        pipe = _pipeline(ranker)
        out = pipe.run(_inputs(), include_outputs_from=SHOW)
        _check(out, ranker, 3)

        text = pipe.dumps()
        assert "sk-test-from-env-0000" not in text and ("RAG_RERANK_TEST_KEY" in text) == use_server
        loaded = Pipeline.loads(text, allowed_modules=TRUSTED)
        again = loaded.get_component("ranker")
        assert isinstance(again, RagRerankRanker)
        assert again.to_dict() == ranker.to_dict()
        assert again.policy == RetryPolicy(max_attempts=2)
        assert again.rerank_options == {"duplicate_threshold": 0.9}

        aout = asyncio.run(loaded.run_async(_inputs(), include_outputs_from=SHOW))
        _check(aout, again, 3)
        assert [d.id for d in aout["ranker"]["documents"]] == [d.id for d in out["ranker"]["documents"]]
        assert pipe.run(_inputs(top_k=1))["ranker"]["documents"][0].id == out["ranker"]["documents"][0].id

    if use_server:
        calls = openai_calls_sync_then_async(srv.requests, 3)
        assert calls[0].headers.get("authorization") == "Bearer sk-test-from-env-0000"
        assert again.last_result.meta.backend == "openai"
    else:
        assert again.last_result.meta.backend == "local"


def test_same_ranking_as_rerank_and_inputs_untouched() -> None:
    docs = _docs()
    before = copy.deepcopy(docs)
    ranker = RagRerankRanker(top_k=3, lambda_=0.5)
    out = ranker.run(query=QUERY, documents=docs)
    direct = rerank(QUERY, [{"id": d.id, "text": d.content} for d in docs], 3, 0.5)
    assert [d.id for d in out["documents"]] == direct.ids
    assert [d.score for d in out["documents"]] == [r.score for r in direct.ranked]
    assert docs == before
    for doc in out["documents"]:
        src = next(d for d in docs if d.id == doc.id)
        assert all(doc.meta[k] is v for k, v in src.meta.items())  # the very same objects
    # a run-time lambda_ overrides the init one
    out2 = ranker.run(query=QUERY, documents=docs, lambda_=0.9)
    assert [d.id for d in out2["documents"]] == rerank(QUERY, [{"id": d.id, "text": d.content}
                                                               for d in docs], 3, 0.9).ids


def test_empty_list_and_bad_input() -> None:
    ranker = RagRerankRanker()
    assert ranker.run(query=QUERY, documents=[]) == {"documents": [], "dropped": []}
    assert asyncio.run(ranker.run_async(query=QUERY, documents=[])) == {"documents": [], "dropped": []}
    dup = [Document(id="x", content="a"), Document(id="x", content="b")]
    many = [Document(id=str(i), content=f"passage {i}") for i in range(51)]
    one = [Document(id="x", content="a")]
    for docs, query, needle in ((dup, QUERY, "duplicate"), (many, QUERY, "50"), (one, None, "query")):
        with pytest.raises(InputError) as direct:
            rerank(query, [{"id": d.id, "text": d.content} for d in docs])
        with pytest.raises(InputError) as ours:
            ranker.run(query=query, documents=docs)
        with pytest.raises(InputError) as aours:
            asyncio.run(ranker.run_async(query=query, documents=docs))
        assert str(ours.value) == str(aours.value) == str(direct.value)
        assert needle in str(ours.value)


def test_secrets_and_unserializable_options() -> None:
    with pytest.raises(InputError, match="Secret"):
        RagRerankRanker(api_key="sk-plain-text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="token"):  # Haystack refuses to write a token secret
        RagRerankRanker(backend="openai", base_url="http://127.0.0.1:9/v1",
                        api_key=Secret.from_token("sk-very-secret-123")).to_dict()
    from haystack.core.errors import SerializationError

    from rag_rerank.embed.lexical import LexicalEmbedder

    with pytest.raises(SerializationError, match="embedder"):
        RagRerankRanker(embedder=LexicalEmbedder()).to_dict()
    with pytest.raises(InputError, match="lamda_"):
        RagRerankRanker(lamda_=0.5)
    # a Limits option survives the round trip as data
    ranker = RagRerankRanker(limits=Limits(max_chunks=10))
    back = RagRerankRanker.from_dict(ranker.to_dict())
    assert back.rerank_options["limits"] == Limits(max_chunks=10)
    with pytest.raises(InputError, match="10"):
        back.run(query=QUERY, documents=[Document(id=str(i), content=f"p {i}") for i in range(11)])


def test_warm_up_builds_the_backend_once() -> None:
    ranker = RagRerankRanker()
    ranker.warm_up()
    built = ranker.reranker
    ranker.warm_up()
    ranker.run(query=QUERY, documents=_docs())
    assert ranker.reranker is built and ranker.reranker.backend is built.backend


def test_meta_field_and_embed_meta_fields_read_the_documents_meta() -> None:
    """MetaFieldRanker parity: a date in Document.meta orders the kept documents; a title counts."""
    from tests.test_fusion import CHUNKS, TITLED
    from tests.test_fusion import QUERY as FUSION_QUERY

    docs = [Document(id=c["id"], content=c["text"], meta=dict(c["meta"])) for c in CHUNKS]
    before = copy.deepcopy(docs)
    ranker = RagRerankRanker(top_k=4, lambda_=1.0, meta_field="published", meta_value_type="date",
                             missing_meta="drop")
    out = ranker.run(query=FUSION_QUERY, documents=docs)
    assert [d.id for d in out["documents"]] == ["new", "mid", "old"]
    assert [(d.id, d.meta["rerank_dropped_reason"]) for d in out["dropped"]] == [
        ("none", "missing_meta: published")]
    assert docs == before
    titled = [Document(id=c["id"], content=c["text"], meta=dict(c["meta"])) for c in TITLED]
    got = RagRerankRanker(top_k=3, embed_meta_fields=["title"]).run(query="HNSW indexes", documents=titled)
    assert "t1" in [d.id for d in got["documents"]]
    assert "t1" not in [d.id for d in RagRerankRanker(top_k=3).run(query="HNSW indexes",
                                                                    documents=titled)["documents"]]


def test_a_document_without_content_is_named_by_its_haystack_id() -> None:
    # Regression: the error was the guard's "field 'text' must be a string, got null" naming only a
    # hash, with no word about Haystack or content. Every such Document is reported at once.
    docs = [*_docs()[:2], Document(id="doc-7", content=None), Document(content=None, meta={"k": 1})]
    ranker = RagRerankRanker(top_k=2)
    for call in (lambda: ranker.run(query=QUERY, documents=docs),
                 lambda: asyncio.run(ranker.run_async(query=QUERY, documents=docs))):
        with pytest.raises(InputError) as info:
            call()
        assert [(v.path, v.id) for v in info.value.violations] == [("documents[2].content", "doc-7"),
                                                                    ("documents[3].content", docs[3].id)]
        assert all("content is None" in v.message and "cannot be reranked" in v.message
                   for v in info.value.violations)
        assert "field 'text'" not in str(info.value)


def test_a_hand_edited_pipeline_file_reads_policy_and_limits_as_rerank_does() -> None:
    """A YAML with only some limits gets the rest from guard/limits.json; a misspelt policy or limit
    key is refused naming it and the known keys (it was a bare TypeError from the dataclass)."""
    pipe = Pipeline()
    pipe.add_component("ranker", RagRerankRanker(top_k=2))
    text = pipe.dumps()
    partial = text.replace("policy: null",
                           "policy:\n        deadline_s: 3\n      limits:\n        max_chunks: 100")
    ranker = Pipeline.loads(partial, allowed_modules=TRUSTED).get_component("ranker")
    assert ranker.policy == RetryPolicy(deadline_s=3)
    assert ranker.rerank_options["limits"] == Limits(max_chunks=100)
    for bad, named in (("policy:\n        deadline: 3", "unknown RetryPolicy field(s) 'deadline'"),
                       ("policy: null\n      limits:\n        max_chunk: 3", "unknown limit 'max_chunk'")):
        with pytest.raises(Exception) as err:  # Haystack wraps it in a DeserializationError
            Pipeline.loads(text.replace("policy: null", bad), allowed_modules=TRUSTED)
        assert named in str(err.value)
