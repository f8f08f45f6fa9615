"""Throughput of `rag-rerank batch` against a local OpenAI-compatible server with injected latency.

The server is tests/support/fake_llm.py, in its own process on 127.0.0.1, answering every task with
a valid ranking (tests/support/quoting_ranker.py) after `--latency` seconds (default 0.2 s).
The whole CLI path is timed:
reading the input file, guards, render, the real `openai` SDK over HTTP, output guard, post-pass,
ordered JSONL writing. With a latency-bound workload the ideal is linear scaling,
throughput = concurrency / latency, until our own CPU cost or the server saturates.

Run:  python bench/batch.py [--queries 64] [--latency 0.2] [--concurrency 1 8 32]
Prints a Markdown table. A batch line that failed (or a batch run that exited non-zero) is counted,
and the output ends with a `FAILED: <n> of <m> calls raised; first: ...` line (exit code 1).

`--engines` compares the local engine with `--engine ray` on 1 and 2 workers (needs rag-rerank[ray])
for two workloads: the local backend with the MiniLM embedder (sentence-transformers, CPU-bound) and
the openai backend against fake_llm with the injected latency (I/O-bound). One local Ray is started
first, on 127.0.0.1 with this machine's cores, and every `--engine ray` run joins it: its start-up
is printed, not included; each run does include starting its actors and loading their models.

Run:  python bench/batch.py --engines [--queries 64] [--latency 0.2] [--ray-concurrency 8]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from failures import TALLY, run_bench  # noqa: E402

from rag_rerank.cli import main as cli_main  # noqa: E402
from tests.support.shared_data import data_dir, need  # noqa: E402

DEFAULT_DATA = data_dir() / "trec-dl19" / "bm25-top100.json"


def write_queries(path: Path, data: Path, n_queries: int, n_chunks: int) -> None:
    """`n_queries` batch lines from TREC DL19 (cycled), each with its BM25 top `n_chunks` passages."""
    src = json.loads(need(data).read_text(encoding="utf-8"))
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n_queries):
            q = src[i % len(src)]
            chunks = [{"id": str(h["docid"]), "text": h["content"]} for h in q["hits"][:n_chunks]]
            fh.write(
                json.dumps({"query_id": f"{i}", "query": q["query"], "chunks": chunks, "top_k": 5}) + "\n"
            )


def run(
    inp: Path, out: Path, url: str | None, concurrency: int, extra: tuple[str, ...] = ()
) -> tuple[float, int]:
    """Time one `rag-rerank batch` run: the openai backend at `url`, or the CLI options in `extra`."""
    args = ["batch", "-i", str(inp), "-o", str(out), "--concurrency", str(concurrency), "--no-progress"]
    if url is not None:
        args += ["--backend", "openai", "--base-url", url, "--model", "fake-gpt"]
    args += extra
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()) as err:
        code = cli_main(args)
    elapsed = time.perf_counter() - t0
    records = [json.loads(line) for line in out.open(encoding="utf-8")] if out.is_file() else []
    where = f"batch {' '.join(extra) or 'openai'} at concurrency {concurrency}"
    TALLY.add(len(records), {f"line {r.get('line')} ({r.get('query_id')})": json.dumps(r["error"])
                             for r in records if "error" in r}, where=where)
    if code != 0 and not any("error" in r for r in records):  # failed as a whole: no line to blame
        TALLY.fail(where, f"rag-rerank batch exited {code}: {' '.join(err.getvalue().split())[:300]}")
    return elapsed, len(records)


_SERVER = """
import sys
sys.path.insert(0, sys.argv[1])
from http.server import ThreadingHTTPServer
from tests.support.fake_llm import FakeLLM
from tests.support.quoting_ranker import quoting_ranker
ThreadingHTTPServer.request_queue_size = 256  # the default listen backlog (5) drops bursts of connects
with FakeLLM(handler=quoting_ranker(float(sys.argv[2]))) as srv:
    print(srv.openai_url, flush=True)
    sys.stdin.read()  # serve until the parent closes our stdin
"""


@contextlib.contextmanager
def fake_server(latency: float) -> Iterator[str]:
    """fake_llm in its own process, so its threads do not compete with the client for the GIL."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(ROOT), str(latency)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=10)


