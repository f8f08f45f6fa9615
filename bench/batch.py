"""Throughput of `rag-rerank batch` against a local OpenAI-compatible server with injected latency.

The server is tests/support/fake_llm.py, in its own process on 127.0.0.1, answering every task with
a valid ranking (tests/support/quoting_ranker.py) after `--latency` seconds (default 0.2 s).
The whole CLI path is timed:
reading the input file, guards, render, the real `openai` SDK over HTTP, output guard, post-pass,
ordered JSONL writing. With a latency-bound workload the ideal is linear scaling,
throughput = concurrency / latency, until our own CPU cost or the server saturates.

Run:  python bench/batch.py [--queries 64] [--latency 0.2] [--concurrency 1 8 32]
Prints a Markdown table (with the client process's CPU milliseconds per query: what one event-loop
thread spends on each). A batch line that failed (or a batch run that exited non-zero) is counted,
and the output ends with a `FAILED: <n> of <m> calls raised; first: ...` line (exit code 1).

`--engines` compares the local engine with `--engine ray` on 1 and 2 workers (needs rag-rerank[ray])
for two workloads: the local backend with the MiniLM embedder (sentence-transformers, CPU-bound) and
the openai backend against fake_llm with the injected latency (I/O-bound). One local Ray is started
first, on 127.0.0.1 with this machine's cores, and every `--engine ray` run joins it: its start-up
is printed, not included; each run does include starting its actors and loading their models.

Run:  python bench/batch.py --engines [--queries 64] [--latency 0.2] [--ray-concurrency 8]

`--floor` (with `--server fast_llm`, which records our request bodies) also sends the same request
bodies with the bare `openai.AsyncOpenAI` client at each concurrency, a new client per run as
each batch run opens its own (and, as ours, with the process's one TLS context, made before the
clock starts), parsing only the answer's JSON: no input file, guards or post-pass.
It is the ceiling any client built on the SDK reaches in one event loop on this machine.

Run:  python bench/batch.py --server fast_llm --floor [--concurrency 32 64]

`--offline` times the CPU-bound case instead: the default (local backend, no server, no key) on
`--queries` lines of texts this process has not seen, in one process and in `--workers` worker
processes (default 2), each run on the same file, the workers' run first so that neither finds the
texts in its caches (a forked worker inherits the parent's caches, and the parent then has not
read them); the outputs are compared record by record.

Run:  python bench/batch.py --offline [--queries 172] [--chunks 50] [--workers 2] [--rounds 2]

`--instructions` counts instead of timing (valgrind's callgrind, PYTHONHASHSEED=0: a figure a
shared machine's load cannot blur): the client's instructions per query of a batch run over texts
this process has not seen (`cold`, as a real batch's, and as the first timed run above without
`--fresh`), of a second run over the same texts (`warm`: every per-text cache filled, the server
knowing every body) and of the floor (the bare client sending the same bodies, as `--floor`),
each in its own process under callgrind, the server outside it, instrumented only around the run.
Needs valgrind and a C compiler (bench/instructions.py's helper).

Run:  python bench/batch.py --server fast_llm --instructions [--queries 64] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import ssl
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


def write_queries(path: Path, data: Path, n_queries: int, n_chunks: int, mark: str = "") -> None:
    """`n_queries` batch lines from TREC DL19 (cycled), each with its BM25 top `n_chunks` passages;
    a `mark` and the cycle's number are appended to every query and passage (` [mark.1]`), so that
    no text of the file was seen before by this process, nor earlier in the file (`--fresh`)."""
    src = json.loads(need(data).read_text(encoding="utf-8"))
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n_queries):
            q = src[i % len(src)]
            tail = f" [{mark}.{i // len(src)}]" if mark else ""
            chunks = [{"id": str(h["docid"]), "text": h["content"] + tail} for h in q["hits"][:n_chunks]]
            line = {"query_id": f"{i}", "query": q["query"] + tail, "chunks": chunks, "top_k": 5}
            fh.write(json.dumps(line) + "\n")


CPU: dict[int, float] = {}  # the client process's CPU seconds of the last run at each concurrency


def _cpu() -> float:
    """CPU seconds of this process and of its waited-for children (`batch --workers` joins its
    worker processes; the server, a child too, is not waited for until the end)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def run(
    inp: Path, out: Path, url: str | None, concurrency: int, extra: tuple[str, ...] = ()
) -> tuple[float, int]:
    """Time one `rag-rerank batch` run: the openai backend at `url`, or the CLI options in `extra`."""
    args = ["batch", "-i", str(inp), "-o", str(out), "--concurrency", str(concurrency), "--no-progress"]
    if url is not None:
        args += ["--backend", "openai", "--base-url", url, "--model", "fake-gpt"]
    args += extra
    t0, c0 = time.perf_counter(), _cpu()
    with contextlib.redirect_stderr(io.StringIO()) as err:
        code = cli_main(args)
    elapsed = time.perf_counter() - t0
    CPU[concurrency] = _cpu() - c0
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
def fake_server(latency: float, server: str = "fake_llm") -> Iterator[str]:
    """fake_llm (or bench/fast_llm.py with `server="fast_llm"`) in its own process, so its threads
    do not compete with the client for the GIL."""
    cmd = ([sys.executable, str(ROOT / "bench" / "fast_llm.py"), "--latency", str(latency)]
           if server == "fast_llm" else [sys.executable, "-c", _SERVER, str(ROOT), str(latency)])
    proc = subprocess.Popen(
        cmd,
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
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


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
    with tempfile.TemporaryDirectory() as tmp, fake_server(args.latency, args.server) as url:
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


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context for every bare client of this process, made before any clock starts.

    A `rag-rerank batch` run opens its own SDK client too, but verifies servers with one context per
    process (made by the warm-up run): the bare client made its own in every timed run (the system's
    CA certificates loaded, about 40 ms of the floor's CPU and wall time per run, 2% of a run of 320
    queries at 32 in flight), which made the floor slower than the SDK is."""
    return ssl.create_default_context()


def bare_sdk_run(url: str, bodies: list[dict], concurrency: int, transport: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of sending `bodies` with the bare AsyncOpenAI client over the
    SDK's default transport (`"httpx"`, `DefaultAsyncHttpxClient`) or its aiohttp one (`"aiohttp"`,
    `openai[aiohttp]`), each with the process's one TLS context (`_tls_context`, as our backend's
    clients have theirs) and our backend's default timeout (60 s; the SDK's own gives a connection
    5 s, which a client slowed by valgrind can miss), at most `concurrency` in flight, each
    answer's content parsed as JSON and checked for a ranking."""
    import asyncio

    import openai

    tls = _tls_context()

    async def all_of() -> None:
        sem = asyncio.Semaphore(concurrency)
        http = (openai.DefaultAioHttpClient(verify=tls) if transport == "aiohttp"
                else openai.DefaultAsyncHttpxClient(verify=tls))
        async with openai.AsyncOpenAI(base_url=url, api_key="sk-bench", max_retries=0, timeout=60.0,
                                      http_client=http) as client:
            async def one(body: dict) -> None:
                async with sem:
                    resp = await client.chat.completions.create(**body)
                if not json.loads(resp.choices[0].message.content or "{}").get("ranked"):
                    TALLY.fail("bare SDK", "no ranking in the answer")
            await asyncio.gather(*(one(b) for b in bodies))

    t0, c0 = time.perf_counter(), time.process_time()
    asyncio.run(all_of())
    return time.perf_counter() - t0, time.process_time() - c0


COUNTED = ("cold", "warm", "floor")


def counted_child(args: argparse.Namespace) -> None:
    """One `--instructions` stage (`args.counted`), instrumented between the helper's cg_start and
    cg_stop: the batch run at `args.concurrency[0]` (cold or warm) or the floor's."""
    import ctypes

    from peers import server_json

    cg = ctypes.CDLL(args.helper)
    c = args.concurrency[0]
    with workspace(args) as (tmp, url, inp, warm):
        run(warm, tmp / "warm-out.jsonl", url, 2)  # imports, the session's TLS context: not counted
        if args.counted == "cold":
            fresh = tmp / "fresh.jsonl"
            write_queries(fresh, args.data, args.queries, args.chunks, mark="cold")
            cg.cg_start()
            run(fresh, tmp / "counted.jsonl", url, c)
            cg.cg_stop()
            return
        run(inp, tmp / "first.jsonl", url, c)  # every text seen, every body known to the server
        if args.counted == "warm":
            cg.cg_start()
            run(inp, tmp / "counted.jsonl", url, c)
            cg.cg_stop()
            return
        seen = server_json(url, "recorded")
        bodies = [seen[i % len(seen)] for i in range(args.queries)]
        bare_sdk_run(url, bodies[:2], 2, "httpx")  # the client's imports, the TLS context: not counted
        cg.cg_start()
        bare_sdk_run(url, bodies, c, "httpx")
        cg.cg_stop()


def instructions(args: argparse.Namespace) -> None:
    """Each `COUNTED` stage in its own process under callgrind; prints instructions per query."""
    from instructions import build_helper

    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        helper = build_helper(tmp)
        if helper is None:
            TALLY.fail("--instructions", "valgrind or the callgrind helper is missing")
            return
        for stage in COUNTED:
            out = tmp / f"{stage}.out"
            cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p",
                   sys.executable, str(Path(__file__).resolve()), "--counted", stage, "--helper", str(helper),
                   "--server", args.server, "--queries", str(args.queries), "--chunks", str(args.chunks),
                   "--latency", str(args.latency), "--concurrency", str(args.concurrency[0]),
                   "--data", str(args.data)]
            env = {**os.environ, "PYTHONHASHSEED": "0",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
            totals = [int(line.split()[1]) for f in tmp.glob(f"{stage}.out.*")
                      for line in f.read_text(encoding="utf-8", errors="replace").splitlines()
                      if line.startswith("totals:")]
            if done.returncode != 0 or not totals:
                said = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("=="))
                TALLY.fail(f"--instructions {stage}", (said + done.stdout)[-800:])
                continue
            rows.append((stage, max(totals) / args.queries))
    print(f"Client instructions per query (callgrind, PYTHONHASHSEED=0): rag-rerank batch, openai backend -> "
          f"{args.server} ({args.latency * 1000:.0f} ms), {args.queries} queries x {args.chunks} chunks, "
          f"--concurrency {args.concurrency[0]}\n")
    print("| run | M instructions per query |")
    print("|---|---:|")
    names = {"cold": "batch, unseen texts (cold)", "warm": "batch, the same texts again (warm)",
             "floor": "the floor: bare AsyncOpenAI, same bodies"}
    for stage, per in rows:
        print(f"| {names[stage]} | {per / 1e6:.3f} |")


