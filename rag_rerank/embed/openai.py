"""Embeddings from an OpenAI-compatible `/v1/embeddings` endpoint through the official client.

Works with OpenAI itself and with local servers (vLLM, llama.cpp, Ollama, TEI) through
`base_url`. The SDK's own bounded retries (`max_retries`) handle transient HTTP failures; a
failure that survives them becomes an `EmbedderError` (a `BackendError`, CLI exit 3) naming the
embedder, the URL and what came back, and an answer with the wrong number of vectors, mixed lengths
or NaN is refused rather than passed on to MMR. A server without an embeddings endpoint (a chat-only
vLLM, llama.cpp without --embeddings) is told apart and the way out named.
"""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends.common import error_message, http_client, is_transient_status, unreachable_reason
from ..errors import Attempt, EmbedderError, InputError, Violation
from ..redaction import display_url, scrub, secrets_of
from ..wording import counted
from .base import l2_normalise

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
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", f"openai:{self.model or DEFAULT_MODEL}")

    def __getstate__(self) -> dict[str, Any]:
        # A copy (a worker process, a framework copying its components) makes its own client.
        return {k: v for k, v in self.__dict__.items() if k not in ("_client", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _client=[], _lock=threading.Lock())

    def close(self) -> None:
        """Close the client's connections; the next `embed` opens a new client."""
        with self._lock:
            clients = list(self._client)
            self._client.clear()
        for client in clients:
            client.close()

    def client(self) -> Any:
        """One client per embedder, created on first use (it holds the HTTP connection pool)."""
        with self._lock:  # concurrent requests embed in worker threads: one client, not one each
            return self._client[0] if self._client else self._new_client()

    def _new_client(self) -> Any:
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
                    base_url=base_url, api_key=key, timeout=self.timeout, max_retries=self.max_retries,
                    http_client=http_client(openai),
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
            raise self._failed(exc) from None
        except json.JSONDecodeError as exc:  # a JSON content-type body the SDK could not parse
            raise self._error(f"answered with a body that is not valid JSON ({exc})") from None
        # A server that is not an embeddings endpoint (an HTML page, `{}`, a list) gives the SDK
        # no `data` list of `{index, embedding}`: refuse it like any other unusable answer.
        raw = getattr(response, "data", None)
        if not isinstance(raw, list) or not all(
            isinstance(getattr(d, "index", None), int) and isinstance(getattr(d, "embedding", None), list)
            for d in raw
        ):
            shown = " ".join(str(response)[:120].split())
            raise self._error(f"answered without a 'data' list of {{index, embedding}} objects ({shown!r})",
                              hint=_NO_ENDPOINT)
        data = sorted(raw, key=lambda d: d.index)
        problem = None
        if len(data) != len(texts):
            problem = f"{counted(len(data), 'vector')} for {counted(len(texts), 'text')}"
        elif len({len(d.embedding) for d in data}) != 1 or not data[0].embedding:
            problem = "vectors of different or zero length"
        elif not all(isinstance(x, (int, float)) and math.isfinite(x) for d in data for x in d.embedding):
            problem = "a vector holds NaN, Infinity or a non-number"
        if problem:
            raise self._error(f"answered with unusable vectors ({problem})")
        return [list(d.embedding) for d in data]

    def url(self) -> str:
        """Where the embeddings are posted: what a user must check when they do not come back."""
        return display_url(str(self.client().base_url).rstrip("/") + "/embeddings") or ""

    def _error(self, what: str, kind: str = "fatal", hint: str = "") -> EmbedderError:
        """One failure, naming the embedder, the URL and what came back (`what`), then `hint`."""
        hidden = secrets_of(self.api_key, urls=[self.base_url])
        what = scrub(what, hidden)
        head = f"the openai embedder (model {self.model or DEFAULT_MODEL!r}) at {self.url()} {what}"
        return EmbedderError(head + (f"; {hint}" if hint else ""), [Attempt(1, kind, what[:200])])

    def _failed(self, exc: Any) -> EmbedderError:
        """An SDK error (after the SDK's own `max_retries`) as an `EmbedderError`: the HTTP status and
        the server's own message, and for an endpoint the server does not have, what to do instead."""
        import openai

        if isinstance(exc, openai.APIStatusError):
            status = int(exc.status_code)
            message = " ".join(error_message(exc).split())[:300]
            missing = status in (404, 405, 501) or (status == 400 and "embedding" in message.lower())
            return self._error(f"answered HTTP {status}: {message}",
                               "transient" if is_transient_status(status) else "fatal",
                               hint=_NO_ENDPOINT if missing else "")
        if isinstance(exc, openai.APITimeoutError):
            return self._error(f"did not answer within {self.timeout:g}s", "transient")
        if isinstance(exc, openai.APIConnectionError):
            hidden = secrets_of(self.api_key, urls=[self.base_url])
            if (why := unreachable_reason(exc, hidden)) is not None:
                return self._error(f"could not be reached: {why}")  # fatal: nothing to retry against
            cause = exc.__cause__ or exc
            return self._error(f"could not be reached ({type(cause).__name__}: {cause})", "transient")
        return self._error(f"failed ({type(exc).__name__}: {exc})")


# What to do when the server has no embeddings endpoint (a chat-only vLLM, llama.cpp without
# --embeddings, a proxy): the CLI's and the library's spelling of the two ways out.
_NO_ENDPOINT = ("does this server serve embeddings (llama.cpp needs --embeddings)? Use another embedder "
                "(lexical), a server that embeds (--embed-base-url URL, get_embedder('openai', "
                "base_url=URL)), or fallback local to compare lexical vectors instead")
