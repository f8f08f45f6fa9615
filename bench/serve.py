"""The rerank service under load: `rag-rerank serve` driven by `wrk` (Debian's package: a load
generator we did not write) against a local OpenAI-compatible upstream (`bench/fast_llm.py`, in its
own process), 20 documents a request.

Prints five figures, each with the machine's load average (this machine's 2 cores are shared;
timings are noisy, read them with the load next to them):

1. throughput at 32 concurrent clients, `--workers 2`, upstream answering in 200 ms: requests per
   second against the ideal (concurrency / 0.2 s), and every status wrk saw;
2. added latency with an instant upstream: p50 / p99 of one client's sequential requests to the
   service (`--workers 1`, keep-alive) minus those of `Reranker.rerank` of the same request in
   this process (same upstream, same session options);
3. overload at 256 concurrent clients (limits 16 in flight + 32 queued, 2 s at most, per worker): the statuses
   (only 200 and 429 expected), wrk's socket errors (a request unanswered after wrk's 30 s timeout
   counts as one), the workers' peak RSS;
4. resident memory of the workers over 20,000 requests (instant upstream): RSS after a warm-up
   and after, and the growth;
5. one worker SIGKILLed 3 s into a 10 s run at 32 clients: non-2xx answers and socket errors
   (only the requests that worker held may fail), and whether uvicorn started a new worker.

Run:  python bench/serve.py [--quick]     (needs `wrk` on PATH: apt-get install wrk)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # the bench scripts import each other by name

from batch import fake_server  # noqa: E402

from tests.support.service import (  # noqa: E402
    ServiceDidNotStart,
    openai_model,
    serve_process,
    workers_of,
)

QUERY = "How do I keep a vector index fresh when documents change every hour?"
TOPICS = [
    "HNSW graphs",
    "IVF lists",
    "product quantisation",
    "BM25 scoring",
    "chunk overlap",
    "embedding drift",
    "re-indexing jobs",
    "tombstones",
    "TTL caches",
    "write-ahead logs",
]
DOCS = [
    f"Note {i}: {TOPICS[i % len(TOPICS)]} matter when documents change; step {i} rebuilds "
    f"{'the index' if i % 3 else 'only the changed shards'} every {i + 1} hours."
    for i in range(20)
]
BODY = {"model": "llm", "query": QUERY, "documents": DOCS, "top_n": 5}

# Counts every status per wrk thread and prints them when the run ends (wrk prints only non-2xx).
LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = io.open(os.getenv("BENCH_BODY")):read("*a")
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) statuses = {} end
function response(status, headers, body) statuses[status] = (statuses[status] or 0) + 1 end
function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    local s = t:get("statuses")
    for code, n in pairs(s) do total[code] = (total[code] or 0) + n end
  end
  local parts = {}
  for code, n in pairs(total) do table.insert(parts, string.format('"%d": %d', code, n)) end
  io.write("STATUSES {" .. table.concat(parts, ", ") .. "}\\n")
  io.write(string.format("LATENCY_MS p50=%.2f p99=%.2f\\n", latency:percentile(50) / 1000,
                         latency:percentile(99) / 1000))
end
"""


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def upstream(latency: float) -> contextlib.AbstractContextManager[str]:
    """bench/fast_llm.py in its own process (`batch.fake_server`), answering after `latency` s."""
    return fake_server(latency, server="fast_llm")


def config_file(folder: Path, url: str, limits: dict[str, Any] | None = None) -> Path:
    path = folder / f"serve-{abs(hash((url, json.dumps(limits))))}.json"
    models = {"llm": openai_model(url, "BENCH_UPSTREAM_KEY", "fake")}
    path.write_text(json.dumps({"models": models, "limits": limits or {}}), encoding="utf-8")
    return path


@contextlib.contextmanager
def service(config: Path, workers: int) -> Iterator[tuple[str, subprocess.Popen]]:
    """`rag-rerank serve` with `config` and `workers` (`serve_process`), every worker's session warmed."""
    import httpx

    try:
        with serve_process("--config", str(config), root=ROOT, env={"BENCH_UPSTREAM_KEY": "k"},
                           workers=workers, timeout=90, log_level="error") as (url, proc):
            with httpx.Client(timeout=60) as client:  # warm every worker's session (imports, first calls)
                for _ in range(8 * workers):
                    client.post(f"{url}/v2/rerank", json=BODY, headers={"Connection": "close"})
            yield url, proc
    except ServiceDidNotStart as exc:
        raise SystemExit(str(exc)) from None


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True,
                         check=False)
    return [int(p) for p in out.stdout.split()]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{pid}/status").read_text()
            total += int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return total / 1024


