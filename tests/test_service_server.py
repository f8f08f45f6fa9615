"""`rag-rerank serve` as a user runs it: a separate process, `--workers 2` sharing the response
cache and the metrics, SIGTERM draining the requests in flight, a bad config refused at start-up.

Every server here is a subprocess on 127.0.0.1 with a free port, waited for with a bound, and
stopped by its own pid when the test ends (`tests/support/service.serve_process`, which
bench/serve.py starts its servers with too).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from tests.support.fake_llm import FakeLLM, auto_ranker  # noqa: E402
from tests.support.service import openai_model, serve_process, workers_of  # noqa: E402
from tests.support.sockets import closed_port  # noqa: E402

pytestmark = pytest.mark.timeout(120)
QUERY = "What is the capital of the United States?"
DOCS = [
    "Carson City is the capital of Nevada.",
    "Washington, D.C. is the capital of the United States.",
    "Capital punishment existed in the United States.",
]


def python(repo_root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`python ARGV` with this checkout's package, its output captured, within 60 s."""
    env = {**os.environ, "PYTHONPATH": str(repo_root)}
    return subprocess.run(
        [sys.executable, *argv], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_two_workers_share_the_response_cache_and_the_metrics(repo_root: Path, tmp_path: Path) -> None:
    with FakeLLM(handler=auto_ranker()) as llm:
        config = tmp_path / "serve.yaml"
        model = openai_model(llm.openai_url, "UPSTREAM_KEY", cache=str(tmp_path / "cache"))
        config.write_text(json.dumps({"models": {"llm": model}}), encoding="utf-8")
        with serve_process("--config", str(config), root=repo_root, env={"UPSTREAM_KEY": "k"}, workers=2) as (
            url,
            proc,
        ):
            assert len(workers_of(proc)) == 2
            body = {"model": "llm", "query": QUERY, "documents": DOCS}
            answers = []
            for _ in range(8):  # a new connection each time: either worker may take it
                with httpx.Client(timeout=30) as client:
                    answers.append(client.post(f"{url}/v2/rerank", json=body).json())
            metrics = httpx.get(f"{url}/metrics").text
    assert len(llm.requests) == 1  # one worker asked; every later answer came from the shared cache
    assert {a["rag_rerank"]["cache"]["hits"] for a in answers[1:]} == {1}
    assert [r["index"] for r in answers[0]["results"]] == [r["index"] for r in answers[-1]["results"]]
    # multiprocess metrics: whichever worker answered /metrics counts both workers' requests
    assert 'rag_rerank_requests_total{model="llm",route="/v2/rerank",status="200"} 8.0' in metrics
    assert 'rag_rerank_cache_total{model="llm",result="hit"} 7.0' in metrics


def test_sigterm_drains_the_request_in_flight_and_refuses_new_ones(repo_root: Path, tmp_path: Path) -> None:
    with FakeLLM(handler=auto_ranker(latency=2.0)) as llm:
        config = tmp_path / "serve.json"
        model = openai_model(llm.openai_url, "UPSTREAM_KEY", "m")
        config.write_text(json.dumps({"models": {"llm": model}}), encoding="utf-8")
        with serve_process("--config", str(config), root=repo_root, env={"UPSTREAM_KEY": "k"}) as (url, proc):
            got: list[httpx.Response] = []
            body = {"model": "llm", "query": QUERY, "documents": DOCS}
            slow = threading.Thread(
                target=lambda: got.append(httpx.post(f"{url}/v2/rerank", json=body, timeout=30))
            )
            slow.start()
            while not llm.requests:  # the request is in flight upstream
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            refused = False
            deadline = time.monotonic() + 15
            while not refused and time.monotonic() < deadline:  # the listening socket closes
                try:
                    httpx.get(f"{url}/health", timeout=5)
                    time.sleep(0.1)
                except httpx.ConnectError:
                    refused = True
            assert refused  # new connections are refused; the request in flight still gets its answer
            slow.join(timeout=30)
            # uvicorn re-raises the signal once drained: the exit status says SIGTERM ended it
            assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    assert got and got[0].status_code == 200 and got[0].json()["results"]


def heavy_documents(count: int, chars: int, seed: int = 7) -> list[str]:
    """`count` documents of `chars` characters of made-up sentences: ranking them with a large
    `max_tokens_per_doc` makes the library choose evidence in every one, about 0.1 s of CPU per
    document at the time of writing (200 documents: about 20 s of CPU, load ~10)."""
    import random

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 10))) for _ in range(3000)]
    docs = []
    for _ in range(count):
        parts: list[str] = []
        while sum(len(p) + 1 for p in parts) < chars:
            parts.append(" ".join(rng.choice(vocab) for _ in range(rng.randint(8, 30))).capitalize() + ".")
        docs.append(" ".join(parts)[:chars])
    return docs


