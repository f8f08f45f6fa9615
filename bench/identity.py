"""Whether a change kept every LLM-path result byte for byte: a SHA-256 over a recorded LLM batch.

`bench/offline.py` fingerprints the offline default (the local backend). This does the same for
the path an LLM answer takes (input guard, render, the openai SDK over HTTP, output guard,
post-pass, result): `tests/support/fake_llm.py` on 127.0.0.1 answers every task with a varied
but deterministic ranking (`varied_answer`: an order and scores from a hash of the query and the
chunk, reasons quoting the chunk, chunks dropped with each kind of reason or left out), and
`Reranker("openai")` reranks TREC DL19's 43 queries at 20 and 50 passages under several options
(the MMR lambda, the layouts, top_k, near-copies of passages added, windows), then the same
requests through `arerank_many` (the batch path). Each result is recorded whole, as
`bench/offline.py` records it (the card's object with `scores`, and `meta` without its timing);
the output guard's verdicts on a set of faulty answers (misquotes, unknown ids, bad scores) are
recorded too. Two checkouts whose SHA-256s match gave the same bytes for every one of them.

Run:  python bench/identity.py [--data PATH]
Prints one SHA-256 per part and one over all; the answers are computed, not stored, so the
script is the recording.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rag_rerank import Reranker  # noqa: E402
from rag_rerank.guard.output import judge  # noqa: E402
from rag_rerank.models import Chunk  # noqa: E402
from tests.support.fake_llm import FakeLLM, RecordedRequest, Reply  # noqa: E402
from tests.support.shared_data import data_dir, need  # noqa: E402

DEFAULT_DATA = data_dir() / "trec-dl19" / "bm25-top100.json"
_CHUNKS = re.compile(r"<chunks>(.*?)</chunks>", re.DOTALL)
_TOP_K = re.compile(r"<top_k>(\d+)</top_k>")
_QUERY = re.compile(r"<query>(.*?)</query>", re.DOTALL)


def _h(*parts: str) -> int:
    return int.from_bytes(hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest(), "big")


def _quote(text: str, start: int) -> str:
    """Six words of the chunk from word `start` (quotation marks and backslashes left out)."""
    words = text.replace('"', " ").replace("\\", " ").split()
    start = min(start, max(0, len(words) - 6))
    return " ".join(words[start:start + 6])


def varied_answer(prompt: str) -> dict[str, Any]:
    """A valid answer whose order, scores and drops vary with the query and the chunks."""
    top_k = int(m.group(1)) if (m := _TOP_K.search(prompt)) else 5
    query = m.group(1) if (m := _QUERY.search(prompt)) else ""
    body = m.group(1) if (m := _CHUNKS.search(prompt)) else ""
    records = [json.loads(line) for line in body.split("\n") if line.strip()]
    order = sorted(records, key=lambda r: _h(query, r["id"]))
    ranked, dropped = [], []
    for i, rec in enumerate(order):
        h = _h(rec["id"], query, "kind")
        if i < top_k:
            score = round(0.3 + 0.69 * ((_h(rec["id"], query) >> 8) % 1000) / 1000, 3)
            words = _quote(rec["text"], h % 7)
            reason = (f'says "{words}"' if h % 3 else f"about {' '.join(words.split()[:3])}")
            item: dict[str, Any] = {"id": rec["id"], "score": score, "reason": reason}
            if h % 11 == 0:
                item["diversity_note"] = "the model's own note"
            ranked.append(item)
        elif h % 5 == 0:
            continue  # left out of the answer altogether
        elif h % 5 == 1 and ranked:
            dropped.append({"id": rec["id"], "reason": f"redundant_with:{ranked[h % len(ranked)]['id']}"})
        elif h % 5 == 2:
            dropped.append({"id": rec["id"], "reason": f"not_selected: 0.{100 + h % 800:03d}"})
        elif h % 5 == 3:
            dropped.append({"id": rec["id"], "reason": "off topic for this question"})
        else:
            dropped.append({"id": rec["id"], "reason": "below_min_score: 0.150"})
    ranked.sort(key=lambda it: -it["score"])
    return {"ranked": ranked, "dropped": dropped}


def handle(req: RecordedRequest) -> Reply:
    return Reply.openai_text(json.dumps(varied_answer(req.prompt), ensure_ascii=False))


def load(path: Path, n: int) -> list[tuple[str, list[dict[str, Any]]]]:
    data = json.loads(need(path).read_text(encoding="utf-8"))
    return [(q["query"], [{"id": str(h["docid"]), "text": h["content"]} for h in q["hits"][:n]])
            for q in data]


def with_copies(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every fourth passage again under a new id, some word for word, some with a word changed."""
    out = list(chunks)
    for i, c in enumerate(chunks[::4]):
        text = c["text"] if i % 2 else c["text"].replace(" the ", " a ", 1)
        out.append({"id": f"{c['id']}-copy", "text": text})
    return out


