"""Calibration (`rag_rerank.calibration`, `rag-rerank calibrate`): the maps' fit and monotonicity,
ECE and Brier on known values, the file (a bad one is an `InputError` naming it), and the whole run
on the simulated judge's miscalibrated scores."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rag_rerank.calibration import (
    FORMAT,
    Calibration,
    Scored,
    apply,
    as_calibration,
    brier,
    calibrate,
    ece,
    fit,
    fit_judged,
    fit_platt,
    load,
    mismatch,
    pav,
    save,
    split_queries,
)
from rag_rerank.cli import main
from rag_rerank.errors import InputError
from tests.support.judged_set import simjudge, write_judged_set

sj = simjudge()


def synthetic(n_queries: int = 40, per_query: int = 25, seed: int = 0) -> list[Scored]:
    """Raw scores squashed into [0.6, 0.9] whose true probability of relevance is the unsquashed score."""
    rng = np.random.default_rng(seed)
    out = []
    for q in range(n_queries):
        for i in range(per_query):
            truth = float(rng.uniform())
            grade = int(rng.uniform() < truth)
            out.append(Scored(f"q{q}", f"d{i}", 0.6 + 0.3 * truth, grade))
    return out


# --------------------------------------------------------------------------- figures


def test_ece_and_brier_on_known_values() -> None:
    assert brier([1.0, 0.0], [1, 0]) == 0.0
    assert brier([0.5, 0.5], [1, 0]) == 0.25
    # a bin at 0.8 holding 80% relevant chunks is calibrated
    assert ece([0.8] * 10, [1] * 8 + [0] * 2) == pytest.approx(0.0)
    # all at 0.9, half relevant: one bin, gap 0.4
    assert ece([0.9] * 4, [1, 0, 1, 0]) == pytest.approx(0.4)
    # two bins weighted by size: 0.05 (2 of 4, gap 0.05) and 0.95 (2 of 4, gap 0.45)
    assert ece([0.05, 0.05, 0.95, 0.95], [0, 0, 1, 0]) == pytest.approx(0.5 * 0.05 + 0.5 * 0.45)
    assert ece([1.0], [1]) == 0.0  # 1.0 falls in the last bin
    assert math.isnan(ece([], []))


# --------------------------------------------------------------------------- maps


def test_pav_pools_adjacent_violators() -> None:
    knots, values = pav([0.1, 0.2, 0.3, 0.4, 0.5], [0, 1, 0, 1, 1])
    # (0.2, 0.3) pool to 0.5; then 0.4 and 0.5 (both 1) pool to 1
    assert list(knots) == pytest.approx([0.1, 0.25, 0.45])
    assert list(values) == pytest.approx([0.0, 0.5, 1.0])
    k2, v2 = pav([0.5, 0.5, 0.1], [1, 0, 0])  # equal scores pooled first
    assert list(k2) == pytest.approx([0.1, 0.5]) and list(v2) == pytest.approx([0.0, 0.5])


def test_isotonic_map_is_monotone_clipped_and_strict_between_knots() -> None:
    points = synthetic()
    cal = fit([p.score for p in points], [p.grade for p in points], "isotonic")
    grid = np.linspace(-1, 2, 601)
    out = apply(cal, grid)
    assert np.all(np.diff(out) >= 0) and out.min() >= 0 and out.max() <= 1
    inside = (grid > cal.knots[0]) & (grid < cal.knots[-1])
    assert np.all(np.diff(out[inside]) > 0)
    assert np.all(np.diff(cal.values) > 0)


def test_platt_recovers_a_sigmoid() -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, 20000)
    y = (rng.uniform(size=x.size) < 1 / (1 + np.exp(-(8 * x - 4)))).astype(float)
    a, b = fit_platt(x, y)
    assert a == pytest.approx(8, rel=0.1) and b == pytest.approx(-4, rel=0.1)
    cal = fit(x, y, "platt")
    out = apply(cal, np.linspace(0, 1, 50))
    assert np.all(np.diff(out) > 0) and out.min() >= 0 and out.max() <= 1


def test_platt_never_decreases_and_separable_data_stays_finite() -> None:
    a, b = fit_platt([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1])
    assert math.isfinite(a) and math.isfinite(b) and a > 0
    a, _ = fit_platt([0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0])  # scores that mean the opposite
    assert a == 0.0


def test_fit_on_part_measures_on_the_rest_and_halves_ece() -> None:
    cal = fit_judged(synthetic(), rel_level=1, fraction=0.5, seed=0, method="auto",
                     fitted_for={"backend": "openai", "model": "m"})
    test = cal.figures["test"]
    assert test["after"]["ece"] <= test["before"]["ece"] / 2
    assert test["after"]["brier"] < test["before"]["brier"]
    assert set(test["methods"]) == {"isotonic", "platt"}
    assert cal.method in ("isotonic", "platt") and cal.figures["choice"]["cv_brier"]
    assert not set(cal.split["fit"]) & set(cal.split["test"])
    assert len(cal.split["fit"]) == 20 and len(cal.split["test"]) == 20
    forced = fit_judged(synthetic(), method="isotonic")
    assert forced.method == "isotonic" and forced.figures["choice"]["by"] == "asked for"


def test_split_is_seeded() -> None:
    qids = [f"q{i}" for i in range(10)]
    assert split_queries(qids, 0.5, 3) == split_queries(qids, 0.5, 3)
    assert split_queries(qids, 0.5, 3) != split_queries(qids, 0.5, 4)
    fit_q, test_q = split_queries(qids, 0.99, 0)
    assert len(fit_q) == 9 and len(test_q) == 1


def test_fit_needs_both_kinds_of_judgement_and_two_queries() -> None:
    ones = [Scored(f"q{i}", "d", 0.5, 1) for i in range(4)]
    with pytest.raises(InputError, match="every judged chunk of the 2 fit queries is relevant"):
        fit_judged(ones)
    with pytest.raises(InputError, match="calibration needs at least 2"):
        fit_judged([Scored("q", "d", 0.5, 1)])
    with pytest.raises(InputError, match="split must be a fraction"):
        fit_judged(synthetic(), fraction=1.5)


# --------------------------------------------------------------------------- the file


def test_save_load_round_trip(tmp_path: Path) -> None:
    cal = fit_judged(synthetic(), fitted_for={"backend": "openai", "model": "m"})
    path = save(cal, tmp_path / "cal.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["format"] == FORMAT and data["version"] == 1 and data["fitted_for"]["model"] == "m"
    again = load(path)
    assert again == as_calibration(str(path)) == as_calibration(data)
    grid = np.linspace(0, 1, 21)
    assert np.allclose(apply(again, grid), apply(cal, grid)) and np.allclose(again(grid), cal(grid))


@pytest.mark.parametrize(("content", "message"), [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"format": "other"}', "not a rag-rerank calibration file"),
    (json.dumps({"format": FORMAT, "version": 9, "method": "platt", "map": {"a": 1, "b": 0}}),
     "version 9 is newer than this rag-rerank reads"),
    (json.dumps({"format": FORMAT, "version": 1, "method": "spline", "map": {}}), "'method' must be one of"),
    (json.dumps({"format": FORMAT, "version": 1, "method": "isotonic", "map": {"knots": [0.1, 0.2],
                                                                                "values": [0.5, 0.4]}}),
     "map.values must not decrease"),
    (json.dumps({"format": FORMAT, "version": 1, "method": "isotonic", "map": {"knots": [0.2, 0.1],
                                                                                "values": [0.1, 0.4]}}),
     "map.knots must be strictly increasing"),
    (json.dumps({"format": FORMAT, "version": 1, "method": "isotonic", "map": {"knots": [0.1],
                                                                                "values": [0.1, 0.4]}}),
     "differ in length"),
    (json.dumps({"format": FORMAT, "version": 1, "method": "platt", "map": {"a": -2, "b": 0}}),
     "map.a must be >= 0"),
    (json.dumps({"format": FORMAT, "version": 1, "method": "platt", "map": {"a": "x", "b": 0}}),
     "map.a must be a finite number"),
])
def test_a_bad_or_missing_file_is_an_input_error_naming_it(tmp_path: Path, content: str | None,
                                                           message: str) -> None:
    path = tmp_path / "calibration.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError) as info:
        load(path)
    (violation,) = info.value.violations
    assert violation.path == str(path) and message in violation.message
    assert str(path) in str(info.value)


def test_a_directory_or_a_wrong_type_is_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory"):
        load(tmp_path)
    with pytest.raises(InputError, match="calibration must be a Calibration"):
        as_calibration(3)


def test_mismatch_names_what_differs() -> None:
    cal = Calibration("platt", a=1.0, fitted_for={"backend": "openai", "model": "m1"})
    assert mismatch(cal, backend="openai", model="m1") is None
    assert mismatch(cal, backend="openai", model="m2") == ("calibration fitted for another setup: model 'm2' "
                                                           "(fitted for 'm1')")


# --------------------------------------------------------------------------- on the simulated judge


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_judged_set(tmp_path_factory.mktemp("cal"), queries=24, chunks=10)


def test_calibrate_on_squashed_scores_through_a_session(data) -> None:
    cands, qrels = data
    with sj.SimJudge.from_files(cands, qrels, sj.Knobs(squash=(0.6, 0.9), noise=0.1, seed=1)) as judge:
        run = calibrate(cands, qrels, rel_level=2, backend="openai", base_url=judge.openai_url, model="sim")
    cal = run.calibration
    test = cal.figures["test"]
    assert not run.failed and run.unscored == 0 and run.unjudged == 0
    assert test["chunks"] + cal.figures["fit"]["chunks"] == 24 * 10
    assert test["after"]["ece"] <= test["before"]["ece"] / 2
    assert cal.fitted_for["backend"] == "openai" and cal.fitted_for["model"] == "sim"
    assert cal.rel_level == 2


def test_cli_writes_the_file_and_prints_the_figures(data, tmp_path: Path, capsys) -> None:
    cands, qrels = data
    out = tmp_path / "sub" / "cal.json"
    with sj.SimJudge.from_files(cands, qrels, sj.Knobs(squash=(0.6, 0.9), noise=0.1, seed=1)) as judge:
        args = ["calibrate", "--candidates", str(cands), "--qrels", str(qrels), "-o", str(out), "--backend",
                "openai", "--base-url", judge.openai_url, "--model", "sim", "--rel-level", "2", "--seed", "5"]
        assert main(args) == 0
        table = capsys.readouterr().out
        assert main([*args, "--json", "--method", "platt"]) == 0
        printed = json.loads(capsys.readouterr().out)
    assert "held-out scores" in table and "raw" in table and f"written to {out}" in table
    assert printed["method"] == "platt" and printed["split"]["seed"] == 5
    assert load(out).method == "platt"


def test_cli_errors_name_the_flag(data, tmp_path: Path, capsys) -> None:
    cands, qrels = data
    out = str(tmp_path / "c.json")
    base = ["calibrate", "--candidates", str(cands), "--qrels", str(qrels), "-o", out]
    assert main([*base, "--split", "1"]) == 2
    assert "--split" in capsys.readouterr().err
    assert main(["calibrate", "--candidates", str(cands), "--qrels", str(qrels), "-o", out, "--rel-level",
                 "7"]) == 2
    assert "--rel-level: rel_level must be a grade from 1 to 3" in capsys.readouterr().err
    other = tmp_path / "other-qrels.txt"
    other.write_text("zz 0 d 1\n", encoding="utf-8")
    assert main(["calibrate", "--candidates", str(cands), "--qrels", str(other), "-o", out]) == 2
    assert "judge none of the 24 candidate queries" in capsys.readouterr().err
    assert main(["calibrate", "--candidates", str(cands), "--qrels", str(tmp_path / "none"), "-o", out]) == 2
    assert "--qrels: no such file" in capsys.readouterr().err
    assert not Path(out).exists()


def _two_queries(tmp_path: Path) -> tuple[Path, Path]:
    chunks = [{"id": "a", "text": "IVF partitions vectors into cells"},
              {"id": "b", "text": "HNSW builds a graph"}]
    cands = tmp_path / "cands.jsonl"
    cands.write_text("".join(json.dumps({"qid": q, "query": f"what is {q}", "chunks": chunks}) + "\n"
                             for q in ("ivf", "hnsw")), encoding="utf-8")
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("ivf 0 a 1\nivf 0 b 0\nhnsw 0 a 0\nhnsw 0 b 1\n", encoding="utf-8")
    return cands, qrels


@pytest.mark.parametrize("server", ["refuses", "resets"])
def test_cli_names_the_real_cause_of_a_connection_failure(tmp_path: Path, capsys, monkeypatch,
                                                          server: str) -> None:
    """A server that refuses or resets the connection (real sockets on 127.0.0.1): the cause, as
    batch and arerank report it, never an event-loop error from the HTTP pool's clean-up
    ("RuntimeError: no running event loop", "IndexError: pop from an empty deque")."""
    from tests.support.sockets import Resetter, closed_port

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    cands, qrels = _two_queries(tmp_path)
    out = tmp_path / "cal.json"
    with Resetter() as resetter:
        port = resetter.port if server == "resets" else closed_port()
        code = main(["calibrate", "--candidates", str(cands), "--qrels", str(qrels), "-o", str(out),
                     "--backend", "openai", "-m", "x", "--base-url", f"http://127.0.0.1:{port}/v1",
                     "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert "no running event loop" not in err and "empty deque" not in err
    if server == "resets":
        assert "Connection reset by peer" in err or "Server disconnected" in err, err
    else:
        assert f"connection refused at 127.0.0.1:{port}" in err, err
