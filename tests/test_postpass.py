"""The diversity post-pass: accounting, duplicates, MMR against a plain float64 reference, layouts."""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import rag_rerank.postpass as pp
from rag_rerank.embed import l2_normalise
from rag_rerank.errors import InputError
from rag_rerank.guard import validate_request
from rag_rerank.models import Chunk, Dropped, Ranked, RerankRequest
from rag_rerank.postpass import LAYOUTS, lost_in_the_middle, postpass, postpass_guarded, select
from rag_rerank.reasons import normalise

MIN_SCORE = 0.2


# --------------------------------------------------------------------------- a plain reference


def reference_selection(rel, vectors, k, lam, lengths, threshold):
    """MMR with near-duplicate grouping, written as the issue states it, in float64 Python loops.

    First pick: the most relevant; then argmax of lam*rel - (1-lam)*max_sim over the selected;
    ties to the earlier input. A pick's group (itself + remaining candidates at or above the
    threshold) is represented by its shortest member (then higher relevance, then input order);
    everything at or above the threshold against the kept one leaves the pool.
    """
    v = np.asarray(vectors, dtype=np.float64)
    s = v @ v.T
    sim = (s + s.T) * 0.5
    pool = list(range(len(rel)))
    picked = []
    while len(picked) < k and pool:
        if not picked:
            choice = max(pool, key=lambda i: (rel[i], -i))
        else:
            choice, best = None, -math.inf
            for i in pool:
                value = lam * rel[i] - (1.0 - lam) * max(sim[i][j] for j in picked)
                if value > best:
                    choice, best = i, value
        group = [i for i in pool if i == choice or sim[choice][i] >= threshold]
        keep = min(group, key=lambda i: (lengths[i], -rel[i], i))
        picked.append(keep)
        pool = [i for i in pool if i != keep and sim[keep][i] < threshold]
    return picked


def _request(vectors, texts, top_k, lam, ids=None):
    ids = ids or [f"id-{i}" for i in range(len(vectors))]
    rows = zip(ids, texts, vectors, strict=True)
    chunks = tuple(Chunk(id=i, text=t, embedding=tuple(float(x) for x in v)) for i, t, v in rows)
    return RerankRequest(query="q", chunks=chunks, top_k=top_k, lambda_=lam)


# --------------------------------------------------------------------------- properties

_ID_ALPHABET = st.sampled_from(["a", "A", " ", "é", "1", "-", ":", "ß"])
_score = st.one_of(st.sampled_from([0.0, 0.2, 0.5, 0.9, 1.0]), st.floats(0.0, 1.0))


@st.composite
def cases(draw):
    n = draw(st.integers(0, 12))
    dim = draw(st.integers(1, 4))
    vectors = [draw(st.lists(st.integers(-3, 3), min_size=dim, max_size=dim)) for _ in range(n)]
    ids = draw(st.lists(st.text(_ID_ALPHABET, min_size=1, max_size=4), min_size=n, max_size=n, unique=True))
    lengths = draw(st.lists(st.integers(1, 6), min_size=n, max_size=n))
    texts = [" ".join(["w"] * m) for m in lengths]
    status = draw(
        st.lists(st.sampled_from(["scored", "scored", "scored", "dropped", "silent"]), min_size=n, max_size=n)
    )
    scores = draw(st.lists(_score, min_size=n, max_size=n))
    top_k = draw(st.integers(1, 14))
    lam = draw(st.one_of(st.sampled_from([0.0, 0.5, 0.7, 1.0]), st.floats(0.0, 1.0)))
    threshold = draw(st.one_of(st.sampled_from([0.5, 0.9, 0.95, 1.01]), st.floats(0.0, 1.0)))
    return ids, vectors, texts, status, scores, top_k, lam, threshold


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_postpass_properties(case):
    ids, vectors, texts, status, scores, top_k, lam, threshold = case
    request = _request(vectors, texts, top_k, lam, ids)
    rows = list(zip(ids, status, scores, strict=True))
    scored = [Ranked(i, s, f"cites {i}") for i, st_, s in rows if st_ == "scored"]
    dropped = [Dropped(i, "off topic") for i, st_ in zip(ids, status, strict=True) if st_ == "dropped"]
    result = postpass(request, scored, dropped, duplicate_threshold=threshold, min_score=MIN_SCORE)

    out_ids = [r.id for r in result.ranked] + [d.id for d in result.dropped]
    assert sorted(out_ids) == sorted(ids)  # every input id exactly once, byte for byte
    assert len(result.ranked) <= top_k
    score_of = {r.id: r.score for r in scored}
    assert all(score_of[r.id] == r.score and r.score > MIN_SCORE for r in result.ranked)

    if not ids:
        assert result.ranked == () and result.dropped == ()
        return
    unit = l2_normalise(np.array(vectors, dtype=np.float64)).astype(np.float64)
    row = {i: k for k, i in enumerate(ids)}
    ranked_ids = [r.id for r in result.ranked]
    for a in range(len(ranked_ids)):
        for b in range(a + 1, len(ranked_ids)):
            assert float(unit[row[ranked_ids[a]]] @ unit[row[ranked_ids[b]]]) < threshold + 1e-9

    for d in result.dropped:
        if d.reason.startswith("redundant_with:"):
            assert d.reason.removeprefix("redundant_with:") in ranked_ids
        if d.id in score_of and score_of[d.id] <= MIN_SCORE:
            assert d.reason == f"below_min_score: {score_of[d.id]:.3f}"

    cand = [k for k, i in enumerate(ids) if i in score_of and score_of[i] > MIN_SCORE]
    expected = reference_selection(
        [score_of[ids[k]] for k in cand], unit[cand], top_k, lam, [len(texts[k]) for k in cand], threshold
    )
    assert ranked_ids == [ids[cand[j]] for j in expected]


