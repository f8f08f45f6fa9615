"""`rag-rerank serve`: the Cohere-compatible rerank API (`/v1/rerank`, `/v2/rerank`) in front of
`Reranker` sessions, for any RAG stack that speaks it (the `serve` extra: FastAPI, uvicorn,
prometheus-client).

One module per job: `config.py` (model names to sessions, keys, limits), `protocol.py` (Cohere's
request and response shapes, errors), `keys.py` (bearer keys, per-key daily budgets), `admission.py`
(in-flight bound and queue), `metrics.py` (Prometheus), `app.py` (the ASGI app), `server.py`
(uvicorn, workers), `ray_serve.py` (the same app on Ray Serve). Nothing here ranks: the handlers
translate a request into one `Reranker.arerank` call and its result back.
"""

from __future__ import annotations

from .config import ServiceConfig, load_config, parse_config

__all__ = ["ServiceConfig", "load_config", "parse_config"]
