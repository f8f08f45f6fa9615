"""`RagRerankRanker`: rag-rerank as a Haystack ranker component.

Needs the `haystack` extra (haystack-ai 2.x / 3.x). Put it after a retriever in a `Pipeline`;
it outputs the kept Documents (`Document.score` set, reason in `meta`) and the dropped ones, each
with its reason, so nothing the retriever found disappears without a trace.

Serialization follows Haystack's rules: every init parameter goes into `to_dict()` (so a pipeline
dumps to YAML and loads back), the API key is a `Secret` (an environment variable is written by
name; a token secret refuses to be serialized), and the backend and embedder are built in
`warm_up()` (a sentence-transformers embedder loads its model there), once per component.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..cost import Budget, Prices
from ..errors import InputError, MissingDependencyError, Violation
from ..guard.limits import Limits, as_limits
from ..models import RerankResult
from ..retry import RetryPolicy
from ..session import Reranker, SessionCache
from . import _common
from ._common import DROPPED_KEY

try:
    from haystack import Document, component, default_from_dict, default_to_dict
    from haystack.core.errors import SerializationError
    from haystack.utils import Secret, deserialize_secrets_inplace
except ImportError:  # pragma: no cover - exercised in a subprocess without the package
    raise MissingDependencyError("rag_rerank.integrations.haystack", "haystack", "haystack-ai>=2") from None

__all__ = ["RagRerankRanker"]

# Options that are frozen dataclasses: written as a dict of their plain fields, rebuilt on load.
# (RetryPolicy's injectable clock/sleep functions are left out; they are for tests, not configs.)
_DATACLASS_OPTIONS: dict[str, type] = {"policy": RetryPolicy, "limits": Limits, "budget": Budget,
                                       "prices": Prices}
_PLAIN = (str, int, float, bool, type(None))


def _plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _dump_option(name: str, value: Any) -> Any:
    """An option as YAML-safe data, or a SerializationError naming it (never a silent loss)."""
    if name in _DATACLASS_OPTIONS and isinstance(value, _DATACLASS_OPTIONS[name]):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.repr}
    if _plain(value):
        return value
    raise SerializationError(
        f"RagRerankRanker option {name!r} is a {type(value).__name__} object, which cannot be written "
        f"to a pipeline file; give it by name (e.g. backend='openai', embedder='sentence-transformers')"
    )


@component
class RagRerankRanker:
    """Rerank retrieved Documents with rag-rerank: the best `top_k`, each with a score and a reason.

    Outputs `documents` (copies in ranked order, `score` = rag-rerank's score in [0, 1],
    `meta["rerank_reason"]` and, when given, `meta["rerank_diversity_note"]`) and `dropped`
    (copies of every other input Document, retriever score unchanged, `meta["rerank_dropped_reason"]`).
    Document ids are the chunk ids, verbatim; only id and content are shown to the reranker.
    `last_result` holds the `RerankResult` (with `.meta`, the `RunMeta`) of the latest run.

    Options are `rerank()`'s under its names; any other `rerank()` option (`limits`,
    `duplicate_threshold`, and options added later) may be passed as a keyword too.
    """

    def __init__(
        self,
        *,
        top_k: int = 5,
        lambda_: float | None = None,
        backend: str = "local",
        model: str | None = None,
        base_url: str | None = None,
        api_key: Secret | None = None,
        embedder: Any = "lexical",
        fallback: str | list[str] | None = None,
        policy: RetryPolicy | None = None,
        layout: str = "mmr",
        strict: bool = False,
        **rerank_options: Any,
    ) -> None:
        """
        :param top_k: How many Documents to keep at most (the card's default is 5).
        :param lambda_: MMR trade-off between relevance (1.0) and diversity (0.0); None: 0.7.
        :param backend: "local" (offline, deterministic), "openai" (also any OpenAI-compatible
            server through `base_url`), "anthropic", or a Backend instance (not serializable).
        :param model: The model name for the openai / anthropic backends.
        :param base_url: The server's URL, e.g. a vLLM or llama.cpp server.
        :param api_key: A Haystack `Secret`, e.g. `Secret.from_env_var("OPENAI_API_KEY")`; None
            lets the provider SDK read its usual environment variable.
        :param embedder: The post-pass embedder: "lexical", "sentence-transformers[:MODEL]",
            "openai[:MODEL]", or an Embedder instance (not serializable).
        :param fallback: "local" to answer with the local ranking when the backend fails for good, or
            a chain of steps tried in order (["cross-encoder:MODEL", "local", "input"]);
            `last_result.meta.status` says whether it did.
        :param policy: A `RetryPolicy`; None: the defaults.
        :param layout: "mmr" (default) or another layout `rerank()` accepts.
        :param strict: True turns off the formatting-only repair of the model's output.
        :param rerank_options: Further `rerank()` options by name.
        """
        if api_key is not None and not isinstance(api_key, Secret):
            msg = ("api_key must be a haystack Secret (Secret.from_env_var('OPENAI_API_KEY') or "
                   f"Secret.from_token(...)), got {type(api_key).__name__}")
            raise InputError([Violation(path="api_key", message=msg)])
        _common.check_options(rerank_options, component="RagRerankRanker", count_name="top_k")
        _common.check_connection(backend, model=model, base_url=base_url, api_key=api_key)
        self.top_k = top_k
        self.lambda_ = lambda_
        self.backend = backend
        self.model = model
        self.base_url = base_url
        self.api_key = api_key
        self.embedder = embedder
        self.fallback = fallback
        self.policy = policy
        self.layout = layout
        self.strict = strict
        self.rerank_options = dict(rerank_options)
        self._sessions = SessionCache()
        self._last: RerankResult | None = None

    @property
    def last_result(self) -> RerankResult | None:
        """The `RerankResult` (with `.dropped` and `.meta`) of the most recent run of this component."""
        return self._last

    @property
    def reranker(self) -> Reranker:
        """The `Reranker` session this component ranks with, built by `warm_up` (or the first run)."""
        return self._sessions.get(self._options())[0]

    # --- life cycle

    def warm_up(self) -> None:
        """Build the `Reranker` session once (the backend and its HTTP connection pool; a
        sentence-transformers model loads here) and reuse it for every run."""
        self._sessions.get(self._options())

    def _options(self) -> dict[str, Any]:
        key = self.api_key.resolve_value() if self.api_key is not None else None
        return {
            "lambda_": self.lambda_,
            "backend": self.backend,
            "model": self.model,
            "base_url": self.base_url,
            "api_key": key,
            "embedder": self.embedder,
            "fallback": self.fallback,
            "policy": self.policy,
            "layout": self.layout,
            "strict": self.strict,
            **self.rerank_options,
        }

    # --- serialization

    def to_dict(self) -> dict[str, Any]:
        """Every init parameter as YAML-safe data; the key as a Secret (env var name only)."""
        options = {name: _dump_option(name, value) for name, value in self.rerank_options.items()}
        return default_to_dict(
            self,
            top_k=self.top_k,
            lambda_=self.lambda_,
            backend=_dump_option("backend", self.backend),
            model=self.model,
            base_url=self.base_url,
            api_key=self.api_key.to_dict() if self.api_key is not None else None,
            embedder=_dump_option("embedder", self.embedder),
            fallback=self.fallback,
            policy=_dump_option("policy", self.policy),
            layout=self.layout,
            strict=self.strict,
            **options,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RagRerankRanker:
        init = dict(data.get("init_parameters", {}))
        deserialize_secrets_inplace(init, keys=["api_key"])
        # A hand-edited pipeline file may hold a typo ({"deadline": 3}) or only some fields
        # ({"max_chunks": 100}): each is read as rerank() reads it, an InputError naming the key
        # instead of a TypeError from the dataclass, and missing limits from guard/limits.json.
        if isinstance(init.get("policy"), dict):
            init["policy"] = _common.policy_value(init["policy"])
        if isinstance(init.get("limits"), dict):
            init["limits"] = as_limits(init["limits"])
        return default_from_dict(cls, {**data, "init_parameters": init})

    # --- running

    def _call_args(self, documents: list[Document], top_k: int | None,
                   lambda_: float | None) -> tuple[list[Any], Any, dict[str, Any], list[Any]]:
        """(texts, top_k, rerank options, metadata) for `run` and `run_async`, with this run's
        `top_k` / `lambda_` overrides applied."""
        # A Document may carry only a blob or a dataframe; the guard would name the hash-like id
        # and "field 'text'", which says nothing to a Haystack user. Every such Document at once.
        empty = [Violation(path=f"documents[{i}].content", id=d.id,
                           message="this Haystack Document's content is None: documents without text "
                           "cannot be reranked (filter them out before the ranker)")
                 for i, d in enumerate(documents) if getattr(d, "content", None) is None]
        if empty:
            raise InputError(empty)
        options = self._options()
        if lambda_ is not None:
            options["lambda_"] = lambda_
        texts = [d.content for d in documents]
        return texts, self.top_k if top_k is None else top_k, options, [d.meta for d in documents]

    def _assemble(self, documents: list[Document], ids: list[str], result: RerankResult) -> dict[str, Any]:
        self._last = result
        ranked, dropped = _common.placed(result, ids)
        kept = [dataclasses.replace(documents[i], score=r.score,
                                    meta={**documents[i].meta, **_common.ranked_meta(r)})
                for i, r in ranked]
        gone = [dataclasses.replace(documents[i], meta={**documents[i].meta, DROPPED_KEY: d.reason})
                for i, d in dropped]
        return {"documents": kept, "dropped": gone}

    @component.output_types(documents=list[Document], dropped=list[Document])
    def run(self, query: str, documents: list[Document], top_k: int | None = None,
            lambda_: float | None = None) -> dict[str, Any]:
        """Rerank `documents` for `query`.

        :param query: The question the documents should answer.
        :param documents: The retrieved Documents (at most the card's 50).
        :param top_k: Overrides the init `top_k` for this run.
        :param lambda_: Overrides the init `lambda_` for this run.
        :returns: `documents` (kept, ranked) and `dropped` (every other input Document).
        """
        documents = list(documents)
        ids = [d.id for d in documents]
        result = _common.run(self._sessions, query, ids, *self._call_args(documents, top_k, lambda_))
        return self._assemble(documents, ids, result)

    @component.output_types(documents=list[Document], dropped=list[Document])
    async def run_async(self, query: str, documents: list[Document], top_k: int | None = None,
                        lambda_: float | None = None) -> dict[str, Any]:
        """`run` for `Pipeline.run_async`: the backend call is awaited (`arerank`)."""
        documents = list(documents)
        ids = [d.id for d in documents]
        result = await _common.arun(self._sessions, query, ids, *self._call_args(documents, top_k, lambda_))
        return self._assemble(documents, ids, result)
