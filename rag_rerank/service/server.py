"""Running the app on uvicorn: one process, or `workers` processes sharing the port.

One process serves the app built here. With `workers > 1` uvicorn starts that many processes,
each building its own app from the configuration's path (`app.app_from_env`), and restarts one
that dies; they share what lives in files: the response cache (SQLite, `cache.py`), the keys'
daily spending (`keys.Ledger`) and the Prometheus counters (multiprocess mode, a temporary folder
made here). The configuration is checked here first, so a mistake in it is one error at start-up,
not one per worker.

SIGTERM (or Ctrl-C) drains: uvicorn stops accepting connections, lets the requests in flight finish
(up to `limits.drain_s`), then runs the app's shutdown, which closes the sessions.
"""

from __future__ import annotations

import copy
import logging
import logging.config
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..errors import MissingDependencyError
from .app import CONFIG_ENV, KEYS_ENV, Service, create_app
from .config import ServiceConfig, load_config, read_keys_file
from .metrics import MULTIPROC_ENV


def _uvicorn():
    try:
        import uvicorn
    except ImportError:
        raise MissingDependencyError("rag-rerank serve", "serve", "uvicorn") from None
    return uvicorn


def resolve(config_path: str | None, keys_file: str | None) -> ServiceConfig:
    """The configuration `serve` runs with (the config file, plus the keys file's keys)."""
    config = load_config(config_path)
    if keys_file:
        config = config.with_keys(read_keys_file(keys_file))
    return config


def log_config(level: str) -> dict[str, Any]:
    """uvicorn's logging configuration with the package's loggers (`rag_rerank`, which is silent
    unless an application configures it) on the same stderr handler at `level`: an upstream failure,
    a missing upstream key or an internal error reaches the operator's log (each worker applies it)."""
    from uvicorn.config import LOGGING_CONFIG

    out = copy.deepcopy(LOGGING_CONFIG)
    out["loggers"]["rag_rerank"] = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    return out


def serve(
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    workers: int = 1,
    config_path: str | None = None,
    keys_file: str | None = None,
    log_level: str = "info",
) -> None:
    """Serve until SIGTERM / Ctrl-C (module docstring). Raises `InputError` for a bad config."""
    uvicorn = _uvicorn()
    logging_config = log_config(log_level)
    logging.config.dictConfig(logging_config)  # before the sessions are built: their warnings show
    config = resolve(config_path, keys_file)
    common = {
        "host": host,
        "port": port,
        "log_level": log_level,
        "log_config": logging_config,
        "timeout_graceful_shutdown": config.limits.drain_s,
        "backlog": 2048,
        "server_header": False,
    }
    if workers <= 1:
        uvicorn.run(create_app(config), **common)
        return
    Service(config).close()  # the sessions build: a bad option is one error here, not one per worker
    os.environ[CONFIG_ENV] = str(Path(config_path).resolve()) if config_path else ""
    os.environ[KEYS_ENV] = str(Path(keys_file).resolve()) if keys_file else ""
    made = None
    if not os.environ.get(MULTIPROC_ENV):
        made = tempfile.mkdtemp(prefix="rag-rerank-metrics-")
        os.environ[MULTIPROC_ENV] = made
    try:
        uvicorn.run("rag_rerank.service.app:app_from_env", factory=True, workers=workers, **common)
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


__all__ = ["log_config", "resolve", "serve"]
