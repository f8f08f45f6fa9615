"""Duplicate-threshold study on the clough-stevenson corpus (how the default thresholds were chosen).

Each of the 95 answers is graded against its Wikipedia source as `cut` (copied), `light`
(lightly edited), `heavy` (rewritten) or `non` (written independently). The post-pass must treat
`cut` and `light` answers as near-duplicates of their source and `non` answers as distinct. For
every embedder this prints the cosine between each answer and its source per category, the
separation gap (lowest cut/light cosine minus highest non cosine), the midpoint of that gap,
and where the embedder's current default threshold falls. Pairs of `non` answers to the same
task (independent texts on one topic, the usual state of a retrieval candidate list) are
reported too, for information only: two students may have copied the same outside page.

    python bench/duplicates.py                                  # lexical + sentence-transformers
    python bench/duplicates.py --embedders lexical

An embedder that is not installed is reported as skipped; a call that raises stops the run with a
`FAILED: ...` line on stdout and exit code 1.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from failures import TALLY, run_bench  # noqa: E402

from rag_rerank.embed import embed_texts, get_embedder  # noqa: E402
from rag_rerank.errors import MissingDependencyError  # noqa: E402
from tests.support.shared_data import data_dir  # noqa: E402

DATA = data_dir() / "clough-stevenson"
CATEGORIES = ("cut", "light", "heavy", "non")


def read_text(path: Path) -> str:
    """The corpus mixes UTF-8 and Windows-1252 files."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors="replace")


def load_corpus(data: Path = DATA) -> dict[str, list[tuple[str, str, str]]]:
    """task -> [(file, category, text)], the source first with category 'orig'."""
    tasks: dict[str, list[tuple[str, str, str]]] = {}
    with (data / "file_information.csv").open(encoding="utf-8") as fh:
        rows = [(r["File"], r["Task"], r["Category"]) for r in csv.DictReader(fh) if r["Category"] != "orig"]
    for task in sorted({t for _, t, _ in rows}):
        tasks[task] = [(f"orig_task{task}.txt", "orig", read_text(data / f"orig_task{task}.txt"))]
    for name, task, cat in rows:
        tasks[task].append((name, cat, read_text(data / name)))
    return tasks


def shingle_containment(answer: str, source: str, k: int = 3) -> float:
    """Share of the answer's word k-grams found verbatim in the source (0 = nothing copied from it)."""

    def grams(text: str) -> set[tuple[str, ...]]:
        words = text.lower().split()
        return {tuple(words[i : i + k]) for i in range(len(words) - k + 1)}

    a = grams(answer)
    return len(a & grams(source)) / max(1, len(a))


def copied_elsewhere(tasks: dict[str, list[tuple[str, str, str]]], limit: float = 0.05) -> set[str]:
    """cut/light answers sharing under 5% of their word 3-grams with the given source.

    Such an answer was copied from some other text (e.g. another part of the Wikipedia article
    than the excerpt the corpus ships), so no similarity to the shipped source can call it a
    duplicate; these are reported by name and left out of the separation figures.
    """
    out = set()
    for items in tasks.values():
        source = items[0][2]
        for name, cat, text in items[1:]:
            if cat in ("cut", "light") and shingle_containment(text, source) < limit:
                out.add(name)
    return out


def study(spec: str, tasks: dict[str, list[tuple[str, str, str]]], skip: set[str],
          embedder: object = None) -> dict[str, object]:
    """Cosines answer-vs-source per category and non-vs-non per task, for one embedder (`spec`, or
    the `embedder` given, e.g. `get_embedder("lexical", stopword_weight=0.1)`)."""
    embedder = get_embedder(spec) if embedder is None else embedder
    by_cat: dict[str, list[float]] = {c: [] for c in CATEGORIES}
    non_pairs: list[float] = []
    started = time.perf_counter()
    for items in tasks.values():
        vectors = embed_texts(embedder, [text for _, _, text in items]).astype(np.float64)
        TALLY.count()
        sims = vectors @ vectors[0]
        for (name, cat, _), s in zip(items[1:], sims[1:], strict=True):
            if name not in skip:
                by_cat[cat].append(float(s))
        non_idx = [i for i, (_, cat, _) in enumerate(items) if cat == "non"]
        non_pairs += [float(vectors[i] @ vectors[j]) for i, j in itertools.combinations(non_idx, 2)]
    seconds = time.perf_counter() - started
    dup = by_cat["cut"] + by_cat["light"]
    highest_distinct = max(by_cat["non"])
    return {
        "spec": spec,
        "name": embedder.name,
        "threshold": float(getattr(embedder, "duplicate_threshold", float("nan"))),
        "by_cat": by_cat,
        "non_pairs": non_pairs,
        "gap_low": highest_distinct,
        "gap_high": min(dup),
        "seconds": seconds,
    }


def _fmt(values: list[float]) -> str:
    v = np.asarray(values)
    return f"{v.min():.3f} / {np.median(v):.3f} / {v.max():.3f}"


def report(result: dict[str, object]) -> None:
    by_cat = result["by_cat"]
    assert isinstance(by_cat, dict)
    thr = float(result["threshold"])  # type: ignore[arg-type]
    low, high = float(result["gap_low"]), float(result["gap_high"])  # type: ignore[arg-type]
    print(f"\n### {result['name']}  (embedding time {float(result['seconds']):.2f} s for 100 texts)\n")  # type: ignore[arg-type]
    print("| pair | n | cosine min / median / max | at or above threshold |")
    print("|---|---:|---|---:|")
    rows = [(f"answer `{c}` vs its source", by_cat[c]) for c in CATEGORIES]
    rows.append(("two `non` answers, same task (not a criterion)", result["non_pairs"]))
    for label, values in rows:
        values = list(values)  # type: ignore[arg-type]
        above = sum(v >= thr for v in values)
        print(f"| {label} | {len(values)} | {_fmt(values)} | {above}/{len(values)} |")
    dup = list(by_cat["cut"]) + list(by_cat["light"])
    precision_first = math.floor(low * 100 + 1) / 100  # smallest 0.01 step above every `non` cosine
    caught = sum(v >= precision_first for v in dup)
    print(
        f"\nprecision-first threshold (no `non` answer at or above it): {precision_first:.2f}, "
        f"catches {caught}/{len(dup)} cut/light answers"
    )
    verdict = "separated" if high > low else "NOT separated"
    print(
        f"\nlowest cut/light = {high:.3f}, highest non = {low:.3f}: {verdict}, "
        f"gap {high - low:+.3f}, midpoint {(high + low) / 2:.3f}; default threshold {thr:.3f} "
        f"({'inside' if low < thr <= high else 'OUTSIDE'} the gap)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--embedders", nargs="+", default=["lexical", "sentence-transformers"])
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args(argv)
    tasks = load_corpus(args.data)
    print(f"clough-stevenson: {sum(len(v) - 1 for v in tasks.values())} answers, {len(tasks)} sources")
    skip = copied_elsewhere(tasks)
    for items in tasks.values():
        for name, cat, text in items[1:]:
            if name in skip:
                print(
                    f"left out: {name} ({cat}) shares {shingle_containment(text, items[0][2]):.1%} of its "
                    "word 3-grams with the source: copied from another text"
                )
    for spec in args.embedders:
        try:
            report(study(spec, tasks, skip))
        except MissingDependencyError as exc:
            print(f"\n### {spec}: skipped ({exc})")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_bench(main))
