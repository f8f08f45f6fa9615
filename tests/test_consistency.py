"""`consistency=k` and `calibration=` in the engine, against the simulated judge (a real HTTP
server on 127.0.0.1, `bench/simjudge.py`): seeded passes (same request, same result), agreement
falling as the judge's primacy bias grows, nDCG recovered by averaging over shuffles, k times the
calls in the plan and under budgets, each pass cached on its own; calibration applied monotonically
before the minimum score, named in meta, a bad file a ConfigError naming it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rag_rerank import Reranker, plan
from rag_rerank.calibration import Calibration, save
from rag_rerank.cli import main
from rag_rerank.engine import aggregate
from rag_rerank.errors import BudgetError, ConfigError, InputError
from rag_rerank.judgments import read_candidates, read_grades
from tests.support.judged_set import simjudge, write_judged_set

sj = simjudge()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_judged_set(tmp_path_factory.mktemp("consistency"), queries=8, chunks=12)


def _ndcg(order: list[str], grades: dict[str, int], k: int = 5) -> float:
    gains = [grades.get(i, 0) for i in order[:k]]
    dcg = sum((2 ** g - 1) / math.log2(r + 2) for r, g in enumerate(gains))
    ideal = sorted(grades.values(), reverse=True)[:k]
    idcg = sum((2 ** g - 1) / math.log2(r + 2) for r, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def _run(data: tuple[Path, Path], knobs: object, **options: object) -> list:
    cands, qrels = data
    with sj.SimJudge.from_files(cands, qrels, knobs) as judge, \
            Reranker(backend="openai", base_url=judge.openai_url, model="sim") as session:
        return [session.rerank(q.query, list(q.chunks), top_k=5, **options) for q in read_candidates(cands)]


def _mean_ndcg(data: tuple[Path, Path], results: list) -> float:
    grades = read_grades(data[1])
    qs = read_candidates(data[0])
    return sum(_ndcg(r.full_order(), grades[q.qid]) for q, r in zip(qs, results, strict=True)) / len(qs)


def test_same_request_same_passes_same_result(data) -> None:
    knobs = sj.Knobs(primacy=0.4, noise=0.05, seed=2)
    a = _run(data, knobs, consistency=3)
    b = _run(data, knobs, consistency=3)
    assert [r.to_json(scores=True) for r in a] == [r.to_json(scores=True) for r in b]
    meta = a[0].meta
    assert meta.consistency["passes"] == 3 and meta.calls == 3 and len(meta.consistency["taus"]) == 3
    assert meta.to_dict()["consistency"]["aggregate"] == "debiased_mean"
    assert meta.consistency["position_slope"] < 0  # a primacy bias: the first shown scored higher


def test_the_aggregation_takes_out_a_position_effect_linear_in_position() -> None:
    truth = [0.9, 0.6, 0.3, 0.1]
    orders = [[0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2]]  # orders[p][j]: where chunk j was shown
    where = [[pos / 3 for pos in order] for order in orders]
    primacy = [[t + 0.4 * (1 - x) for t, x in zip(truth, w, strict=True)] for w in where]
    scores, slope = aggregate(primacy, where, "debiased_mean")
    assert slope == pytest.approx(-0.4) and scores == pytest.approx(truth)
    recency = [[t + 0.3 * x for t, x in zip(truth, w, strict=True)] for w in where]
    scores, slope = aggregate(recency, where, "debiased_mean")
    assert slope == pytest.approx(0.3) and scores == pytest.approx(truth)
    means, none = aggregate(primacy, where, "mean_score")
    assert none is None and means == pytest.approx([sum(r[j] for r in primacy) / 3 for j in range(4)])
    flat, zero = aggregate([truth, truth], [[0, 0.5, 1, 0.25], [1, 0, 0.5, 0.75]], "debiased_mean")
    assert zero == pytest.approx(0.0) and flat == pytest.approx(truth)


def test_one_pass_is_the_plain_rerank(data) -> None:
    knobs = sj.Knobs(primacy=0.4, noise=0.05, seed=2)
    plain = _run(data, knobs)
    one = _run(data, knobs, consistency=1)
    assert [r.to_json(scores=True) for r in plain] == [r.to_json(scores=True) for r in one]
    assert "consistency" not in one[0].meta.to_dict() and "calibration" not in one[0].meta.to_dict()


def test_agreement_falls_as_the_primacy_bias_grows(data) -> None:
    def agreement(primacy: float) -> float:
        results = _run(data, sj.Knobs(primacy=primacy, noise=0.02, seed=1), consistency=3)
        return sum(r.meta.consistency["agreement"] for r in results) / len(results)

    a0, a3, a8 = agreement(0.0), agreement(0.3), agreement(0.8)
    assert a0 > a3 > a8
    assert a0 > 0.6  # noise alone reorders the equal-grade chunks


def test_consistency_recovers_ndcg_lost_to_a_primacy_bias(data) -> None:
    fair = _mean_ndcg(data, _run(data, sj.Knobs(noise=0.02, seed=1)))
    # Each query's candidates shown best-last: the primacy bias now favours the least relevant.
    cands, qrels = data
    grades = read_grades(qrels)
    worst_first = cands.parent / "worst_first.jsonl"
    lines = []
    for q in read_candidates(cands):
        chunks = sorted(q.chunks, key=lambda c: grades[q.qid].get(c["id"], 0))
        lines.append(json.dumps({"qid": q.qid, "query": q.query, "chunks": list(chunks)}))
    worst_first.write_text("\n".join(lines) + "\n", encoding="utf-8")
    flipped = (worst_first, qrels)
    knobs = sj.Knobs(primacy=1.0, noise=0.02, seed=1)
    biased = _mean_ndcg(flipped, _run(flipped, knobs))
    fixed = _mean_ndcg(flipped, _run(flipped, knobs, consistency=5))
    assert biased < fair - 0.1  # the bias costs
    assert fixed > biased + 0.5 * (fair - biased)  # five shuffled passes recover most of it


def test_consistency_is_checked() -> None:
    for bad in (0, -1, 2.5, True, "3", 21):
        with pytest.raises(InputError, match="consistency"):
            plan("q", [{"id": "a", "text": "a"}, {"id": "b", "text": "b"}], consistency=bad)


def test_the_plan_counts_every_pass_and_budgets_apply(data) -> None:
    chunks = list(read_candidates(data[0])[0].chunks)
    opts = {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "sim", "api_key": "x"}
    one = plan("what about it?", chunks, top_k=5, **opts)
    five = plan("what about it?", chunks, top_k=5, consistency=5, **opts)
    assert five.requests == 5 * one.requests and five.calls == 5 * one.calls
    assert five.prompt_tokens == pytest.approx(5 * one.prompt_tokens, rel=0.05)
    assert five.round_trips == 5 * one.round_trips
    windowed = plan("what about it?", chunks, top_k=3, window_size=5, consistency=2, **opts)
    assert windowed.calls == 2 * plan("what about it?", chunks, top_k=3, window_size=5, **opts).calls
    with Reranker(**opts) as session, pytest.raises(BudgetError):
        session.rerank("what about it?", chunks, top_k=5, consistency=5, budget={"max_calls": 3})


def test_each_pass_is_cached_on_its_own(data, tmp_path) -> None:
    cands, qrels = data
    q = read_candidates(cands)[0]
    with sj.SimJudge.from_files(cands, qrels, sj.Knobs(primacy=0.3, seed=1)) as judge:
        opts = {"backend": "openai", "base_url": judge.openai_url, "model": "sim", "cache": tmp_path / "c"}
        with Reranker(**opts) as session:
            first = session.rerank(q.query, list(q.chunks), top_k=5, consistency=3)
            again = session.rerank(q.query, list(q.chunks), top_k=5, consistency=3)
            plain = session.rerank(q.query, list(q.chunks), top_k=5)
            dry = session.plan(q.query, list(q.chunks), top_k=5, consistency=4)
    assert first.meta.cache == {"hits": 0, "misses": 3, "saved_tokens": 0}
    assert again.meta.cache["hits"] == 3 and again.meta.cache["misses"] == 0
    assert again.to_json(scores=True) == first.to_json(scores=True)
    assert plain.meta.cache["hits"] == 1  # the first pass is the given order: the plain call
    assert sum(e.cached for e in dry.estimates) == 3 and dry.requests == 1


def test_windows_per_window_in_every_pass(data) -> None:
    results = _run(data, sj.Knobs(primacy=0.3, seed=1), consistency=2, window_size=5)
    meta = results[0].meta
    assert {w["pass"] for w in meta.windows} == {0, 1}
    assert meta.calls == 2 * 4  # 12 chunks: three windows and a final pass, twice


# --------------------------------------------------------------------------- calibration


def _calibration_file(folder: Path) -> Path:
    # Squashed scores in [0.6, 0.9] mapped back out: below 0.7 irrelevant, above 0.8 relevant.
    cal = Calibration("isotonic", knots=(0.6, 0.7, 0.8, 0.9), values=(0.02, 0.1, 0.85, 0.97),
                      fitted_for={"backend": "openai", "model": "sim"})
    return save(cal, folder / "calibration.json")


def test_calibration_maps_scores_monotonically_and_is_named_in_meta(data, tmp_path) -> None:
    path = _calibration_file(tmp_path)
    knobs = sj.Knobs(squash=(0.6, 0.9), noise=0.02, seed=3)
    raw = _run(data, knobs, limits={"min_score": 0.0})
    cal = _run(data, knobs, calibration=str(path), limits={"min_score": 0.0})
    for r, c in zip(raw, cal, strict=True):
        assert c.meta.calibration == {"method": "isotonic", "file": str(path), "version": 1}
        rs = {k: v for k, v in r.scores.items() if isinstance(v, float)}
        cs = {k: v for k, v in c.scores.items() if isinstance(v, float)}
        assert rs.keys() == cs.keys() and rs != cs
        for a in rs:
            for b in rs:
                if rs[a] > rs[b] + 1e-3:
                    assert cs[a] >= cs[b] - 1e-3  # monotone: the backend's order stands
    # Squashed, every chunk clears the default minimum score; calibrated, the irrelevant ones do not.
    squashed = _run(data, knobs)
    calibrated = _run(data, knobs, calibration=path)
    assert sum(len(r.ranked) for r in calibrated) < sum(len(r.ranked) for r in squashed)
    assert any("below_min_score" in d.reason for r in calibrated for d in r.dropped)


def test_calibration_fitted_for_another_model_is_said(data, tmp_path) -> None:
    path = _calibration_file(tmp_path)
    cands, qrels = data
    q = read_candidates(cands)[0]
    with sj.SimJudge.from_files(cands, qrels, sj.Knobs(seed=3)) as judge, \
            Reranker(backend="openai", base_url=judge.openai_url, model="other") as session:
        r = session.rerank(q.query, list(q.chunks), top_k=5, calibration=path)
    assert "model 'other'" in r.meta.calibration["warning"]


@pytest.mark.parametrize("content", ["not json", json.dumps({"format": "x"}),
                                     json.dumps({"format": "rag-rerank-calibration", "version": 99})])
def test_a_bad_calibration_file_is_a_config_error_naming_it(tmp_path, content) -> None:
    bad = tmp_path / "bad-calibration.json"
    bad.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad-calibration\.json"):
        plan("q", [{"id": "a", "text": "a"}, {"id": "b", "text": "b"}], calibration=bad)
    with pytest.raises(ConfigError, match=r"missing\.json"):
        plan("q", [{"id": "a", "text": "a"}, {"id": "b", "text": "b"}], calibration=tmp_path / "missing.json")


def test_cli_calibration_and_consistency(data, tmp_path, capsys) -> None:
    path = _calibration_file(tmp_path)
    cands, qrels = data
    q = read_candidates(cands)[0]
    chunks = tmp_path / "chunks.json"
    chunks.write_text("".join(json.dumps(c) + "\n" for c in q.chunks), encoding="utf-8")
    with sj.SimJudge.from_files(cands, qrels, sj.Knobs(squash=(0.6, 0.9), seed=3)) as judge:
        base = ["rerank", "--query", q.query, "--chunks", str(chunks), "--top-k", "5", "--backend", "openai",
                "--base-url", judge.openai_url, "-m", "sim"]
        code = main([*base, "--meta", "--calibration", str(path), "--consistency", "2"])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        meta = json.loads(captured.err.strip().splitlines()[-1])
        assert meta["calibration"]["file"] == str(path) and meta["consistency"]["passes"] == 2
        (tmp_path / "broken.json").write_text("{", encoding="utf-8")
        code = main([*base, "--calibration", str(tmp_path / "broken.json")])
        err = capsys.readouterr().err
        assert code == 2 and "broken.json" in err
        code = main([*base, "--consistency", "3", "--dry-run"])
        out = capsys.readouterr().out
        assert code == 0 and "3" in out
