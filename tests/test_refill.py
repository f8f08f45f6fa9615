"""refill.py: a scored backend's list left short by the merges is asked again for every chunk."""

from __future__ import annotations

from rag_rerank import Reranker, rerank
from rag_rerank import reasons as R
from rag_rerank.engine import plan
from rag_rerank.models import Dropped, Ranked, RerankResult
from rag_rerank.refill import waiting, wanted
from rag_rerank.steps import Plan

HEAD = "Vector index memory latency."
# Ten copies of one sentence, none byte-identical (trailing spaces), ahead of three other chunks on
# the query's subject: candidate_k (8 for top_k 3 of 13) holds only copies, which the merges fold.
CHUNKS = [{"id": f"c{k}", "text": HEAD + " " * k} for k in range(10)] + [
    {"id": "o1", "text": "Vector index memory recall shard."},
    {"id": "o2", "text": "Vector index memory cache disk."},
    {"id": "o3", "text": "Vector index memory graph probe."},
]


def _plan(top_k: int = 3) -> Plan:
    session = Reranker("local")
    return plan(session._setup, "vector index memory", CHUNKS, session.options(top_k=top_k))


def _short(*dropped: Dropped) -> RerankResult:
    return RerankResult(ranked=(Ranked("c0", 0.9, "vector index memory latency"),), dropped=dropped)


def test_a_list_the_merges_left_short_is_refilled_and_says_so() -> None:
    result = rerank("vector index memory", CHUNKS, top_k=3)
    assert len(result.ranked) == 3
    assert [r.id for r in result.ranked if r.id.startswith("c")] == ["c0"]  # one of the copies
    refilled = "refill: merges used up the 8 candidates; all 13 chunks"
    assert any(n.startswith(refilled) for n in result.meta.notes)
    accounted = [r.id for r in result.ranked] + [d.id for d in result.dropped]
    assert sorted(accounted) == sorted(c["id"] for c in CHUNKS)


def test_waiting_when_a_chunk_scored_above_the_minimum_is_not_selected() -> None:
    p = _plan()
    assert wanted(p, p.ask) == 3
    assert waiting(p, p.ask, _short(Dropped("o1", R.reason(R.NOT_SELECTED, "0.410"))))


def test_not_waiting_when_the_waiting_chunk_scored_at_the_minimum_or_gave_no_score() -> None:
    p = _plan()
    floor = p.limits.min_score
    assert not waiting(p, p.ask, _short(Dropped("o1", R.reason(R.NOT_SELECTED, f"{floor:.3f}"))))
    assert not waiting(p, p.ask, _short(Dropped("o1", R.NOT_SELECTED)))
    assert not waiting(p, p.ask, _short(Dropped("o1", R.reason(R.BELOW_MIN_SCORE, "0.010"))))


def test_not_waiting_when_a_word_budget_cut_the_list_or_the_list_is_full() -> None:
    p = _plan()
    waits = Dropped("o1", R.reason(R.NOT_SELECTED, "0.410"))
    assert not waiting(p, p.ask, _short(waits, Dropped("o2", R.OVER_WORD_BUDGET)))
    full = RerankResult(ranked=tuple(Ranked(i, 0.9, "vector") for i in ("c0", "o2", "o3")), dropped=(waits,))
    assert not waiting(p, p.ask, full)


def test_not_waiting_when_the_ask_held_every_chunk() -> None:
    p = _plan(top_k=len(CHUNKS))
    assert p.ask.top_k >= len(p.ask.chunks)
    assert not waiting(p, p.ask, _short(Dropped("o1", R.reason(R.NOT_SELECTED, "0.410"))))
