"""What tracing costs a rerank: per-call time without OpenTelemetry, with the API but no provider,
and with the SDK exporting over OTLP/HTTP through a batch span processor.

Each mode runs in its own Python process, so what is imported is exactly what that mode imports:

* `absent`: every `opentelemetry` module is unimportable (an import hook refuses them), as on a
  machine without the package;
* `api`: the application imported `opentelemetry.trace` but set no tracer provider (the API's
  default proxy provider): rag-rerank writes no span;
* `sdk`: a `TracerProvider` with a `BatchSpanProcessor` and the OTLP/HTTP exporter sending to a
  receiver on 127.0.0.1 (`tests/support/otlp_receiver.py`): every span is made and exported.

Workloads: the local backend over 20 passages (one call), over 50 in windows of 10 (five windows
and a final pass), and the openai backend against the fake server of `bench/batch.py` (its own
process, answering at once) over 20 passages. Rounds interleave the modes, so load on a shared
machine hits them alike; the figure is the median over rounds of each round's median ms per call.
The load average is printed with the figures: on a busy machine they are noisy.

Run:  python bench/tracing.py [--rounds 5] [--calls 40]
      python bench/tracing.py --dump docs/trace-dump.json   # one traced rerank, as the receiver got it
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from batch import fake_server  # noqa: E402

from tests.support.otlp_receiver import OtlpReceiver  # noqa: E402

MODES = ("absent", "api", "sdk")
WORKLOADS = ("local-20", "local-windows-50", "openai-20")
_WORDS = ("index", "memory", "recall", "latency", "graph", "partition", "quantisation", "vector", "cluster",
          "probe", "centroid", "layer", "link", "search", "build", "train", "sample", "shard", "replica",
          "cache", "disk", "ram", "query", "batch")

_BLOCK = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ImportError("blocked for the benchmark: " + name)
sys.meta_path.insert(0, _Block())
"""
_API = "import opentelemetry.trace\n"
_SDK = """
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=ENDPOINT)))
trace.set_tracer_provider(provider)
"""
_RUN = """
import json, statistics, sys, time
from rag_rerank import Reranker
workload, calls, base_url = sys.argv[1], int(sys.argv[2]), sys.argv[3]
words = WORDS
def passage(i):
    return " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(40)) + f" (passage {i})"
n = 50 if workload == "local-windows-50" else 20
chunks = [{"id": f"p{i}", "text": passage(i)} for i in range(n)]
query = "when does a partition index save memory over a graph index"
if workload.startswith("openai"):
    session = Reranker("openai", model="m", base_url=base_url, api_key="sk-bench")
else:
    session = Reranker()
options = {"window_size": 10} if workload == "local-windows-50" else {}
with session:
    for _ in range(3):  # warm: imports, the first client connection, caches of the scorer
        session.rerank(query, chunks, 5, **options)
    times, cpu = [], []
    for _ in range(calls):
        t0, c0 = time.perf_counter(), time.process_time()
        result = session.rerank(query, chunks, 5, **options)
        times.append((time.perf_counter() - t0) * 1000.0)
        cpu.append((time.process_time() - c0) * 1000.0)
    assert result.meta.status == "ok", result.meta.status
# The observation alone (observe.observed around a rerank, then done() with the result's record):
# what a rerank pays for tracing and logging whatever its scorer costs.
from rag_rerank.observe import observed
from rag_rerank.guard import validate_request
request = validate_request(query, chunks, 5, 0.7)
hooks = []
for _ in range(5):
    c0 = time.process_time()
    for _ in range(200):
        with observed(result.meta.backend) as seen:
            seen.planned(request, "m")
            seen.done(result)
    hooks.append((time.process_time() - c0) / 200 * 1e6)
shutdown = globals().get("provider")
if shutdown is not None:
    shutdown.shutdown()
print(json.dumps({"median_ms": statistics.median(times), "cpu_ms": statistics.median(cpu),
                  "hooks_us": statistics.median(hooks), "records": len(result.meta.records),
                  "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry"))[:3]}))
"""


def _script(mode: str, endpoint: str) -> str:
    head = {"absent": _BLOCK, "api": _API, "sdk": _SDK.replace("ENDPOINT", repr(endpoint))}[mode]
    return textwrap.dedent(head) + textwrap.dedent(_RUN).replace("WORDS", repr(list(_WORDS)))