@settings(deadline=None)
@given(
    st.lists(st.tuples(_score, st.lists(st.floats(-1, 1), min_size=3, max_size=3)), min_size=1, max_size=15),
    st.integers(1, 15),
)
def test_lambda_one_is_relevance_order(items, top_k):
    vectors = [v for _, v in items]
    request = _request(vectors, ["t"] * len(items), top_k, 1.0)
    scored = [Ranked(f"id-{k}", s, "r") for k, (s, _) in enumerate(items)]
    result = postpass(request, scored, duplicate_threshold=2.0)  # de-duplication off
    expected = sorted((k for k, (s, _) in enumerate(items) if s > MIN_SCORE), key=lambda k: (-items[k][0], k))
    assert [r.id for r in result.ranked] == [f"id-{k}" for k in expected[:top_k]]


@settings(deadline=None)
@given(
    st.lists(st.floats(0, 1), min_size=1, max_size=30),
    st.integers(0, 30),
    st.floats(0, 1),
    st.integers(1, 6),
    st.randoms(use_true_random=False),
)
def test_mmr_matches_reference(rel, k, lam, dim, rnd):
    vectors = np.array([[rnd.uniform(-1, 1) for _ in range(dim)] for _ in rel])
    unit = l2_normalise(vectors).astype(np.float64)
    sim = unit @ unit.T
    sim = (sim + sim.T) * 0.5
    # the pipeline's own selection with de-duplication off (nothing reaches an infinite threshold)
    picked = select(np.array(rel), sim, k, lambda_=lam, lengths=np.zeros(len(rel)), threshold=math.inf).picked
    got = list(picked)
    expected = reference_selection(rel, unit, k, lam, [0] * len(rel), threshold=math.inf)
    assert got == expected


def reference_full_selection(rel, sim, k, lam, lengths, dup, prefer, layout):
    """`select`'s whole `Selection`, every step's figures made from scratch: each available
    candidate's maximum similarity to the picks so far (the first pick at it), its MMR score
    `lam * rel - (1 - lam) * max_sim` as numpy computes it, the first of the largest; nothing
    carried from one step to the next. The grouping rules are the docstring's."""
    n = len(rel)
    available = [True] * n
    picked, redundant, replaced, promoted, containing = [], {}, {}, {}, set()

    def closest(j):
        m, src = -math.inf, -1
        for p in picked:
            if sim[p][j] > m:
                m, src = sim[p][j], p
        return m, src

    while len(picked) < k and any(available):
        open_ = [j for j in range(n) if available[j]]
        if not picked:
            values = {j: rel[j] for j in open_}
        elif layout == "diversity":
            values = {j: -sum(sim[p][j] for p in picked) for j in open_}
        else:
            values = {j: float(np.float64(lam) * rel[j] - (1.0 - lam) * closest(j)[0]) for j in open_}
        choice = max(open_, key=lambda j: (values[j], -j))
        members = sorted({choice, *(j for j in open_ if dup[choice][j])})
        contains = {m: sum(1 for o in members if prefer[m][o]) for m in members}
        keep = min(members, key=lambda m: (-contains[m], lengths[m], -rel[m], m))
        if picked:
            best = max(open_, key=lambda j: (rel[j], -j))
            if rel[best] > rel[choice] and best != keep and best not in members:
                promoted[keep] = (best, *closest(best), *closest(keep))
        if keep != choice:
            replaced[keep] = choice
            if prefer[keep][choice]:
                containing.add(keep)
        picked.append(keep)
        available[keep] = False
        for j in open_:
            if available[j] and (dup[keep][j] or (j == choice and keep != choice)):
                redundant[j] = keep
                available[j] = False
    return tuple(picked), redundant, replaced, promoted, frozenset(containing)


@settings(deadline=None, max_examples=400)
@given(
    st.integers(1, 14).flatmap(lambda n: st.tuples(
        st.lists(_score, min_size=n, max_size=n),
        # few directions: equal similarities to two picks, equal scores, as real lists of copies have
        st.lists(st.lists(st.integers(-1, 1), min_size=2, max_size=2), min_size=n, max_size=n),
        st.lists(st.integers(1, 4), min_size=n, max_size=n),
        st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))),
        st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))),
    )),
    st.integers(0, 15),
    st.one_of(st.sampled_from([0.0, 0.5, 0.7, 1.0]), st.floats(0.0, 1.0)),
    st.sampled_from(["mmr", "diversity", "lost_in_the_middle"]),
)
def test_selection_matches_a_from_scratch_reference(case, k, lam, layout):
    """Every field of `select`'s result (picks, duplicates, stand-ins, the numbers behind each MMR
    note) equals the from-scratch reference's, on lists with ties, duplicate groups and containment:
    the running figures `select` carries from step to step change nothing."""
    rel, raw, lengths, dup_pairs, prefer_pairs = case
    n = len(rel)
    unit = l2_normalise(np.array(raw, dtype=np.float64)).astype(np.float64)
    sim = unit @ unit.T
    sim = (sim + sim.T) * 0.5
    dup = np.zeros((n, n), dtype=bool)
    for i, j in dup_pairs:
        if i != j:
            dup[i, j] = dup[j, i] = True
    prefer = np.zeros((n, n), dtype=bool)
    for i, j in prefer_pairs:
        if dup[i, j] and not prefer[j, i]:
            prefer[i, j] = True
    got = select(np.array(rel), sim, k, lambda_=lam, lengths=np.array(lengths), threshold=math.inf,
                 layout=layout, duplicate=dup, prefer=prefer)
    want = reference_full_selection(rel, sim.tolist(), k, lam, lengths, dup.tolist(), prefer.tolist(), layout)
    assert (got.picked, got.redundant, got.replaced, got.promoted_over, got.containing) == want


# --------------------------------------------------------------------------- the accounting, plainly