def test_a_heavy_request_leaves_the_server_answering_and_gets_its_504_on_time(
    repo_root: Path, tmp_path: Path
) -> None:
    """The CPU work of a request (here, choosing evidence in 200 long documents) runs off the event
    loop: while it runs, /health, /ready and another rerank are answered, and the request gets its
    504 at its deadline while its work is still running (it keeps its in-flight slot until it ends).

    No timing is asserted but generous client timeouts: every claim is an order of events. /ready
    saw the work in flight before and after /health and a small rerank were answered; the 504 came
    while /ready still showed the work in flight. With the work on the loop, nothing but that
    request is answered until it ends (QA finding #1: /health took 90 s), so /ready never sees it."""
    config = tmp_path / "serve.json"
    limits = {"deadline_s": 0.5, "max_in_flight": 2, "max_body_bytes": 10_000_000}
    config.write_text(json.dumps({"models": {"local": {"backend": "local"}}, "limits": limits}), "utf-8")
    heavy = {"model": "local", "query": "memory graph index", "documents": heavy_documents(200, 39_000),
             "max_tokens_per_doc": 4096}
    small = {"model": "local", "query": QUERY, "documents": DOCS}
    with serve_process("--config", str(config), root=repo_root) as (url, proc):
        got: list[httpx.Response] = []
        worker = threading.Thread(
            target=lambda: got.append(httpx.post(f"{url}/v2/rerank", json=heavy, timeout=300))
        )
        worker.start()

        def in_flight() -> int:
            return httpx.get(f"{url}/ready", timeout=60).json()["in_flight"]

        seen = False
        while not seen and worker.is_alive():
            seen = in_flight() == 1
        assert seen, f"the heavy request's work was never seen in flight: {got and got[0].text[:200]}"
        health = httpx.get(f"{url}/health", timeout=60)
        other = httpx.post(f"{url}/v2/rerank", json=small, timeout=60)
        assert health.status_code == 200 and other.status_code == 200 and other.json()["results"]
        worker.join(timeout=120)
        assert got and got[0].status_code == 504 and "deadline of 0.5s" in got[0].json()["message"]
        assert in_flight() == 1  # the 504 came on time; the abandoned work still holds its slot
        proc.kill()  # not to spend the rest of its CPU time


