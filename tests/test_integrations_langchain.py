"""RagRerankCompressor inside real LangChain pipelines: an InMemoryVectorStore retriever with
langchain-core's deterministic embeddings, then the compressor, in ContextualCompressionRetriever
(langchain-classic) and as a Runnable step; sync and async; the local backend and the openai
backend against the scripted server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore

from rag_rerank import InputError, rerank
from rag_rerank.integrations.langchain import RagRerankCompressor
from tests.support.corpus import (
    PASSAGES,
    QUERY,
    metadata,
    openai_calls_sync_then_async,
    openai_options,
)
from tests.support.fake_llm import FakeLLM, auto_ranker


def _docs() -> list[Document]:
    return [Document(id=key, page_content=text, metadata=metadata(i, key))
            for i, (key, text) in enumerate(PASSAGES)]


@pytest.fixture
def retriever() -> Any:
    store = InMemoryVectorStore(embedding=DeterministicFakeEmbedding(size=64))
    store.add_documents(_docs())
    return store.as_retriever(search_kwargs={"k": len(PASSAGES)})


def _check(out: list[Document], retrieved: list[Document], comp: RagRerankCompressor, top_n: int) -> None:
    """What every pipeline must give: scored copies in the order and with the scores of the result."""
    result = comp.last_result
    assert result is not None
    assert 1 <= len(out) <= top_n
    assert [d.id for d in out] == result.ids
    assert [d.metadata["relevance_score"] for d in out] == [r.score for r in result.ranked]
    assert all(d.metadata["rerank_reason"] for d in out)
    # every retrieved document is either returned or accounted for in dropped, exactly once
    assert sorted(result.ids + [d.id for d in result.dropped]) == sorted(d.id for d in retrieved)
    # metadata comes through untouched: the same datetime / set objects, plus our keys
    by_id = {d.id: d for d in retrieved}
    for doc in out:
        src = by_id[doc.id]
        assert doc.page_content == src.page_content
        for key, value in src.metadata.items():
            assert doc.metadata[key] is value
    assert out[0].id in {"paris", "louvre"}
    assert "leaves" not in {d.id for d in out}


@pytest.mark.parametrize("use_server", [False, True], ids=["local", "openai"])
def test_contextual_compression_retriever_sync_and_async(retriever: Any, use_server: bool) -> None:
    from langchain_classic.retrievers import ContextualCompressionRetriever

    with FakeLLM(handler=auto_ranker()) as srv:
        options = openai_options(srv.openai_url) if use_server else {}
        comp = RagRerankCompressor(top_n=3, **options)
        pipeline = ContextualCompressionRetriever(base_compressor=comp, base_retriever=retriever)
        retrieved = retriever.invoke(QUERY)
        snapshot = copy.deepcopy(retrieved)

        out = pipeline.invoke(QUERY)
        _check(out, retrieved, comp, 3)
        aout = asyncio.run(pipeline.ainvoke(QUERY))
        _check(aout, retrieved, comp, 3)
        assert [d.id for d in aout] == [d.id for d in out]
        assert retriever.invoke(QUERY) == snapshot  # nothing written back into the store

    if use_server:
        calls = openai_calls_sync_then_async(srv.requests, 2)
        assert "Paris is the capital city of France" in calls[0].prompt
        assert comp.last_result.meta.backend == "openai"
    else:
        assert comp.last_result.meta.backend == "local"


@pytest.mark.parametrize("use_server", [False, True], ids=["local", "openai"])
def test_runnable_chain_after_a_retriever(retriever: Any, use_server: bool) -> None:
    with FakeLLM(handler=auto_ranker()) as srv:
        options = openai_options(srv.openai_url) if use_server else {}
        comp = RagRerankCompressor(top_n=2, **options)
        chain = ({"documents": retriever, "query": RunnablePassthrough()} | comp
                 | RunnableLambda(lambda docs: [d.id for d in docs]))
        retrieved = retriever.invoke(QUERY)
        ids = chain.invoke(QUERY)
        assert ids == comp.last_result.ids and 1 <= len(ids) <= 2
        assert asyncio.run(chain.ainvoke(QUERY)) == ids
        docs = ({"documents": retriever, "query": RunnablePassthrough()} | comp).invoke(QUERY)
        _check(docs, retrieved, comp, 2)
        # batch runs the step per input
        assert chain.batch([QUERY, QUERY]) == [ids, ids]


def test_same_ranking_as_rerank_on_the_same_ids_and_texts() -> None:
    docs = _docs()
    comp = RagRerankCompressor(top_n=3, lambda_=0.5)
    out = comp.compress_documents(docs, QUERY)
    direct = rerank(QUERY, [{"id": d.id, "text": d.page_content} for d in docs], 3, 0.5)
    assert [d.id for d in out] == direct.ids
    assert [d.metadata["relevance_score"] for d in out] == [r.score for r in direct.ranked]


def test_inputs_never_mutated_and_dropped_documents_reachable() -> None:
    docs = _docs()
    before = copy.deepcopy(docs)
    comp = RagRerankCompressor(top_n=2)
    got = comp.rerank_documents(docs, QUERY)
    assert docs == before
    assert all("relevance_score" not in d.metadata for d in docs)
    assert len(got.items) + len(got.dropped) == len(docs)
    assert {d.id for d in got.dropped} == {d.id for d in got.result.dropped}
    reasons = {d.id: d.reason for d in got.result.dropped}
    assert all(d.metadata["rerank_dropped_reason"] == reasons[d.id] for d in got.dropped)
    assert got.meta is got.result.meta and got.meta.backend == "local"


def test_position_is_the_id_when_documents_have_none() -> None:
    docs = [Document(page_content=text) for _, text in PASSAGES]
    out = RagRerankCompressor(top_n=3).compress_documents(docs, QUERY)
    assert all(d.id is None for d in out)  # copies keep the caller's (absent) id
    texts = [d.page_content for d in docs]
    comp = RagRerankCompressor(top_n=3)
    comp.compress_documents(docs, QUERY)
    assert [texts[int(i)] for i in comp.last_result.ids] == [d.page_content for d in out]


def test_a_position_taken_as_another_documents_id_is_not_a_duplicate() -> None:
    """`Document(id="1")` first, an id-less Document second: position "1" is taken, so the second is
    "#1" instead of a refused "duplicate id '1'" the caller never wrote."""
    docs = [Document(id="1", page_content="Paris is the capital of France."),
            Document(page_content="Lyon is a large city in France."),
            Document(id="#1", page_content="Photosynthesis happens in green leaves.")]
    got = RagRerankCompressor(top_n=3).rerank_documents(docs, QUERY)
    assert sorted(got.result.ids + [d.id for d in got.result.dropped]) == ["##1", "#1", "1"]
    assert got.items[0].id == "1" and len(got.items) + len(got.dropped) == 3
    assert {d.page_content for d in got.items + got.dropped} == {d.page_content for d in docs}


def test_options_pass_through_and_redundant_duplicates_are_dropped() -> None:
    # two near-identical passages: the duplicate is dropped as redundant with the kept one
    docs = [Document(id="a", page_content="Paris is the capital city of France."),
            Document(id="b", page_content="Paris is the capital city of France!"),
            Document(id="c", page_content="Lyon is a large city in France.")]
    comp = RagRerankCompressor(top_n=3, duplicate_threshold=0.9, embedder="lexical", layout="mmr")
    assert comp.rerank_options == {"duplicate_threshold": 0.9}
    got = comp.rerank_documents(docs, QUERY)
    # (Lyon does not say what the capital is: it may be dropped too, as below the minimum score.)
    assert {d.id: d.reason for d in got.result.dropped}.get("b") == "redundant_with:a"
    assert [d.metadata["rerank_dropped_reason"] for d in got.dropped if d.id == "b"] == ["redundant_with:a"]
    assert [d.id for d in got.items][:1] == ["a"]


def test_diversity_notes_land_in_metadata() -> None:
    comp = RagRerankCompressor(top_n=4, lambda_=0.3)
    out = comp.compress_documents(_docs(), QUERY)
    notes = {r.id: r.diversity_note for r in comp.last_result.ranked}
    assert any(notes.values())  # MMR moved something: the corpus has a second Paris passage
    for doc in out:
        assert doc.metadata.get("rerank_diversity_note") == notes[doc.id]


def test_empty_list_gives_empty_list_but_query_is_still_checked() -> None:
    comp = RagRerankCompressor()
    assert comp.compress_documents([], QUERY) == []
    assert asyncio.run(comp.acompress_documents([], QUERY)) == []
    assert comp.last_result is not None and comp.last_result.ranked == ()
    with pytest.raises(InputError, match="query"):
        comp.compress_documents([], "  ")


@pytest.mark.parametrize(
    ("docs", "query", "needle"),
    [
        ([Document(id="x", page_content="a"), Document(id="x", page_content="b")], QUERY, "duplicate"),
        ([Document(id=str(i), page_content=f"passage {i}") for i in range(51)], QUERY, "50"),
        ([Document(id="x", page_content="a")], None, "query"),
    ],
    ids=["duplicate-ids", "over-the-limit", "missing-query"],
)
def test_bad_input_is_the_same_input_error_as_rerank(docs: list[Document], query: Any, needle: str) -> None:
    with pytest.raises(InputError) as direct:
        rerank(query, [{"id": d.id, "text": d.page_content} for d in docs])
    comp = RagRerankCompressor()
    with pytest.raises(InputError) as ours:
        comp.compress_documents(docs, query)
    with pytest.raises(InputError) as aours:
        asyncio.run(comp.acompress_documents(docs, query))
    assert str(ours.value) == str(aours.value) == str(direct.value)
    assert needle in str(ours.value)


def test_construction_checks_option_names_and_hides_the_key() -> None:
    with pytest.raises(InputError, match="lamda_"):
        RagRerankCompressor(lamda_=0.5)
    with pytest.raises(InputError, match="top_n"):
        RagRerankCompressor(top_k=3)
    comp = RagRerankCompressor(backend="openai", base_url="http://127.0.0.1:9/v1",
                               api_key="sk-very-secret-123")
    assert "sk-very-secret-123" not in repr(comp)
    assert "sk-very-secret-123" not in str(comp.model_dump())


def test_a_component_with_a_retry_policy_dumps_to_json_and_reloads_it() -> None:
    """`model_dump_json()` with `policy=RetryPolicy(...)` raised a PydanticSerializationError (the
    policy's clock and sleep functions); it writes the numeric fields and reloads as a RetryPolicy."""
    import json

    from rag_rerank import RetryPolicy

    comp = RagRerankCompressor(top_n=2, policy=RetryPolicy(deadline_s=10, max_attempts=3))
    data = json.loads(comp.model_dump_json())
    assert data["policy"]["deadline_s"] == 10 and "clock" not in data["policy"]
    back = RagRerankCompressor(**data)
    assert back.policy == RetryPolicy(deadline_s=10, max_attempts=3)
    assert back.compress_documents(_docs(), QUERY)


def test_runnable_input_must_name_query_and_documents() -> None:
    with pytest.raises(InputError, match="documents"):
        RagRerankCompressor().invoke({"query": QUERY})


def test_backend_failure_raises_or_falls_back_to_local() -> None:
    from rag_rerank import BackendError
    from tests.support.fake_llm import Reply

    docs = _docs()
    with FakeLLM(handler=lambda req: Reply.openai_error(400, "model 'fake-gpt' does not exist")) as srv:
        failing = RagRerankCompressor(top_n=2, **openai_options(srv.openai_url))
        with pytest.raises(BackendError, match="does not exist"):
            failing.compress_documents(docs, QUERY)
        with pytest.raises(BackendError):
            asyncio.run(failing.acompress_documents(docs, QUERY))
        rescued = RagRerankCompressor(top_n=2, fallback="local", **openai_options(srv.openai_url))
        out = asyncio.run(rescued.acompress_documents(docs, QUERY))
    assert out and out[0].id in {"paris", "louvre"}
    assert rescued.last_result.meta.fallback == "local"
    assert "sk-test-0000" not in " ".join(rescued.last_result.meta.notes)


def test_meta_field_reads_datetime_metadata_and_titles_count() -> None:
    import datetime

    from tests.test_fusion import CHUNKS, TITLED
    from tests.test_fusion import QUERY as FUSION_QUERY

    docs = []
    for c in CHUNKS:
        meta = dict(c["meta"])
        if "published" in meta:  # a datetime object, as loaders often produce: sent as ISO 8601
            meta["published"] = datetime.datetime.fromisoformat(meta["published"].replace("Z", "+00:00"))
        docs.append(Document(id=c["id"], page_content=c["text"], metadata=meta))
    comp = RagRerankCompressor(top_n=4, lambda_=1.0, meta_field="published", meta_value_type="date")
    assert [d.id for d in comp.compress_documents(docs, FUSION_QUERY)] == ["new", "mid", "old", "none"]
    assert isinstance(docs[0].metadata["published"], datetime.datetime)  # the caller's object untouched
    titled = [Document(id=c["id"], page_content=c["text"], metadata=dict(c["meta"])) for c in TITLED]
    kept = asyncio.run(RagRerankCompressor(top_n=3, embed_meta_fields=["title"]).acompress_documents(
        titled, "HNSW indexes"))
    assert "t1" in [d.id for d in kept]