def reference_items(request, scored, llm_dropped, sel, sim_all, rows, threshold, layout, word_budget):
    """`ranked` and `dropped` as the module docstring states them, written plainly from `select`'s
    own `Selection` (held to its reference above) and the similarities of the compared `rows`:
    each chunk's reason found by the rules in their order, each note by its cases, positions by
    searching lists, nothing carried from one chunk to the next."""
    chunks = request.chunks
    said = {r.id: r for r in scored}
    llm = {d.id: d.reason for d in llm_dropped}
    cand = [i for i, c in enumerate(chunks) if c.id in said and said[c.id].score > MIN_SCORE]
    rel = [said[chunks[i].id].score for i in cand]
    picked = list(sel.picked)
    over = []
    if word_budget is not None:
        used = 0
        for pos, j in enumerate(picked):
            used += len(chunks[cand[j]].text.split())
            if used >= word_budget:
                picked, over = picked[:pos + 1], picked[pos + 1:]
                break
    final = lost_in_the_middle(picked) if layout == "lost_in_the_middle" else picked
    by_rel = sorted(range(len(cand)), key=lambda j: (-rel[j], j))

    def name(j):
        return chunks[cand[j]].id

    ranked = []
    for pos, j in enumerate(final):
        sel_pos, rel_pos, notes = picked.index(j), by_rel.index(j), []
        if j in sel.replaced:
            other = sel.replaced[j]
            gone = f"{name(other)} (score {rel[other]:.2f})"
            notes.append(f"kept as it contains {gone}, dropped as redundant" if j in sel.containing
                         else f"kept as the more concise of near-duplicates; {gone} dropped as redundant")
        if j in sel.promoted_over:
            skipped, s, src, own, own_src = sel.promoted_over[j]
            closest = f"; closest chunk above it: {name(own_src)}, cosine {own:.2f}" if own_src >= 0 else ""
            via = f" with {name(src)}" if src >= 0 else ""
            notes.append(f"{'MMR' if layout != 'diversity' else 'diversity order'} placed this at rank "
                         f"{sel_pos + 1} (score {rel[j]:.2f}{closest}) ahead of {name(skipped)} "
                         f"(score {rel[skipped]:.2f}, cosine {s:.2f}{via})")
        if not notes and sel_pos > rel_pos and layout != "lost_in_the_middle":
            notes.append(f"demoted from relevance rank {rel_pos + 1} to {sel_pos + 1} for diversity")
        if layout == "lost_in_the_middle" and pos != sel_pos:
            notes.append(f"lost-in-the-middle layout: selection rank {sel_pos + 1} "
                         f"placed at position {pos + 1}")
        r = said[name(j)]
        ranked.append(Ranked(r.id, r.score, r.reason, "; ".join(notes) or r.diversity_note))

    ranked_at = sorted(cand[j] for j in final)
    kept_of = {cand[j]: cand[keep] for j, keep in sel.redundant.items()}
    index = {c.id: i for i, c in enumerate(chunks)}
    dropped = []
    for i, chunk in enumerate(chunks):
        if i in ranked_at:
            continue
        reason = llm.get(chunk.id)
        target = index.get(reason.removeprefix("redundant_with:")) if reason is not None else None
        if i in [cand[j] for j in over]:
            why = "over_word_budget"
        elif chunk.id in said and said[chunk.id].score <= MIN_SCORE:
            why = f"below_min_score: {said[chunk.id].score:.3f}"
        elif i in kept_of:
            why = f"redundant_with:{chunks[kept_of[i]].id}" if kept_of[i] in ranked_at else "not_selected"
        elif chunk.id in said:
            why = f"not_selected: {said[chunk.id].score:.3f}"
        elif reason is not None and not reason.startswith("redundant_with:"):
            why = normalise(reason)
        elif target is not None and target in ranked_at:
            why = reason
        elif target is not None and kept_of.get(target) in ranked_at:
            why = f"redundant_with:{chunks[kept_of[target]].id}"
        else:  # the closest ranked chunk it duplicates (the first of equals), else not selected
            same = [r for r in ranked_at if sim_all[rows.index(i)][rows.index(r)] >= threshold]
            if same:
                closest = max(same, key=lambda r: (sim_all[rows.index(i)][rows.index(r)], -r))
                why = f"redundant_with:{chunks[closest].id}"
            else:
                unjudged = "not_selected: the model neither ranked nor dropped it"
                why = unjudged if reason is None else "not_selected"
        dropped.append(Dropped(chunk.id, why))
    return tuple(ranked), tuple(dropped)


_LLM_REASON = st.one_of(st.sampled_from(["off topic", "below_min_score (0.1)", "not_selected: 0.410", "",
                                         "redundant_with:", "redundant_with:nobody"]),
                        st.text(max_size=12))


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.lists(st.one_of(_LLM_REASON, st.integers(0, 11)), min_size=12, max_size=12),
       st.sampled_from(LAYOUTS), st.one_of(st.none(), st.integers(1, 12)))
@example(case=(["a", "b", "c", "d"], [[1, 0], [1, 0], [0, 1], [1, 0]], ["w", "w w", "w", "w"],
               ["scored", "scored", "dropped", "silent"], [0.9, 0.8, 0.5, 0.5], 2, 0.7, 0.95),
         llm_reasons=[1, *[""] * 11], layout="mmr", word_budget=None)
def test_the_accounting_follows_the_plain_rules(case, llm_reasons, layout, word_budget):
    """Every ranked item (score, reason, note) and every dropped reason equal the plain reference's
    from the same selection, with notes of every kind, orphans (a chunk the model left out, or
    dropped as `redundant_with:` another), the model's reasons and a word budget: the one pass over
    the chunks, the ranked items built in one loop and the memoised number formats change nothing.
    (An integer in `llm_reasons` is `redundant_with:` the id at that place.)"""
    ids, vectors, texts, status, scores, top_k, lam, threshold = case
    request = _request(vectors, texts, top_k, lam, ids)
    rows_ = list(zip(ids, status, scores, strict=True))
    # integer scores (0 or 1) keep their type on this entry, as the caller's `Ranked` had them
    scored = [Ranked(i, int(s) if s in (0.0, 1.0) else s, f"cites {i}", "own note" if k % 3 == 0 else None)
              for k, (i, st_, s) in enumerate(rows_) if st_ == "scored"]
    dropped = [Dropped(i, f"redundant_with:{ids[r % len(ids)]}" if isinstance(r, int) else r)
               for (i, st_), r in zip(zip(ids, status, strict=True), llm_reasons[:len(ids)], strict=True)
               if st_ == "dropped"]
    seen = {}
    real_select, real_similarity = pp.select, pp._similarity

    def spy_select(*args, **kwargs):
        seen["sel"] = real_select(*args, **kwargs)
        return seen["sel"]

    def spy_similarity(vectors):
        seen.setdefault("sim", real_similarity(vectors))
        return seen["sim"]

    pp.select, pp._similarity = spy_select, spy_similarity
    try:
        result = postpass(request, scored, dropped, duplicate_threshold=threshold, min_score=MIN_SCORE,
                          layout=layout, word_budget=word_budget)
    finally:
        pp.select, pp._similarity = real_select, real_similarity
    if not ids:
        return
    score_of = {r.id: r.score for r in scored}
    llm = {d.id: d.reason for d in dropped}
    # the rows compared: the candidates, and the chunks left without a reason of their own
    rows = [i for i, c in enumerate(request.chunks)
            if (c.id in score_of and score_of[c.id] > MIN_SCORE)
            or (c.id not in score_of and llm.get(c.id, "redundant_with:").startswith("redundant_with:"))]
    want = reference_items(request, scored, dropped, seen["sel"], seen["sim"].tolist(), rows, threshold,
                           layout, word_budget)
    assert (result.ranked, result.dropped) == want
    assert [r.diversity_note for r in result.ranked] == [r.diversity_note for r in want[0]]
    assert [type(r.score) for r in result.ranked] == [type(r.score) for r in want[0]]


@settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from(LAYOUTS))
def test_the_guarded_entry_reads_the_answer_as_the_checked_entry_does(case, layout):
    """The engine's entry reads the answer's own items (a JSON 1 is the score 1.0; a note may be
    absent): its result equals the checked entry's on the same items made `Ranked` / `Dropped`."""
    ids, vectors, texts, status, scores, top_k, lam, threshold = case
    request = _request(vectors, texts, top_k, lam, ids)
    rows = enumerate(zip(ids, status, scores, strict=True))
    answer = {"ranked": [{"id": i, "score": int(s) if s in (0.0, 1.0) else s, "reason": f"cites {i}",
                          **({"diversity_note": "mine"} if k % 2 else {})}
                         for k, (i, st_, s) in rows if st_ == "scored"],
              "dropped": [{"id": i, "reason": "redundant_with:" + ids[0] if k % 2 else "off topic"}
                          for k, (i, st_) in enumerate(zip(ids, status, strict=True)) if st_ == "dropped"]}
    scored = [Ranked(r["id"], float(r["score"]), r["reason"], r.get("diversity_note"))
              for r in answer["ranked"]]
    dropped = [Dropped(d["id"], d["reason"]) for d in answer["dropped"]]
    settings_ = {"duplicate_threshold": threshold, "layout": layout, "min_score": MIN_SCORE}
    got = postpass_guarded(request, answer, **settings_)
    assert got == postpass(request, scored, dropped, **settings_)
    assert all(type(r.score) is float for r in got.ranked)


@settings(deadline=None, max_examples=300)
@given(st.integers(0, 7).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(0, 7), st.sets(st.tuples(st.integers(0, 6), st.integers(0, 6))),
    st.sampled_from(["C", "F", "T", "int", "float"]))))
@example((3, 3, {(0, 1), (2, 2)}, "F"))
def test_true_cells_are_nonzeros_cells(case):
    """`_true_cells` (a byte search) finds what `zip(*matrix.nonzero())` finds, row by row, whatever
    the matrix's layout or dtype."""
    n, m, cells, kind = case
    matrix = np.zeros((n, m), dtype=bool)
    for i, j in cells:
        if i < n and j < m:
            matrix[i, j] = True
    if kind == "F":
        matrix = np.asfortranarray(matrix)
    elif kind == "T":
        matrix = matrix.T
    elif kind in ("int", "float"):
        matrix = matrix.astype(int if kind == "int" else float) * 3
    assert pp._true_cells(matrix) == [(int(i), int(j)) for i, j in zip(*matrix.nonzero(), strict=True)]


@given(st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 0.005, 0.125, -0.125]))
def test_hundredths_is_the_two_decimal_format(x):
    """The memoised number format of the notes is `f"{x:.2f}"`, for -0.0 next to 0.0 too (one memo key)."""
    assert pp._hundredths(x) == f"{x:.2f}"
    assert pp._hundredths(-x) == f"{-x:.2f}"


@given(st.text() | st.sampled_from(["redundant_with:", "redundant_with:a", "not_selected: 0.41", "off"])
       | st.builds(lambda t: "redundant_with:" + t, st.text()))
def test_a_models_own_reason_stands_or_waits_for_the_ranking(reason):
    """`_standing` (memoised, one lookup per chunk the model dropped): the reason as `normalise`
    files it, or None for a `redundant_with:` reason, which the ranking decides."""
    want = None if reason.startswith("redundant_with:") else normalise(reason)
    assert pp._standing(reason) == want
    assert pp._standing(reason) == want  # from the memo


# --------------------------------------------------------------------------- edge cases


def test_empty_input():
    # the input guard refuses an empty list; the post-pass itself still answers an empty request cleanly
    with pytest.raises(InputError, match="no chunks"):
        validate_request("q", [], 5, 0.7)
    result = postpass(RerankRequest("q", (), 5, 0.7), [])
    assert result.ranked == () and result.dropped == ()


def test_top_k_larger_than_n_and_unscored_chunks():
    request = _request([[1, 0], [0, 1], [1, 1]], ["a", "b", "c"], 10, 0.7)
    result = postpass(request, [Ranked("id-0", 0.9, "a"), Ranked("id-1", 0.8, "b")], duplicate_threshold=0.99)
    assert [r.id for r in result.ranked] == ["id-0", "id-1"]
    unscored = "not_selected: the model neither ranked nor dropped it"
    assert [(d.id, d.reason) for d in result.dropped] == [("id-2", unscored)]


def test_all_scores_at_or_below_minimum():
    request = _request([[1, 0], [0, 1]], ["a", "b"], 3, 0.7)
    result = postpass(request, [Ranked("id-0", 0.2, "a"), Ranked("id-1", 0.05, "b")])
    assert result.ranked == ()
    assert [d.reason for d in result.dropped] == ["below_min_score: 0.200", "below_min_score: 0.050"]


