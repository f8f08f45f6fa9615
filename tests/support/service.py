"""The rerank service (`rag_rerank.service`) on a real uvicorn server on 127.0.0.1, in a thread.

Tests call it with clients we did not write (the cohere SDK, LiteLLM, the framework components)
over real HTTP. The server binds port 0 (the kernel picks a free one), and stopping it is bounded:
a test that leaves a request hanging cannot hang the suite.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any


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
