"""Client-side cost per LLM rerank call, side by side with the peers' LLM rerankers, one server.

Every reranker below asks ONE fast local OpenAI-compatible server (`bench/fast_llm.py`, its own
process, answers precomputed per request body, HTTP/1.1 keep-alive) for a ranking of the same TREC
DL19 passages (the first 20 / 50 BM25 hits of each of the 43 queries), top 10, and the server
answers each one in the format it parses. The server's own time is a hash and a dictionary lookup,
so what is timed is each library's client-side cost: building the request, the HTTP client, parsing
and checking the answer, its own post-processing.

* `openai` SDK, bare: `client.chat.completions.create(**our_request)` with our exact request body
  (recorded by the server from our own calls) and `json.loads` of the content: the floor;
* Haystack `LLMRanker` (haystack-ai) on `OpenAIChatGenerator` with its default JSON schema
  (`document_ranking`) as `response_format`, `raise_on_failure=True`;
* LlamaIndex `StructuredLLMRerank` (llama-index-core + llama-index-llms-openai), all passages in one
  call (`choice_batch_size` = the number of passages), a tool call;
* LangChain `LLMListwiseRerank` (langchain-classic + langchain-openai) on `ChatOpenAI`;
* rag-rerank: a `Reranker(backend="openai", ...)` built once, and the one-shot `rerank(...,
  backend="openai", base_url=...)` that builds and closes its client per call.

Inputs are built before timing in each library's own types (Documents, nodes, chunk dicts). A
peer whose package is missing is skipped with a message. Every call's answer is checked (ours:
ranked, one attempt, no fallback; a peer: a non-empty ranking, no silent fallback), and the server
counts the calls per caller: any failure is printed and the script exits 1.

`--fresh` compares first sight instead, what a real user's call mostly is: in every round each
reranker gets the passages under a mark of its own (`unseen(..., new_reasons=True)`), so no text or
reason was seen before by any of them (the peers keep no per-text caches; ours does). The bare SDK
call replays our request bodies for texts marked for it, recorded by an untimed call of ours before
the round. The server computes an answer the first time it sees a body, and that time falls in the
caller's wall clock (ours: the quoting ranker's answer, dearer than a peer's list of indices; the
bare SDK: none, its bodies were answered when recorded), so with `--fresh` read the client CPU
columns: each library's own work, which the server's time does not enter.

Run:  python bench/peers.py [--rounds 5] [--calls 43] [--sizes 20 50] [--data PATH] [--fresh]
Prints per size the median ms per call (median over rounds of each round's median) and the ratio to
the bare SDK call (median of the per-round ratios: rounds interleave all rerankers, so load on a
shared machine hits them alike), in wall-clock and in the client's CPU time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from batch import fake_server  # noqa: E402

from tests.support.shared_data import data_dir, need  # noqa: E402

DEFAULT_DATA = data_dir() / "trec-dl19" / "bm25-top100.json"
TOP = 10
KEY = "sk-bench-not-a-real-key"
MODEL = "gpt-4o-mini"  # a name every peer knows (LlamaIndex decides function calling from it)

Work = list[tuple[str, list[dict[str, Any]]]]


def load(path: Path, n: int) -> Work:
    data = json.loads(need(path).read_text(encoding="utf-8"))
    return [(q["query"], [{"id": str(h["docid"]), "text": h["content"]} for h in q["hits"][:n]])
            for q in data]


def unseen(work: Work, mark: str, *, new_reasons: bool = False) -> Work:
    """`work` with ` [mark]` appended to every query and passage: texts this process has not seen,
    so the per-text caches hold nothing for them (`--fresh` of `call_stages.py`, `instructions.py`).

    `new_reasons`: the passages' mark goes in front instead (`[mark] text`). The benches' fake model
    quotes each ranked passage's opening words, so its reasons are then new too, as a real model's
    are in every call; with the mark at the end they repeat round after round, and the output
    guard's per-reason memos hit as they never do for a real answer."""
    def marked(text: str) -> str:
        return f"[{mark}] {text}" if new_reasons else f"{text} [{mark}]"

    return [(f"{q} [{mark}]", [{**c, "text": marked(c["text"])} for c in chunks]) for q, chunks in work]