def test_identical_texts_keep_one_and_name_it():
    text = "IVF partitions vectors into Voronoi cells; only nprobe lists are scanned per query."
    request = validate_request(
        "ivf",
        [
            {"id": "x", "text": text},
            {"id": "y", "text": text},
            {"id": "z", "text": "HNSW builds a proximity graph."},
        ],
        3,
        0.7,
    )
    result = postpass(
        request, [Ranked("y", 0.9, "nprobe"), Ranked("x", 0.8, "Voronoi"), Ranked("z", 0.5, "HNSW")]
    )
    assert [r.id for r in result.ranked] == ["y", "z"]  # same length: the more relevant copy stays
    assert ("x", "redundant_with:y") in [(d.id, d.reason) for d in result.dropped]


def test_the_container_is_kept_over_the_chunk_it_contains_with_a_note():
    """Issue 32: the chunk that says more is kept, however relevant the contained one is (it says
    nothing the container does not; dropping the container would lose its second sentence)."""
    short = "IVF is preferred when index memory is constrained or the corpus exceeds RAM."
    long = short + " Disk-resident indexes are then needed, as the FAISS wiki explains in detail."
    request = validate_request("ivf", [{"id": "long", "text": long}, {"id": "short", "text": short}], 2, 0.7)
    result = postpass(request, [Ranked("long", 0.6, "FAISS wiki"), Ranked("short", 0.95, "RAM")])
    assert [r.id for r in result.ranked] == ["long"]
    assert "kept as it contains short" in (result.ranked[0].diversity_note or "")
    assert [(d.id, d.reason) for d in result.dropped] == [("short", "redundant_with:long")]


def test_more_concise_copy_is_kept_with_a_note():
    """Two chunks that say the same (here a copy, spaced and punctuated differently): the more
    concise is kept, as the card asks, even when the other scored higher."""
    short = "IVF is preferred when index memory is constrained or the corpus exceeds RAM."
    wordy = "IVF  is preferred  --  when index memory is constrained, or the corpus exceeds RAM !!!"
    chunks = [{"id": "wordy", "text": wordy}, {"id": "short", "text": short}]
    request = validate_request("ivf", chunks, 2, 0.7)
    result = postpass(request, [Ranked("wordy", 0.95, "RAM"), Ranked("short", 0.6, "RAM")])
    assert [r.id for r in result.ranked] == ["short"]
    assert "more concise" in (result.ranked[0].diversity_note or "")
    assert [(d.id, d.reason) for d in result.dropped] == [("wordy", "redundant_with:short")]


def test_zero_vectors_are_never_duplicates():
    request = _request([[0, 0], [0, 0], [0, 0]], ["a", "b", "c"], 3, 0.5)
    result = postpass(request, [Ranked("id-0", 0.5, "a"), Ranked("id-1", 0.9, "b"), Ranked("id-2", 0.7, "c")])
    assert [r.id for r in result.ranked] == ["id-1", "id-2", "id-0"]


def test_nan_in_caller_vectors_is_an_input_error():
    chunks = (Chunk("a", "x", embedding=(0.1, float("nan"))), Chunk("b", "y", embedding=(0.3, 0.4)))
    request = RerankRequest("q", chunks, 2, 0.7)
    with pytest.raises(InputError) as exc:
        postpass(request, [Ranked("a", 0.9, "x")])
    assert "chunks[0].embedding" in str(exc.value) and "'a'" in str(exc.value)
    with pytest.raises(InputError):
        validate_request("q", [{"id": "a", "text": "x", "embedding": [0.1, float("nan")]}])


def test_mixed_or_mismatched_vectors_are_input_errors():
    some = RerankRequest("q", (Chunk("a", "x", embedding=(1.0, 0.0)), Chunk("b", "y")), 2, 0.7)
    with pytest.raises(InputError, match="'b'"):
        postpass(some, [Ranked("a", 0.9, "x")])
    dims = RerankRequest(
        "q", (Chunk("a", "x", embedding=(1.0, 0.0)), Chunk("b", "y", embedding=(1.0,))), 2, 0.7
    )
    with pytest.raises(InputError, match="different dimensions"):
        postpass(dims, [Ranked("a", 0.9, "x")])
    ok = _request([[1, 0], [0, 1]], ["a", "b"], 2, 0.7)
    with pytest.raises(InputError, match="query vector has 3 dimensions"):
        postpass(ok, [Ranked("id-0", 0.9, "a")], layout="diversity", query_vector=[1, 0, 0])


def test_lambda_zero_maximises_diversity():
    # id-1 is almost id-0; id-2 is orthogonal but least relevant
    request = _request([[1, 0], [0.99, 0.14], [0, 1]], ["a", "b", "c"], 2, 0.0)
    scored = [Ranked("id-0", 0.9, "a"), Ranked("id-1", 0.85, "b"), Ranked("id-2", 0.3, "c")]
    assert [r.id for r in postpass(request, scored, duplicate_threshold=2.0).ranked] == ["id-0", "id-2"]
    one = postpass(
        _request([[1, 0], [0.99, 0.14], [0, 1]], ["a", "b", "c"], 2, 1.0), scored, duplicate_threshold=2.0
    )
    assert [r.id for r in one.ranked] == ["id-0", "id-1"]
    assert one.ranked[1].diversity_note is None


def test_mmr_note_names_the_demoted_chunk():
    request = _request([[1, 0], [0.99, 0.14], [0, 1]], ["a", "b", "c"], 2, 0.5)
    scored = [Ranked("id-0", 0.9, "a"), Ranked("id-1", 0.85, "b"), Ranked("id-2", 0.6, "c")]
    result = postpass(request, scored, duplicate_threshold=2.0)
    assert [r.id for r in result.ranked] == ["id-0", "id-2"]
    assert "id-1" in (result.ranked[1].diversity_note or "")
    assert ("id-1", "not_selected: 0.850") in [(d.id, d.reason) for d in result.dropped]


