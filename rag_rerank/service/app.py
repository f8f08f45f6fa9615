"""The ASGI app of `rag-rerank serve`: Cohere's `/v1/rerank` and `/v2/rerank` in front of one
`Reranker` session per configured model name (FastAPI, the `serve` extra).

Each rerank handler does the same few steps, none of which ranks anything: authenticate the key
(`keys.py`), read the body within its size limit, translate it (`protocol.parse_request`), find the
model's session (404 naming the configured ones), take an in-flight slot (`admission.py`, 429 when
full), reserve the key's budget (429 when spent), call `Reranker.arerank` once under the request's
deadline (504), and translate the result back (`protocol.response`). Every failure becomes a
status and a Cohere-style body (`protocol.Failure`); an unexpected one is logged here with its
traceback under an error id and answered 500 with that id only, so no stack trace, upstream URL
or key reaches a client.

`create_app(config)` builds the sessions at once (a bad configuration fails at start-up, not at the
first request) and closes them at shutdown. `app_from_env()` is the factory `serve --workers N`
gives uvicorn: each worker process builds its own app from the config path in the environment.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from ..backends.factory import capabilities
from ..cost import as_prices
from ..errors import (
    BackendError,
    BudgetError,
    CacheMissError,
    InputError,
    MissingDependencyError,
    Violation,
)
from ..evidence import MIN_TOKENS_PER_CHUNK
from ..models import RerankResult
from ..paths import default_cache_dir
from ..session import Reranker, off_loop
from . import protocol
from .admission import Admission, Draining, Overloaded
from .config import ApiKey, ModelSpec, ServiceConfig, build_sessions, load_config, read_keys_file
from .keys import Ledger, Usage, authenticate, bearer_token, utc_day
from .metrics import Metrics

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from pydantic import BaseModel, Field
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError:  # the serve extra is not installed
    raise MissingDependencyError("rag-rerank serve", "serve", "fastapi") from None

log = logging.getLogger("rag_rerank.service")

CONFIG_ENV = "RAG_RERANK_SERVE_CONFIG"
KEYS_ENV = "RAG_RERANK_SERVE_KEYS_FILE"


# --------------------------------------------------------------------------- OpenAPI shapes


class V2RerankRequest(BaseModel):
    """`POST /v2/rerank`."""

    model: str = Field(description="a configured model name (GET /v1/models)")
    query: str
    documents: list[str]
    top_n: int | None = Field(
        None, ge=1, description="at most this many results (default: the model's top_k)"
    )
    max_tokens_per_doc: int | None = Field(
        None, ge=MIN_TOKENS_PER_CHUNK, description="a longer document is ranked by its evidence"
    )
    return_documents: bool | None = None


class V1RerankRequest(BaseModel):
    """`POST /v1/rerank`."""

    model: str | None = Field(None, description="a configured model name; absent: the default model")
    query: str
    documents: list[str | dict[str, Any]]
    top_n: int | None = Field(None, ge=1)
    rank_fields: list[str] | None = None
    return_documents: bool | None = None
    max_chunks_per_doc: int | None = None
    max_tokens_per_doc: int | None = Field(
        None, ge=MIN_TOKENS_PER_CHUNK, description="a longer document is ranked by its evidence"
    )


class RerankResultItem(BaseModel):
    index: int
    relevance_score: float
    document: dict[str, Any] | None = None


class RerankResponse(BaseModel):
    id: str
    results: list[RerankResultItem]
    meta: dict[str, Any]
    rag_rerank: dict[str, Any] = Field(description="ours: reasons, dropped documents, calls, cache, notes")


class ErrorBody(BaseModel):
    id: str
    message: str
    rag_rerank: dict[str, Any] | None = None


_ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorBody} for s in (400, 401, 404, 413, 429, 500, 502, 503, 504)
}


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


# --------------------------------------------------------------------------- the app


class Service:
    """What one app holds: the configuration, a session per model, admission, ledger, metrics."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        for spec in config.models.values():
            missing_key_warning(spec)
        self.sessions, bad = build_sessions(config.models)
        if bad:
            self.close()
            raise InputError(bad, headline="invalid service config")
        limits = config.limits
        # What each session's input guard applies: the service's query and document limits.
        self.limits = {
            name: protocol.library_limits(limits, session.defaults.limits)
            for name, session in self.sessions.items()
        }
        self.admission = Admission(limits.max_in_flight, limits.max_queue, limits.queue_timeout_s)
        self.ledger = Ledger(ledger_path(config)) if any(k.budget for k in config.keys) else None
        self.metrics = Metrics()
        self.ready = False  # until warm_up: /ready answers 503

    def warm_up(self) -> None:
        """Load what a session loads on first use (the local scorer's tables, a cross-encoder) before
        the first request, for the sessions whose backend sends no request: an upstream is never
        called to warm up. Then the service is ready."""
        for session in self.sessions.values():
            if not capabilities(session.backend).makes_requests:
                session.rerank("warm up", [{"id": "0", "text": "warm up the scorer"}], 1)
        self.ready = True

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()
        if getattr(self, "ledger", None) is not None:
            self.ledger.close()

    def failure_response(self, failure: protocol.Failure) -> JSONResponse:
        return JSONResponse(failure.body(), status_code=failure.status, headers=dict(failure.headers or {}))

    def refuse(self, reason: str, failure: protocol.Failure) -> protocol.Failure:
        self.metrics.refusals.labels(reason).inc()
        return failure

    def authorize(self, request: Request) -> ApiKey | None:
        if not self.config.auth:
            return None
        key = authenticate(self.config.keys, bearer_token(request.headers.get("authorization")))
        if key is None:
            raise _Answer(
                self.refuse(
                    "auth",
                    protocol.Failure(401, "invalid or missing API key (send Authorization: Bearer KEY)"),
                ),
                headers={"WWW-Authenticate": "Bearer"},
            )
        return key

    async def read_json(self, request: Request) -> Any:
        limit = self.config.limits.max_body_bytes
        too_big = protocol.Failure(
            413,
            f"the request body is over the limit of {limit} bytes (max_body_bytes)",
            details={"limit": "max_body_bytes", "max": limit},
        )
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise _Answer(self.refuse("limit", too_big))
        size, parts = 0, []
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise _Answer(self.refuse("limit", too_big))
            parts.append(part)
        try:
            return json.loads(b"".join(parts))
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Answer(protocol.Failure(400, f"the request body is not JSON: {str(exc)[:120]}")) from None

    def planned(
        self, key: ApiKey | None, session: Reranker, call: protocol.RerankCall, options: Mapping[str, Any]
    ) -> Usage:
        """What the request will use by its plan (offline), for the key's budget; nothing without one."""
        if key is None or self.ledger is None or not key.budget.spend:
            return Usage()
        plan = session.plan(call.query, call.chunks(), **options)
        return Usage(calls=plan.requests, tokens=plan.total_tokens, cost=plan.cost or 0.0)

    def used(self, session: Reranker, result: RerankResult) -> Usage:
        units = protocol.billed(result, capabilities(session.backend).makes_requests)
        prices = as_prices(session.defaults.prices)
        cost = prices.cost(units["input_tokens"], units["output_tokens"]) if prices is not None else 0.0
        return Usage(
            calls=units["search_units"], tokens=units["input_tokens"] + units["output_tokens"], cost=cost
        )

    async def rerank(self, request: Request, version: int) -> Response:
        route = f"/v{version}/rerank"
        started = time.monotonic()
        model = "-"
        status = 500
        try:
            key = self.authorize(request)
            call = protocol.parse_request(await self.read_json(request), version, self.config.limits)
            model = call.model or self.config.default_model
            session = self.sessions.get(model)
            if session is None:
                names = ", ".join(self.sessions)
                model = "-"
                raise _Answer(
                    protocol.Failure(
                        404,
                        f"model {call.model!r} not found; configured models: {names}",
                        details={"models": list(self.sessions)},
                    )
                )
            options, notes = protocol.call_options(call, limits=self.limits[model])
            deadline = self.config.limits.deadline_s
            with self.metrics.in_flight.track_inprogress():
                result = await self.within_deadline(self.admitted(key, session, call, options), deadline)
            if result.meta.fallback_reason:  # answered, but not by the configured upstream
                log.warning("model %r: answered by the fallback: %s", model, result.meta.fallback_reason)
            sends = capabilities(session.backend).makes_requests
            self.metrics.observe(model, result, sends)
            status = 200
            return JSONResponse(protocol.response(call, result, notes))
        except _Answer as answer:
            status = answer.failure.status
            response = self.failure_response(answer.failure)
            response.headers.update(answer.headers)
            return response
        except Exception as exc:  # every failure answered with a status and a Cohere-style body
            failure = self.classify(exc, model)
            status = failure.status
            return self.failure_response(failure)
        finally:
            self.metrics.requests.labels(route, model, str(status)).inc()
            if status == 200:
                self.metrics.latency.labels(route, model).observe(time.monotonic() - started)

    async def within_deadline(self, work: Coroutine[Any, Any, RerankResult], deadline: float) -> RerankResult:
        """`work`'s result, or `TimeoutError` (504) once `deadline` seconds have passed, on time: the
        work runs as a task of its own, and at the deadline it is cancelled without waiting for it.
        CPU work in a thread cannot be stopped (`session.off_loop`): the task ends when that work does,
        and until then it keeps its in-flight slot (`admitted`), so `max_in_flight` bounds the work
        really running, abandoned or not, and its result is discarded."""
        task = asyncio.ensure_future(work)
        try:
            return await asyncio.wait_for(asyncio.shield(task), deadline)
        except BaseException:  # the deadline, or this handler cancelled (shutdown)
            task.cancel()
            task.add_done_callback(_discard)
            raise

    async def admitted(
        self, key: ApiKey | None, session: Reranker, call: protocol.RerankCall, options: Mapping[str, Any]
    ) -> RerankResult:
        """The rerank inside an in-flight slot, with the key's budget reserved and settled."""
        async with self.admission.slot():
            planned = await off_loop(self.planned, key, session, call, options)
            day = utc_day()
            if key is not None and self.ledger is not None and key.budget:
                # SQLite may wait for another worker's transaction: off the event loop
                reason = await asyncio.to_thread(self.ledger.reserve, key, planned, day)
                if reason is not None:
                    raise _Answer(self.refuse("budget", protocol.budget_failure(reason)))
            used = Usage()
            try:
                result = await session.arerank(call.query, call.chunks(), **options)
                used = self.used(session, result)
                return result
            finally:
                if key is not None and self.ledger is not None and key.budget:
                    await asyncio.to_thread(self.ledger.settle, key, planned, used, day)

    def secret_free(self, exc: Exception) -> str:
        """`exc`'s text for the server log, with any configured upstream key in it masked (an
        upstream's error body may echo the key it refused)."""
        text = str(exc)
        for spec in self.config.models.values():
            key = os.environ.get(spec.api_key_env) if spec.api_key_env else None
            if key and len(key) >= 4:
                text = text.replace(key, "***")
        return text

    def classify(self, exc: Exception, model: str = "-") -> protocol.Failure:
        limits = self.config.limits
        if isinstance(exc, Overloaded):
            return self.refuse(
                "overload",
                protocol.Failure(
                    429,
                    f"the server is at capacity ({limits.max_in_flight} requests in flight, "
                    f"{limits.max_queue} queued); retry after the time in Retry-After",
                    {"Retry-After": str(limits.retry_after_s)},
                    {"reason": "overload"},
                ),
            )
        if isinstance(exc, Draining):
            return self.refuse(
                "draining", protocol.Failure(503, "the server is shutting down", {"Retry-After": "1"})
            )
        if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
            return protocol.Failure(
                504,
                f"the request did not finish within its deadline of {limits.deadline_s:g}s",
                details={"reason": "deadline"},
            )
        if isinstance(exc, InputError):
            return protocol.input_failure(exc)
        if isinstance(exc, BudgetError):
            return self.refuse("budget", protocol.budget_failure(exc))
        if isinstance(exc, BackendError):
            failure = protocol.upstream_failure(exc)
            text = self.secret_free(exc)
            log.warning("model %r: upstream failure, answered %d: %s", model, failure.status, text)
            return failure
        if isinstance(exc, CacheMissError):
            return protocol.Failure(502, "replay: the response cache holds no answer for this request")
        error_id = uuid.uuid4().hex[:12]
        log.exception("internal error %s", error_id)
        return protocol.Failure(500, f"internal error (id {error_id}; the server log has the details)")


