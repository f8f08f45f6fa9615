"""`RagRerankCompressor`: rag-rerank as a LangChain document compressor and Runnable step.

Needs the `langchain` extra (langchain-core 1.x). It is a `BaseDocumentCompressor`, so it drops
into `ContextualCompressionRetriever`, and also a Runnable taking `{"query", "documents"}`, so it
chains after a retriever without any wrapper::

    chain = {"documents": retriever, "query": RunnablePassthrough()} | RagRerankCompressor(top_n=3)

Returned Documents are copies in ranked order; the caller's Documents are never modified.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InputError, MissingDependencyError, Violation
from ..models import RerankResult
from ..session import SessionCache
from . import _common
from ._common import DROPPED_KEY, SCORE_KEY, Reranked

try:
    from langchain_core.callbacks import Callbacks
    from langchain_core.documents import BaseDocumentCompressor, Document
    from langchain_core.runnables import RunnableConfig, RunnableSerializable
    from pydantic import ConfigDict, Field, PrivateAttr, SecretStr
except ImportError:  # pragma: no cover - exercised in a subprocess without the package
    raise MissingDependencyError("rag_rerank.integrations.langchain", "langchain",
                                 "langchain-core>=1") from None

from ._pydantic import ComponentValidators  # needs pydantic, which the framework brings

__all__ = ["RagRerankCompressor", "Reranked"]


class RagRerankCompressor(ComponentValidators, BaseDocumentCompressor,
                          RunnableSerializable[dict[str, Any], list[Document]]):
    """Rerank retrieved Documents with rag-rerank: the best `top_n`, each with a score and a reason.

    Each returned Document is a copy of the caller's with `metadata["relevance_score"]`,
    `metadata["rerank_reason"]` and, when the model gave one, `metadata["rerank_diversity_note"]`.
    `Document.id` is the chunk id when set, else the Document's position in the list ("0", "1", ...).

    Options are `rerank()`'s, under its names; any other `rerank()` option (`limits`,
    `duplicate_threshold`, and options added later) may be passed as a keyword too and goes through
    unchanged. `rerank_documents` / `arerank_documents` return the dropped Documents and the
    `RunMeta` as well; `last_result` holds the `RerankResult` of the latest call.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    top_n: int = 5
    """How many Documents to keep at most (rerank()'s `top_k`; the card's default is 5)."""
    lambda_: float | None = None
    """MMR trade-off between relevance (1.0) and diversity (0.0); None: the card's default 0.7."""
    backend: Any = "local"
    """"local" (offline, deterministic), "openai" (any OpenAI-compatible server), "anthropic", a Backend."""
    model: str | None = None
    base_url: str | None = None
    api_key: SecretStr | None = Field(default=None, exclude=True)
    """A SecretStr, left out of every dump, so it never shows in a repr, a log or a saved config;
    None: the provider SDK reads its environment variable (OPENAI_API_KEY, ANTHROPIC_API_KEY)."""
    embedder: Any = "lexical"
    fallback: str | list[str] | None = None  # "local", or a chain such as ["cross-encoder:MODEL", "input"]
    policy: Any = None
    layout: str = "mmr"
    strict: bool = False
    rerank_options: dict[str, Any] = Field(default_factory=dict)
    """Further rerank() options by name; unknown keywords given to the constructor land here."""

    _last: RerankResult | None = PrivateAttr(default=None)
    _sessions: SessionCache = PrivateAttr(default_factory=SessionCache)

    @property
    def last_result(self) -> RerankResult | None:
        """The `RerankResult` (with `.dropped` and `.meta`) of the most recent call on this instance.

        Shared by every call: when one instance serves concurrent requests, use
        `arerank_documents`, whose return value belongs to its own call."""
        return self._last

    @staticmethod
    def _ids(documents: Sequence[Document]) -> list[str]:
        """Each Document's own id, else its position ("0", "1", ...); a position another Document
        already has as its own id gets "#" in front until it is free, so a list mixing
        `Document(id="1")` with id-less Documents is not refused for a duplicate the caller never wrote."""
        own = {d.id for d in documents if d.id is not None}
        out: list[str] = []
        for i, d in enumerate(documents):
            if d.id is not None:
                out.append(d.id)
                continue
            name = str(i)
            while name in own:
                name = "#" + name
            out.append(name)
        return out

    def _assemble(self, documents: Sequence[Document], ids: list[str],
                  result: RerankResult) -> Reranked[Document]:
        self._last = result
        ranked, dropped = _common.placed(result, ids)
        kept = tuple(
            documents[i].model_copy(update={"metadata": {**documents[i].metadata, SCORE_KEY: r.score,
                                                         **_common.ranked_meta(r)}})
            for i, r in ranked
        )
        gone = tuple(
            documents[i].model_copy(update={"metadata": {**documents[i].metadata, DROPPED_KEY: d.reason}})
            for i, d in dropped
        )
        return Reranked(items=kept, dropped=gone, result=result)

    def rerank_documents(self, documents: Sequence[Document], query: str) -> Reranked[Document]:
        """Kept and dropped Documents (copies) and the `RerankResult` of this call."""
        documents = list(documents)
        ids = self._ids(documents)
        texts, metas = [d.page_content for d in documents], [d.metadata for d in documents]
        result = _common.run(self._sessions, query, ids, texts, self.top_n, self._options(), metas)
        return self._assemble(documents, ids, result)

    async def arerank_documents(self, documents: Sequence[Document], query: str) -> Reranked[Document]:
        """`rerank_documents` with the backend call awaited (`arerank`), not pushed to a thread."""
        documents = list(documents)
        ids = self._ids(documents)
        texts, metas = [d.page_content for d in documents], [d.metadata for d in documents]
        result = await _common.arun(self._sessions, query, ids, texts, self.top_n, self._options(), metas)
        return self._assemble(documents, ids, result)

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """The best `top_n` Documents for `query`, as scored copies in ranked order."""
        return list(self.rerank_documents(documents, query).items)

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """`compress_documents` for asyncio: awaits `arerank`."""
        return list((await self.arerank_documents(documents, query)).items)

    # --- Runnable: input {"query": str, "documents": [Document, ...]} -> [Document, ...]

    @staticmethod
    def _unpack(value: Any) -> tuple[Any, list[Document]]:
        if not isinstance(value, Mapping) or "query" not in value or "documents" not in value:
            got = sorted(value) if isinstance(value, Mapping) else type(value).__name__
            msg = f"RagRerankCompressor as a Runnable takes {{'query': str, 'documents': [...]}}, got {got}"
            raise InputError([Violation(path="input", message=msg)])
        return value["query"], list(value["documents"])

    def invoke(self, input: dict[str, Any], config: RunnableConfig | None = None,
               **kwargs: Any) -> list[Document]:
        def call(value: dict[str, Any]) -> list[Document]:
            query, documents = self._unpack(value)
            return list(self.compress_documents(documents, query))

        return self._call_with_config(call, input, config)

    async def ainvoke(self, input: dict[str, Any], config: RunnableConfig | None = None,
                      **kwargs: Any) -> list[Document]:
        async def call(value: dict[str, Any]) -> list[Document]:
            query, documents = self._unpack(value)
            return list(await self.acompress_documents(documents, query))

        return await self._acall_with_config(call, input, config)
