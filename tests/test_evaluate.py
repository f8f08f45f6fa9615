"""`rag-rerank eval` on a real slice of TREC DL19, checked against metrics computed by hand here."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

pytest.importorskip("ir_measures")

from rag_rerank import rerank
from rag_rerank.cli import main
from rag_rerank.errors import InputError
from rag_rerank.evaluate import evaluate, rerank_queries
from rag_rerank.judgments import read_candidates
from rag_rerank.metrics import reranked_order
from tests.support.shared_data import data_dir, require

DATA = data_dir()
DL19 = DATA / "trec-dl19"
QIDS = ("1037798", "1129237", "183378")  # three judged queries with relevant passages in their top 20
DEPTH = 20


@pytest.fixture(scope="module")
def dl19_slice(tmp_path_factory):
    require(DL19 / "bm25-top100.json")
    out = tmp_path_factory.mktemp("dl19")
    rows = []
    for item in json.loads((DL19 / "bm25-top100.json").read_text(encoding="utf-8")):
        hits = sorted(item["hits"], key=lambda h: h["rank"])
        qid = str(hits[0]["qid"])
        if qid in QIDS:
            rows.append({"qid": qid, "query": item["query"],
                         "chunks": [{"id": h["docid"], "text": h["content"]} for h in hits[:DEPTH]]})
    assert len(rows) == len(QIDS)
    cands = out / "candidates.jsonl"
    cands.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    qrels_lines = [line for line in (DL19 / "qrels.txt").read_text().splitlines() if line.split()[0] in QIDS]
    qrels = out / "qrels.txt"
    qrels.write_text("\n".join(qrels_lines) + "\n", encoding="utf-8")
    judged = {}
    for line in qrels_lines:
        qid, _, doc, rel = line.split()
        judged.setdefault(qid, {})[doc] = int(rel)
    return rows, cands, qrels, judged


def _ndcg10(order, rels):
    """trec_eval's nDCG@10: linear gain, log2 discount, ideal over every judged grade of the query."""
    dcg = sum(rels.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(order[:10]))
    ideal = sorted((r for r in rels.values() if r > 0), reverse=True)[:10]
    return dcg / sum(r / math.log2(i + 2) for i, r in enumerate(ideal))


def _rr10(order, rels, level):
    return next((1.0 / (i + 1) for i, doc in enumerate(order[:10]) if rels.get(doc, 0) >= level), 0.0)


def _recall(order, rels, k, level):
    relevant = {d for d, r in rels.items() if r >= level}
    return len(relevant & set(order[:k])) / len(relevant)


def _mean(values):
    values = list(values)
    return sum(values) / len(values)


def test_input_order_metrics_match_a_hand_computation(dl19_slice):
    rows, cands, qrels, judged = dl19_slice
    report = evaluate(cands, qrels, k=10, lambda_=1.0, concurrency=2, rel_level=2)
    orders = {r["qid"]: [c["id"] for c in r["chunks"]] for r in rows}
    ndcg = _mean(_ndcg10(o, judged[q]) for q, o in orders.items())
    assert report.input["nDCG@10"] == pytest.approx(ndcg, abs=1e-9)
    assert report.input["MRR@10"] == pytest.approx(_mean(_rr10(o, judged[q], 2) for q, o in orders.items()),
                                                   abs=1e-9)
    assert report.input["Recall@10"] == pytest.approx(
        _mean(_recall(o, judged[q], 10, 2) for q, o in orders.items()), abs=1e-9)


def test_reranked_metrics_are_those_of_the_pipeline_order(dl19_slice):
    rows, cands, qrels, judged = dl19_slice
    report = evaluate(cands, qrels, k=5, lambda_=0.7, concurrency=2)
    expected = []
    for r in rows:
        ids = [c["id"] for c in r["chunks"]]
        result = rerank(r["query"], r["chunks"], 5, 0.7)
        order = reranked_order(ids, result.ids)
        assert sorted(order) == sorted(ids)
        expected.append(_ndcg10(order, judged[r["qid"]]))
    assert report.reranked["nDCG@10"] == pytest.approx(_mean(expected), abs=1e-9)
    assert report.failed == {}
    assert 0.0 < report.reranked["distance@5"] <= 2.0


def test_reranked_order_keeps_every_candidate_once():
    assert reranked_order(["a", "b", "c", "d"], ["c", "a"]) == ["c", "a", "b", "d"]
    assert reranked_order(["a", "b"], []) == ["a", "b"]


