"""RagRerankPostprocessor inside real LlamaIndex pipelines: a VectorStoreIndex over a few nodes
(llama-index-core's MockEmbedding; MockLLM for the query engine, so nothing reaches OpenAI), its
retriever followed by the postprocessor, and a query engine with it in `node_postprocessors`;
sync and async; the local backend and the openai backend against the scripted server."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.bridge.pydantic import Field
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.llms import MockLLM
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

from rag_rerank import InputError, rerank
from rag_rerank.integrations.llama_index import RagRerankPostprocessor
from tests.support.corpus import (
    PASSAGES,
    QUERY,
    metadata,
    openai_calls_sync_then_async,
    openai_options,
)
from tests.support.fake_llm import FakeLLM, auto_ranker


class Recorder(BaseEventHandler):
    """Collects the instrumentation events a run emits (LlamaIndex's own handler interface)."""

    events: list[Any] = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "Recorder"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, (ReRankStartEvent, ReRankEndEvent)):
            self.events.append(event)


@pytest.fixture(autouse=True)
def offline_settings() -> Iterator[None]:
    """No OpenAI default anywhere: a deterministic local embedding and a mock LLM, restored after."""
    saved = (Settings._llm, Settings._embed_model)
    Settings.embed_model = MockEmbedding(embed_dim=16)
    Settings.llm = MockLLM(max_tokens=8)
    yield
    Settings._llm, Settings._embed_model = saved


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    root = get_dispatcher()
    handler = Recorder(events=[])
    root.add_event_handler(handler)
    yield handler
    root.event_handlers.remove(handler)


def _nodes() -> list[TextNode]:
    return [TextNode(id_=key, text=text, metadata=metadata(i, key)) for i, (key, text) in enumerate(PASSAGES)]


@pytest.fixture
def index() -> VectorStoreIndex:
    return VectorStoreIndex(_nodes(), embed_model=MockEmbedding(embed_dim=16))


def _check(out: list[NodeWithScore], retrieved: list[NodeWithScore], pp: RagRerankPostprocessor,
           top_n: int) -> None:
    result = pp.last_result
    assert result is not None
    assert 1 <= len(out) <= top_n
    assert [n.node.node_id for n in out] == result.ids
    assert [n.score for n in out] == [r.score for r in result.ranked]
    assert sorted(result.ids + [d.id for d in result.dropped]) == sorted(n.node.node_id for n in retrieved)
    by_id = {n.node.node_id: n for n in retrieved}
    for n in out:
        src = by_id[n.node.node_id].node
        assert n.node.get_content(metadata_mode=MetadataMode.NONE) == src.get_content(MetadataMode.NONE)
        for key, value in src.metadata.items():
            assert n.node.metadata[key] is value
        assert n.node.metadata["rerank_reason"]
        # our keys stay out of what the answering LLM sees and what gets embedded
        assert "rerank_reason" not in n.node.get_content(metadata_mode=MetadataMode.LLM)
        assert "rerank_reason" not in n.node.get_content(metadata_mode=MetadataMode.EMBED)
    assert out[0].node.node_id in {"paris", "louvre"}
    assert "leaves" not in {n.node.node_id for n in out}


@pytest.mark.parametrize("use_server", [False, True], ids=["local", "openai"])
def test_retriever_then_postprocessor_sync_and_async(index: VectorStoreIndex, recorder: Recorder,
                                                     use_server: bool) -> None:
    retriever = index.as_retriever(similarity_top_k=len(PASSAGES))
    with FakeLLM(handler=auto_ranker()) as srv:
        options = openai_options(srv.openai_url) if use_server else {}
        pp = RagRerankPostprocessor(top_n=3, **options)
        retrieved = retriever.retrieve(QUERY)
        assert len(retrieved) == len(PASSAGES)
        snapshot = copy.deepcopy(retrieved)

        out = pp.postprocess_nodes(retrieved, query_bundle=QueryBundle(QUERY))
        _check(out, retrieved, pp, 3)
        aout = asyncio.run(pp.apostprocess_nodes(retrieved, query_str=QUERY))
        _check(aout, retrieved, pp, 3)
        assert [n.node.node_id for n in aout] == [n.node.node_id for n in out]
        assert [(n.node.node_id, n.score, n.node.metadata) for n in retrieved] == \
            [(n.node.node_id, n.score, n.node.metadata) for n in snapshot]

    starts = [e for e in recorder.events if isinstance(e, ReRankStartEvent)]
    ends = [e for e in recorder.events if isinstance(e, ReRankEndEvent)]
    assert len(starts) == len(ends) == 2
    assert starts[0].top_n == 3 and len(starts[0].nodes) == len(PASSAGES)
    assert [n.node.node_id for n in ends[0].nodes] == [n.node.node_id for n in out]
    if use_server:
        openai_calls_sync_then_async(srv.requests, 2)
        assert "openai" in starts[0].model_name
        assert pp.last_result.meta.backend == "openai"