def test_llm_redundant_with_is_repointed_or_downgraded():
    text = "IVF partitions vectors into Voronoi cells; only nprobe lists are scanned per query."
    request = validate_request(
        "ivf",
        [
            {"id": "a", "text": text},
            {"id": "b", "text": text[:-1] + " !!!"},  # a copy of a, less concise
            {"id": "c", "text": "Risotto needs stirring."},
            {"id": "d", "text": "HNSW is a graph index."},
        ],
        1,
        0.7,
    )
    scored = [Ranked("b", 0.9, "Voronoi"), Ranked("a", 0.8, "Voronoi"), Ranked("d", 0.7, "graph")]
    dropped = [Dropped("c", "redundant_with:b")]
    result = postpass(request, scored, dropped)
    assert [r.id for r in result.ranked] == ["a"]
    reasons = {d.id: d.reason for d in result.dropped}
    assert reasons == {"b": "redundant_with:a", "c": "redundant_with:a", "d": "not_selected: 0.700"}
    dropped = [Dropped("c", "redundant_with:d")]
    assert {d.id: d.reason for d in postpass(request, scored, dropped).dropped}["c"] == "not_selected"


_GUARDED_TEXTS = [
    "IVF partitions vectors into Voronoi cells; only nprobe lists are scanned per query.",
    "IVF partitions vectors into Voronoi cells; only nprobe lists are scanned per query !!!",
    "Risotto needs stirring.",
    "HNSW is a graph index.",
    "HNSW is a graph index with layers of links, searched greedily from the top layer.",
    "Product quantisation splits each vector into sub-vectors and codes each one.",
]


def _item(cid, score, reason, note=None):
    return {"id": cid, "score": score, "reason": reason, **({"diversity_note": note} if note else {})}


@pytest.mark.parametrize("layout", ["mmr", "diversity", "lost_in_the_middle"])
@pytest.mark.parametrize("threshold", [None, 0.6])
@pytest.mark.parametrize(
    "answer",
    [
        {"ranked": [_item("1", 0.9, "Voronoi", "kept"), _item("0", 0.8, "Voronoi"), _item("3", 0.7, "graph"),
                    _item("4", 0.6, "layers"), _item("5", 0.1, "codes")],
         "dropped": [{"id": "2", "reason": "redundant_with:1"}]},
        {"ranked": [_item("4", 1, "layers"), _item("3", 0.5, "graph")],
         "dropped": [{"id": "2", "reason": "off topic"}, {"id": "0", "reason": "below_min_score: 0.100"}]},
        {"ranked": [_item("5", 0.0, "codes")]},
    ],
)
def test_guarded_entry_gives_the_checked_entrys_result(answer, threshold, layout):
    # The engine's call reads the guarded answer as it is; any other caller's goes through the checks.
    records = [{"id": str(i), "text": t} for i, t in enumerate(_GUARDED_TEXTS)]
    request = validate_request("vector index", records, 2, 0.5)
    scored = [Ranked(r["id"], float(r["score"]), r["reason"], r.get("diversity_note"))
              for r in answer["ranked"]]
    dropped = [Dropped(d["id"], d["reason"]) for d in answer.get("dropped", ())]
    settings_ = {"duplicate_threshold": threshold, "layout": layout, "min_score": 0.2}
    checked = postpass(request, scored, dropped, **settings_)
    assert postpass_guarded(request, answer, **settings_) == checked
    assert {r.id for r in checked.ranked} | {d.id for d in checked.dropped} == {str(i) for i in range(6)}


def test_lost_in_the_middle_order():
    assert lost_in_the_middle(range(1, 11)) == [1, 3, 5, 7, 9, 10, 8, 6, 4, 2]
    assert lost_in_the_middle(range(1, 10)) == [1, 3, 5, 7, 9, 8, 6, 4, 2]
    assert lost_in_the_middle([]) == []
    vectors = np.eye(10).tolist()
    request = _request(vectors, ["w"] * 10, 10, 0.7)
    scored = [Ranked(f"id-{k}", 1.0 - k * 0.05, "r") for k in range(10)]
    result = postpass(request, scored, layout="lost_in_the_middle")
    assert [r.id for r in result.ranked] == [f"id-{k - 1}" for k in (1, 3, 5, 7, 9, 10, 8, 6, 4, 2)]


def test_word_budget_keeps_the_chunk_that_crosses_it():
    request = _request(np.eye(4).tolist(), ["one two three", "four five", "six seven eight", "nine"], 4, 0.7)
    scored = [Ranked(f"id-{k}", 0.9 - k * 0.1, "r") for k in range(4)]
    result = postpass(request, scored, word_budget=4)
    assert [r.id for r in result.ranked] == ["id-0", "id-1"]  # 3 words, then 5 >= 4: keep it, stop
    assert {d.id: d.reason for d in result.dropped} == {
        "id-2": "over_word_budget",
        "id-3": "over_word_budget",
    }


def test_diversity_layout_opens_with_the_closest_to_the_query():
    request = validate_request(
        "voronoi cells nprobe",
        [
            {"id": "hnsw", "text": "HNSW builds a hierarchical proximity graph."},
            {"id": "ivf", "text": "IVF partitions vectors into Voronoi cells; nprobe cells are scanned."},
            {"id": "ivf2", "text": "IVF scans nprobe Voronoi cells of the partitioned vectors per query."},
            {"id": "pq", "text": "Product quantisation compresses vectors into short codes."},
        ],
        3,
        0.7,
    )
    scored = [
        Ranked("hnsw", 0.9, "graph"),
        Ranked("ivf", 0.5, "Voronoi"),
        Ranked("ivf2", 0.5, "Voronoi"),
        Ranked("pq", 0.4, "codes"),
    ]
    result = postpass(request, scored, layout="diversity", duplicate_threshold=2.0)
    assert result.ranked[0].id in ("ivf", "ivf2")
    assert result.ranked[1].id in ("hnsw", "pq")  # then away from the opener, not its near twin


def test_bad_arguments_are_input_errors_naming_them():
    request = _request([[1, 0]], ["a"], 1, 0.7)
    with pytest.raises(InputError) as exc:
        postpass(
            request,
            [Ranked("nope", 0.9, "a"), Ranked("id-0", float("nan"), "a")],
            layout="zigzag",
            word_budget=0,
        )
    text = str(exc.value)
    for part in ("'nope' is not an input id", "scored[1].score", "layout", "word_budget"):
        assert part in text


