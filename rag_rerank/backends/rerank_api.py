"""`backend="rerank-api"`: any server speaking the `/v1/rerank` protocol of Cohere and Jina,
which vLLM, llama.cpp's server and Infinity also serve.

Request `POST {base_url}/rerank` with `{model, query, documents, top_n}` (top_n = every chunk,
so each one gets a score and a reason for where it went); response
`{"results": [{"index", "relevance_score"}, ...]}`. A `base_url` that already ends in `/rerank`
is used as is. The key comes from `api_key` or `RERANK_API_KEY` (none needed for a local server),
the URL from `base_url` or `RERANK_BASE_URL`.

**Scores.** Cohere, Jina, Infinity and vLLM's cross-encoders return probabilities in [0, 1];
llama.cpp's server returns raw logits. With `score_mapping="auto"` (default) the scores of one
response are used as they are when every one lies in [0, 1], and otherwise all of them go through
the logistic sigmoid (a logit of 0 becomes 0.5). `"identity"` (values clipped to [0, 1]) and
`"sigmoid"` force one mapping.

**Failures** follow the LLM backends' policy, driven by `retry.py`: 429 and 5xx are transient
(Retry-After honoured), a timeout or a dropped connection too; 401/403 and other 4xx fail fast,
and so does a connection refused or a host name that does not resolve (nothing to retry against);
a body that is not the protocol (not JSON, no `results`, an index out of range or repeated, a
score that is not a number) is fatal with a message saying what was wrong. The API key is
scrubbed from every message. **Long documents** are cut to `max_chars` characters (default
10,000, about 2,500 tokens) before sending, so a long chunk cannot push a request over a
server's context limit; `meta.notes` says how many were cut. Usage (`usage` tokens, Cohere's
`meta.billed_units`) is summed into `meta.usage`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .. import reasons
from ..errors import FatalFailure, InputError, TransientFailure, UnreachableFailure, Violation
from ..models import RerankRequest
from ..redaction import display_url, scrub, secrets_of
from ..wording import counted
from .base import Capabilities, Completion
from .common import (
    ClosableBackend,
    SDKClients,
    base_url_problem,
    connection_detail,
    is_transient_status,
    resolve_credentials,
    retry_after_seconds,
    shared_ssl_context,
    unreachable_reason,
)
from .scored import SCORE_DECIMALS, answer, labelled

URL_ENV, KEY_ENV = "RERANK_BASE_URL", "RERANK_API_KEY"
SCORE_MAPPINGS = ("auto", "identity", "sigmoid")
DEFAULT_MAX_CHARS = 10_000
RERANK_API_REASON = labelled("rerank-api")


def endpoint(base_url: str) -> str:
    """The rerank URL for a base URL (`http://host:8000/v1` -> `http://host:8000/v1/rerank`)."""
    url = base_url.rstrip("/")
    return url if url.endswith("/rerank") else url + "/rerank"


def map_scores(raw: Sequence[float], mapping: str) -> list[float]:
    """Relevance scores into [0, 1] (see the module docstring)."""
    sigmoid = mapping == "sigmoid" or (mapping == "auto" and any(not 0.0 <= s <= 1.0 for s in raw))
    if sigmoid:
        return [1.0 / (1.0 + math.exp(-max(-500.0, min(500.0, s)))) for s in raw]
    return [min(1.0, max(0.0, s)) for s in raw]


def _usage(body: Mapping[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    sources = [body.get("usage"), (body.get("meta") or {}).get("billed_units")
               if isinstance(body.get("meta"), Mapping) else None]
    for src in sources:
        if isinstance(src, Mapping):
            for k, v in src.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer():
                    out[str(k)] = out.get(str(k), 0) + int(v)
    return out


def _httpx() -> Any:
    """The HTTP client the installed openai SDK brings: `httpx2` (recent releases) or `httpx`.

    Neither is a dependency of ours; openai (a core dependency) always brings one of them, and a
    fresh install of today's openai has only httpx2, so `import httpx` alone failed there (CLI exit 4).
    The two share the API used here (Client, AsyncClient, TimeoutException, TransportError).
    """
    try:
        import httpx2

        return httpx2
    except ImportError:
        import httpx

        return httpx


class RerankAPIBackend(ClosableBackend):
    """A `/v1/rerank` client behind the Backend protocol (see the module docstring)."""

    name = "rerank-api"
    # Answers built by backends/scored.py: guard-valid by construction, never re-asked; a server
    # that bills each request and says what it sends (the response cache may answer it); its
    # client's own timeout bounds a call (`complete` takes none).
    capabilities = Capabilities(scored=True, cacheable=True, closes=True, needs_key=True)

    def __init__(self, model: str | None = None, base_url: str | None = None, api_key: str | None = None, *,
                 timeout: float = 60.0, max_chars: int | None = DEFAULT_MAX_CHARS,
                 score_mapping: str = "auto") -> None:
        bad: list[Violation] = []
        if score_mapping not in SCORE_MAPPINGS:
            bad.append(Violation(path="score_mapping", value=score_mapping,
                                 message=f"score_mapping must be one of {', '.join(SCORE_MAPPINGS)}"))
        if max_chars is not None and (isinstance(max_chars, bool) or not isinstance(max_chars, int)
                                      or max_chars < 1):
            bad.append(Violation(path="max_chars", value=max_chars, message="must be None or an int >= 1"))
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            bad.append(Violation(path="timeout", value=timeout, message="must be a number of seconds > 0"))
        if model is not None and not isinstance(model, str):
            bad.append(Violation(path="model", value=model, message="model must be a string"))
        if not (base_url or os.environ.get(URL_ENV)):
            # Every missing piece at once: fixing the URL only to learn about the key next is a wasted run.
            bad.append(Violation(path="base_url", message="the rerank-api backend needs the server's "
                                 f"URL: pass base_url (CLI --base-url) or set {URL_ENV}, e.g. "
                                 "http://127.0.0.1:8000/v1"))
            if not (api_key or os.environ.get(KEY_ENV)):
                bad.append(Violation(path="api_key", message="no API key: pass api_key= or set "
                                     f"{KEY_ENV} (a server on 127.0.0.1 / localhost needs none)"))
        if bad:
            raise InputError(bad, headline="invalid rerank-api options")
        url, key = resolve_credentials("rerank-api", base_url, api_key, url_env=URL_ENV, key_env=KEY_ENV)
        assert url is not None  # checked above
        if problem := base_url_problem(url):
            raise InputError([Violation(path="base_url", message=problem, value=display_url(url))])
        self.model, self.url, self._key = model, endpoint(url), key
        self._hidden = secrets_of(key, urls=[url])  # what every message is scrubbed of
        self.timeout, self.max_chars, self.score_mapping = float(timeout), max_chars, score_mapping
        self._clients = SDKClients(self._make_sync, self._make_async)

    # -- HTTP ------------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key}", "Content-Type": "application/json",
                "Accept": "application/json"}

    def _make_sync(self) -> Any:
        return _httpx().Client(timeout=self.timeout, headers=self._headers(), verify=shared_ssl_context())

    def _make_async(self) -> Any:
        return _httpx().AsyncClient(timeout=self.timeout, headers=self._headers(),
                                    verify=shared_ssl_context())

    def payload(self, request: RerankRequest) -> tuple[dict[str, Any], int]:
        """The request body and how many documents were cut to `max_chars`."""
        docs = [c.text for c in request.chunks]
        cut = 0
        if self.max_chars is not None:
            cut = sum(len(d) > self.max_chars for d in docs)
            docs = [d[: self.max_chars] for d in docs]
        body: dict[str, Any] = {"query": request.query, "documents": docs, "top_n": len(docs)}
        if self.model:
            body["model"] = self.model
        return body, cut

    def cache_identity(self, prompt: str, request: RerankRequest, max_tokens: int) -> dict[str, Any]:
        """What decides this call's answer, for the response cache's key (`cache.py`): the endpoint
        (credentials masked), the request body (model, query, documents) and the score mapping."""
        return {"backend": self.name, "url": display_url(self.url), "body": self.payload(request)[0],
                "score_mapping": self.score_mapping}

    def _failure(self, exc: Exception) -> TransientFailure | FatalFailure:
        httpx = _httpx()
        if isinstance(exc, httpx.TimeoutException):
            return TransientFailure(f"rerank-api: request timed out after {self.timeout:g}s")
        if isinstance(exc, httpx.TransportError):
            if (why := unreachable_reason(exc, self._hidden)) is not None:
                return UnreachableFailure(f"rerank-api: {why}")
            return TransientFailure(f"rerank-api: connection error: {connection_detail(exc, self._hidden)}")
        return FatalFailure(f"rerank-api: {type(exc).__name__}: {scrub(str(exc), self._hidden)[:300]}")

    def _status(self, response: Any) -> None:
        status = int(response.status_code)
        if status < 400:
            return
        text = " ".join(scrub(response.text, self._hidden).split())[:300]
        detail = f"rerank-api: HTTP {status} from {display_url(self.url)}: {text}"
        if is_transient_status(status):
            raise TransientFailure(detail, status=status, retry_after=retry_after_seconds(response.headers))
        if status in (401, 403):
            detail += f" (check api_key / {KEY_ENV})"
        raise FatalFailure(detail, status=status)

    def _completion(self, response: Any, request: RerankRequest, cut: int) -> Completion:
        self._status(response)
        n = len(request.chunks)
        try:
            body = response.json()
        except ValueError:
            shown = " ".join(scrub(response.text, self._hidden).split())[:120]
            where = display_url(self.url)
            raise FatalFailure(f"rerank-api: the response from {where} is not JSON: {shown!r}") from None
        scores = self._scores(body, n)
        notes = (f"rerank-api: {counted(cut, 'document')} cut to max_chars={self.max_chars}",) if cut else ()
        obj = answer(request, scores, RERANK_API_REASON, decimals=SCORE_DECIMALS,
                     unscored_reason=reasons.reason(reasons.NOT_SELECTED, "not returned by the rerank API"))
        model = body.get("model") if isinstance(body.get("model"), str) else self.model
        return Completion(text=json.dumps(obj, ensure_ascii=False), model=model, usage=_usage(body),
                          notes=notes)

    def _scores(self, body: Any, n: int) -> list[float | None]:
        results = body.get("results") if isinstance(body, Mapping) else None
        if not isinstance(results, list):
            raise FatalFailure(f"rerank-api: the response from {display_url(self.url)} has no 'results' list "
                               "(is this a /v1/rerank server?)")
        raw: dict[int, float] = {}
        for pos, item in enumerate(results):
            index = item.get("index") if isinstance(item, Mapping) else None
            score = item.get("relevance_score") if isinstance(item, Mapping) else None
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
                raise FatalFailure(f"rerank-api: results[{pos}].index {index!r} is not a document index "
                                   f"(0..{n - 1})")
            if index in raw:
                raise FatalFailure(f"rerank-api: results[{pos}] repeats index {index}")
            ok = isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score)
            if not ok:
                raise FatalFailure(f"rerank-api: results[{pos}].relevance_score {score!r} is not a "
                                   "finite number")
            raw[index] = float(score)
        mapped = dict(zip(raw, map_scores(list(raw.values()), self.score_mapping), strict=True))
        return [mapped.get(i) for i in range(n)]

    # -- Backend protocol ----------------------------------------------------------------------

    def complete(self, prompt: str, request: RerankRequest, *, max_tokens: int,
                 feedback: Sequence[Violation] = (), previous: str | None = None) -> Completion:
        body, cut = self.payload(request)
        try:
            response = self._clients.sync().post(self.url, json=body)
        except Exception as exc:
            raise self._failure(exc) from None
        return self._completion(response, request, cut)

    async def acomplete(self, prompt: str, request: RerankRequest, *, max_tokens: int,
                        feedback: Sequence[Violation] = (), previous: str | None = None) -> Completion:
        body, cut = self.payload(request)
        try:
            response = await self._clients.for_running_loop().post(self.url, json=body)
        except Exception as exc:
            raise self._failure(exc) from None
        return self._completion(response, request, cut)