def test_depth_limits_what_is_reranked(dl19_slice):
    _, cands, _, _ = dl19_slice
    queries = read_candidates(cands)
    ranked, failed, kinds = rerank_queries(queries, k=3, lambda_=1.0, depth=4)
    assert failed == {} and kinds == {}
    for q in queries:
        assert set(ranked[q.qid]) <= set(q.ids[:4])
        assert reranked_order(q.ids, ranked[q.qid])[4:] == q.ids[4:]


def test_cli_json_and_resume(dl19_slice, tmp_path, capsys):
    _, cands, qrels, _ = dl19_slice
    resume = tmp_path / "resume.jsonl"
    argv = ["eval", "--candidates", str(cands), "--qrels", str(qrels), "--k", "10", "--lambda", "1.0",
            "--json", "--no-progress", "--resume", str(resume)]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert set(first) >= {"input", "reranked"}
    assert set(first["input"]) == set(first["reranked"]) >= {"nDCG@10", "Recall@10", "MRR@10", "distance@10"}
    done = resume.read_text().splitlines()
    assert len(done) == 1 + len(QIDS)  # header + one line per query
    assert main(argv) == 0  # every query is already in the resume file: nothing is reranked again
    assert json.loads(capsys.readouterr().out)["reranked"] == first["reranked"]
    assert resume.read_text().splitlines() == done


def test_cli_table(dl19_slice, capsys):
    _, cands, qrels, _ = dl19_slice
    assert main(["eval", "--candidates", str(cands), "--qrels", str(qrels), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "nDCG@10" in out and "reranked" in out and f"{len(QIDS)} queries" in out


def test_resume_file_for_another_configuration_is_refused(dl19_slice, tmp_path, capsys):
    _, cands, qrels, _ = dl19_slice
    resume = tmp_path / "r.jsonl"
    base = ["eval", "--candidates", str(cands), "--qrels", str(qrels), "--no-progress",
            "--resume", str(resume)]
    assert main([*base, "--k", "3"]) == 0
    capsys.readouterr()
    assert main([*base, "--k", "4"]) == 2
    assert "another configuration" in capsys.readouterr().err


def test_bad_candidates_name_the_line(tmp_path, capsys):
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"qid": "1", "query": "q", "chunks": [{"id": "a", "text": "x"}]}\nnot json\n'
                   '{"qid": "2", "query": "", "chunks": []}\n', encoding="utf-8")
    with pytest.raises(InputError) as exc:
        read_candidates(bad)
    lines = sorted(v.line for v in exc.value.violations)
    assert lines == [2, 3]
    qrels = tmp_path / "q.txt"
    qrels.write_text("1 0 a 1\n", encoding="utf-8")
    assert main(["eval", "--candidates", str(bad), "--qrels", str(qrels), "--no-progress"]) == 2
    assert "line 2" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_candidates_and_qrels_from_pipe_paths_are_read(tmp_path, capsys):
    """`--candidates <(...) --qrels <(...)` hands over pipes, not regular files: they were refused as
    "no such file". Named pipes stand for them here."""
    import threading

    argv = _tiny(tmp_path)
    writers = []
    for flag in ("--candidates", "--qrels"):
        at = argv.index(flag) + 1
        data, fifo = Path(argv[at]).read_bytes(), tmp_path / f"{flag[2:]}.pipe"
        os.mkfifo(fifo)
        writers.append(threading.Thread(target=lambda f=fifo, d=data: f.write_bytes(d), daemon=True))
        argv[at] = str(fifo)
    for w in writers:
        w.start()
    assert main(argv) == 0, capsys.readouterr().err
    assert "nDCG@10" in capsys.readouterr().out
    for w in writers:
        w.join(timeout=10)