def test_a_bad_config_is_refused_at_start_up_naming_the_key(repo_root: Path, tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(
        "models:\n  m1: {backend: local, options: {topk: 3}}\nlimits: {max_in_flight: 0}\n", encoding="utf-8"
    )
    port = str(closed_port())
    out = python(repo_root, "-m", "rag_rerank", "serve", "--config", str(config), "--port", port)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "models.m1.options.topk" in out.stderr and "top_k" in out.stderr
    assert "limits.max_in_flight" in out.stderr


def test_bad_option_values_and_every_models_build_problems_exit_2_at_once(
    repo_root: Path, tmp_path: Path
) -> None:
    """QA finding #16: `lambda: 2` crashed start-up with a traceback (exit 3), `top_k: 0` started
    serving, and of a file with several problems only the unknown key was named. Now one report names
    them all with their paths: the option values (judged with the file) and what building each model
    finds (a base_url that is no URL, an unknown embedder)."""
    config = tmp_path / "bad.yaml"
    config.write_text(
        "models:\n  m: {backend: local, options: {topk: 3, lambda: 2, top_k: 0, max_tokens_per_chunk: 8}}\n"
        "  g: {backend: openai, model: m, base_url: 'ftp://x'}\n"
        "  e: {backend: local, embedder: nope}\n",
        encoding="utf-8",
    )
    port = str(closed_port())
    out = python(repo_root, "-m", "rag_rerank", "serve", "--config", str(config), "--port", port)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    for path in ("models.m.options.topk", "models.m.options.lambda", "models.m.options.top_k",
                 "models.m.options.max_tokens_per_chunk", "models.g.base_url", "models.e.embedder"):
        assert f"{path}:" in out.stderr, out.stderr
    assert "at least 16 tokens (or left unset)" in out.stderr  # in words a YAML file knows (no None)


def test_upstream_failures_and_a_missing_key_reach_the_log(repo_root: Path, tmp_path: Path) -> None:
    """QA finding #17: the operator sees, at WARNING in the server's log, that a model's api_key_env
    is unset (at start-up) and why an upstream failed (connection refused), never a key; the client
    gets 502 saying the upstream is unreachable."""
    nothing = f"http://127.0.0.1:{closed_port()}/v1"
    models = {"nokey": openai_model(nothing, "SERVICE_TEST_UNSET_KEY"),
              "key": openai_model(nothing, "SERVICE_TEST_SET_KEY")}
    config = tmp_path / "serve.json"
    config.write_text(json.dumps({"models": models}), encoding="utf-8")
    env = {"SERVICE_TEST_SET_KEY": "sk-upstream-secret-5555"}
    with serve_process("--config", str(config), root=repo_root, env=env) as (url, proc):
        body = {"query": QUERY, "documents": DOCS}
        answers = [httpx.post(f"{url}/v2/rerank", json={"model": m, **body}, timeout=60) for m in models]
    log = proc.stderr.read() if proc.stderr else ""
    assert [a.status_code for a in answers] == [502, 502]
    assert all("unreachable" in a.json()["message"] for a in answers)
    assert "WARNING" in log and "SERVICE_TEST_UNSET_KEY" in log and "not set" in log, log
    assert log.count("upstream failure") == 2 and "connection refused" in log, log
    assert "sk-upstream-secret-5555" not in log and "Traceback" not in log


def test_the_readmes_serve_and_curl_commands_work(repo_root: Path) -> None:
    """A fresh machine runs `rag-rerank serve` as the README shows and answers its curl of /v2/rerank."""
    import re
    import shlex
    import shutil

    text = (repo_root / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Run it as a service") :]
    serve_line = re.search(r"rag-rerank serve ([^\n]*)", section).group(1)  # type: ignore[union-attr]
    curl_line = re.search(r"^curl [^\n]*", section, re.MULTILINE).group(0)  # type: ignore[union-attr]
    args = shlex.split(serve_line)
    port = args.index("--port")
    with serve_process(*(args[:port] + args[port + 2 :]), root=repo_root) as (url, _):
        curl = shlex.split(curl_line)
        curl = [url + "/v2/rerank" if a.startswith("http://127.0.0.1:8080") else a for a in curl]
        if shutil.which("curl"):
            out = subprocess.run(curl, capture_output=True, text=True, timeout=60, check=True).stdout
            answer = json.loads(out)
        else:
            payload = json.loads(curl[curl.index("-d") + 1])
            answer = httpx.post(f"{url}/v2/rerank", json=payload, timeout=60).json()
    from rag_rerank import Reranker

    with Reranker(window_size=50) as reranker:
        docs = payload_docs(curl_line)
        expected = reranker.rerank(
            "What is the capital of the United States?",
            [{"id": str(i), "text": t} for i, t in enumerate(docs)],
            2,
        )
    assert [(r["index"], r["relevance_score"]) for r in answer["results"]] == [
        (int(r.id), r.score) for r in expected.ranked
    ]
    assert answer["results"][0]["index"] == 1 and answer["meta"]["api_version"]["version"] == "2"


def payload_docs(curl_line: str) -> list[str]:
    import shlex

    args = shlex.split(curl_line)
    return json.loads(args[args.index("-d") + 1])["documents"]


def test_without_the_serve_extra_the_cli_names_it(repo_root: Path) -> None:
    code = (
        "import sys; sys.modules['fastapi'] = None\n"  # as if the serve extra were not installed
        "from rag_rerank.cli import main; sys.exit(main(['serve', '--port', '1']))"
    )
    out = python(repo_root, "-c", code)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "pip install 'rag-rerank[serve]'" in out.stderr
