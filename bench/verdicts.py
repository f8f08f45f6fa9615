"""Whether a change kept every redundancy verdict: a SHA-256 over the judgements the post-pass makes.

`bench/offline.py` and `bench/identity.py` fingerprint whole results, in which most pairs of chunks
are never judged word by word; a speed change to `rag_rerank/redundancy.py` needs the verdicts
themselves. This hashes `judge`'s (redundant, why, keep) for:

* every pair of each of the 43 TREC DL19 lists (the query and its first 30 BM25 passages), under
  the real cosines (the static table's and the lexical embedder's) and with both set to 1.0, so
  that the substitution rules run for every pair;
* the `redundancy()` matrices (redundant, prefer) of each list at 20 and 30 passages;
* every MRPC train and validation pair and every STS Benchmark train and development pair of
  issue 32's groups (`bench/redundancy.py`), under their real cosines.

Two checkouts printing the same SHA-256 judged every one of them alike.

Run:  python bench/verdicts.py [--data PATH]
Prints the number of judgements, the seconds taken and the SHA-256.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import peers  # noqa: E402
import redundancy as corpora  # noqa: E402  (bench/redundancy.py)

from rag_rerank.embed import embed_texts, get_embedder  # noqa: E402
from rag_rerank.redundancy import RULES, Verdict, judge, read, redundancy  # noqa: E402


def _cosines(embedder: object, texts: list[str]) -> np.ndarray:
    vectors = embed_texts(embedder, texts).astype(np.float64)
    return vectors @ vectors.T


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=peers.DEFAULT_DATA)
    args = ap.parse_args()
    digest = hashlib.sha256()
    count = 0
    rules = RULES["static"]
    static, lexical = get_embedder("static"), get_embedder("lexical")
    started = time.perf_counter()

    def record(verdict: Verdict) -> None:
        nonlocal count
        digest.update(repr((verdict.redundant, verdict.why, verdict.keep)).encode())
        count += 1

    for query, chunks in peers.load(args.data, 30):
        texts = [query, *(c["text"] for c in chunks)]
        sem, lex = _cosines(static, texts), _cosines(lexical, texts)
        for i, j in itertools.combinations(range(len(texts)), 2):
            for s, lx in ((sem[i, j], lex[i, j]), (1.0, 1.0)):
                record(judge(read(texts[i]), read(texts[j]), float(s), rules, float(lx)))
        for n in (20, 30):
            same, prefer = redundancy(texts[1:n + 1], sem[1:n + 1, 1:n + 1], rules, lex[1:n + 1, 1:n + 1])
            digest.update(same.tobytes())
            digest.update(prefer.tobytes())
            count += 1
    for split in ("train", "held-out"):
        for data, _ in corpora.corpus_groups(split).values():
            pairs = [(a, b, False, "") for a, b, _ in data]
            sem_pairs, lex_pairs = corpora.cosines("static", pairs), corpora.cosines("lexical", pairs)
            for (a, b, _), s, lx in zip(data, sem_pairs, lex_pairs, strict=True):
                record(judge(read(a), read(b), float(s), rules, float(lx)))
    print(f"{count} judgements, {time.perf_counter() - started:.1f} s, sha256 {digest.hexdigest()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