def test_missing_file_is_a_usage_error(tmp_path, capsys):
    assert main(["eval", "--candidates", str(tmp_path / "nope.jsonl"), "--qrels", str(tmp_path / "q")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_subtopic_metrics(tmp_path):
    pytest.importorskip("pyndeval")
    cands = tmp_path / "c.jsonl"
    cands.write_text(json.dumps({"qid": "7", "query": "jaguar", "chunks": [
        {"id": "7.1", "text": "Jaguar cars: the British luxury car maker and its sports models."},
        {"id": "7.2", "text": "Jaguar car dealers and used Jaguar car prices."},
        {"id": "7.3", "text": "The jaguar is a big cat of the Americas, a spotted feline predator."},
        {"id": "7.4", "text": "Jacksonville Jaguars, the American football team."},
    ]}) + "\n", encoding="utf-8")
    subs = tmp_path / "s.txt"
    subs.write_text("7 7.1 7.1 1\n7 7.1 7.2 1\n7 7.2 7.3 1\n7 7.3 7.4 1\n", encoding="utf-8")
    qrels = tmp_path / "q.txt"
    qrels.write_text("7 0 7.1 1\n7 0 7.2 1\n7 0 7.3 1\n7 0 7.4 1\n", encoding="utf-8")
    report = evaluate(cands, qrels, k=2, lambda_=1.0, subtopics=subs)
    # input order's top 2 covers one subtopic of three
    assert report.input["St-recall@2"] == pytest.approx(1 / 3)
    assert 0.0 <= report.reranked["alpha-nDCG@2"] <= 1.0


def _tiny(tmp_path):
    cands = tmp_path / "c.jsonl"
    cands.write_text(json.dumps({"qid": "1", "query": "ivf memory", "chunks": [
        {"id": "a", "text": "IVF saves memory"}, {"id": "b", "text": "HNSW is a graph"}]}) + "\n",
        encoding="utf-8")
    qrels = tmp_path / "q.txt"
    qrels.write_text("1 0 a 1\n", encoding="utf-8")
    return ["eval", "--candidates", str(cands), "--qrels", str(qrels), "--no-progress"]


@pytest.mark.parametrize("junk", [b"[1]\n{}\n", b"\x85\xff not utf-8\n", "dir"])
def test_unusable_resume_file_is_bad_input_not_an_internal_error(tmp_path, capsys, junk):
    """Regression: a directory, a non-record line or non-UTF-8 bytes as --resume crashed with exit 4."""
    resume = tmp_path / "r.jsonl"
    if junk == "dir":
        resume.mkdir()
    else:
        resume.write_bytes(junk)
    assert main([*_tiny(tmp_path), "--resume", str(resume)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "resume" in err and "internal" not in err


@pytest.mark.parametrize(
    ("flag", "value"), [("--lambda", "5"), ("--duplicate-threshold", "nan"), ("--depth", "60")]
)
def test_bad_shared_option_is_exit_2_once_not_a_failure_per_query(tmp_path, capsys, flag, value):
    """Regression: --lambda 5 (or a --depth over max_chunks) failed every query separately and
    exited 3 (backend failure) with a multi-line message per query."""
    assert main([*_tiny(tmp_path), flag, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag.lstrip("-").replace("-", "_") in err


def test_empty_candidates_file_is_bad_input(tmp_path, capsys):
    """Regression: an empty candidates file printed a table of NaN and exited 0."""
    argv = _tiny(tmp_path)
    Path(argv[2]).write_text("\n", encoding="utf-8")
    assert main(argv) == 2
    assert "holds no queries" in capsys.readouterr().err


def test_a_failed_query_is_reported_on_one_line(tmp_path, capsys):
    """A per-query failure (here a lone surrogate in one chunk) is one stderr line, not one per violation."""
    argv = _tiny(tmp_path)
    row = {"qid": "1", "query": "q", "chunks": [{"id": "a", "text": "x\ud800"}]}
    Path(argv[2]).write_text(json.dumps(row) + "\n", encoding="utf-8")
    main(argv)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "query 1 kept its input order" in err and "surrogate" in err


@pytest.mark.parametrize("line", ["1 0 a high", "1 0 a 1.5", "1 0 a", "1 0 a 1 extra"])
def test_bad_qrels_line_is_named_by_its_number(tmp_path, capsys, line):
    """Regression: a malformed qrels line was reported as a bare Python message
    ("invalid literal for int()", "not enough values to unpack") with no line number."""
    argv = _tiny(tmp_path)
    Path(argv[4]).write_text(f"1 0 b 0\n{line}\n", encoding="utf-8")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 2" in err and "qrels" in err


def test_qrels_with_a_bom_and_crlf_still_judge_the_first_query(tmp_path, capsys):
    """Regression: a BOM became part of the first qid, so its judgments silently matched nothing."""
    argv = _tiny(tmp_path)
    Path(argv[4]).write_bytes(b"\xef\xbb\xbf1 0 b 1\r\n")
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["input"]["Recall@10"] == 1.0  # b is judged relevant for qid 1 and is in the list


def test_qrels_of_queries_not_in_the_candidates_do_not_count_as_zeros(tmp_path, capsys):
    """Regression: judgments for a qid absent from the candidates entered the mean as a zero."""
    argv = _tiny(tmp_path)
    Path(argv[4]).write_text("1 0 a 1\nnot-run 0 a 1\n", encoding="utf-8")
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["input"]["nDCG@10"] == 1.0 and report["input"]["MRR@10"] == 1.0


def test_qrels_that_judge_no_candidate_query_are_bad_input(tmp_path, capsys):
    """Regression: empty or mismatched qrels printed NaN metrics (invalid JSON with --json), exit 0."""
    argv = _tiny(tmp_path)
    Path(argv[4]).write_text("other 0 a 1\n", encoding="utf-8")
    assert main([*argv, "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "judges none" in captured.err


def test_a_query_with_no_candidates_is_bad_input_not_a_backend_failure(tmp_path, capsys):
    """Regression: `"chunks": []` passed the candidates check, failed in the reranker and made
    eval exit 3 (backend failure) instead of 2 (bad input)."""
    argv = _tiny(tmp_path)
    Path(argv[2]).write_text('{"qid": "1", "query": "ivf", "chunks": []}\n', encoding="utf-8")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 1" in err and "chunks" in err and "empty" in err


def test_a_query_failing_only_on_bad_input_exits_2_and_the_rest_is_measured(tmp_path, capsys):
    """Regression: a per-query input error (here a score that is no number; an over-budget chunk is now
    shortened to fit, issue 34) made eval exit 3, the code for a backend failure; now the exit code
    follows the worst failure, as in `batch`."""
    argv = _tiny(tmp_path)
    bad = {"qid": "2", "query": "ivf", "chunks": [{"id": "x", "text": "one text", "score": "high"},
                                                    {"id": "y", "text": "another text"}]}
    with open(argv[2], "a", encoding="utf-8") as fh:
        fh.write(json.dumps(bad) + "\n")
    assert main([*argv, "--json"]) == 2
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert set(report["info"]["failed"]) == {"2"} and report["info"]["failure_kinds"] == {"2": "input"}
    assert "query 2 kept its input order: InputError" in captured.err


def test_a_backend_failure_still_exits_3(tmp_path, capsys, monkeypatch):
    from tests.support.fake_llm import FakeLLM, Reply

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeLLM([Reply.openai_error(401, "no key")] * 4) as srv:
        code = main([*_tiny(tmp_path), "--backend", "openai", "--base-url", srv.openai_url, "-m", "m"])
    assert code == 3
    assert "query 1 kept its input order: BackendError" in capsys.readouterr().err


# --- resume files written before failure kinds were recorded -------------------------------------

_HEADER = {"config": {"backend": "local", "model": None, "embedder": "lexical", "k": 10, "lambda": None,
                      "depth": 50, "duplicate_threshold": None}}


def _resume_file(tmp_path: Path, *records: dict) -> Path:
    resume = tmp_path / "old.jsonl"
    resume.write_text("".join(json.dumps(r) + "\n" for r in (_HEADER, *records)), encoding="utf-8")
    return resume


@pytest.mark.parametrize(
    ("error", "code", "kind"),
    [
        ("InputError: invalid input (1 problem) - chunks: 51 chunks is over the limit of 50", 2, "input"),
        ("MissingDependencyError: sentence-transformers needs the optional package", 2, "input"),
        ("BackendError: openai: no valid answer after 3 attempts", 3, "backend"),
        ("ValueError: operands could not be broadcast together", 4, "internal"),
    ],
)
def test_a_failure_from_an_old_resume_file_exits_by_its_exception_name(
    tmp_path: Path, capsys, error: str, code: int, kind: str
) -> None:
    """Records written before kinds existed ({"qid", "error": "<Exception>: ..."}) were all taken for
    backend failures (exit 3), so resuming gave another exit code than the run that wrote them."""
    resume = _resume_file(tmp_path, {"qid": "1", "error": error})
    assert main([*_tiny(tmp_path), "--json", "--resume", str(resume)]) == code
    report = json.loads(capsys.readouterr().out)
    assert report["info"]["failure_kinds"] == {"1": kind}


@pytest.mark.parametrize(
    ("record", "fragment"),
    [
        ({"qid": "1", "ranked": "a"}, "'ranked' must be a list of id strings"),
        ({"qid": "1", "ranked": 5}, "'ranked' must be a list of id strings"),
        ({"qid": "1", "error": {"detail": "x"}}, "'error' must be a string"),
        ({"qid": None, "ranked": []}, "'qid' must be a string or an integer"),
        ({"qid": "1", "ranked": ["a", "zz"]}, "query 1's ranked ids ['zz'] are not among its candidates"),
    ],
)
def test_a_resume_record_that_cannot_be_ours_is_bad_input_naming_the_line(
    tmp_path: Path, capsys, record: dict, fragment: str
) -> None:
    """Was exit 4 (KeyError, TypeError), or for "ranked": "a" a run scored with the ids 'a'..."""
    resume = _resume_file(tmp_path, record)
    assert main([*_tiny(tmp_path), "--resume", str(resume)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "line 2" in err[0] and fragment in err[0]


def test_failures_of_queries_not_in_the_candidates_file_are_not_reported(tmp_path: Path, capsys) -> None:
    resume = _resume_file(tmp_path, {"qid": "other", "error": "BackendError: x", "kind": "backend"})
    assert main([*_tiny(tmp_path), "--json", "--resume", str(resume)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["info"]["failed"] == {} and captured.err == ""


def test_a_resume_file_does_not_mix_embeddings_servers(tmp_path: Path, capsys, monkeypatch) -> None:
    """The embedder's server is part of the configuration: before today an openai embedder ignored
    an openai backend's --base-url, so an old file's rankings came from other vectors."""
    from tests.support.fake_llm import FakeLLM, auto_ranker

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeLLM(handler=auto_ranker()) as old, FakeLLM(handler=auto_ranker()) as new:
        monkeypatch.setenv("OPENAI_BASE_URL", old.openai_url)
        resume = tmp_path / "r.jsonl"
        first = [*_tiny(tmp_path), "-e", "openai:e", "--resume", str(resume)]
        assert main(first) == 0
        header = json.loads(resume.read_text(encoding="utf-8").splitlines()[0])
        assert header["config"]["embed_base_url"] == old.openai_url
        # The same file as an older version wrote it (no embed_base_url): still the same server.
        del header["config"]["embed_base_url"]
        lines = resume.read_text(encoding="utf-8").splitlines()
        resume.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n", encoding="utf-8")
        assert main(first) == 0
        capsys.readouterr()
        # Everything else equal, another embeddings server: refused, not mixed in.
        assert main([*first, "--embed-base-url", new.openai_url]) == 2
        assert "another configuration" in capsys.readouterr().err
        assert new.requests == []


# --- issue 15 -------------------------------------------------------------------------------------------


def test_the_table_prints_the_effective_lambda_not_none(tmp_path, capsys):
    assert main(_tiny(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "lambda None" not in out and "lambda 0.7 (default)" in out
    assert main([*_tiny(tmp_path), "--lambda", "0.5"]) == 0
    assert "lambda 0.5," in capsys.readouterr().out


@pytest.mark.parametrize("value", ["5", "-0.1", "1.5"])
def test_duplicate_threshold_must_be_a_cosine_in_0_1(tmp_path, capsys, value):
    assert main([*_tiny(tmp_path), "--duplicate-threshold", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "duplicate_threshold must be a cosine in [0, 1]" in err


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("dir", "is a directory, not a file"),
     ("png", "is not a text file (byte 0 is not UTF-8); expected TREC qrels"),
     ("nul", "is a binary file (a NUL byte at 6); expected TREC qrels")],
)
def test_a_directory_or_binary_file_as_qrels_is_named_as_such(tmp_path, capsys, kind, expected):
    argv = _tiny(tmp_path)
    qrels = tmp_path / "judged"
    if kind == "dir":
        qrels.mkdir()
    else:
        qrels.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" if kind == "png" else b"1 0 a \x001\n")
    argv[argv.index("--qrels") + 1] = str(qrels)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and "codec" not in err


def test_a_resume_config_mismatch_names_the_setting_that_differs(tmp_path, capsys):
    resume = tmp_path / "r.jsonl"
    assert main([*_tiny(tmp_path), "--resume", str(resume), "--k", "3"]) == 0
    capsys.readouterr()
    assert main([*_tiny(tmp_path), "--resume", str(resume), "--k", "4", "--lambda", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "another configuration (k: file 3, now 4; lambda: file None, now 0.5)" in err


# --- novelty-aware nDCG ---------------------------------------------------------------------------


def _qrels(rows: list[tuple[str, str, int]]):
    import tempfile

    from rag_rerank.judgments import read_qrels

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as fh:
        fh.write("".join(f"{q} 0 {d} {r}\n" for q, d, r in rows))
    return read_qrels(fh.name)


_TEXTS = {
    "a": "IVF partitions the vectors into Voronoi cells and scans only nprobe of them per query.",
    "a-copy": "IVF partitions the vectors into Voronoi cells and scans only nprobe of them per query!",
    "b": "HNSW keeps a layered proximity graph in memory, which makes it fast but RAM-heavy.",
    "c": "Sourdough needs a ripe starter and a long cold proof before baking.",
}


def test_novelty_ndcg_equals_plain_ndcg_when_no_candidate_repeats_another():
    from ir_measures import calc_aggregate, nDCG

    from rag_rerank.metrics import novelty_ndcg, scored_run

    qrels = _qrels([("q1", "a", 2), ("q1", "b", 1), ("q1", "c", 0)])
    orders = {"q1": ["c", "b", "a"]}
    texts = {"q1": {d: _TEXTS[d] for d in ("a", "b", "c")}}
    plain = calc_aggregate([nDCG @ 10], qrels, scored_run(orders))[nDCG @ 10]
    assert novelty_ndcg(qrels, orders, texts, 10) == pytest.approx(plain)


def test_a_near_copy_listed_below_its_original_gains_nothing_and_the_ideal_skips_copies():
    from rag_rerank.metrics import novelty_ndcg

    qrels = _qrels([("q1", "a", 2), ("q1", "a-copy", 2), ("q1", "b", 1)])
    texts = {"q1": {d: _TEXTS[d] for d in ("a", "a-copy", "b")}}
    with_copy = novelty_ndcg(qrels, {"q1": ["a", "a-copy", "b"]}, texts, 10)
    without = novelty_ndcg(qrels, {"q1": ["a", "b", "a-copy"]}, texts, 10)
    # ideal = [2, 1] (the copy is skipped): listing a, b first is perfect; a, a-copy, b is not
    assert without == pytest.approx(1.0)
    disc = [1 / math.log2(i + 2) for i in range(3)]
    assert with_copy == pytest.approx((2 * disc[0] + 0 * disc[1] + 1 * disc[2]) / (2 * disc[0] + 1 * disc[1]))


def test_eval_reports_novelty_ndcg_for_both_orders(dl19_slice):
    _, cands, qrels, _ = dl19_slice
    report = evaluate(cands, qrels, k=10, lambda_=1.0)
    for side in (report.input, report.reranked):
        assert 0.0 <= side["novelty-nDCG@10"] <= 1.0


def test_metadata_flags_reach_the_reranker(tmp_path, capsys):
    """`eval` takes rerank's metadata flags: candidates may carry `meta`, and `--meta-field year
    --meta-weight 1` orders by it (newest first), so the newer, judged-relevant chunk leads."""
    cands = tmp_path / "c.jsonl"
    chunks = [{"id": f"{age}", "text": f"The {year} release notes list the HNSW index options.",
               "meta": {"year": year}} for age, year in (("old", 2019), ("new", 2024))]
    cands.write_text(json.dumps({"qid": "1", "query": "HNSW index options release notes",
                                 "chunks": chunks}) + "\n", encoding="utf-8")
    qrels = tmp_path / "q.txt"
    qrels.write_text("1 0 new 1\n1 0 old 0\n", encoding="utf-8")
    base = ["eval", "--candidates", str(cands), "--qrels", str(qrels), "--k", "2", "--json",
            "--no-progress", "--duplicate-threshold", "1.0"]
    assert main([*base, "--meta-field", "year", "--meta-weight", "1", "--meta-value-type", "int"]) == 0
    by_year = json.loads(capsys.readouterr().out)
    assert by_year["reranked"]["nDCG@10"] == pytest.approx(1.0)
    assert by_year["input"]["nDCG@10"] < 0.7
    assert main([*base, "--meta-weight", "1"]) == 2  # a --meta-* flag without --meta-field
    assert "--meta-field" in capsys.readouterr().err
    resume = tmp_path / "r.jsonl"
    assert main([*base, "--resume", str(resume), "--meta-field", "year", "--meta-weight", "1"]) == 0
    capsys.readouterr()
    # The same resume file with another metadata weight would mix two orders: refused, naming it.
    assert main([*base, "--resume", str(resume), "--meta-field", "year", "--meta-weight", "0.5"]) == 2
    assert "meta_weight" in capsys.readouterr().err


def test_bad_lambda_and_duplicate_threshold_are_reported_together(tmp_path, capsys):
    assert main([*_tiny(tmp_path), "--lambda", "5", "--duplicate-threshold", "-1"]) == 2
    err = capsys.readouterr().err
    assert "lambda must be a number in [0, 1]" in err
    assert "duplicate_threshold must be a cosine in [0, 1]" in err


@pytest.mark.parametrize("level", ["-1", "0", "3"])
def test_a_rel_level_outside_the_qrels_grades_is_an_error_naming_the_flag_and_range(tmp_path, capsys, level):
    """Regression: --rel-level -1 printed Recall 0 and MRR 1 (every document "relevant"), 0 crashed
    with an internal TypeError from ir-measures (exit 4), and one above the highest grade printed
    zeros for Recall and MRR, all without a word."""
    argv = _tiny(tmp_path)
    Path(argv[4]).write_text("1 0 a 2\n1 0 b 0\n", encoding="utf-8")
    assert main([*argv, "--rel-level", level]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "--rel-level" in captured.err and "from 1 to 2" in captured.err and f"got {level}" in captured.err


def test_evaluate_refuses_a_rel_level_that_is_not_a_grade(tmp_path):
    argv = _tiny(tmp_path)
    for bad in (0, 2, 1.5, True):
        with pytest.raises(InputError) as err:
            evaluate(argv[2], argv[4], rel_level=bad)
        (v,) = err.value.violations
        assert v.path == "rel_level" and "1 (the highest grade" in v.message


def test_the_table_says_what_the_columns_and_rows_are_and_which_grade_counts(tmp_path, capsys):
    """Regression: the table did not say what "input" and "reranked" were, what distance@k measures,
    or which --rel-level its Recall and MRR used (nor did --json)."""
    argv = _tiny(tmp_path)
    Path(argv[4]).write_text("1 0 a 2\n", encoding="utf-8")
    assert main([*argv, "--rel-level", "2"]) == 0
    out = capsys.readouterr().out
    assert "input: the candidates' order" in out and "grade >= 2 is relevant" in out
    assert "distance@10: mean pairwise cosine distance" in out
    assert main([*argv, "--rel-level", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["info"]["rel_level"] == 2


def test_queries_the_qrels_do_not_judge_are_counted_in_the_table_and_json(tmp_path, capsys):
    """Regression: with qrels for 1 of 2 queries the table said "2 queries" while nDCG, Recall and
    MRR averaged over the 1 judged query only, and nothing said so."""
    argv = _tiny(tmp_path)
    rows = [{"qid": "1", "query": "ivf memory", "chunks": [{"id": "a", "text": "IVF saves memory"}]},
            {"qid": "2", "query": "hnsw", "chunks": [{"id": "b", "text": "HNSW is a graph"}]}]
    Path(argv[2]).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert main(argv) == 0
    assert "1 of the 2 queries has no judgments in the qrels" in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)["info"]
    assert info["queries"] == 2 and info["judged_queries"] == 1


@pytest.mark.parametrize("content", ["", "other 1 a 1\n"])
def test_subtopics_that_judge_no_candidate_query_are_bad_input(tmp_path, capsys, content):
    """Regression: an empty or mismatched --subtopics file printed the table without the subtopic
    rows the user asked for, exit 0."""
    argv = _tiny(tmp_path)
    subs = tmp_path / "subs.txt"
    subs.write_text(content, encoding="utf-8")
    assert main([*argv, "--subtopics", str(subs)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "subtopics" in captured.err and "judges none" in captured.err


@pytest.mark.parametrize("cut", ["record", "header"])
def test_resuming_after_a_half_written_line_keeps_the_file_resumable(tmp_path, capsys, cut):
    """Regression: a run interrupted mid-write left a half line; the resumed run appended its records
    right after it, so the next resume found a broken line mid-file and refused it ("not a resume
    file", exit 2). A half-written header lost the header for good."""
    argv = _tiny(tmp_path)
    rows = [{"qid": str(i), "query": "ivf memory", "chunks": [
        {"id": "a", "text": "IVF saves memory"}, {"id": "b", "text": "HNSW is a graph"}]} for i in (1, 2)]
    Path(argv[2]).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    resume = tmp_path / "r.jsonl"
    assert main([*argv, "--json", "--resume", str(resume)]) == 0
    first = json.loads(capsys.readouterr().out)
    whole = resume.read_bytes()
    header_end = whole.index(b"\n") + 1
    resume.write_bytes(whole[:-20] if cut == "record" else whole[: header_end - 5])
    for _ in range(2):
        assert main([*argv, "--json", "--resume", str(resume)]) == 0
        assert json.loads(capsys.readouterr().out)["reranked"] == first["reranked"]
    lines = [json.loads(line) for line in resume.read_text(encoding="utf-8").splitlines()]
    assert "config" in lines[0] and sorted(r["qid"] for r in lines[1:]) == ["1", "2"]


def test_a_document_judged_twice_with_different_grades_is_named(tmp_path, capsys):
    """Regression: with `1 0 b 2` then `1 0 b 0`, nDCG and Recall read one grade and MRR the other
    (nDCG 0 next to MRR 0.5), and swapping the lines changed the figures; nothing was said."""
    argv = _tiny(tmp_path)
    Path(argv[4]).write_text("1 0 b 2\n1 0 a 1\n1 0 b 0\n", encoding="utf-8")
    assert main([*argv, "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "line 3" in captured.err and "judged 0 here and 2 on line 1" in captured.err
    Path(argv[4]).write_text("1 0 b 2\n1 0 b 2\n", encoding="utf-8")  # the same judgment twice is harmless
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input"]["Recall@10"] == 1.0


def _synthetic_queries(n: int = 20) -> list:
    from rag_rerank.judgments import CandidateQuery

    return [CandidateQuery(f"q{i}", f"When does IVF save index memory? ({i})",
                           tuple({"id": f"d{j}", "text": f"IVF note {j}: partitions save index memory {i}"}
                                 for j in range(8)))
            for i in range(n)]


def test_rerank_queries_works_inside_a_running_event_loop() -> None:
    """A Jupyter cell (or an async web handler) runs inside an event loop, where `asyncio.run`
    refuses to start: `evaluate()` / `rerank_queries()` raised RuntimeError there."""
    import asyncio

    queries = _synthetic_queries()
    outside = rerank_queries(queries, k=3)

    async def cell() -> object:
        return rerank_queries(queries, k=3)

    assert asyncio.run(cell()) == outside and len(outside[0]) == len(queries)


def test_rerank_queries_closes_its_backend_once_for_all_slices() -> None:
    """Each 16-query slice ran in an `asyncio.run` loop of its own with one shared backend: every
    slice's async client (and its connections) was left behind for the garbage collector."""
    import gc
    import warnings

    from tests.support.fake_llm import FakeLLM
    from tests.support.quoting_ranker import quoting_ranker

    queries = _synthetic_queries(40)  # three slices
    with FakeLLM(handler=quoting_ranker()) as srv:
        gc.collect()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            ranked, failed, _ = rerank_queries(queries, k=3, backend="openai", base_url=srv.openai_url,
                                               api_key="sk-test", model="m")
            gc.collect()
    assert (len(ranked), failed) == (len(queries), {})
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_the_resume_header_and_json_never_hold_the_embedding_servers_password(
        tmp_path: Path, capsys, monkeypatch) -> None:
    """`embed_base_url` is written to the resume file and printed by --json: a password in
    OPENAI_BASE_URL is masked there, and a second run still finds the file its own."""
    from tests.support.fake_llm import FakeLLM, auto_ranker

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeLLM(handler=auto_ranker()) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.openai_url.replace("http://", "http://user:s3cret-pass@"))
        resume = tmp_path / "r.jsonl"
        args = [*_tiny(tmp_path), "-e", "openai:e", "--resume", str(resume), "--json"]
        assert main(args) == 0
        assert main(args) == 0
        assert srv.requests, "the embeddings were asked of the server"
    out = capsys.readouterr().out + resume.read_text(encoding="utf-8")
    assert "s3cret-pass" not in out and "user:***@127.0.0.1" in out


def test_each_querys_status_is_recorded_and_kept_by_resume(tmp_path: Path) -> None:
    """meta.status per query: a fallback's ranking is scored like the model's, so eval says how
    many there were; a resumed run reads them back from its file."""
    from tests.support.fake_llm import FakeLLM, Reply
    from tests.support.quoting_ranker import quoting_ranker

    queries = _synthetic_queries(4)
    ranker, seen = quoting_ranker(), []

    def answer(req):  # the second request is refused: that query is ranked by the fallback
        seen.append(req)
        return Reply.openai_error(401, "invalid api key") if len(seen) == 2 else ranker(req)

    resume = tmp_path / "resume.jsonl"
    options = {"backend": "openai", "api_key": "sk-test", "model": "m", "fallback": "local", "concurrency": 1}
    statuses: dict[str, str] = {}
    with FakeLLM(handler=answer) as srv:
        ranked, failed, _ = rerank_queries(queries, k=3, base_url=srv.openai_url, resume=resume,
                                           statuses=statuses, **options)
    assert failed == {} and len(ranked) == 4
    assert sorted(statuses.values()) == ["fallback", "ok", "ok", "ok"]
    again: dict[str, str] = {}
    rerank_queries(queries, k=3, base_url="http://127.0.0.1:9/v1", resume=resume, statuses=again, **options)
    assert again == statuses  # nothing asked again: every query was in the file, with its status