def fast_server(latency: float = 0.0) -> contextlib.AbstractContextManager[str]:
    """bench/fast_llm.py in its own process (bench/batch.py starts it); yields its OpenAI base URL."""
    return fake_server(latency, server="fast_llm")


def server_json(url: str, what: str) -> Any:
    with urllib.request.urlopen(f"{url.removesuffix('/v1')}/{what}") as resp:
        return json.loads(resp.read())


class Failed(Exception):
    """A call whose answer is not what the reranker should have returned."""


@dataclass
class Peer:
    """One reranker: `prepare(work)` turns the inputs into its own types (untimed) and returns
    `call(i)` for the i-th query; `close` releases its clients."""

    name: str
    prepare: Callable[[Work], Callable[[int], None]]
    close: Callable[[], None] = lambda: None


def _ours_check(result: Any) -> None:
    meta = result.meta
    if not result.ranked or meta.attempts != 1 or meta.fallback is not None:
        raise Failed(f"rag-rerank: ranked={len(result.ranked)} attempts={meta.attempts} "
                     f"fallback={meta.fallback}")


def ours_once(url: str) -> Peer:
    from rag_rerank import Reranker

    session = Reranker("openai", model=MODEL, base_url=url, api_key=KEY)

    def prepare(work: Work) -> Callable[[int], None]:
        def call(i: int) -> None:
            query, chunks = work[i]
            _ours_check(session.rerank(query, chunks, TOP))
        return call

    return Peer("rag-rerank, Reranker built once", prepare, session.close)


def ours_oneshot(url: str) -> Peer:
    from rag_rerank import rerank

    def prepare(work: Work) -> Callable[[int], None]:
        def call(i: int) -> None:
            query, chunks = work[i]
            _ours_check(rerank(query, chunks, TOP, backend="openai", model=MODEL, base_url=url, api_key=KEY))
        return call

    return Peer("rag-rerank, one-shot rerank()", prepare)


def bare_sdk(url: str, recorded: dict[int, list[dict[str, Any]]]) -> Peer:
    import openai

    client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)

    def prepare(work: Work) -> Callable[[int], None]:
        bodies = recorded[len(work[0][1])]

        def call(i: int) -> None:
            resp = client.chat.completions.create(**bodies[i])
            if not json.loads(resp.choices[0].message.content or "{}").get("ranked"):
                raise Failed("openai SDK: no ranking in the answer")
        return call

    return Peer("openai SDK, bare call (our request)", prepare, client.close)


def haystack(url: str) -> Peer:
    from haystack import Document
    from haystack.components.generators.chat import OpenAIChatGenerator
    from haystack.components.rankers import LLMRanker
    from haystack.components.rankers.llm_ranker import _default_openai_chat_generator
    from haystack.utils import Secret

    # LLMRanker's own default schema, sent the Chat Completions way (its default generator uses
    # the Responses API, which an OpenAI-compatible server need not serve).
    schema = _default_openai_chat_generator().generation_kwargs["text"]["format"]
    fmt = {"type": "json_schema", "json_schema": {"name": schema["name"], "schema": schema["schema"]}}
    generator = OpenAIChatGenerator(api_key=Secret.from_token(KEY), model=MODEL, api_base_url=url,
                                    generation_kwargs={"temperature": 0.0, "response_format": fmt},
                                    max_retries=0)
    ranker = LLMRanker(chat_generator=generator, top_k=TOP, raise_on_failure=True)
    ranker.warm_up()

    def prepare(work: Work) -> Callable[[int], None]:
        docs = [[Document(id=c["id"], content=c["text"]) for c in chunks] for _, chunks in work]

        def call(i: int) -> None:
            if not ranker.run(query=work[i][0], documents=docs[i])["documents"]:
                raise Failed("haystack: no documents ranked")
        return call

    return Peer("Haystack LLMRanker", prepare, ranker.close)