def test_diversity_layout_with_caller_vectors_and_a_query_vector():
    vectors = [[1, 0, 0], [0.9, 0.1, 0], [0, 1, 0], [0, 0, 1]]
    request = _request(vectors, ["a", "b", "c", "d"], 3, 0.7)
    scored = [Ranked(f"id-{k}", s, "r") for k, s in enumerate([0.9, 0.8, 0.7, 0.6])]
    result = postpass(request, scored, layout="diversity", query_vector=[0, 0, 2], duplicate_threshold=2.0)
    # closest to the query first (the least relevant chunk), then least similar on average to the picks
    assert [r.id for r in result.ranked] == ["id-3", "id-0", "id-2"]
    no_query = postpass(request, scored, layout="diversity", duplicate_threshold=2.0)
    assert no_query.ranked[0].id == "id-0" and any("without a query vector" in n for n in no_query.meta.notes)


# --------------------------------------------------------------------------- who decides duplicates


class _TopicEmbedder:
    """A caller's own embedder that maps every text mentioning 'IVF' to one direction.

    Semantic embedders behave like this on passages that agree: high cosine, different words.
    """

    name = "topic"
    duplicate_threshold = 0.9

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = [[1.0, 0.0] if "IVF" in t else [0.0, 1.0] for t in texts]
        return l2_normalise(np.array(rows))


def _ivf_request() -> RerankRequest:
    chunks = (
        Chunk(id="a", text="IVF partitions vectors into Voronoi cells and scans nprobe lists."),
        Chunk(id="b", text="IVF suits corpora that exceed RAM because indexes can live on disk."),
        Chunk(id="c", text="IVF partitions vectors into Voronoi cells and scans nprobe lists!"),
    )
    return RerankRequest(query="When is IVF better?", chunks=chunks, top_k=3, lambda_=0.7)


def _scored() -> list[Ranked]:
    return [Ranked("a", 0.9, "Voronoi cells"), Ranked("b", 0.8, "exceed RAM"), Ranked("c", 0.85, "Voronoi")]


def test_text_duplicates_by_default_whatever_embedder_drives_mmr() -> None:
    result = postpass(_ivf_request(), _scored(), embedder=_TopicEmbedder())
    # b agrees with a on topic (cosine 1.0 under this embedder) but says something else: kept.
    assert [r.id for r in result.ranked] == ["a", "b"]
    # c is a near-verbatim copy of a: dropped, pointing at the kept chunk.
    assert {d.id: d.reason for d in result.dropped} == {"c": "redundant_with:a"}


def test_embedding_duplicates_when_asked() -> None:
    result = postpass(_ivf_request(), _scored(), embedder=_TopicEmbedder(), duplicates_by="embedding")
    assert len(result.ranked) == 1
    assert {d.reason.split(":")[0] for d in result.dropped} == {"redundant_with"}
    assert len(result.dropped) == 2


def test_unknown_duplicates_by_is_an_input_error() -> None:
    with pytest.raises(InputError) as err:
        postpass(_ivf_request(), _scored(), duplicates_by="vibes")
    assert err.value.violations[0].path == "duplicates_by"


def test_each_diversity_note_describes_its_own_chunk():
    """Three chunks promoted over the same skipped one carried one identical note (issue 15)."""
    vectors = [[1, 0, 0, 0, 0], [0.9, 0.436, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0],
               [0, 0, 0.1, 0, 0.995]]
    request = _request(vectors, ["a", "b", "c", "d", "e"], 4, 0.5)
    scored = [Ranked("id-0", 0.9, "a"), Ranked("id-1", 0.85, "b"), Ranked("id-2", 0.6, "c"),
              Ranked("id-3", 0.55, "d"), Ranked("id-4", 0.5, "e")]
    result = postpass(request, scored, duplicate_threshold=0.99)
    assert [r.id for r in result.ranked] == ["id-0", "id-2", "id-3", "id-4"]
    notes = [r.diversity_note for r in result.ranked[1:]]
    assert all(n and "id-1" in n for n in notes), notes  # each was placed above the skipped id-1
    assert len(set(notes)) == 3, notes
    for r, note in zip(result.ranked[1:], notes, strict=True):
        assert f"score {r.score:.2f}" in note  # its own score, not only the skipped chunk's


# --------------------------------------------------------------------------- the threshold tie


class _HalfCosineEmbedder:
    """Vectors whose cosine is exactly 0.5 in binary floating point: (1,0,0,0) and (1,1,1,1)/2.

    Its own duplicate threshold is that very value, so the tie is the embedder's default case.
    """

    name = "half-cosine"
    duplicate_threshold = 0.5

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.array([[1.0, 0.0, 0.0, 0.0] if t.startswith("a") else [0.5, 0.5, 0.5, 0.5] for t in texts])