def fingerprint(result: Any) -> str:
    if isinstance(result, Exception):
        return f"{type(result).__name__}: {result}"
    meta = {k: v for k, v in result.meta.to_dict().items() if k != "latency_ms"}
    for w in meta.get("windows", []):
        w.pop("latency_ms", None)
    return result.to_json(scores=True) + json.dumps(meta, sort_keys=True)


VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("default", {}),
    ("lambda 0.3, top_k 5", {"lambda_": 0.3, "top_k": 5}),
    ("lambda 1.0, top_k 3", {"lambda_": 1.0, "top_k": 3}),
    ("layout diversity", {"layout": "diversity"}),
    ("layout lost_in_the_middle", {"layout": "lost_in_the_middle"}),
    ("duplicate_threshold 0.6", {"duplicate_threshold": 0.6}),
]

FAULTY = [
    '{"ranked": [{"id": "%s", "score": 0.9, "reason": "says \\"words nowhere in it\\""}], "dropped": []}',
    '{"ranked": [{"id": "%s", "score": 1.5, "reason": "mentions it"}], '
    '"dropped": [{"id": "nope", "reason": "x"}]}',
    '{"ranked": [{"id": "%s", "score": 0.1, "reason": "relevant"}], '
    '"dropped": [{"id": "%s", "reason": "?"}]}',
    '{"ranked": [], "dropped": [{"id": "%s", "reason": "redundant_with:ghost"}], "extra": 1}',
    '```json\n{"ranked": []}\n```',
    '{"ranked": [{"id": "%s", "score": 0.9, "reason": "r", "bogus": true}]} trailing',
]


def guard_verdicts(work: list[tuple[str, list[dict[str, Any]]]]) -> str:
    out = []
    for q, chunks in work[:10]:
        parsed = [Chunk(c["id"], c["text"]) for c in chunks]
        cid = parsed[0].id
        answers = [json.dumps(varied_answer(f"<query>{q}</query><top_k>10</top_k><chunks>"
                                            + "".join(json.dumps(c) + "\n" for c in chunks) + "</chunks>"))]
        answers += [f.replace("%s", cid) for f in FAULTY]
        for raw in answers:
            obj, violations = judge(raw, parsed, 10, query=q)
            out.append(json.dumps([obj, [repr(v) for v in violations]], sort_keys=True, default=repr))
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = ap.parse_args()
    total = hashlib.sha256()
    rows = []
    with FakeLLM(handler=handle) as srv, Reranker("openai", model="fake-gpt", base_url=srv.openai_url,
                                                   api_key="sk-identity") as session:
        for n in (20, 50):
            work = load(args.data, n)
            for name, options in [*VARIANTS, ("near-copies added", {"copies": True}),
                                  ("windows of 12", {"window_size": 12})]:
                if n == 50 and name == "near-copies added":
                    continue  # over max_chunks
                digest = hashlib.sha256()
                opts = {k: v for k, v in options.items() if k != "copies"}
                for q, chunks in work:
                    try:
                        given = with_copies(chunks) if "copies" in options else chunks
                        result: Any = session.rerank(q, given, **opts)
                    except Exception as exc:  # recorded as it is
                        result = exc
                    digest.update(fingerprint(result).encode())
                rows.append((f"{n} passages, {name}", digest.hexdigest()))
            digest = hashlib.sha256()
            requests = [{"query": q, "chunks": chunks, "top_k": 5} for q, chunks in work]
            for result in asyncio.run(_many(session, requests)):
                digest.update(fingerprint(result).encode())
            rows.append((f"{n} passages, arerank_many", digest.hexdigest()))
        rows.append(("output guard verdicts", hashlib.sha256(guard_verdicts(load(args.data, 20)).encode()
                                                            ).hexdigest()))
    print("| part | SHA-256 |")
    print("|---|---|")
    for name, sha in rows:
        total.update(sha.encode())
        print(f"| {name} | `{sha[:16]}` |")
    print(f"\nall parts sha256: {total.hexdigest()}")
    return 0


async def _many(session: Reranker, requests: list[dict[str, Any]]) -> list[Any]:
    try:
        return await session.arerank_many(requests, concurrency=8)
    finally:
        await session.release_loop()


if __name__ == "__main__":
    raise SystemExit(main())