def llamaindex(url: str) -> Peer:
    from llama_index.core.postprocessor import StructuredLLMRerank
    from llama_index.core.schema import NodeWithScore, TextNode
    from llama_index.llms.openai import OpenAI

    llm = OpenAI(model=MODEL, api_base=url, api_key=KEY, max_retries=0, temperature=0.0)

    def prepare(work: Work) -> Callable[[int], None]:
        nodes = [[NodeWithScore(node=TextNode(id_=c["id"], text=c["text"]), score=0.0) for c in chunks]
                 for _, chunks in work]
        ranker = StructuredLLMRerank(llm=llm, top_n=TOP, choice_batch_size=len(work[0][1]))

        def call(i: int) -> None:
            if not ranker.postprocess_nodes(nodes[i], query_str=work[i][0]):
                raise Failed("llamaindex: no nodes ranked")
        return call

    return Peer("LlamaIndex StructuredLLMRerank", prepare)


def langchain(url: str) -> Peer:
    from langchain_classic.retrievers.document_compressors import LLMListwiseRerank
    from langchain_core.documents import Document
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=url, api_key=KEY, max_retries=0, temperature=0.0)  # type: ignore[arg-type]
    ranker = LLMListwiseRerank.from_llm(llm, top_n=TOP)

    def prepare(work: Work) -> Callable[[int], None]:
        docs = [[Document(page_content=c["text"], id=c["id"]) for c in chunks] for _, chunks in work]

        def call(i: int) -> None:
            if not ranker.compress_documents(docs[i], work[i][0]):
                raise Failed("langchain: no documents ranked")
        return call

    return Peer("LangChain LLMListwiseRerank", prepare)


PEERS: list[tuple[str, Callable[[str], Peer], str]] = [
    ("haystack", haystack, "haystack-ai"),
    ("llamaindex", llamaindex, "llama-index-core and llama-index-llms-openai"),
    ("langchain", langchain, "langchain-classic and langchain-openai"),
]


def timed_round(calls: dict[str, Callable[[int], None]], n_queries: int, count: int, start: int
                ) -> tuple[dict[str, list[float]], dict[str, list[float]], list[str]]:
    """One round: `count` queries, each asked of every reranker in turn (the order rotating per
    query), so a change of load on a shared machine hits them all alike. Returns the wall-clock
    and the client CPU milliseconds of each call per reranker, and any failures."""
    wall: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    failures: list[str] = []
    names = list(calls)
    for k in range(count):
        i = (start + k) % n_queries
        for name in names[k % len(names):] + names[:k % len(names)]:
            if name not in calls:
                continue
            c0, t0 = time.process_time(), time.perf_counter()
            try:
                calls[name](i)
            except Exception as exc:  # reported, and the reranker is not timed any further
                failures.append(f"{name}: {type(exc).__name__}: {exc}")
                calls.pop(name)
                continue
            wall[name].append((time.perf_counter() - t0) * 1000.0)
            cpu[name].append((time.process_time() - c0) * 1000.0)
    return wall, cpu, failures


