"""Where one LLM rerank call's client-side time goes: each stage of a `Reranker` call, timed in place.

A `Reranker("openai", ...)` built once asks `bench/fast_llm.py` (its own process, answers
precomputed per request body, so the server costs microseconds) to rank the first `--passages` BM25
passages of each TREC DL19 query, top 10. The stages are timed by wrapping the library's own
functions for the run (the SDK's send and parse inside the backend's `complete`, the post-pass and
its parts, the output guard's `judge`, the input guard's `_validated`, `render`); "the rest" is the
call's wall time minus those stages (options, plan, retry loop, result). Two warm-up rounds first,
then `--rounds` timed rounds over the 43 queries. No answer is checked beyond the call's own guards.

The backend call is split in turn: the SDK's own send (`client.post`, request options to raw
response) and the reading of the answer's JSON (`_json_of`, which stands in for the SDK's typed
parse) are the SDK's send and parse; what is left of the backend call is our own (the request body
and its schema built, the answer's text taken out and checked). "Our own stages" is then the whole
call less that send and parse, printed below the table.

`--fresh` times first sight instead: every round (warm-up rounds included) sends texts this process
has not seen (a mark appended to each query and passage), so the per-text caches hold nothing for
them; the server then computes each answer when it first sees the request, which adds its time to
the backend call's. `--new-reasons` (with `--fresh`) puts the mark in front of each passage
instead, so that the server's answers, which quote each ranked passage's opening words, give
reasons not seen before either, as a real model's are (`peers.unseen`).

Run:  python bench/call_stages.py [--passages 20] [--rounds 3] [--fresh [--new-reasons]] [--data PATH]
Prints a Markdown table of mean milliseconds per call for each stage.
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import openai  # noqa: E402
import peers  # noqa: E402

import rag_rerank.backends.openai as openai_backend  # noqa: E402
import rag_rerank.engine as engine  # noqa: E402
import rag_rerank.fallback as fallback  # noqa: E402
import rag_rerank.postpass as postpass  # noqa: E402
import rag_rerank.retry as retry  # noqa: E402
from rag_rerank import Reranker  # noqa: E402

SPENT: dict[str, float] = collections.defaultdict(float)
SEND = "  the SDK's send (`client.post`)"
PARSE = "  the answer's JSON (`_json_of`)"

# (module or class, attribute, label); nested stages are listed under their parent with "  ".
STAGES: list[tuple[Any, str, str]] = [
    (openai_backend.OpenAIBackend, "complete", "backend call"),
    (openai.OpenAI, "post", SEND),  # the client the backend sends with
    (openai_backend, "_json_of", PARSE),
    (fallback, "run_postpass", "post-pass"),
    (postpass, "_redundancy", "  redundancy judgement"),
    (postpass, "select", "  MMR selection"),
    (postpass, "_resolve_vectors", "  vectors"),
    (retry, "judge", "output guard (judge)"),
    # A bare JSON object is judged in its two parts (no repair needed): the same stage.
    (retry, "parse_output", "output guard (judge)"),
    (retry, "output_violations", "output guard (judge)"),
    (engine, "check_request_options", "input guard (check_request_options)"),
    (engine, "render", "render"),
]


def wrap(owner: Any, name: str, label: str) -> None:
    inner = getattr(owner, name)

    @functools.wraps(inner)  # keeps the signature (the registry reads an undeclared backend's)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            SPENT[label] += time.perf_counter() - t0

    setattr(owner, name, timed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passages", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", type=Path, default=peers.DEFAULT_DATA)
    ap.add_argument("--fresh", action="store_true", help="texts unseen by this process in every round")
    ap.add_argument("--new-reasons", action="store_true",
                    help="with --fresh: the model's reasons new in every round too, as a real model's are")
    args = ap.parse_args()
    if args.new_reasons and not args.fresh:
        ap.error("--new-reasons goes with --fresh")
    base = peers.load(args.data, args.passages)

    def round_work(r: int) -> peers.Work:
        if not args.fresh:
            return base
        return peers.unseen(base, f"r{r}", new_reasons=args.new_reasons)

    work = base
    for owner, name, label in STAGES:
        wrap(owner, name, label)
    with peers.fast_server() as url, Reranker("openai", model=peers.MODEL, base_url=url,
                                              api_key=peers.KEY) as session:
        for r in range(2):
            for query, chunks in round_work(-1 - r):
                session.rerank(query, chunks, peers.TOP)
        rounds = [round_work(r) for r in range(args.rounds)]
        SPENT.clear()
        t0 = time.perf_counter()
        for work in rounds:
            for query, chunks in work:
                session.rerank(query, chunks, peers.TOP)
        total = time.perf_counter() - t0
    calls = args.rounds * len(work)
    top = sum(v for k, v in SPENT.items() if not k.startswith(" "))
    print(f"One `Reranker.rerank` call, openai backend -> bench/fast_llm.py, {args.passages} DL19 passages, "
          f"top {peers.TOP}{', first sight of every text (--fresh)' if args.fresh else ''}"
          f"{', new reasons in every answer (--new-reasons)' if args.new_reasons else ''}: mean ms per call "
          f"over {calls} calls\n")
    print("| stage | ms per call |")
    print("|---|---:|")
    for label in dict.fromkeys(label for _, _, label in STAGES):
        print(f"| {label.replace('  ', '… ')} | {SPENT[label] * 1000 / calls:.3f} |")
    print(f"| the rest | {(total - top) * 1000 / calls:.3f} |")
    print(f"| **whole call** | {total * 1000 / calls:.3f} |")
    own = total - SPENT[SEND] - SPENT[PARSE]
    print(f"\nour own stages (the whole call less the SDK's send and the answer's JSON): "
          f"{own * 1000 / calls:.3f} ms a call, {own / max(SPENT[SEND] + SPENT[PARSE], 1e-12):.2f} "
          "of that send and parse")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