def missing_key_warning(spec: ModelSpec) -> None:
    """Warn at start-up when a model names an `api_key_env` that is not set: the backend may still
    start (a server on 127.0.0.1 needs no key), but an upstream that wants one refuses every request."""
    if spec.api_key_env and not os.environ.get(spec.api_key_env):
        log.warning(
            "model %r: the environment variable %s (api_key_env) is not set; it is sent no API key",
            spec.name,
            spec.api_key_env,
        )


def ledger_path(config: ServiceConfig) -> str:
    """Where the keys' daily spending is kept: the config's `ledger`, else a file in the cache
    folder (`RAG_RERANK_CACHE_DIR`, else ~/.cache/rag-rerank), shared by every worker."""
    if config.ledger:
        return config.ledger
    folder = default_cache_dir()
    if folder is None:
        raise InputError(
            [
                Violation(
                    path="ledger",
                    message="keys have budgets but there is no cache folder "
                    "to keep their spending in: set ledger: PATH in the config",
                )
            ],
            headline="invalid service config",
        )
    return str(folder / "service-ledger.sqlite3")


def _discard(task: asyncio.Future[Any]) -> None:
    """The end of a request's work after its deadline: its result or error is dropped (the client has
    had its 504), and an unexpected error is logged rather than lost."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None and not isinstance(exc, (_Answer, InputError, BudgetError, BackendError)):
        log.warning("a request's work failed after its deadline: %r", exc)


class _Answer(Exception):
    """A failure decided in a handler's step, answered as it is."""

    def __init__(self, failure: protocol.Failure, headers: Mapping[str, str] | None = None) -> None:
        self.failure = failure
        self.headers = dict(headers or {})
        super().__init__(failure.message)