@pytest.mark.parametrize("use_server", [False, True], ids=["local", "openai"])
def test_query_engine_node_postprocessors(index: VectorStoreIndex, use_server: bool) -> None:
    with FakeLLM(handler=auto_ranker()) as srv:
        options = openai_options(srv.openai_url) if use_server else {}
        pp = RagRerankPostprocessor(top_n=2, **options)
        engine = index.as_query_engine(llm=MockLLM(max_tokens=8), similarity_top_k=len(PASSAGES),
                                       node_postprocessors=[pp])
        response = engine.query(QUERY)
        ids = [n.node.node_id for n in response.source_nodes]
        assert ids == pp.last_result.ids and 1 <= len(ids) <= 2
        assert [n.score for n in response.source_nodes] == [r.score for r in pp.last_result.ranked]
        aresponse = asyncio.run(engine.aquery(QUERY))
        assert [n.node.node_id for n in aresponse.source_nodes] == ids
    if use_server:
        calls = [r for r in srv.requests if r.api == "openai"]
        assert [c.headers.get("x-stainless-async", "")[:5] for c in calls] == ["false", "async"]


def test_same_ranking_as_rerank_and_dropped_nodes_reachable() -> None:
    nodes = [NodeWithScore(node=n, score=0.5) for n in _nodes()]
    pp = RagRerankPostprocessor(top_n=3, lambda_=0.5)
    got = pp.rerank_nodes(nodes, QUERY)
    direct = rerank(QUERY, [{"id": n.node.node_id, "text": n.node.get_content()} for n in nodes], 3, 0.5)
    assert [n.node.node_id for n in got.items] == direct.ids
    assert len(got.items) + len(got.dropped) == len(nodes)
    reasons = {d.id: d.reason for d in got.result.dropped}
    for n in got.dropped:
        assert n.node.metadata["rerank_dropped_reason"] == reasons[n.node.node_id]
        assert n.score == 0.5  # the retriever's score, untouched
    assert all("rerank_reason" not in n.node.metadata for n in nodes)
    assert got.meta.backend == "local"


def test_empty_list_and_bad_input() -> None:
    pp = RagRerankPostprocessor()
    assert pp.postprocess_nodes([], query_str=QUERY) == []
    assert asyncio.run(pp.apostprocess_nodes([], query_str=QUERY)) == []
    dup = [NodeWithScore(node=TextNode(id_="x", text="a")), NodeWithScore(node=TextNode(id_="x", text="b"))]
    many = [NodeWithScore(node=TextNode(id_=str(i), text=f"passage {i}")) for i in range(51)]
    one = [NodeWithScore(node=TextNode(id_="x", text="a"))]
    for nodes, query, needle in ((dup, QUERY, "duplicate"), (many, QUERY, "50"), (one, None, "query")):
        with pytest.raises(InputError) as direct:
            rerank(query, [{"id": n.node.node_id, "text": n.node.get_content()} for n in nodes])
        with pytest.raises(InputError) as ours:
            pp.postprocess_nodes(nodes, query_str=query)
        with pytest.raises(InputError) as aours:
            asyncio.run(pp.apostprocess_nodes(nodes, query_str=query))
        assert str(ours.value) == str(aours.value)
        # The same error as rerank(), except a missing query, named in LlamaIndex's terms.
        if query is None:
            assert "query_bundle" in str(ours.value)
        else:
            assert str(ours.value) == str(direct.value)
        assert needle in str(ours.value)


