"""`GET /metrics` in Prometheus' text format: requests by route, model and status, their latency,
and what the reranker did for them, read off each result's `meta` (the engine's own record of its
calls, re-asks, retries, cache hits and fallbacks), so the counters cannot disagree with the answers.

With `serve --workers N` each worker is its own process; `prometheus_client`'s multiprocess mode
(`PROMETHEUS_MULTIPROC_DIR`, set by `serve` before the workers start) sums them, so any worker's
`/metrics` answers for the whole server.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import MissingDependencyError
from ..models import RerankResult
from .protocol import billed

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Latency buckets (seconds): from a cached or local answer (ms) to an LLM's windows (tens of s).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise MissingDependencyError("rag-rerank serve (/metrics)", "serve", "prometheus-client") from None
    return prometheus_client


class Metrics:
    """The service's counters, in a registry of their own (two apps in one process do not collide)."""

    def __init__(self) -> None:
        prom = _prometheus()
        self._prom = prom
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.requests = prom.Counter(
            "rag_rerank_requests_total",
            "HTTP requests answered, by route, model and status",
            ["route", "model", "status"],
            registry=r,
        )
        self.latency = prom.Histogram(
            "rag_rerank_request_seconds",
            "Time from arrival to answer of a rerank request",
            ["route", "model"],
            buckets=BUCKETS,
            registry=r,
        )
        self.calls = prom.Counter(
            "rag_rerank_llm_calls_total",
            "Backend requests made (attempts, cache hits excluded)",
            ["model"],
            registry=r,
        )
        self.tokens = prom.Counter(
            "rag_rerank_tokens_total", "Tokens reported by the backend", ["model", "kind"], registry=r
        )
        self.cache = prom.Counter(
            "rag_rerank_cache_total", "Response cache lookups", ["model", "result"], registry=r
        )
        self.reasks = prom.Counter(
            "rag_rerank_retries_total",
            "Attempts beyond one per call: re-asks after an "
            "invalid answer and retries after a transient failure",
            ["model"],
            registry=r,
        )
        self.fallbacks = prom.Counter(
            "rag_rerank_fallbacks_total", "Results the local fallback answered", ["model"], registry=r
        )
        self.statuses = prom.Counter(
            "rag_rerank_results_total",
            "Results answered, by model and meta.status (ok, repaired, reasked, fallback, partial)",
            ["model", "status"],
            registry=r,
        )
        self.refusals = prom.Counter(
            "rag_rerank_refusals_total",
            "Requests refused before any reranking, by reason (auth, budget, overload, draining, limit)",
            ["reason"],
            registry=r,
        )
        gauge_mode = {"multiprocess_mode": "livesum"} if os.environ.get(MULTIPROC_ENV) else {}
        self.in_flight = prom.Gauge(
            "rag_rerank_in_flight", "Rerank requests being served", registry=r, **gauge_mode
        )

    def observe(self, model: str, result: RerankResult, sends_requests: bool = True) -> None:
        """Count what the engine did for one result."""
        meta = result.meta
        units = billed(result, sends_requests)
        self.calls.labels(model).inc(units["search_units"])
        if units["input_tokens"]:
            self.tokens.labels(model, "input").inc(units["input_tokens"])
        if units["output_tokens"]:
            self.tokens.labels(model, "output").inc(units["output_tokens"])
        if meta.cache is not None:
            self.cache.labels(model, "hit").inc(meta.cache.get("hits", 0))
            self.cache.labels(model, "miss").inc(meta.cache.get("misses", 0))
        extra = meta.attempts - meta.calls
        if extra > 0:
            self.reasks.labels(model).inc(extra)
        if meta.fallback:
            self.fallbacks.labels(model).inc()
        self.statuses.labels(model, meta.status).inc()

    def exposition(self) -> tuple[bytes, str]:
        """The text `/metrics` answers, and its content type."""
        prom = self._prom
        if os.environ.get(MULTIPROC_ENV):
            from prometheus_client import multiprocess

            registry = prom.CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return prom.generate_latest(registry), prom.CONTENT_TYPE_LATEST
        return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST


__all__ = ["MULTIPROC_ENV", "Metrics"]