def fresh_round(calls: dict[str, Callable[[int], None]], work: Work, mark: str, ours: Peer, sdk: Peer,
                everyone: list[Peer], recorded: dict[int, list[dict[str, Any]]], url: str) -> None:
    """Before a `--fresh` round: each reranker still timed gets `work` under marks of its own (a text
    seen by one is new to the next), and the bare SDK call our request bodies for texts marked for
    it, recorded by an untimed call of ours on them. `mark` names the round and the list size: the
    first 20 passages of a 50-passage list are the 20-passage list's, which a mark naming the round
    alone would hand back as seen."""
    record = ours.prepare(unseen(work, f"sdk-{mark}", new_reasons=True))
    for i in range(len(work)):
        record(i)
    recorded[len(work[0][1])] = server_json(url, "recorded")[-len(work):]
    for k, peer in enumerate(everyone):
        if peer.name in calls:
            target = work if peer is sdk else unseen(work, f"p{k}-{mark}", new_reasons=True)
            calls[peer.name] = peer.prepare(target)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=43,
                    help="timed calls per reranker per round (cycling queries)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 50])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--fresh", action="store_true",
                    help="first sight: every reranker's texts and the model's reasons new in every round "
                         "(compare the client CPU columns)")
    args = ap.parse_args()
    if args.fresh and args.calls > 43:
        ap.error("--fresh asks each query once a round: --calls 43 at most")
    os.environ.setdefault("OPENAI_API_KEY", KEY)
    failures: list[str] = []
    rows: list[tuple[int, str, float, float, float, float]] = []
    with fast_server() as url:
        ours = [ours_once(url), ours_oneshot(url)]
        peers: list[Peer] = []
        for key, make, package in PEERS:
            try:
                peers.append(make(url))
            except ImportError as exc:
                print(f"skipped {key}: {package} not installed ({exc})")
        recorded: dict[int, list[dict[str, Any]]] = {}
        for n in args.sizes:
            work = load(args.data, n)
            calls: dict[str, Callable[[int], None]] = {}
            # Warm every reranker on every query once (imports, clients, the server's answers),
            # ours first: the server records our request bodies for the bare SDK call.
            for peer in ours:
                calls[peer.name] = peer.prepare(work)
                for i in range(len(work)):
                    calls[peer.name](i)
                if not recorded.get(n):
                    bodies = server_json(url, "recorded")
                    recorded[n] = bodies[-len(work):]
            sdk = bare_sdk(url, recorded)
            everyone = [sdk, *ours, *peers]
            for peer in [sdk, *peers]:
                calls[peer.name] = peer.prepare(work)
                try:
                    for i in range(len(work)):
                        calls[peer.name](i)
                except Exception as exc:  # a peer that cannot even warm up is reported, not timed
                    failures.append(f"{peer.name} at {n} passages: {type(exc).__name__}: {exc}")
                    calls.pop(peer.name)
            medians: dict[str, list[float]] = {p.name: [] for p in everyone}
            cpus: dict[str, list[float]] = {p.name: [] for p in everyone}
            ratios: dict[str, list[float]] = {p.name: [] for p in everyone}
            cpu_ratios: dict[str, list[float]] = {p.name: [] for p in everyone}
            for r in range(args.rounds):
                if args.fresh:
                    fresh_round(calls, work, f"n{n}r{r}", ours[0], sdk, everyone, recorded, url)
                start = 0 if args.fresh else r * args.calls  # fresh: each round's texts are new anyway
                wall, cpu, failed = timed_round(calls, len(work), args.calls, start)
                failures += [f"{line} at {n} passages" for line in failed]
                if not wall.get(sdk.name):
                    continue
                base, base_cpu = statistics.median(wall[sdk.name]), statistics.median(cpu[sdk.name])
                for name, times in wall.items():
                    if times:
                        medians[name].append(statistics.median(times))
                        cpus[name].append(statistics.median(cpu[name]))
                        ratios[name].append(medians[name][-1] / base)
                        cpu_ratios[name].append(cpus[name][-1] / base_cpu)
            for peer in everyone:
                if medians[peer.name]:
                    rows.append((n, peer.name, statistics.median(medians[peer.name]),
                                 statistics.median(ratios[peer.name]), statistics.median(cpus[peer.name]),
                                 statistics.median(cpu_ratios[peer.name])))
            sdk.close()
        stats = server_json(url, "stats")
        for peer in [*ours, *peers]:
            peer.close()
    load_avg = os.getloadavg()[0]
    print(f"Client-side ms per rerank call (top {TOP}), TREC DL19 passages, "
          + ("first sight (--fresh: every text and reason new to every reranker; read the CPU columns), "
             if args.fresh else "")
          + "one local OpenAI-compatible server "
          f"(bench/fast_llm.py); median over {args.rounds} rounds of {args.calls} calls each; "
          f"{os.cpu_count()} cores, load average {load_avg:.1f}\n")
    print("| passages | reranker | ms per call | x bare SDK call | client CPU ms per call "
          "| x bare SDK call (CPU) |")
    print("|---:|---|---:|---:|---:|---:|")
    for n, name, ms, ratio, cpu_ms, cpu_ratio in rows:
        print(f"| {n} | {name} | {ms:.2f} | {ratio:.2f} | {cpu_ms:.2f} | {cpu_ratio:.2f} |")
    print(f"\nserver calls per caller: {json.dumps(stats, sort_keys=True)}")
    if failures:
        for line in failures:
            print(f"FAILED: {line}")
        print(f"FAILED: {len(failures)} failure(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
