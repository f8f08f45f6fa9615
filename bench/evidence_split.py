"""How evidence.py cuts text into units, measured on text as it comes: SciFact abstracts as stored
in the corpus (full stops often glued to the next sentence), a run-on text at growing budgets, and
the splitter's own time.

    python bench/evidence_split.py            # all three
    python bench/evidence_split.py --no-glued # the same with the glued-full-stop split switched off

Rationale kept: for each training claim-abstract pair of `../shared/data/scifact/rationales-train.json`
whose rationale sentences are found verbatim in the corpus abstract (`corpus.jsonl.gz`), whether one
complete rationale lies inside the kept passages of `evidence.select(claim, abstract, budget)`
(tokens = characters / 4, as in bench/evidence.py). Even claim ids and odd ones are printed apart;
nothing here is tuned. Times are CPU times on a shared machine: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import statistics
import time
from pathlib import Path
from typing import Any

from rag_rerank import evidence
from rag_rerank.tokens import estimate_tokens

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "scifact"
BUDGETS = (64, 96, 128, 192)


def raw_pairs() -> list[dict[str, Any]]:
    """Training pairs over the corpus text itself, with each sentence's span found in it."""
    corpus = {}
    with gzip.open(DATA / "corpus.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)
            corpus[str(doc["_id"] if "_id" in doc else doc["doc_id"])] = doc["text"]
    out = []
    for p in json.loads((DATA / "rationales-train.json").read_text(encoding="utf-8")):
        text = corpus.get(str(p["doc_id"]))
        if text is None:
            continue
        spans, pos = [], 0
        for s in p["sentences"]:
            k = text.find(s.strip(), pos)
            if k < 0:
                break
            spans.append((k, k + len(s.strip())))
            pos = k + len(s.strip())
        else:
            out.append({**p, "text": text, "spans": spans})
    return out


def served(pair: dict[str, Any], kept: list[tuple[int, int]]) -> bool:
    def inside(span: tuple[int, int]) -> bool:
        return any(a <= span[0] and span[1] <= b for a, b in kept)
    return any(all(inside(pair["spans"][i]) for i in r) for r in pair["rationales"])


def rationale_table(pairs: list[dict[str, Any]]) -> None:
    glued = sum(1 for p in pairs if re.search(r"[a-z0-9)]\.[A-Z]", p["text"]))
    print(f"{len(pairs)} pairs found verbatim in the corpus ({glued} with a full stop glued to a capital)")
    print("part        " + "".join(f"{b:>8}" for b in BUDGETS))
    for name, part in (("even ids", [p for p in pairs if int(p["claim_id"]) % 2 == 0]),
                       ("odd ids", [p for p in pairs if int(p["claim_id"]) % 2 == 1]), ("all", pairs)):
        row = []
        for b in BUDGETS:
            evidence.clear_cache()
            hits = [served(p, [(q.start, q.end) for q in evidence.select(p["claim"], p["text"], b).passages])
                    for p in part]
            row.append(sum(hits) / len(hits))
        print(f"{name:<12}" + "".join(f"{r:>8.3f}" for r in row))


def run_on() -> None:
    random.seed(0)
    words = ["alpha", "beta", "gamma", "delta", "vector", "index", "memory", "graph", "search", "query",
             "cluster", "partition"]
    text = " ".join(random.choice(words) for _ in range(8000)) + ". End."
    evidence.select("x", "a. b. c.", 1, count=estimate_tokens)
    print(f"one run-on text of {estimate_tokens(text)} tokens (estimate_tokens), CPU seconds to choose:")
    for b in (128, 512, 2048, 4096):
        evidence.clear_cache()
        t0 = time.process_time()
        evidence.select("memory index", text, b, count=estimate_tokens)
        print(f"  budget {b}: {time.process_time() - t0:.3f} s (load average {os.getloadavg()[0]:.1f})")


def timing() -> None:
    """Median CPU ms to choose 128 tokens of a ~1,400-token chunk (a training abstract and three
    random corpus abstracts, as /tmp/qa/ev4.py builds them), first sight, with each counter."""
    random.seed(3)
    with gzip.open(DATA / "corpus.jsonl.gz", "rt", encoding="utf-8") as fh:
        docs = [json.loads(line)["text"] for line in fh]
    pairs = json.loads((DATA / "rationales-train.json").read_text(encoding="utf-8"))[:40]
    texts = [(p["claim"], "\n\n".join([" ".join(p["sentences"])] + [random.choice(docs) for _ in range(3)]))
             for p in pairs]
    evidence.select("a", "b. c. d.", 1)
    size = statistics.median(estimate_tokens(t) for _, t in texts)
    for count in (evidence.chars_per_token, estimate_tokens):
        times, split = [], []
        for _ in range(3):
            evidence.clear_cache()
            for q, t in texts:
                t0 = time.process_time()
                evidence.select(q, t, 128, count=count)
                times.append((time.process_time() - t0) * 1000)
                t0 = time.process_time()
                for a, b in evidence.sentences(t):
                    evidence._split_long(t, (a, b), 128 - 2 * count(evidence.ELISION), count)
                split.append((time.process_time() - t0) * 1000)
        print(f"{count.__name__}: chunk of median {size:.0f} tokens, select median "
              f"{statistics.median(times):.1f} ms, of which cutting into units about "
              f"{statistics.median(split):.1f} ms "
              f"(load average {os.getloadavg()[0]:.1f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-glued", action="store_true", help="switch the glued-full-stop split off")
    args = ap.parse_args()
    if args.no_glued:
        evidence._GLUED = re.compile(r"(?!)")
    rationale_table(raw_pairs())
    run_on()
    timing()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
