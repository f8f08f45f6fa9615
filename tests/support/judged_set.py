"""A small judged collection made up for the tests of the bias meter, calibration and the simulated
judge (`bench/simjudge.py`): a candidates file (`rag-rerank eval`'s format) and TREC qrels, graded
0-3, each chunk's text its own words (so a reason can quote it)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"
WORDS = ["harbour", "lighthouse", "granite", "orchard", "violin", "copper", "meadow", "lantern", "glacier",
         "falcon", "saffron", "quarry", "tundra", "beacon", "marble", "willow", "compass", "ember", "canyon",
         "trellis"]


def write_judged_set(folder: Path, *, queries: int = 8, chunks: int = 10, seed: int = 0) -> tuple[Path, Path]:
    """(candidates file, qrels file) in `folder`: per query two chunks of each grade 1-3 and the
    rest grade 0, in a seeded order."""
    rng = random.Random(seed)
    rows, qrels = [], []
    for q in range(queries):
        topic = WORDS[q % len(WORDS)]
        grades = [3, 3, 2, 2, 1, 1] + [0] * (chunks - 6)
        rng.shuffle(grades)
        items = []
        for i, grade in enumerate(grades):
            cid = f"q{q}-d{i}"
            filler = " ".join(rng.sample(WORDS, 4))
            items.append({"id": cid, "text": f"Passage {i} on {topic} and {filler}, judged by hand."})
            qrels.append(f"q{q} 0 {cid} {grade}")
        rows.append({"qid": f"q{q}", "query": f"what about {topic} number {q}?", "chunks": items})
    cands = folder / "candidates.jsonl"
    cands.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    qrels_path = folder / "qrels.txt"
    qrels_path.write_text("\n".join(qrels) + "\n", encoding="utf-8")
    return cands, qrels_path


def simjudge() -> Any:
    """The `bench/simjudge.py` module (benches are scripts, not a package)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import simjudge as module

    return module
