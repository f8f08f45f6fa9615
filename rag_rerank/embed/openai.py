"""Embeddings from an OpenAI-compatible `/v1/embeddings` endpoint through the official client.

Works with OpenAI itself and with local servers (vLLM, llama.cpp, Ollama, TEI) through
`base_url`. The SDK's own bounded retries (`max_retries`) handle transient HTTP failures; a
failure that survives them becomes a `BackendError` (CLI exit 3), and an answer with the wrong
number of vectors, mixed lengths or NaN is refused rather than passed on to MMR.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import Attempt, BackendError, InputError, Violation
from ..wording import counted
from . import l2_normalise

DEFAULT_MODEL = "text-embedding-3-small"
# Not measured here (no network): a conservative cosine for "restates the same text" with OpenAI's
# text-embedding-3 models. Pass `duplicate_threshold` after measuring your model with bench/duplicates.py.
OPENAI_DUPLICATE_THRESHOLD = 0.9


@dataclass(frozen=True)
class OpenAIEmbedder:
    """`embed(texts)` through `openai.OpenAI(base_url=...).embeddings.create`, in batches."""

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 30.0
    max_retries: int = 2
    batch_size: int = 256
    dimensions: int | None = None
    duplicate_threshold: float = OPENAI_DUPLICATE_THRESHOLD
    name: str = field(init=False)
    _client: list[Any] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", f"openai:{self.model or DEFAULT_MODEL}")

    def client(self) -> Any:
        """One client per embedder, created on first use (it holds the HTTP connection pool)."""
        if not self._client:
            import openai

            key = self.api_key or os.environ.get("OPENAI_API_KEY")
            base_url = self.base_url or os.environ.get("OPENAI_BASE_URL")
            if not key:
                if base_url is None:
                    raise InputError(
                        [
                            Violation(
                                path="embedder",
                                message="the openai embedder needs an API key: "
                                "set OPENAI_API_KEY or pass api_key (or a base_url of a local "
                                "server)",
                            )
                        ]
                    )
                key = "unused"  # local OpenAI-compatible servers ignore it, the SDK insists on one
            self._client.append(
                openai.OpenAI(
                    base_url=base_url, api_key=key, timeout=self.timeout, max_retries=self.max_retries
                )
            )
        return self._client[0]

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions or 0), dtype=np.float32)
        rows: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            rows.extend(self._batch(list(texts[start : start + self.batch_size])))
        return l2_normalise(np.asarray(rows, dtype=np.float32))

    def _batch(self, texts: list[str]) -> list[list[float]]:
        import openai

        kw: dict[str, Any] = {
            "model": self.model or DEFAULT_MODEL,
            "input": texts,
            "encoding_format": "float",
        }
        if self.dimensions is not None:
            kw["dimensions"] = self.dimensions
        try:
            response = self.client().embeddings.create(**kw)
        except openai.APIError as exc:
            kind = (
                "transient"
                if isinstance(
                    exc, (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError)
                )
                else "fatal"
            )
            raise BackendError(
                f"{self.name} embeddings failed", [Attempt(1, kind, f"{type(exc).__name__}: {exc}")]
            ) from None
        except json.JSONDecodeError as exc:  # a JSON content-type body the SDK could not parse
            raise BackendError(f"{self.name} embeddings: the answer is not valid JSON",
                               [Attempt(1, "fatal", str(exc))]) from None
        # A server that is not an embeddings endpoint (an HTML page, `{}`, a list) gives the SDK
        # no `data` list of `{index, embedding}`: refuse it like any other unusable answer.
        raw = getattr(response, "data", None)
        problem = None
        if not isinstance(raw, list) or not all(
            isinstance(getattr(d, "index", None), int) and isinstance(getattr(d, "embedding", None), list)
            for d in raw
        ):
            problem = "no 'data' list of {index, embedding} objects (is base_url an embeddings endpoint?)"
            raise BackendError(
                f"{self.name} embeddings: unusable answer ({problem})", [Attempt(1, "fatal", problem)]
            )
        data = sorted(raw, key=lambda d: d.index)
        if len(data) != len(texts):
            problem = f"{counted(len(data), 'vector')} for {counted(len(texts), 'text')}"
        elif len({len(d.embedding) for d in data}) != 1 or not data[0].embedding:
            problem = "vectors of different or zero length"
        elif not all(isinstance(x, (int, float)) and math.isfinite(x) for d in data for x in d.embedding):
            problem = "a vector holds NaN, Infinity or a non-number"
        if problem:
            raise BackendError(
                f"{self.name} embeddings: unusable answer ({problem})", [Attempt(1, "fatal", problem)]
            )
        return [list(d.embedding) for d in data]