def _one(mode: str, workload: str, calls: int, base_url: str, endpoint: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _script(mode, endpoint), workload, str(calls), base_url],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{mode} {workload} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def measure(rounds: int, calls: int) -> None:
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    per: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    hooks: dict[tuple[str, str], list[float]] = {}
    imported: dict[str, list[str]] = {}
    with fake_server(0.0) as base_url, OtlpReceiver() as rx:
        for _ in range(rounds):
            for workload in WORKLOADS:
                for mode in MODES:
                    got = _one(mode, workload, calls, base_url, rx.endpoint)
                    per.setdefault((workload, mode), []).append(got["median_ms"])
                    cpu.setdefault((workload, mode), []).append(got["cpu_ms"])
                    hooks.setdefault((workload, mode), []).append(got["hooks_us"])
                    imported[mode] = got["otel"]
        exported = len(rx.spans)
    print(f"load average after:  {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{rounds} rounds x {calls} calls per mode and workload; median over rounds of each round's median")
    tables = (("wall time per rerank", per, "ms"), ("CPU time per rerank (process)", cpu, "ms"),
              ("the observation alone (observed + done), CPU", hooks, "us"))
    for title, table, unit in tables:
        print(f"\n{title}")
        print(f"{'workload':<18}" + "".join(f"{m + ' ' + unit:>12}" for m in MODES) + f"{'sdk/absent':>12}")
        for workload in WORKLOADS:
            row = [statistics.median(table[(workload, m)]) for m in MODES]
            print(f"{workload:<18}" + "".join(f"{v:>12.3f}" for v in row) + f"{row[2] / row[0]:>12.3f}")
    print(f"opentelemetry modules imported: absent {imported['absent']}, api {imported['api']}, "
          f"sdk {imported['sdk']}; spans the receiver got in the sdk runs: {exported}")


def dump(path: Path) -> None:
    """One traced rerank as the OTLP receiver decoded it: the openai backend (the fake server of
    tests/support) over 24 passages in windows of 10, one window refused (401) and answered by the
    fallback chain's "input" step. Each span is listed with its id's first 6 hex digits and its
    parent's, in start order, times relative to the first span."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from rag_rerank import rerank
    from tests.support.fake_llm import FakeLLM, Reply
    from tests.support.quoting_ranker import quoting_ranker

    chunks = [{"id": f"p{i}", "text": " ".join(_WORDS[(i * 7 + j * 3) % len(_WORDS)] for j in range(30))}
              for i in range(24)]
    ranker, seen = quoting_ranker(), []

    def answer(req: Any) -> Reply:
        seen.append(req)
        return Reply.openai_error(401, "invalid api key") if len(seen) == 2 else ranker(req)

    with OtlpReceiver() as rx:
        provider = TracerProvider(resource=Resource.create({"service.name": "rag-rerank-example"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=rx.endpoint)))
        trace.set_tracer_provider(provider)
        with FakeLLM(handler=answer) as srv:
            result = rerank("when does a partition index save memory", chunks, 3, backend="openai", model="m",
                            base_url=srv.openai_url, api_key="sk-example", window_size=10, concurrency=1,
                            fallback=["input"])
        provider.shutdown()
    spans = sorted(rx.spans, key=lambda s: s["start"])
    t0 = min(s["start"] for s in spans)
    out = [{"name": s["name"], "id": s["span_id"][:6],
            "parent": s["parent_span_id"][:6] if s["parent_span_id"] else None,
            "start_ms": round((s["start"] - t0) / 1e6, 3),
            "duration_ms": round((s["end"] - s["start"]) / 1e6, 3),
            "status": s["status"]["code"], "attributes": s["attributes"]} for s in spans]
    path.write_text(json.dumps({"meta.status": result.meta.status, "spans": out}, indent=1) + "\n",
                    encoding="utf-8")
    print(f"{len(out)} spans from one rerank (meta.status {result.meta.status}) written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--dump", type=Path, default=None, metavar="FILE")
    args = parser.parse_args()
    if args.dump is not None:
        dump(args.dump)
    else:
        measure(args.rounds, args.calls)


if __name__ == "__main__":
    main()