def wrk(
    url: str, connections: int, seconds: float, body: Path, script: Path, timeout: str = "10s"
) -> dict[str, Any]:
    out = subprocess.run(
        [
            "wrk",
            "-t",
            "2",
            "-c",
            str(connections),
            "-d",
            f"{seconds}s",
            "--timeout",
            timeout,
            "-s",
            str(script),
            f"{url}/v2/rerank",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "BENCH_BODY": str(body)},
        timeout=seconds + 120,
        check=False,
    ).stdout
    statuses = json.loads(re.search(r"STATUSES (\{.*\})", out).group(1))  # type: ignore[union-attr]
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    lat = re.search(r"LATENCY_MS p50=([\d.]+) p99=([\d.]+)", out)
    return {
        "requests": requests,
        "rps": requests / seconds,
        "statuses": statuses,
        "socket_errors": dict(
            zip(("connect", "read", "write", "timeout"), map(int, errors.groups()), strict=True)
        )
        if errors
        else {},
        "p50_ms": float(lat.group(1)) if lat else None,
        "p99_ms": float(lat.group(2)) if lat else None,
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def added_latency(folder: Path, n: int) -> None:
    import httpx

    from rag_rerank import Reranker
    from rag_rerank.service.config import load_config

    with upstream(0.0) as url:
        config = config_file(folder, url)
        spec = load_config(config).models["llm"]
        os.environ["BENCH_UPSTREAM_KEY"] = "k"
        chunks = [{"id": str(i), "text": t} for i, t in enumerate(DOCS)]
        with Reranker(**spec.reranker_kwargs()) as reranker:
            for _ in range(20):
                reranker.rerank(QUERY, chunks, 5)
            direct = []
            cpu = time.process_time()
            for _ in range(n):
                t = time.perf_counter()
                reranker.rerank(QUERY, chunks, 5)
                direct.append((time.perf_counter() - t) * 1000)
            direct_cpu = (time.process_time() - cpu) * 1000 / n
        with service(config, 1) as (base, proc), httpx.Client(timeout=30) as client:
            for _ in range(20):
                client.post(f"{base}/v2/rerank", json=BODY)
            served = []
            cpu = cpu_s(proc.pid)
            for _ in range(n):
                t = time.perf_counter()
                r = client.post(f"{base}/v2/rerank", json=BODY)
                served.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200, r.text
            served_cpu = (cpu_s(proc.pid) - cpu) * 1000 / n
    d50, d99, s50, s99 = pct(direct, 0.5), pct(direct, 0.99), pct(served, 0.5), pct(served, 0.99)
    print(f"2. added latency, instant upstream, {n} sequential requests each ({load()}):")
    print(
        f"   in-process Reranker.rerank p50 {d50:.2f} ms, p99 {d99:.2f} ms; through the service (httpx, "
        f"keep-alive) p50 {s50:.2f} ms, p99 {s99:.2f} ms"
    )
    mean = statistics.mean(served) - statistics.mean(direct)
    print(f"   added: p50 {s50 - d50:+.2f} ms, p99 {s99 - d99:+.2f} ms (mean {mean:+.2f} ms)")
    print(
        f"   CPU per request: in process {direct_cpu:.2f} ms, the service process {served_cpu:.2f} ms "
        f"(added {served_cpu - direct_cpu:+.2f} ms; wall-clock figures include waiting for a core)"
    )


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs (a smoke test of the bench itself)")
    ap.add_argument("--only", type=int, nargs="*", help="run only these figures (1-5)")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    only = set(args.only or range(1, 6))
    seconds = 5 if args.quick else 20
    folder = Path(tempfile.mkdtemp(prefix="rag-rerank-bench-serve-"))
    body = folder / "body.json"
    body.write_text(json.dumps(BODY), encoding="utf-8")
    script = folder / "post.lua"
    script.write_text(LUA, encoding="utf-8")
    failed = []
    print(f"bench/serve.py: 20 documents a request, wrk 2 threads; {load()}")
    if 1 in only:
        with upstream(0.2) as url, service(config_file(folder, url), 2) as (base, proc):
            pids = workers_of(proc)
            upstream_pid = [p for p in children(os.getpid()) if "fast_llm" in cmdline(p)]
            before = [sum(cpu_s(p) for p in pids), sum(cpu_s(p) for p in upstream_pid)]
            wall = time.monotonic()
            r = wrk(base, 32, seconds, body, script)
            wall = time.monotonic() - wall
            used = [sum(cpu_s(p) for p in pids) - before[0], sum(cpu_s(p) for p in upstream_pid) - before[1]]
        ideal = 32 / 0.2
        n = max(1, r["requests"])
        print(f"1. throughput, 32 clients, --workers 2, upstream 200 ms, {seconds} s ({load()}):")
        print(
            f"   {r['rps']:.1f} req/s = {100 * r['rps'] / ideal:.1f}% of the ideal {ideal:.0f}; statuses "
            f"{r['statuses']}; socket errors {r['socket_errors']}; p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms"
        )
        print(
            f"   CPU: the workers {1000 * used[0] / n:.2f} ms a request ({used[0] / wall:.2f} cores), "
            f"the upstream {1000 * used[1] / n:.2f} ms a request ({used[1] / wall:.2f} cores)"
        )
        if set(r["statuses"]) != {"200"} or any(r["socket_errors"].values()):
            failed.append("throughput run had failed requests")
    if 2 in only:
        added_latency(folder, 100 if args.quick else 500)
    if 3 in only:
        limits = {"max_in_flight": 16, "max_queue": 32, "queue_timeout_s": 2}
        with upstream(0.2) as url, service(config_file(folder, url, limits), 2) as (base, proc):
            pids = workers_of(proc)
            before = rss_mb(pids)
            peak = [before]
            sampler = _Sampler(pids, peak)
            sampler.start()
            r = wrk(base, 256, seconds, body, script, timeout="30s")
            sampler.stop()
        print(
            f"3. overload, 256 clients, --workers 2, 16 in flight + 32 queued (2 s at most) per worker, "
            f"{seconds} s ({load()}):"
        )
        print(
            f"   statuses {r['statuses']}; socket errors {r['socket_errors']}; {r['rps']:.1f} req/s; "
            f"workers' RSS {before:.1f} MB before, peak {max(peak):.1f} MB"
        )
        if set(r["statuses"]) - {"200", "429"} or any(r["socket_errors"].values()):
            failed.append("overload run had answers other than 200 / 429 or socket errors")
    if 4 in only:
        total = 2000 if args.quick else 20_000
        with upstream(0.0) as url, service(config_file(folder, url), 2) as (base, proc):
            pids = workers_of(proc)
            wrk(base, 32, 3, body, script)  # warm-up
            start = rss_mb(pids)
            done = 0
            samples = []
            while done < total:
                r = wrk(base, 32, 5, body, script)
                done += r["requests"]
                samples.append(rss_mb(pids))
                if set(r["statuses"]) != {"200"}:
                    failed.append(f"memory run: statuses {r['statuses']}")
        growth = 100 * (samples[-1] - start) / start
        print(f"4. resident memory over {done} requests, --workers 2, instant upstream ({load()}):")
        print(
            f"   workers' RSS {start:.1f} MB after warm-up, {samples[-1]:.1f} MB after ({growth:+.1f}%); "
            f"samples {', '.join(f'{s:.0f}' for s in samples[:: max(1, len(samples) // 10)])} MB"
        )
    if 5 in only:
        with upstream(0.2) as url, service(config_file(folder, url), 2) as (base, proc):
            victims = workers_of(proc)
            import threading

            def kill() -> None:
                time.sleep(3)
                os.kill(victims[0], signal.SIGKILL)

            killer = threading.Thread(target=kill)
            killer.start()
            r = wrk(base, 32, 10, body, script)
            killer.join()
            time.sleep(2)
            after = workers_of(proc)
        bad = sum(n for code, n in r["statuses"].items() if code != "200")
        print(f"5. one of 2 workers SIGKILLed 3 s into 10 s at 32 clients, upstream 200 ms ({load()}):")
        print(
            f"   {r['requests']} requests: statuses {r['statuses']}, non-2xx {bad}, socket errors "
            f"{r['socket_errors']}; workers after: {len(after)} (new: {sorted(set(after) - set(victims))})"
        )
    shutil.rmtree(folder, ignore_errors=True)
    if failed:
        print("FAILED: " + "; ".join(failed))
        return 1
    return 0


class _Sampler:
    """Samples the workers' RSS every 0.2 s into `peak` while a run goes on."""

    def __init__(self, pids: list[int], peak: list[float]) -> None:
        import threading

        self.pids, self.peak, self._stop = pids, peak, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak.append(rss_mb(self.pids))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


if __name__ == "__main__":
    sys.exit(main())