def create_app(config: ServiceConfig | None = None) -> FastAPI:
    """The service's ASGI app for `config` (default: the offline `local` model, no keys)."""
    service = Service(config or load_config(None))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Each request's CPU work (planning, shortening long chunks, the post-pass) runs in a worker
        # thread (`session.off_loop`), so /health and the other requests keep being answered. One
        # thread per in-flight slot (and a few for the cache and the ledger): a small request never
        # waits for a thread behind long ones; more work than slots waits for a slot instead (429).
        workers = service.config.limits.max_in_flight + 8
        executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rag-rerank-work")
        asyncio.get_running_loop().set_default_executor(executor)
        await asyncio.to_thread(service.warm_up)
        yield
        service.admission.draining = True
        service.ready = False
        for session in service.sessions.values():
            await session.aclose()
        service.close()

    from .. import __version__

    app = FastAPI(
        title="rag-rerank",
        version=__version__,
        lifespan=lifespan,
        description="Cohere-compatible rerank API backed by rag-rerank's guarded LLM reranker.",
        # FastAPI's /docs and /redoc pages load their scripts from a CDN: blank on an offline host,
        # and a third party learns of every visit. The schema itself is served (/openapi.json).
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = service

    @app.exception_handler(StarletteHTTPException)
    async def framework_error(request: Request, exc: StarletteHTTPException) -> Response:
        """The router's own answers (404 unknown path, 405 wrong method) in Cohere's error shape."""
        return service.failure_response(
            protocol.Failure(exc.status_code, framework_message(request, exc), headers=exc.headers)
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        errors = [{"path": ".".join(map(str, e.get("loc", ()))), "message": str(e.get("msg", ""))}
                  for e in exc.errors()]
        shown = "; ".join(f"{e['path']}: {e['message']}" for e in errors[:3])
        return service.failure_response(
            protocol.Failure(422, f"invalid request: {shown}", details={"errors": errors})
        )
    if service.config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(service.config.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )

    @app.post(
        "/v2/rerank",
        response_model=None,
        openapi_extra=_body_schema(V2RerankRequest),
        responses={200: {"model": RerankResponse}, **_ERRORS},
        summary="Rerank documents (Cohere v2)",
    )
    async def rerank_v2(request: Request) -> Response:
        return await service.rerank(request, 2)

    @app.post(
        "/v1/rerank",
        response_model=None,
        openapi_extra=_body_schema(V1RerankRequest),
        responses={200: {"model": RerankResponse}, **_ERRORS},
        summary="Rerank documents (Cohere v1)",
    )
    async def rerank_v1(request: Request) -> Response:
        return await service.rerank(request, 1)

    @app.get("/v1/models", response_model=None, summary="The model names a request may ask for")
    async def models(request: Request) -> Response:
        try:
            service.authorize(request)
        except _Answer as answer:
            response = service.failure_response(answer.failure)
            response.headers.update(answer.headers)
            return response
        return JSONResponse(
            {
                "models": [spec.describe() for spec in service.config.models.values()],
                "default_model": service.config.default_model,
            }
        )

    @app.get("/health", summary="Liveness: the process answers")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", response_model=None, summary="Readiness: sessions built, not draining")
    async def ready() -> Response:
        ok = service.ready and not service.admission.draining
        return JSONResponse(
            {
                "status": "ready" if ok else "draining",
                "models": list(service.sessions),
                "in_flight": service.admission.in_flight,
                "queued": service.admission.waiting,
            },
            status_code=200 if ok else 503,
        )

    @app.get("/metrics", response_model=None, summary="Prometheus metrics")
    async def metrics() -> Response:
        body, content_type = service.metrics.exposition()
        return Response(body, media_type=content_type)

    return app


ENDPOINTS = (
    "POST /v1/rerank, POST /v2/rerank, GET /v1/models, GET /health, GET /ready, GET /metrics, "
    "GET /openapi.json"
)


def framework_message(request: Request, exc: StarletteHTTPException) -> str:
    """What the router's refusal means, with what the service does answer."""
    path = request.url.path[:200]
    if exc.status_code == 404:
        return f"no such path: {path} (this service answers {ENDPOINTS})"
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("allow") or (exc.headers or {}).get("Allow") or ""
        return f"method {request.method} is not allowed on {path}" + (f"; use {allowed}" if allowed else "")
    return str(exc.detail)


def app_from_env() -> FastAPI:
    """The app a uvicorn worker builds (`serve --workers N`): the config file named by
    `RAG_RERANK_SERVE_CONFIG` and the keys file by `RAG_RERANK_SERVE_KEYS_FILE`, when set."""
    config = load_config(os.environ.get(CONFIG_ENV) or None)
    keys_file = os.environ.get(KEYS_ENV)
    if keys_file:
        config = config.with_keys(read_keys_file(keys_file))
    return create_app(config)


__all__ = ["CONFIG_ENV", "KEYS_ENV", "Service", "app_from_env", "create_app"]