def _start_local_ray() -> float:
    """One local Ray for every `--engine ray` run (they join it); returns its start-up seconds."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    import ray

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", configure_logging=False)
    return time.perf_counter() - t0


@contextlib.contextmanager
def workspace(args: argparse.Namespace) -> Iterator[tuple[Path, str, Path, Path]]:
    """A temporary folder, the fake server's URL, the queries file and a 2-query warm-up file."""
    with tempfile.TemporaryDirectory() as tmp, fake_server(args.latency) as url:
        inp = Path(tmp) / "queries.jsonl"
        write_queries(inp, args.data, args.queries, args.chunks)
        warm = Path(tmp) / "warm.jsonl"
        write_queries(warm, args.data, 2, args.chunks)
        yield Path(tmp), url, inp, warm


def engines(args: argparse.Namespace) -> None:
    """The local engine vs Ray with 1 and 2 workers, for a CPU-bound and an I/O-bound workload."""
    ray_start = _start_local_ray()
    c = args.ray_concurrency
    setups = [("local", ()), ("ray, 1 worker", ("--engine", "ray", "--workers", "1")),
              ("ray, 2 workers", ("--engine", "ray", "--workers", "2"))]
    rows = []
    with workspace(args) as (tmp, url, inp, warm):
        minilm = ("--backend", "local", "--embedder", "sentence-transformers")
        workloads = [
            ("local backend + MiniLM", None, minilm),
            (f"openai -> fake_llm, {args.latency * 1000:.0f} ms", url, ()),
        ]
        for name, wl_url, wl_extra in workloads:
            run(warm, tmp / "warm-out.jsonl", wl_url, 2, wl_extra)  # imports and the driver's model
            reference: Path | None = None
            for label, engine in setups:
                out = tmp / f"out-{len(rows)}.jsonl"
                elapsed, n = run(inp, out, wl_url, c, (*wl_extra, *engine))
                same = _same_records(reference, out) if reference else "(reference)"
                reference = reference or out
                rows.append((name, label, n, elapsed, n / elapsed, same))
    print(
        f"rag-rerank batch: local engine vs Ray Data on this machine ({os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}); {args.queries} queries x {args.chunks} chunks, "
        f"--concurrency {c} per worker; local Ray started once in {ray_start:.1f} s (not included)\n"
    )
    print("| workload | engine | queries | wall time (s) | queries/s | output = local engine's |")
    print("|---|---|---:|---:|---:|---|")
    for name, label, n, elapsed, qps, same in rows:
        print(f"| {name} | {label} | {n} | {elapsed:.2f} | {qps:.1f} | {same} |")


def _same_records(a: Path, b: Path) -> str:
    """Whether two outputs hold the same records, timing aside."""

    def load(p: Path) -> list[dict]:
        recs = [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines()]
        for r in recs:
            r.get("meta", {}).pop("latency_ms", None)
        return recs

    return "yes" if load(a) == load(b) else "NO"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--chunks", type=int, default=20, help="chunks per query")
    ap.add_argument("--latency", type=float, default=0.2, help="seconds the server waits before answering")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--engines", action="store_true", help="local engine vs Ray with 1 and 2 workers")
    ap.add_argument("--ray-concurrency", type=int, default=8, help="--concurrency of each run with --engines")
    args = ap.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "sk-bench-not-a-real-key")
    if args.engines:
        engines(args)
        return 0
    rows = []
    with workspace(args) as (tmp, url, inp, warm):
        run(warm, tmp / "warm-out.jsonl", url, 2)  # imports (openai SDK), caches: not timed
        for c in args.concurrency:
            out = tmp / f"out-{c}.jsonl"
            elapsed, n = run(inp, out, url, c)
            ideal = min(c, args.queries) / args.latency
            rows.append((c, n, elapsed, n / elapsed, ideal))
    print(
        f"rag-rerank batch throughput: {args.queries} queries x {args.chunks} chunks, openai backend -> "
        f"fake_llm (own process, 127.0.0.1) with {args.latency * 1000:.0f} ms latency per call\n"
    )
    print("| concurrency | queries | wall time (s) | queries/s | ideal queries/s | efficiency |")
    print("|---:|---:|---:|---:|---:|---:|")
    for c, n, elapsed, qps, ideal in rows:
        print(f"| {c} | {n} | {elapsed:.2f} | {qps:.1f} | {ideal:.1f} | {qps / ideal:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(run_bench(main))
