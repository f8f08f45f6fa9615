"""The bias meter (`rag_rerank.bias`, `rag-rerank bias`): Kendall tau-b on known orders, seeded
orders, reasons read for their scores, and the meter on the simulated judge with a known bias
(tau falls as the bias grows; the rank shift shows where)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rag_rerank.bias import (
    DECILES,
    average_ranks,
    kendall_tau,
    measure_bias,
    order_keys,
    shown_orders,
)
from rag_rerank.cli import main
from rag_rerank.errors import InputError
from rag_rerank.models import Dropped, Ranked, RerankResult
from tests.support.judged_set import simjudge, write_judged_set

sj = simjudge()


# --------------------------------------------------------------------------- Kendall tau


def test_kendall_tau_on_known_orders() -> None:
    assert kendall_tau([4, 3, 2, 1], [4, 3, 2, 1]) == 1.0
    assert kendall_tau([4, 3, 2, 1], [1, 2, 3, 4]) == -1.0
    # one adjacent swap among 4 items: 5 concordant, 1 discordant pairs of 6
    assert kendall_tau([4, 3, 2, 1], [4, 3, 1, 2]) == pytest.approx(4 / 6)
    # ties: tau-b = (C - D) / sqrt((n0 - n1)(n0 - n2)); x has one tied pair
    assert kendall_tau([3, 2, 2, 1], [4, 3, 2, 1]) == pytest.approx(5 / math.sqrt(5 * 6))
    assert math.isnan(kendall_tau([1, 1, 1], [3, 2, 1]))  # no order to compare
    assert math.isnan(kendall_tau([1], [1]))
    with pytest.raises(ValueError):
        kendall_tau([1, 2], [1, 2, 3])


def test_kendall_tau_matches_scipy_with_ties() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(5)
    for _ in range(20):
        x = rng.integers(0, 5, size=15).astype(float)
        y = rng.integers(0, 5, size=15).astype(float)
        assert kendall_tau(x, y) == pytest.approx(stats.kendalltau(x, y).statistic)


def test_average_ranks_share_ties() -> None:
    assert list(average_ranks([0.9, 0.5, 0.5, 0.1])) == [1.0, 2.5, 2.5, 4.0]


def test_shown_orders_are_seeded_permutations() -> None:
    ids = [f"d{i}" for i in range(12)]
    a = shown_orders(ids, 3, "q1")
    assert a == shown_orders(ids, 3, "q1")
    assert a["given"] == ids and a["reversed"] == ids[::-1] and sorted(a["shuffled"]) == sorted(ids)
    assert a["shuffled"] != shown_orders(ids, 4, "q1")["shuffled"]
    assert a["shuffled"] != shown_orders(ids, 3, "q2")["shuffled"]


def test_scores_are_read_from_ranked_and_dropped_reasons() -> None:
    result = RerankResult((Ranked("a", 0.8, "r"), Ranked("b", 0.8, "r")),
                          (Dropped("c", "not_selected: 0.410"), Dropped("d", "redundant_with:a")))
    assert list(order_keys(result, ["a", "b", "c", "d"])) == [0.8, 0.8, 0.41, -1.0]
    # a result with `scores` (every engine result) is read from them: a window's loser included
    with_scores = RerankResult(result.ranked, result.dropped, scores={"a": 0.8, "b": 0.8, "c": 0.33,
                                                                      "d": "not scored"})
    assert list(order_keys(with_scores, ["a", "b", "c", "d"])) == [0.8, 0.8, 0.33, -1.0]


# --------------------------------------------------------------------------- the meter on the judge


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_judged_set(tmp_path_factory.mktemp("bias"), queries=8, chunks=10)


def _measure(data: tuple[Path, Path], knobs: object, **kw: object):
    cands, qrels = data
    with sj.SimJudge.from_files(cands, qrels, knobs) as judge:
        return measure_bias(cands, backend="openai", base_url=judge.openai_url, model="sim", **kw)


def test_an_unbiased_noiseless_judge_is_perfectly_consistent(data) -> None:
    report = _measure(data, sj.Knobs())
    assert report.tau_mean == pytest.approx(1.0)
    assert all(v == pytest.approx(1.0) for v in report.tau_by_pair.values())
    assert report.shift_by_decile == pytest.approx([0.0] * DECILES)
    assert not report.failed and len(report.queries) == 8


def test_tau_falls_as_the_primacy_bias_grows(data) -> None:
    taus = [_measure(data, sj.Knobs(primacy=p, noise=0.05, seed=1)).tau_mean for p in (0.0, 0.2, 0.6)]
    assert taus[0] > taus[1] > taus[2]


def test_the_rank_shift_shows_where_the_bias_points(data) -> None:
    primacy = _measure(data, sj.Knobs(primacy=0.5, seed=1)).shift_by_decile
    recency = _measure(data, sj.Knobs(recency=0.5, seed=1)).shift_by_decile
    assert primacy[0] > 0 > primacy[-1]
    assert recency[-1] > 0 > recency[0]
    given_reversed = _measure(data, sj.Knobs(primacy=0.5, seed=1)).tau_by_pair["given~reversed"]
    assert given_reversed < 0.5  # the two orders that disagree most about who comes first


def test_pointwise_logprob_scoring_has_no_position_to_favour(data) -> None:
    report = _measure(data, sj.Knobs(primacy=0.6, noise=0.05, seed=1),
                      backend_options={"scoring": "logprobs"})
    assert report.tau_mean == pytest.approx(1.0)


def test_same_seed_same_report(data) -> None:
    a = _measure(data, sj.Knobs(primacy=0.3, noise=0.1, seed=2), seed=7).to_dict()
    b = _measure(data, sj.Knobs(primacy=0.3, noise=0.1, seed=2), seed=7).to_dict()
    for d in (a, b):
        d["info"].pop("wall_s")
    assert a == b


def test_depth_and_top_k_are_checked(data) -> None:
    with pytest.raises(InputError, match="depth must be a whole number from 1 to 50"):
        measure_bias(data[0], depth=51)
    with pytest.raises(InputError, match="top_k must be a whole number of at least 2"):
        measure_bias(data[0], top_k=1)


def test_the_local_backend_can_be_measured(data) -> None:
    report = measure_bias(data[0], depth=6)
    assert report.config["backend"] == "local" and report.config["depth"] == 6
    assert all(-1.0 <= t <= 1.0 for t in report.tau_by_pair.values())


# --------------------------------------------------------------------------- the command


def test_cli_prints_a_table_or_json(data, capsys) -> None:
    cands, qrels = data
    with sj.SimJudge.from_files(cands, qrels, sj.Knobs(primacy=0.4, seed=1)) as judge:
        base = ["bias", "--candidates", str(cands), "--backend", "openai", "--base-url", judge.openai_url,
                "--model", "sim", "--seed", "3"]
        assert main([*base, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert main(base) == 0
        table = capsys.readouterr().out
    assert set(out) == {"kendall_tau", "rank_shift_by_decile", "rank_shift_band", "per_query", "info"}
    assert set(out["kendall_tau"]) == {"mean", "given~reversed", "given~shuffled", "reversed~shuffled"}
    assert len(out["rank_shift_by_decile"]) == DECILES and out["info"]["measured"] == 8
    assert "given~reversed" in table and "0-10%" in table and "8 queries measured" in table


def test_cli_bad_input_is_one_line_and_exit_2(data, capsys, tmp_path) -> None:
    assert main(["bias", "--candidates", str(tmp_path / "nope.jsonl")]) == 2
    assert "--candidates: no such file" in capsys.readouterr().err
    assert main(["bias", "--candidates", str(data[0]), "--depth", "60"]) == 2
    err = capsys.readouterr().err
    assert "--depth" in err and len(err.strip().splitlines()) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"qid": "q1"}\n', encoding="utf-8")
    assert main(["bias", "--candidates", str(bad)]) == 2
    assert "line 1" in capsys.readouterr().err


def test_cli_backend_failure_is_exit_3(data, capsys) -> None:
    from tests.support.fake_llm import FakeLLM, Reply

    with FakeLLM(handler=lambda req: Reply.openai_error(401, "bad key", type_="invalid_api_key")) as srv:
        code = main(["bias", "--candidates", str(data[0]), "--backend", "openai", "--base-url",
                     srv.openai_url, "--model", "m", "--depth", "4"])
    assert code == 3
    assert "not measured" in capsys.readouterr().err
