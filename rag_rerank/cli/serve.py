"""`rag-rerank serve`: the Cohere-compatible rerank API over HTTP (the `serve` extra)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from .common import EXIT_OK, whole_number


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command(
        "serve",
        "serve the Cohere-compatible /v1/rerank and /v2/rerank API (needs rag-rerank[serve])",
        "Serve the Cohere-compatible /v1/rerank and /v2/rerank API (and GET /v1/models,\n"
        "/health, /ready, /metrics, /docs) backed by rag-rerank sessions, one per model name in\n"
        "--config. Without --config the offline local backend answers as model 'local'.\n"
        "SIGTERM drains the requests in flight. Needs the serve extra:\n"
        "  pip install 'rag-rerank[serve]'",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=whole_number, default=8080, help="port (default 8080)")
    p.add_argument(
        "--workers",
        type=whole_number,
        default=1,
        metavar="N",
        help="worker processes sharing the port, the response cache and the key budgets (default 1)",
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="YAML or JSON: models (name -> backend, model, options), keys, limits, cors",
    )
    p.add_argument(
        "--api-keys-file",
        default=None,
        metavar="FILE",
        help="accepted bearer keys, one key or its SHA-256 hex per line",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="server log level (default info)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..service.server import serve  # imports FastAPI and uvicorn: only when serving

    serve(
        args.host,
        args.port,
        workers=max(1, args.workers),
        config_path=args.config,
        keys_file=args.api_keys_file,
        log_level=args.log_level,
    )
    return EXIT_OK
