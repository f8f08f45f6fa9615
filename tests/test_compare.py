"""`rag-rerank compare`: per-query metrics of two runs, the paired statistics, the gate, and every
kind of input it reads, on the real DL19 collection (BM25 top 100, 43 judged queries)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("ir_measures")

from rag_rerank.cli import main
from rag_rerank.compare import compare_runs, parse_gate, parse_metric
from rag_rerank.errors import InputError
from rag_rerank.judgments import read_qrels
from rag_rerank.runfiles import Run, run_from_orders
from tests.support.dl19 import DL19, write_candidates
from tests.support.shared_data import require


@pytest.fixture(scope="module")
def dl19(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(candidates JSONL of every judged query, the qrels, the BM25 TREC run)."""
    require(DL19 / "bm25-top100.json")
    cands = write_candidates(tmp_path_factory.mktemp("dl19") / "candidates.jsonl")
    return cands, DL19 / "qrels.txt", DL19 / "bm25.run"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_run_compared_with_itself_differs_by_zero_with_p_one_and_passes(dl19, capsys) -> None:
    _, qrels, bm25 = dl19
    code, out, err = run_cli(
        capsys, "compare", bm25, bm25, "--qrels", qrels, "--fail-if-worse", "nDCG@10:0", "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    for m in data["metrics"]:
        assert m["diff"] == 0 and m["ci"] == [0, 0] and m["p_value"] == 1 and m["p_holm"] == 1
        assert (m["wins"], m["losses"], m["ties"]) == (0, 0, 43) and m["moved"] == []
    assert data["gates"][0]["failed"] is False and data["gates"][0]["p_value"] == 1


def test_the_bm25_run_scores_as_eval_and_the_published_figure(dl19, capsys) -> None:
    cands, qrels, bm25 = dl19
    code, out, _ = run_cli(
        capsys, "compare", bm25, "input", "--candidates", cands, "--qrels", qrels, "--json"
    )
    assert code == 0
    ndcg = json.loads(out)["metrics"][0]
    # the TREC file and the candidates' order are the same BM25 ranking: 0.5058 (docs/eval.md)
    assert ndcg["metric"] == "nDCG@10" and ndcg["mean_a"] == pytest.approx(0.5058, abs=5e-5)
    assert ndcg["mean_b"] == pytest.approx(ndcg["mean_a"])


def test_the_known_dl19_regression_of_the_local_reranker_is_caught_and_named(dl19, capsys) -> None:
    # docs/compare.md: on DL19 the local backend at lambda 0.3 (diversity first: nDCG@10 0.4375) is worse
    # than BM25's order (0.5058)
    cands, qrels, _ = dl19

    def gate(a: str, b: str, margin: str, *extra: str) -> tuple[int, str, str]:
        return run_cli(capsys, "compare", a, b, "--candidates", cands, "--qrels", qrels,
                       "--fail-if-worse", f"nDCG@10:{margin}", "--no-progress", *extra)

    code, out, err = gate("input", "rerank:lambda=0.3", "0", "--rel-level", "2")
    assert code == 1, err
    assert "gate nDCG@10:0 FAILED" in out
    assert "B is worse than A on nDCG@10" in err and "1103812 (-0.472)" in err  # the query that lost most
    # The other way round (B = the BM25 order) nothing fails; with a margin wider than the loss, neither.
    code, _, err = gate("rerank:lambda=0.3", "input", "0", "--rel-level", "2")
    assert code == 0, err
    code, out, _ = gate("input", "rerank:lambda=0.3", "0.1", "--rel-level", "2")
    assert code == 0 and "gate nDCG@10:0.1 passed" in out


def test_a_batch_output_and_an_eval_resume_file_compare_as_the_same_rerank(dl19, tmp_path, capsys) -> None:
    cands, qrels, _ = dl19
    rows = [json.loads(line) for line in cands.read_text(encoding="utf-8").splitlines()][:12]
    small = tmp_path / "cands.jsonl"
    small.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    batch_in = tmp_path / "in.jsonl"
    batch_in.write_text(
        "".join(
            json.dumps({"query_id": r["qid"], "query": r["query"], "chunks": r["chunks"][:50], "top_k": 10})
            + "\n"
            for r in rows
        ),
        encoding="utf-8",
    )
    assert (
        main(["batch", "--input", str(batch_in), "--output", str(tmp_path / "out.jsonl"), "--no-progress"])
        == 0
    )
    resume = tmp_path / "resume.jsonl"
    assert (
        main(
            [
                "eval",
                "--candidates",
                str(small),
                "--qrels",
                str(qrels),
                "--resume",
                str(resume),
                "--no-progress",
                "--json",
            ]
        )
        == 0
    )
    capsys.readouterr()
    results = {}
    for name, spec in (("batch", tmp_path / "out.jsonl"), ("eval", resume), ("rerank", "rerank:")):
        code, out, err = run_cli(
            capsys, "compare", "input", spec, "--candidates", small, "--qrels", qrels, "--json"
        )
        assert code == 0, err
        results[name] = {m["metric"]: m["per_query"] for m in json.loads(out)["metrics"]}
    assert results["batch"] == results["eval"] == results["rerank"]
    assert len(results["batch"]["nDCG@10"]) == 12


def orders_run(label: str, orders: dict[str, list[str]], usage: dict | None = None) -> Run:
    run = run_from_orders(label, orders, "test")
    return Run(run.label, run.orders, run.format, usage=usage or {})


def tiny_qrels(tmp_path: Path) -> list:
    path = tmp_path / "qrels.txt"
    path.write_text(
        "".join(f"q{i} 0 d{i}_{j} {1 if j == 0 else 0}\n" for i in range(30) for j in range(3)),
        encoding="utf-8",
    )
    return read_qrels(path)


def test_wins_losses_ties_holm_and_the_queries_that_moved_most(tmp_path: Path) -> None:
    qrels = tiny_qrels(tmp_path)
    a = {f"q{i}": [f"d{i}_0", f"d{i}_1", f"d{i}_2"] for i in range(30)}  # the relevant one first everywhere
    b = {q: list(ids) for q, ids in a.items()}
    for i in range(10):  # B loses on q0..q9 (relevant one third), wins nowhere
        b[f"q{i}"] = [f"d{i}_1", f"d{i}_2", f"d{i}_0"]
    c = compare_runs(
        orders_run("A", a),
        orders_run("B", b),
        qrels,
        metrics=["nDCG@3", "MRR@10", "P@1"],
        gates=["MRR@10:0.1"],
    )
    mrr = c.metric("MRR@10")
    assert (mrr.wins, mrr.losses, mrr.ties) == (0, 10, 20)
    assert mrr.diff == pytest.approx(-10 * (1 - 1 / 3) / 30)
    assert mrr.ci[1] < 0 and mrr.p_value < 0.01
    assert [m.p_holm >= m.p_value for m in c.metrics] == [True] * 3
    assert [q for q, *_ in mrr.moved(3)] == ["q0", "q1", "q2"]
    gate = c.gates[0]
    assert gate.failed and len(gate.drivers) == 5 and all(d < 0 for *_, d in gate.drivers)


def test_cost_per_query_when_usage_is_known(tmp_path: Path) -> None:
    from rag_rerank.cost import Prices

    qrels = tiny_qrels(tmp_path)
    a = {f"q{i}": [f"d{i}_0"] for i in range(30)}
    usage = {f"q{i}": {"prompt_tokens": 1000 + 10 * i, "completion_tokens": 100} for i in range(30)}
    c = compare_runs(orders_run("A", a), orders_run("B", a, usage), qrels, prices=Prices(0.15, 0.60))
    assert "A" not in c.cost
    assert c.cost["B"]["prompt_tokens"] == pytest.approx(1145) and c.cost["B"]["completion_tokens"] == 100
    assert c.cost["B"]["cost"] == pytest.approx((1145 * 0.15 + 100 * 0.60) / 1e6)


def test_alpha_ndcg_with_subtopics(tmp_path: Path) -> None:
    pytest.importorskip("pyndeval")
    from rag_rerank.judgments import read_subtopics

    qrels = tiny_qrels(tmp_path)
    subs = tmp_path / "subtopics.txt"
    subs.write_text("".join(f"q{i} {s} d{i}_{s} 1\n" for i in range(30) for s in range(2)), encoding="utf-8")
    a = {f"q{i}": [f"d{i}_0", f"d{i}_1", f"d{i}_2"] for i in range(30)}
    b = {f"q{i}": [f"d{i}_0", f"d{i}_2", f"d{i}_1"] for i in range(30)}  # the second subtopic comes later
    c = compare_runs(
        orders_run("A", a),
        orders_run("B", b),
        qrels,
        subtopics=read_subtopics(subs),
        metrics=["nDCG@10", "alpha-nDCG@3"],
    )
    alpha = c.metric("alpha-nDCG@3")
    assert alpha.losses == 30 and alpha.diff < 0 and len(alpha.qids) == 30
    with pytest.raises(InputError, match="needs subtopic judgments"):
        compare_runs(orders_run("A", a), orders_run("B", b), qrels, metrics=["alpha-nDCG@3"])


def test_queries_in_one_run_only_are_left_out_and_listed(tmp_path: Path) -> None:
    qrels = tiny_qrels(tmp_path)
    a = {f"q{i}": [f"d{i}_0"] for i in range(30)}
    b = {f"q{i}": [f"d{i}_0"] for i in range(25)}
    c = compare_runs(orders_run("A", a), orders_run("B", b), qrels)
    assert c.left_out == {"only in A": ("q25", "q26", "q27", "q28", "q29")}
    assert len(c.metrics[0].qids) == 25


def test_metric_names_and_gates() -> None:
    assert str(parse_metric("Recall@10", rel_level=2).measure) == "R(rel=2)@10"
    assert str(parse_metric("MRR@10").measure) == "RR@10"
    assert parse_metric("alpha-nDCG@10").subtopic and not parse_metric("AP").subtopic
    assert parse_gate("nDCG@10:0.01") == ("nDCG@10", 0.01)
    for bad in ("nDCG@10", "nDCG@10:-1", ":0.1", "nDCG@10:x"):
        with pytest.raises(InputError, match="METRIC:MARGIN"):
            parse_gate(bad)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--metric", "nDGC@10"], "--metric: unknown metric 'nDGC@10'"),
        (["--fail-if-worse", "nDCG@10"], "--fail-if-worse"),
        (["--alpha", "1.5"], "--alpha: alpha must be strictly between 0 and 1"),
        (["--resamples", "10"], "--resamples"),
    ],
)
def test_bad_options_are_exit_2_naming_the_flag(dl19, capsys, extra: list[str], needle: str) -> None:
    _, qrels, bm25 = dl19
    code, _, err = run_cli(capsys, "compare", bm25, bm25, "--qrels", qrels, *extra)
    assert code == 2 and needle in err, err