def test_options_checked_and_key_never_serialized() -> None:
    with pytest.raises(InputError, match="lamda_"):
        RagRerankPostprocessor(lamda_=0.5)
    with pytest.raises(InputError, match="top_n"):
        RagRerankPostprocessor(top_k=2)
    pp = RagRerankPostprocessor(top_n=2, backend="openai", base_url="http://127.0.0.1:9/v1",
                                api_key="sk-very-secret-123", duplicate_threshold=0.9)
    assert pp.rerank_options == {"duplicate_threshold": 0.9}
    assert "sk-very-secret-123" not in repr(pp) and "sk-very-secret-123" not in pp.to_json()
    back = RagRerankPostprocessor.from_json(pp.to_json())
    assert back.top_n == 2 and back.rerank_options == {"duplicate_threshold": 0.9} and back.api_key is None


def test_a_component_with_a_retry_policy_serializes_and_reloads_it() -> None:
    """`to_json()` with `policy=RetryPolicy(...)` raised a TypeError (the policy's clock and sleep
    functions); it writes the numeric fields and `from_json` gives the same RetryPolicy back."""
    from rag_rerank import RetryPolicy

    pp = RagRerankPostprocessor(top_n=2, policy=RetryPolicy(deadline_s=10, max_attempts=3))
    data = json.loads(pp.to_json())
    assert data["policy"]["deadline_s"] == 10 and "sleep" not in data["policy"]
    back = RagRerankPostprocessor.from_json(pp.to_json())
    assert back.policy == RetryPolicy(deadline_s=10, max_attempts=3)
    with pytest.raises(InputError, match="'deadline'"):
        RagRerankPostprocessor(policy={"deadline": 3})


def test_meta_field_reads_node_metadata() -> None:
    from tests.test_fusion import CHUNKS, TITLED
    from tests.test_fusion import QUERY as FUSION_QUERY

    nodes = [NodeWithScore(node=TextNode(id_=c["id"], text=c["text"], metadata=dict(c["meta"])), score=0.5)
             for c in CHUNKS]
    pp = RagRerankPostprocessor(top_n=4, lambda_=1.0, meta_field="published", meta_value_type="date",
                                missing_meta="top")
    got = pp.rerank_nodes(nodes, FUSION_QUERY)
    assert [n.node.node_id for n in got.items] == ["none", "new", "mid", "old"]
    titled = [NodeWithScore(node=TextNode(id_=c["id"], text=c["text"], metadata=dict(c["meta"])), score=0.5)
              for c in TITLED]
    got = asyncio.run(RagRerankPostprocessor(top_n=3, embed_meta_fields=["title"]).arerank_nodes(
        titled, "HNSW indexes"))
    assert "t1" in [n.node.node_id for n in got.items]


def test_postprocess_without_a_query_names_query_bundle_and_query_str() -> None:
    # Regression: the error was the generic "query must be a string, got null", naming an argument
    # a LlamaIndex caller never passed.
    nodes = [NodeWithScore(node=n, score=0.5) for n in _nodes()]
    pp = RagRerankPostprocessor(top_n=2)
    for call in (lambda: pp.postprocess_nodes(nodes), lambda: asyncio.run(pp.apostprocess_nodes(nodes)),
                 lambda: pp.postprocess_nodes([])):
        with pytest.raises(InputError) as info:
            call()
        [violation] = info.value.violations
        assert violation.path == "query_bundle" and "query_str" in violation.message
        assert "got null" not in str(info.value)
    assert len(pp.postprocess_nodes(nodes, query_str=QUERY)) == 2


def test_a_pickled_postprocessor_keeps_its_backend_instance() -> None:
    """LlamaIndex pickles components by dropping what does not pickle ("Removing unpickleable
    attribute backend", on the root logger): a postprocessor built on `make_backend("openai", ...)`
    came back without its backend and failed on its first query."""
    import pickle

    from rag_rerank import make_backend

    nodes = [NodeWithScore(node=TextNode(text=text, id_=key), score=0.5) for key, text in PASSAGES]
    with FakeLLM(handler=auto_ranker()) as srv:
        opts = openai_options(srv.openai_url)
        backend = make_backend(opts.pop("backend"), **opts)
        post = RagRerankPostprocessor(top_n=2, backend=backend)
        expected = [n.node.node_id for n in post.postprocess_nodes(nodes, query_str=QUERY)]
        copied = pickle.loads(pickle.dumps(post))
        assert type(copied.backend) is type(backend) and copied.backend is not backend
        kept = [n.node.node_id for n in copied.postprocess_nodes(nodes, query_str=QUERY)]
        backend.close()
        copied.backend.close()
    assert kept == expected and len(expected) == 2
    assert [r.api for r in srv.requests] == ["openai", "openai"]  # the copy called the server too
