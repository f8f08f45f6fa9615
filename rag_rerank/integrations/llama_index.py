"""`RagRerankPostprocessor`: rag-rerank as a LlamaIndex node postprocessor.

Needs the `llama-index` extra (llama-index-core 0.14). Use it wherever LlamaIndex takes
`node_postprocessors` (query engines, chat engines) or call `postprocess_nodes` on a retriever's
nodes. Like LlamaIndex's own rerankers it keeps `top_n` nodes and emits `ReRankStartEvent` /
`ReRankEndEvent` to the instrumentation dispatcher (and a RERANKING event to the callback manager).

Returned nodes are copies: the caller's nodes and their metadata are never modified.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..backends.factory import name_of
from ..errors import InputError, MissingDependencyError, Violation
from ..models import RerankResult
from ..session import SessionCache
from . import _common
from ._common import DROPPED_KEY, NOTE_KEY, REASON_KEY, Reranked

try:
    from llama_index.core.bridge.pydantic import Field, PrivateAttr, SecretStr
    from llama_index.core.callbacks import CBEventType, EventPayload
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
except ImportError:  # pragma: no cover - exercised in a subprocess without the package
    raise MissingDependencyError("rag_rerank.integrations.llama_index", "llama-index",
                                 "llama-index-core>=0.14") from None

from ._pydantic import ComponentValidators  # needs pydantic, which the framework brings

__all__ = ["RagRerankPostprocessor", "Reranked"]

dispatcher = get_dispatcher(__name__)

# Our keys describe the ranking, not the document: kept out of the text LlamaIndex builds for the
# answering LLM and for embedding, as LlamaIndex does for its own bookkeeping metadata.
_OURS = (REASON_KEY, NOTE_KEY, DROPPED_KEY)


class RagRerankPostprocessor(ComponentValidators, BaseNodePostprocessor):
    """Rerank retrieved nodes with rag-rerank: the best `top_n`, each with a score and a reason.

    `NodeWithScore.score` is rag-rerank's score in [0, 1]; node ids are the chunk ids, verbatim.
    Each kept node is a copy with `metadata["rerank_reason"]` and, when the model gave one,
    `metadata["rerank_diversity_note"]`; both are excluded from the LLM and embedding views of the
    node. Only the node id and its text (no metadata) are shown to the reranker.

    Options are `rerank()`'s, under its names; any other `rerank()` option (`limits`,
    `duplicate_threshold`, and options added later) may be passed as a keyword too.
    `rerank_nodes` / `arerank_nodes` also return the dropped nodes and the `RunMeta`;
    `last_result` holds the `RerankResult` of the latest call.
    """

    top_n: int = Field(default=5, description="How many nodes to keep at most (rerank()'s top_k).")
    lambda_: float | None = Field(default=None, description="MMR relevance/diversity trade-off; None: 0.7.")
    backend: Any = Field(default="local", description="local, openai, anthropic, or a Backend instance.")
    model: str | None = None
    base_url: str | None = None
    api_key: SecretStr | None = Field(default=None, exclude=True,
                                      description="Never serialized: a reloaded component reads the "
                                      "provider's environment variable (OPENAI_API_KEY...) instead.")
    embedder: Any = "lexical"
    fallback: str | list[str] | None = None  # "local", or a chain such as ["cross-encoder:MODEL", "input"]
    policy: Any = None
    layout: str = "mmr"
    strict: bool = False
    rerank_options: dict[str, Any] = Field(default_factory=dict,
                                           description="Further rerank() options by name.")

    _last: RerankResult | None = PrivateAttr(default=None)
    _sessions: SessionCache = PrivateAttr(default_factory=SessionCache)

    @classmethod
    def class_name(cls) -> str:
        return "RagRerankPostprocessor"

    @property
    def last_result(self) -> RerankResult | None:
        """The `RerankResult` (with `.dropped` and `.meta`) of the most recent call on this instance.

        Shared by every call; for concurrent use, `arerank_nodes` returns each call's own result."""
        return self._last

    def _model_name(self) -> str:
        name = self.backend if isinstance(self.backend, str) else name_of(self.backend)
        return f"rag-rerank:{name}" + (f":{self.model}" if self.model else "")

    @staticmethod
    def _copy(item: NodeWithScore, score: float | None, meta: dict[str, Any]) -> NodeWithScore:
        node = item.node
        llm, embed = node.excluded_llm_metadata_keys, node.excluded_embed_metadata_keys
        update = {
            "metadata": {**node.metadata, **meta},
            "excluded_llm_metadata_keys": [*llm, *(k for k in meta if k not in llm)],
            "excluded_embed_metadata_keys": [*embed, *(k for k in meta if k not in embed)],
        }
        return NodeWithScore(node=node.model_copy(update=update), score=score)

    def _assemble(self, nodes: Sequence[NodeWithScore], ids: list[str],
                  result: RerankResult) -> Reranked[NodeWithScore]:
        self._last = result
        ranked, dropped = _common.placed(result, ids)
        kept = tuple(self._copy(nodes[i], r.score, _common.ranked_meta(r)) for i, r in ranked)
        gone = tuple(self._copy(nodes[i], nodes[i].score, {DROPPED_KEY: d.reason}) for i, d in dropped)
        return Reranked(items=kept, dropped=gone, result=result)

    @staticmethod
    def _inputs(nodes: Sequence[NodeWithScore]) -> tuple[list[str], list[str]]:
        return ([n.node.node_id for n in nodes],
                [n.node.get_content(metadata_mode=MetadataMode.NONE) for n in nodes])

    def _event(self, nodes: Sequence[NodeWithScore], query: str | None) -> AbstractContextManager[Any]:
        dispatcher.event(ReRankStartEvent(query=query, nodes=list(nodes), top_n=self.top_n,
                                          model_name=self._model_name()))
        return self.callback_manager.event(
            CBEventType.RERANKING,
            payload={EventPayload.NODES: list(nodes), EventPayload.MODEL_NAME: self._model_name(),
                     EventPayload.QUERY_STR: query, EventPayload.TOP_K: self.top_n},
        )

    def rerank_nodes(self, nodes: Sequence[NodeWithScore], query: str | None) -> Reranked[NodeWithScore]:
        """Kept and dropped nodes (copies) and the `RerankResult` of this call."""
        nodes = list(nodes)
        with self._event(nodes, query) as event:
            ids, texts = self._inputs(nodes)
            metas = [n.node.metadata for n in nodes]
            result = _common.run(self._sessions, query, ids, texts, self.top_n, self._options(), metas)
            out = self._assemble(nodes, ids, result)
            event.on_end(payload={EventPayload.NODES: list(out.items)})
        dispatcher.event(ReRankEndEvent(nodes=list(out.items)))
        return out

    async def arerank_nodes(self, nodes: Sequence[NodeWithScore],
                            query: str | None) -> Reranked[NodeWithScore]:
        """`rerank_nodes` with the backend call awaited (`arerank`), not pushed to a thread."""
        nodes = list(nodes)
        with self._event(nodes, query) as event:
            ids, texts = self._inputs(nodes)
            result = await _common.arun(self._sessions, query, ids, texts, self.top_n, self._options(),
                                        [n.node.metadata for n in nodes])
            out = self._assemble(nodes, ids, result)
            event.on_end(payload={EventPayload.NODES: list(out.items)})
        dispatcher.event(ReRankEndEvent(nodes=list(out.items)))
        return out

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        return list(self.rerank_nodes(nodes, _query_of(query_bundle)).items)

    async def _apostprocess_nodes(self, nodes: list[NodeWithScore],
                                  query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        return list((await self.arerank_nodes(nodes, _query_of(query_bundle))).items)


def _query_of(query_bundle: QueryBundle | None) -> str:
    """The query of a `postprocess_nodes` call; without one, an error in LlamaIndex's own terms
    (the generic "query must be a string, got null" names an argument the caller never saw)."""
    if query_bundle is None:
        msg = ("RagRerankPostprocessor needs the query to rerank for: call postprocess_nodes(nodes, "
               "query_str=...) or pass query_bundle=QueryBundle(...)")
        raise InputError([Violation(path="query_bundle", message=msg)])
    return query_bundle.query_str
