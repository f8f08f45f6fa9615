"""The rerank service (`rag_rerank.service`) on a real server on 127.0.0.1: in a thread
(`running`), or as a user runs it, `rag-rerank serve` in a process of its own (`serve_process`,
shared by tests/test_service_server.py and bench/serve.py).

Tests call it with clients we did not write (the cohere SDK, LiteLLM, the framework components)
over real HTTP. The server binds a free port, and starting and stopping it are bounded: a server
that does not come up, or a test that leaves a request hanging, cannot hang the suite.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .sockets import closed_port


@contextlib.contextmanager
def running(app: Any, *, timeout: float = 20.0) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 until the block ends; yields its base URL (`http://127.0.0.1:PORT`)."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", timeout_graceful_shutdown=5
        )
    )
    thread = threading.Thread(target=server.run, name="rerank-service", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the rerank service did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def openai_model(base_url: str, key_env: str, model: str = "fake-gpt", **extra: Any) -> dict[str, Any]:
    """A service config's model entry (`models: {name: ...}`) for the openai backend at `base_url`
    (a fake LLM server), its key read from the environment variable `key_env`; `extra` adds keys
    (`cache`, `options`)."""
    return {"backend": "openai", "model": model, "base_url": base_url, "api_key_env": key_env, **extra}


class ServiceDidNotStart(RuntimeError):
    """`rag-rerank serve` exited, or was not ready in time; the message ends with its stderr."""


def workers_of(proc: subprocess.Popen) -> list[int]:
    """The serving processes: the uvicorn workers under `proc` (not multiprocessing's resource
    tracker), or `proc` itself when it serves alone."""
    out = subprocess.run(
        ["ps", "-o", "pid=,args=", "--ppid", str(proc.pid)], capture_output=True, text=True, check=False
    ).stdout
    kids = [
        int(line.split()[0])
        for line in out.splitlines()
        if "multiprocessing.spawn" in line and "resource_tracker" not in line
    ]
    return kids or [proc.pid]


@contextlib.contextmanager
def serve_process(
    *args: str,
    root: Path,
    env: Mapping[str, str] | None = None,
    workers: int = 1,
    timeout: float = 60.0,
    log_level: str = "warning",
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m rag_rerank serve --port P --workers N ARGS` (the package under `root`) until the
    block ends; yields its base URL and process once `/ready` answers 200 and all `workers` are up.

    Raises `ServiceDidNotStart` with the server's stderr when it exits or is not ready within
    `timeout` seconds. At the end it gets SIGTERM (it drains, as in production) unless it has exited
    already, and is killed if it has not stopped 30 s later."""
    import httpx

    port = closed_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rag_rerank", "serve", "--port", str(port), "--workers", str(workers),
         "--log-level", log_level, *args],
        env={**os.environ, "PYTHONPATH": str(root), **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(httpx.HTTPError):
                ready = httpx.get(f"{url}/ready", timeout=2).status_code == 200
                if ready and len(workers_of(proc)) >= workers:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                if proc.poll() is None:
                    proc.kill()
                err = proc.communicate(timeout=10)[1] or ""
                raise ServiceDidNotStart(f"rag-rerank serve did not start within {timeout:g}s: {err[-2000:]}")
            time.sleep(0.2)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