def test_cosine_exactly_at_the_threshold_is_a_duplicate() -> None:
    # "at or above the threshold": the tie is a near-duplicate, one ulp below it is not
    request = _request([[1, 0, 0, 0], [1, 1, 1, 1]], ["a a a", "b b b b"], 2, 0.7)
    scored = [Ranked("id-0", 0.9, "first"), Ranked("id-1", 0.8, "second")]
    vectors = np.array([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    assert float(vectors[0] @ vectors[1]) == 0.5  # the premise: no rounding anywhere

    tie = postpass(request, scored, duplicate_threshold=0.5)
    assert [r.id for r in tie.ranked] == ["id-0"]
    assert [(d.id, d.reason) for d in tie.dropped] == [("id-1", "redundant_with:id-0")]

    above = postpass(request, scored, duplicate_threshold=float(np.nextafter(0.5, 1.0)))
    assert [r.id for r in above.ranked] == ["id-0", "id-1"] and above.dropped == ()


def test_cosine_exactly_at_the_embedders_own_threshold_is_a_duplicate() -> None:
    chunks = (Chunk(id="x", text="a short one"), Chunk(id="y", text="b a somewhat longer one"))
    request = RerankRequest(query="q", chunks=chunks, top_k=2, lambda_=0.7)
    scored = [Ranked("x", 0.6, "r"), Ranked("y", 0.9, "r")]
    result = postpass(request, scored, embedder=_HalfCosineEmbedder(), duplicates_by="embedding")
    # y is picked first (more relevant); x ties with it at 0.5 and is the more concise: x stands in
    assert [r.id for r in result.ranked] == ["x"]
    assert [(d.id, d.reason) for d in result.dropped] == [("y", "redundant_with:x")]


def test_sibling_chunks_sharing_an_embedded_title_are_not_near_duplicates() -> None:
    """With `embed_meta_fields=["title"]` the post-pass sees each text with its title before it;
    three chunks of one document (one long title) must still be judged on their own texts, not
    dropped as `redundant_with:` one another, and the "more concise" choice reads the own text."""
    from rag_rerank import rerank
    from rag_rerank.fusion import with_embedded_meta

    title = "Approximate nearest neighbour indexes in FAISS: a practical guide to HNSW, IVF and PQ"
    chunks = [
        {"id": "p1", "meta": {"title": title},
         "text": "HNSW builds a layered proximity graph; search descends greedily from the top layer."},
        {"id": "p2", "meta": {"title": title},
         "text": "IVF clusters vectors with k-means and scans only the nprobe closest lists at query time."},
        {"id": "p3", "text": "Product quantization compresses vectors into short codes to cut memory use.",
         "meta": {"title": title}},
    ]
    view = with_embedded_meta(validate_request("how do HNSW and IVF indexes work", chunks, 3, 0.7), ["title"])
    scored = [Ranked("p1", 0.9, "cites the layered proximity graph"),
              Ranked("p2", 0.85, "cites nprobe lists"), Ranked("p3", 0.8, "cites short codes")]
    out = postpass(view, scored, [])
    assert out.ids == ["p1", "p2", "p3"] and out.dropped == ()
    both = rerank("how do HNSW and IVF indexes work", chunks, 3, embed_meta_fields=["title"])
    assert not [d for d in both.dropped if d.reason.startswith("redundant_with:")], both.dropped
    # the own texts are still compared: the same passage twice under two titles is one passage
    copies = [{"id": "a", "text": chunks[0]["text"], "meta": {"title": "Guide"}},
              {"id": "b", "text": chunks[0]["text"], "meta": {"title": "Another guide to graphs"}}]
    view = with_embedded_meta(validate_request("how does HNSW search", copies, 2, 0.7), ["title"])
    out = postpass(view, [Ranked("a", 0.9, "cites the graph"), Ranked("b", 0.85, "cites the graph")], [])
    assert out.ids == ["a"] and out.dropped[0].reason == "redundant_with:a"


# --------------------------------------------------------------------------- issue 37: blocked products


class _Recorded(np.ndarray):
    """An array that notes the shape of every matrix product asked of it (`_gram`'s BLAS calls)."""

    products: ClassVar[list[tuple[int, int, int, bool]]] = []

    def __matmul__(self, other: np.ndarray) -> np.ndarray:
        left, right = np.asarray(self), np.asarray(other)
        symmetric = bool(np.shares_memory(left, right)) and left.shape == right.shape[::-1]
        _Recorded.products.append((left.shape[0], left.shape[1], right.shape[1], symmetric))
        return left @ right


@pytest.mark.parametrize("dim", [16, 384, 4096])
def test_similarity_in_blocks_is_the_product_exactly_symmetric(dim: int) -> None:
    """`_similarity` sums symmetric products over slices of columns, or multiplies square blocks of
    rows for a long list: whatever the number of rows around either regime's edges, it is `v @ v.T`
    (within rounding: another summation order), exactly symmetric (MMR and the redundancy judgement
    read `sim[i, j]` from either side), and every product it asks of the BLAS is one the BLAS runs
    on the calling thread (OpenBLAS's bounds: m * n * k for a product, (n + 1) * n * k for x @ x.T)."""
    from rag_rerank import postpass as pp

    rng = np.random.default_rng(dim)
    side = max(1, int(np.sqrt(pp.SINGLE_THREAD_MNK // dim)))
    for n in sorted({1, 2, side - 1, side, side + 1, 2 * side + 3, 19, 20, 21, 50, 57, 58, 59, 60, 90}):
        v = rng.standard_normal((max(n, 1), dim))
        v = (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)
        sim = pp._similarity(v)
        assert sim.shape == (len(v), len(v)) and sim.dtype == np.float64
        assert np.array_equal(sim, sim.T)
        exact = v.astype(np.float64) @ v.astype(np.float64).T
        assert np.allclose(sim, exact, rtol=0, atol=1e-12)
        _Recorded.products = []
        pp._gram(v.astype(np.float64).view(_Recorded))
        assert _Recorded.products, n
        for m, k, p, symmetric in _Recorded.products:
            assert k <= dim
            if symmetric:
                assert (m + 1) * m * k <= pp.SINGLE_THREAD_SYRK, (n, m, k)
            else:
                assert m * p * k <= pp.SINGLE_THREAD_MNK, (n, m, k, p)
    assert pp._similarity(np.zeros((0, dim))).shape == (0, 0)


def test_cached_lexical_rows_give_the_same_similarities_as_fresh_ones() -> None:
    """A lexical row from the memo (`UNIT_ROWS`, kept sparse) is the row computed afresh: the
    similarity matrix of a list is the same bits whichever of its texts were seen before."""
    from rag_rerank import postpass as pp

    rng = np.random.default_rng(37)
    words = [f"w{i}" for i in range(300)]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 40)))) for _ in range(70)]
    texts += [texts[0], "", "w1"]  # a copy, an empty text, a one-word text
    for n in (1, 5, 20, 40, len(texts)):
        pp.UNIT_ROWS["lexical"].clear()
        rows = [int(i) for i in rng.choice(len(texts), size=min(n, len(texts)), replace=False)]
        fresh = pp._similarity(pp._embed_rows(pp._LEXICAL, texts, rows))
        pp.UNIT_ROWS["lexical"].clear()
        pp._embed_rows(pp._LEXICAL, texts, rows[: n // 2])
        for _ in ("half of them cached", "all cached"):
            assert pp._similarity(pp._embed_rows(pp._LEXICAL, texts, rows)).tobytes() == fresh.tobytes()
