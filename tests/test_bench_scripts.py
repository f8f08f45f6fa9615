"""The benchmark scripts still run against the library they measure: each answers `--help`, and the
quality bench's ablation backends build. Figures are not checked here (benchmarks print numbers;
tests never pin a timing); this catches a bench left behind by an API change, as happened when
the local fusion gained a signal."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
WITH_ARGPARSE = sorted(p.name for p in BENCH.glob("*.py") if "argparse" in p.read_text(encoding="utf-8"))


@pytest.mark.parametrize("script", WITH_ARGPARSE)
def test_bench_script_answers_help(script: str) -> None:
    out = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True,
                         timeout=120, cwd=BENCH.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout


def test_quality_bench_ablation_backends_build() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import quality
    finally:
        sys.path.remove(str(BENCH))
    texts = ["IVF partitions vectors into cells.", "Risotto needs warm stock."]
    for backend in (quality._cosine_only("lexical"), quality._no_prior("lexical")):
        scores = backend.scores("How does an IVF index work?", texts)
        assert scores.shape == (2,) and scores[0] > scores[1]


@pytest.mark.parametrize("script", ["overhead.py", "batch.py", "offline.py", "cache_state.py"])
def test_a_speed_bench_without_the_data_says_where_to_point_it(script: str, tmp_path: Path) -> None:
    """docs/speed.md invites `python bench/overhead.py` on your own machine, where the shared TREC
    data is absent: the run ended in a FileNotFoundError traceback."""
    import os

    env = {**os.environ, "RAG_RERANK_DATA": str(tmp_path / "nowhere")}
    out = subprocess.run([sys.executable, str(BENCH / script)], capture_output=True, text=True, timeout=120,
                         cwd=BENCH.parent, env=env)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    missing = tmp_path / "nowhere" / "trec-dl19" / "bm25-top100.json"
    assert out.stderr.strip() == (f"{missing} not found: this bench reads the shared evaluation data (not "
                                  "shipped with the package); set RAG_RERANK_DATA to that data folder or "
                                  "pass --data FILE")


def _failures_module():
    sys.path.insert(0, str(BENCH))
    try:
        import failures
    finally:
        sys.path.remove(str(BENCH))
    return failures


def test_a_bench_with_failed_calls_says_so_on_stdout_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    """The benches printed failed queries on stderr only (or skipped them), and exited 0: a table
    measured with queries left in their input order looked like a clean one."""
    failures = _failures_module()
    tally = failures.Tally()
    tally.add(43, {"qid 1037798": "InternalError: the output guard refused\nthe local answer"},
              where="local + lexical, top-50")
    assert tally.call("query 2", lambda: 1 / 0) is None
    assert tally.call("query 3", lambda: "ok") == "ok"
    assert tally.finish(0) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        "FAILED: 2 of 45 calls raised; first: local + lexical, top-50, qid 1037798: InternalError: the "
        "output guard refused the local answer")
    clean = failures.Tally()
    clean.count(5)
    assert clean.finish(0) == 0 and capsys.readouterr().out == ""


def test_a_bench_that_crashes_says_so_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    failures = _failures_module()
    tally = failures.Tally()
    tally.count(3)

    def main() -> int:
        raise RuntimeError("the backend raised")

    assert failures.run_bench(main, tally) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == ("FAILED: 1 of 4 calls raised; first: the run stopped: "
                                             "RuntimeError: the backend raised")
    assert "Traceback" in captured.err


def test_a_bench_script_whose_queries_fail_exits_1() -> None:
    out = subprocess.run([sys.executable, str(BENCH / "multilingual.py"), "--embedder", "no-such-embedder"],
                         capture_output=True, text=True, timeout=300, cwd=BENCH.parent)
    assert out.returncode == 1, out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("FAILED: 17 of 17 calls raised; first: query de-01: InputError: "), last
    assert "ERROR" in out.stdout  # each failed query is on its row, not left out silently


def test_unseen_texts_give_new_reasons_only_when_asked() -> None:
    """`--fresh` benches mark every text so no per-text cache holds it; `--new-reasons` must also
    make the fake model's reasons new (it quotes a passage's opening words), as a real model's are,
    or the output guard's per-reason memos would hit in a figure that claims first sight."""
    sys.path.insert(0, str(BENCH))
    try:
        import peers
    finally:
        sys.path.remove(str(BENCH))
    from rag_rerank import Reranker
    from rag_rerank.engine import plan
    from tests.support.quoting_ranker import answer_for

    work = [("what do cells hold?",  # passages longer than the eight words quoted, as DL19's are
             [{"id": "a", "text": "IVF partitions the stored vectors into cells, each around a centroid."},
              {"id": "b", "text": "HNSW links the stored vectors in layered graphs that a search walks."}])]
    session = Reranker("local")
    options = session.options(top_k=2)

    def reasons(marked: peers.Work) -> list[str]:
        (query, chunks), = marked
        answer = answer_for(plan(session._setup, query, chunks, options).prompt)
        return [r["reason"] for r in answer["ranked"]]

    for new_reasons in (False, True):
        one, two = (peers.unseen(work, mark, new_reasons=new_reasons) for mark in ("r1", "r2"))
        assert one[0][0] == "what do cells hold? [r1]"
        texts = [c["text"] for c in one[0][1]]
        assert texts == ([f"[r1] {c['text']}" for c in work[0][1]] if new_reasons
                         else [f"{c['text']} [r1]" for c in work[0][1]])
        assert set(reasons(one)).isdisjoint(reasons(two)) == new_reasons


def test_a_fresh_peers_round_gives_every_reranker_texts_none_has_seen() -> None:
    """`bench/peers.py --fresh` claims first sight for every reranker: a text one of them saw (ours
    fills per-text caches) must not come back to the next, nor from one round to the next, and the
    bare SDK call must replay our request bodies for texts marked for it alone."""
    sys.path.insert(0, str(BENCH))
    try:
        import peers
    finally:
        sys.path.remove(str(BENCH))
    work = [("what do cells hold?",
             [{"id": "a", "text": "IVF partitions the stored vectors into cells, each around a centroid."},
              {"id": "b", "text": "HNSW links the stored vectors in layered graphs that a search walks."}])]
    seen: dict[str, list[str]] = {}

    def watching(name: str) -> peers.Peer:
        def prepare(marked: peers.Work) -> Callable[[int], None]:
            seen.setdefault(name, []).extend(c["text"] for c in marked[0][1])
            return lambda i: None
        return peers.Peer(name, prepare)

    with peers.fast_server() as url:
        recorded: dict[int, list[dict[str, Any]]] = {}
        ours = peers.ours_once(url)
        sdk = peers.bare_sdk(url, recorded)
        others = [watching("one"), watching("two")]
        calls: dict[str, Callable[[int], None]] = {p.name: lambda i: None for p in [sdk, *others]}
        for mark in ("r0", "r1"):
            peers.fresh_round(calls, work, mark, ours, sdk, [sdk, *others], recorded, url)
            sdk_text = json.dumps(recorded[2][0])
            assert f"[sdk-{mark}]" in sdk_text and "IVF partitions" in sdk_text
            calls[sdk.name](0)  # the replayed body is answered with a ranking
        ours.close()
        sdk.close()
    everything = seen["one"] + seen["two"]
    assert len(set(everything)) == len(everything) == 8  # 2 texts x 2 rerankers x 2 rounds, all new
    assert all("IVF" in t or "HNSW" in t for t in everything)
