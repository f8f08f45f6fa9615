"""The same app as a Ray Serve deployment: `serve.run(rerank_deployment(config))` puts the rerank
API behind Ray's HTTP proxy, with as many replicas as asked, each replica building its own app
(its own sessions, connection pools and admission bound) from the configuration when it starts.

The configuration travels to the replicas as data (a `ServiceConfig` or a file path), never as a
built app: sessions hold connections and locks that do not pickle, and each replica needs its own.
Needs Ray Serve (`pip install 'rag-rerank[ray-serve]'`).
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import MissingDependencyError
from .app import create_app
from .config import ServiceConfig, load_config


def _serve() -> Any:
    try:
        from ray import serve
    except ImportError:
        raise MissingDependencyError("the Ray Serve deployment", "ray-serve", "ray[serve]") from None
    return serve


def rerank_deployment(
    config: ServiceConfig | str | os.PathLike[str] | None = None,
    *,
    name: str = "rag-rerank",
    num_replicas: int = 1,
    **deployment_options: Any,
) -> Any:
    """A bound Ray Serve application serving the rerank API for `config` (a `ServiceConfig`, a
    config file's path, or None for the offline default); pass it to `ray.serve.run`.
    `deployment_options` go to `serve.deployment` (ray_actor_options, max_ongoing_requests...)."""
    serve = _serve()
    settings = config if isinstance(config, ServiceConfig) or config is None else load_config(config)

    def build() -> Any:  # runs on each replica
        return create_app(settings)

    ingress = serve.ingress(build)()
    return serve.deployment(ingress, name=name, num_replicas=num_replicas, **deployment_options).bind()


__all__ = ["rerank_deployment"]
