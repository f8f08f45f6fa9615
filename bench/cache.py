"""What the response cache saves, and whether the plan counted the calls: `rag-rerank batch` run
twice over the same queries against a local OpenAI-compatible server with injected latency.

The server is tests/support/fake_llm.py in its own process (as bench/batch.py starts it), answering
every task with a valid ranking after `--latency` seconds. Three runs of the same batch file, each
in a fresh process state but one cache folder:

1. cold: an empty cache, every call a request;
2. warm: the same file again, every call served from the cache (no request);
3. replay: `--replay`, which must answer everything from the cache or fail.

Each run is also planned first with `--dry-run` (no request), and the plan's call count is compared
with the calls the run's `meta` reports (hits + misses). Two workloads: one call per query (top 20
candidates) and windows (top 60 in windows of 20: three windows and a final pass per query).

Run:  python bench/cache.py [--queries 43] [--latency 0.2] [--concurrency 8]
Prints a Markdown table; a failed line or a plan that miscounted prints FAILED and exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from batch import DEFAULT_DATA, fake_server, write_queries  # noqa: E402
from batch import run as batch_run  # noqa: E402
from failures import TALLY, run_bench  # noqa: E402

from rag_rerank.cli import main as cli_main  # noqa: E402


def _cli(args: list[str]) -> tuple[int, str]:
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()):
        code = cli_main(args)
    return code, out.getvalue()


def _planned_calls(base: list[str]) -> int:
    """The batch's planned calls, from `--dry-run`'s JSON plan (no request is made)."""
    code, text = _cli([*base, "--dry-run"])
    if code != 0:
        TALLY.fail("dry-run", f"exit {code}: {text[-300:]}")
        return -1
    return int(json.loads(text)["calls"])


def _run(inp: Path, out: Path, url: str, concurrency: int, extra: tuple[str, ...]) -> dict[str, float]:
    """One batch run (bench/batch.py's, which counts its failed lines), with its cache figures."""
    elapsed, n = batch_run(inp, out, url, concurrency, extra)
    records = [json.loads(line) for line in out.open(encoding="utf-8")] if out.is_file() else []
    caches = [r["meta"].get("cache") or {} for r in records if "meta" in r]
    return {"seconds": elapsed, "hits": sum(c.get("hits", 0) for c in caches),
            "misses": sum(c.get("misses", 0) for c in caches),
            "saved": sum(c.get("saved_tokens", 0) for c in caches), "queries": n}


def _same_results(a: Path, b: Path) -> bool:
    def results(p: Path) -> list[object]:
        return [json.loads(line).get("result") for line in p.open(encoding="utf-8")]

    return results(a) == results(b)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=43)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    workloads = [("one call, top 20", 20, ()),
                 ("windows, top 60 in windows of 20", 60, ("--window-size", "20"))]
    print(f"rag-rerank batch, {args.queries} TREC DL19 queries, a server answering in "
          f"{args.latency * 1000:.0f} ms, concurrency {args.concurrency}\n")
    print("| workload | run | planned calls | calls (meta) | cache hits | requests | saved tokens | seconds "
          "| same results as cold |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp, fake_server(args.latency) as url:
        for name, depth, extra in workloads:
            inp = Path(tmp) / f"q{depth}.jsonl"
            write_queries(inp, args.data, args.queries, depth)
            cache = Path(tmp) / f"cache{depth}"
            options = ("--cache", str(cache), *extra)
            base = ["batch", "-i", str(inp), "--backend", "openai", "--base-url", url, "--model", "fake-gpt",
                    "--concurrency", str(args.concurrency), "--no-progress", *options]
            cold_out = Path(tmp) / f"cold{depth}.jsonl"
            for run, flags in (("cold", ()), ("warm", ()), ("replay", ("--replay",))):
                planned = _planned_calls([*base, *flags])
                out = cold_out if run == "cold" else Path(tmp) / f"{run}{depth}.jsonl"
                got = _run(inp, out, url, args.concurrency, (*options, *flags))
                calls = int(got["hits"] + got["misses"])
                if planned != calls and not TALLY.failed:  # a failed line reports no meta
                    TALLY.fail(f"{name}, {run}", f"planned {planned} calls, meta reports {calls}")
                same = "(reference)" if run == "cold" else ("yes" if _same_results(cold_out, out) else "NO")
                if same == "NO":
                    TALLY.fail(f"{name}, {run}", "results differ from the cold run")
                print(f"| {name} | {run} | {planned} | {calls} | {int(got['hits'])} | {int(got['misses'])} | "
                      f"{int(got['saved'])} | {got['seconds']:.2f} | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(run_bench(main))