def test_bad_files_are_exit_2_naming_the_line_or_the_flag(dl19, tmp_path, capsys) -> None:
    _, qrels, bm25 = dl19
    bad = tmp_path / "bad.run"
    bad.write_text("264014 Q0 5611210 1 15.7 rank\n264014 Q0 6641238 2 rank\n", encoding="utf-8")
    code, _, err = run_cli(capsys, "compare", bm25, bad, "--qrels", qrels)
    assert code == 2 and "line 2" in err and str(bad) in err and "6 columns" in err, err
    code, _, err = run_cli(capsys, "compare", bm25, bm25, "--qrels", tmp_path / "missing.txt")
    assert code == 2 and "--qrels: no such file" in err, err
    code, _, err = run_cli(capsys, "compare", "input", bm25, "--qrels", qrels)
    assert code == 2 and "'input' needs --candidates" in err, err
    other = tmp_path / "other.qrels"
    other.write_text("x 0 y 1\n", encoding="utf-8")
    code, _, err = run_cli(capsys, "compare", bm25, bm25, "--qrels", other)
    assert code == 2 and "no query is in both runs and judged" in err, err


def test_the_table_says_what_it_shows(dl19, capsys) -> None:
    cands, qrels, bm25 = dl19
    code, out, _ = run_cli(
        capsys,
        "compare",
        bm25,
        "input",
        "--candidates",
        cands,
        "--qrels",
        qrels,
        "--metric",
        "nDCG@10",
        "--metric",
        "P@5",
        "--resamples",
        "1000",
    )
    assert code == 0
    assert out.splitlines()[2].split()[:4] == ["metric", "n", "A", "B"]
    assert "paired bootstrap (bca, 1000 resamples, seed 0)" in out and "Holm over 2 metrics" in out


