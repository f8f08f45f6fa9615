"""The same rerank app as a Ray Serve deployment, on a local Ray: the Cohere SDK gets the same
ranking through Ray's HTTP proxy as from the app on uvicorn. Skipped when Ray Serve is not
installed (`rag-rerank[ray-serve]`)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.local_ray import start_local_ray
from tests.support.sockets import closed_port

pytestmark = pytest.mark.timeout(240)

QUERY = "What is the capital of the United States?"
DOCS = [
    "Carson City is the capital of Nevada.",
    "Washington, D.C. is the capital of the United States.",
    "Capital punishment existed in the United States.",
]


def test_ray_serve_deployment_answers_the_cohere_sdk(repo_root: Path) -> None:
    ray = pytest.importorskip("ray")
    serve = pytest.importorskip("ray.serve")
    pytest.importorskip("fastapi")
    cohere = pytest.importorskip("cohere")
    from rag_rerank import Reranker
    from rag_rerank.service.ray_serve import rerank_deployment

    start_local_ray(ray, repo_root)
    port = closed_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(rerank_deployment(), name="rag-rerank", route_prefix="/")
        client = cohere.ClientV2(api_key="any", base_url=f"http://127.0.0.1:{port}", timeout=60)
        deadline = time.monotonic() + 60
        while True:  # the proxy may answer 503 until the replica is up
            try:
                response = client.rerank(model="local", query=QUERY, documents=DOCS, top_n=2)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        serve.shutdown()
        ray.shutdown()
    with Reranker(window_size=50) as reranker:
        expected = reranker.rerank(QUERY, [{"id": str(i), "text": t} for i, t in enumerate(DOCS)], 2)
    assert [(r.index, r.relevance_score) for r in response.results] == [
        (int(r.id), r.score) for r in expected.ranked
    ]
    assert response.model_extra["rag_rerank"]["backend"] == "local"
