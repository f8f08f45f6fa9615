"""What the two pydantic components (LangChain's compressor, LlamaIndex's postprocessor) declare
alike: constructor keywords that are not fields become `rerank_options`, a connection option the
backend would ignore is refused, the `policy` field is written to and read from a dump as the
numbers of its `RetryPolicy`, and the `Reranker` session they rank with.

A mixin, not a base model: each component's base class comes from its framework. Imported only by
those two modules, after their framework (which brings pydantic) has imported."""

from __future__ import annotations

from typing import Any

from pydantic import field_serializer, field_validator, model_validator

from ..redaction import display_url
from ..session import Reranker
from . import _common


class ComponentValidators:
    """Mix into a pydantic component that has a `policy` field, a `rerank_options` field and a
    `_sessions` (`SessionCache`) private attribute."""

    def _options(self) -> dict[str, Any]:
        return _common.component_options(self)

    @property
    def reranker(self) -> Reranker:
        """The `Reranker` session this component ranks with: built on first use, kept while its
        backend, model, base_url, api_key and embedder stay the same."""
        return self._sessions.get(self._options())[0]  # type: ignore[attr-defined]

    @model_validator(mode="before")
    @classmethod
    def _collect_options(cls, data: Any) -> Any:
        """Keywords that are not fields are rerank() options: checked by name now, passed on later."""
        fields = set(cls.model_fields)  # type: ignore[attr-defined]  # a pydantic model's
        return _common.collect_options(data, fields, component=cls.__name__)

    @model_validator(mode="after")
    def _connection_used(self) -> Any:
        """A model / base_url / api_key the named backend would ignore is refused now."""
        _common.check_connection(self.backend, model=self.model,  # type: ignore[attr-defined]
                                 base_url=self.base_url, api_key=self.api_key)  # type: ignore[attr-defined]
        return self

    def __repr_args__(self) -> Any:
        """The fields a repr shows, a password or key in `base_url` masked (`user:***@host`): a
        component's repr ends up in logs and tracebacks. `api_key` is a SecretStr already."""
        for name, value in super().__repr_args__():  # type: ignore[misc]
            yield name, display_url(value) if name == "base_url" and isinstance(value, str) else value

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_value(cls, value: Any) -> Any:
        """A policy reloaded from a dump (a dict of its numeric fields) is a RetryPolicy again."""
        return _common.policy_value(value)

    @field_serializer("policy")
    def _policy_data(self, policy: Any) -> Any:
        """A RetryPolicy dumps as its numeric fields (its clock and sleep functions cannot be written)."""
        return _common.policy_data(policy)