def test_bad_options_are_named_before_any_rerank(dl19, capsys) -> None:
    # B's configuration is bad too (lambda 5): the rerank would stop on it, naming only lambda; the
    # metric and the grade are checked first, so they are what the user reads
    cands, qrels, _ = dl19
    both = ["compare", "input", "rerank:lambda=5", "--candidates", cands, "--qrels", qrels]
    code, _, err = run_cli(capsys, *both, "--metric", "nDCG@10", "--metric", "bogus@3", "--rel-level", "7")
    assert code == 2, err
    assert "--metric: unknown metric 'bogus@3'" in err and "--rel-level" in err
    assert "lambda" not in err
    code, _, err = run_cli(capsys, *both)
    assert code == 2 and "lambda must be" in err, err


def test_adding_a_metric_changes_no_other_metrics_interval_or_p_value(tmp_path: Path) -> None:
    qrels = tiny_qrels(tmp_path)
    a = {f"q{i}": [f"d{i}_0", f"d{i}_1", f"d{i}_2"] for i in range(30)}
    b = {f"q{i}": ([f"d{i}_1", f"d{i}_0", f"d{i}_2"] if i % 3 else a[f"q{i}"]) for i in range(30)}
    alone = compare_runs(orders_run("A", a), orders_run("B", b), qrels, metrics=["nDCG@3"]).metrics[0]
    more = compare_runs(orders_run("A", a), orders_run("B", b), qrels, metrics=["P@1", "nDCG@3", "MRR@10"])
    same = more.metric("nDCG@3")
    # equal to the last bits a matrix product of another width may sum in another order
    assert same.ci == pytest.approx(alone.ci, abs=1e-12) and same.p_value == pytest.approx(alone.p_value)
    assert same.p_holm >= alone.p_holm