def offline(args: argparse.Namespace) -> None:
    """The default backend in one process and in `args.workers` processes, on unseen texts."""
    workers = max(args.workers, 2)
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        warm = tmp / "warm.jsonl"
        write_queries(warm, args.data, 2, args.chunks, mark="warm")
        run(warm, tmp / "warm-out.jsonl", None, 2)  # imports, the static table: not timed
        for r in range(args.rounds):
            inp = tmp / f"round-{r}.jsonl"
            write_queries(inp, args.data, args.queries, args.chunks, mark=f"round {r}")
            outs = {}
            for w in (workers, 1):
                outs[w] = tmp / f"out-{r}-{w}.jsonl"
                elapsed, n = run(inp, outs[w], None, 4, ("--workers", str(w)))
                rows.append((r + 1, w, n, elapsed, CPU[4] / max(n, 1) * 1000.0))
            rows[-1] += (_same_records(outs[workers], outs[1]),)
            rows[-2] += ("",)
    print(f"rag-rerank batch, the offline default (local backend): {args.queries} queries x {args.chunks} "
          f"chunks of unseen text (DL19, marked per round), --concurrency 4 per process; "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}\n")
    print("| round | processes | queries | wall time (s) | queries/s | CPU ms per query (all processes) "
          "| output = one process's |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for r, w, n, elapsed, cpu, same in rows:
        print(f"| {r} | {w} | {n} | {elapsed:.2f} | {n / elapsed:.1f} | {cpu:.2f} | {same} |")


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
    ap.add_argument("--server", choices=["fake_llm", "fast_llm"], default="fake_llm",
                    help="tests/support/fake_llm.py (a thread per connection) or bench/fast_llm.py (asyncio)")
    ap.add_argument("--engines", action="store_true", help="local engine vs Ray with 1 and 2 workers")
    ap.add_argument("--ray-concurrency", type=int, default=8, help="--concurrency of each run with --engines")
    ap.add_argument("--floor", action="store_true",
                    help="also time the bare AsyncOpenAI client sending our request bodies "
                         "(--server fast_llm)")
    ap.add_argument("--fresh", action="store_true",
                    help="each run's texts unseen by this process (a mark appended), as in a real batch; "
                         "without it later runs repeat the texts of earlier ones (per-text caches warm)")
    ap.add_argument("--workers", type=int, default=1,
                    help="batch --workers: local worker processes, each with --concurrency / N in flight")
    ap.add_argument("--http", choices=["httpx", "aiohttp"], default=None,
                    help="batch --http: the async client's HTTP transport (default httpx)")
    ap.add_argument("--offline", action="store_true",
                    help="the offline default (no server) in one process and in --workers processes")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of --offline")
    ap.add_argument("--instructions", action="store_true",
                    help="count the client's instructions per query (callgrind): cold, warm and the floor")
    ap.add_argument("--counted", choices=COUNTED, help=argparse.SUPPRESS)
    ap.add_argument("--helper", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if (args.floor or args.instructions) and args.server != "fast_llm":
        ap.error("--floor and --instructions need --server fast_llm (it records the bodies to replay)")
    os.environ.setdefault("OPENAI_API_KEY", "sk-bench-not-a-real-key")
    if args.engines:
        engines(args)
        return 0
    if args.offline:
        offline(args)
        return 0
    if args.counted:
        counted_child(args)
        return 0
    if args.instructions:
        instructions(args)
        return 0
    rows = []
    floor: list[tuple[str, int, float, float]] = []
    spread = (("--workers", str(args.workers)) if args.workers > 1 else ()) + (
        ("--http", args.http) if args.http else ())
    with workspace(args) as (tmp, url, inp, warm):
        run(warm, tmp / "warm-out.jsonl", url, 2)  # imports (openai SDK), caches: not timed
        for c in args.concurrency:
            out = tmp / f"out-{c}.jsonl"
            per = max(1, c // args.workers)
            if args.fresh:
                inp = tmp / f"queries-{c}.jsonl"
                write_queries(inp, args.data, args.queries, args.chunks, mark=f"run {c}")
            elapsed, n = run(inp, out, url, per, spread)
            c = per * args.workers
            ideal = min(c, args.queries) / args.latency
            rows.append((c, n, elapsed, n / elapsed, ideal, CPU[per] / max(n, 1) * 1000.0))
        if args.floor:
            from peers import server_json

            seen = server_json(url, "recorded")  # each distinct body once, in the order first sent
            bodies = [seen[i % len(seen)] for i in range(args.queries)]  # the queries cycle as the lines do
            for transport in ("httpx", "aiohttp"):
                bare_sdk_run(url, bodies[:2], 2, transport)  # the client's imports: not timed
                floor += [(transport, c, *bare_sdk_run(url, bodies, c, transport)) for c in args.concurrency]
    print(
        f"rag-rerank batch throughput: {args.queries} queries x {args.chunks} chunks, openai backend -> "
        f"{args.server} (own process, 127.0.0.1) with {args.latency * 1000:.0f} ms latency per call"
        + (f"; {args.workers} worker processes, the concurrency split between them" if args.workers > 1
           else "")
        + (f"; --http {args.http}" if args.http else "")
        + ("; every run on texts this process had not seen (--fresh)" if args.fresh else "") + "\n"
    )
    print("| concurrency | queries | wall time (s) | queries/s | ideal queries/s | efficiency "
          "| client CPU ms per query |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for c, n, elapsed, qps, ideal, cpu in rows:
        print(f"| {c} | {n} | {elapsed:.2f} | {qps:.1f} | {ideal:.1f} | {qps / ideal:.0%} | {cpu:.2f} |")
    if args.floor:
        print("\nThe floor: the bare `openai.AsyncOpenAI` client sending the same request bodies "
              "(no input file, guards or post-pass)\n")
        print("| SDK transport | concurrency | wall time (s) | queries/s | efficiency "
              "| client CPU ms per query |")
        print("|---|---:|---:|---:|---:|---:|")
        for transport, c, wall, cpu_s in floor:
            qps = args.queries / wall
            ideal = min(c, args.queries) / args.latency
            print(f"| {transport} | {c} | {wall:.2f} | {qps:.1f} | {qps / ideal:.0%} "
                  f"| {cpu_s / args.queries * 1000:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(run_bench(main))
