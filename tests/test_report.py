"""The `--html` pages of compare, eval, bias and calibrate: self-contained (no script, no link, no
address to fetch), each figure present, the user's text escaped, the numbers of `--json`; and, when
Chromium is installed, opened in a real headless browser that must make no request but the page."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("ir_measures")
pytest.importorskip("matplotlib")

from rag_rerank.cli import main
from rag_rerank.compare import compare_runs
from rag_rerank.errors import MissingDependencyError
from rag_rerank.judgments import read_qrels
from rag_rerank.report import compare_page, sections
from rag_rerank.runfiles import run_from_orders
from tests.support.browser import Browser, find_chromium, page_url
from tests.support.dl19 import DL19, PAGES, page_commands, write_candidates
from tests.support.shared_data import require

QIDS = ("1037798", "1129237", "183378", "104861", "148538", "1103812", "87452", "489204")


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The four pages, written by the CLI on eight DL19 queries (BM25 top 20, the local backend)."""
    require(DL19 / "bm25-top100.json")
    out = tmp_path_factory.mktemp("report")
    cands = write_candidates(out / "candidates.jsonl", QIDS, depth=20)
    paths = {}
    for name, argv in page_commands(cands, out, compare_b="rerank:", resamples=2000).items():
        paths[name] = out / f"{name}.html"
        code = main([*argv, "--no-progress", "--html", str(paths[name])])
        assert code in (0, 1), (name, code)  # compare's gate may fail: its page is written all the same
        assert paths[name].is_file()
    return paths


@pytest.mark.parametrize("name", list(PAGES))
def test_each_page_is_self_contained_and_has_its_figures(pages: dict[str, Path], name: str) -> None:
    html = pages[name].read_text(encoding="utf-8")
    want_sections, figures = PAGES[name]
    assert sections(html) == want_sections
    assert html.count("<svg") == figures
    lowered = html.lower()
    for needle in ("<script", "<link", "<img", "<iframe", "@import", "src=", "<object", "<embed"):
        assert needle not in lowered, needle
    # the only absolute addresses are XML namespace names (never fetched)
    addresses = set(re.findall(r"[\w:-]+=\"(https?://[^\"]+)\"", html))
    assert addresses <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, addresses
    assert not [u for u in re.findall(r"url\(([^)]*)\)", html) if not u.startswith("#")]
    assert "@media print" in html


def test_the_users_text_is_escaped(tmp_path: Path) -> None:
    qrels_path = tmp_path / "q.txt"
    qrels_path.write_text("".join(f"<b>q{i}</b> 0 d{i} 1\n" for i in range(6)), encoding="utf-8")
    qrels = read_qrels(qrels_path)
    a = run_from_orders("<script>alert(1)</script>", {f"<b>q{i}</b>": [f"d{i}", "x"] for i in range(6)}, "t")
    b = run_from_orders("B", {f"<b>q{i}</b>": ["x", f"d{i}"] for i in range(6)}, "t")
    html = compare_page(compare_runs(a, b, qrels, n_resamples=200))
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;b&gt;q0&lt;/b&gt;" in html and "<b>q0</b>" not in html


def test_the_figures_numbers_are_in_json(pages: dict[str, Path], tmp_path: Path, capsys) -> None:
    cands = pages["eval"].parent / "candidates.jsonl"
    assert main(["bias", "--candidates", str(cands), "--no-progress", "--json"]) == 0
    band = json.loads(capsys.readouterr().out)["rank_shift_band"]
    assert band["confidence"] == 0.95 and len(band["low"]) == len(band["high"]) == 10
    assert all(lo <= hi for lo, hi in zip(band["low"], band["high"], strict=True) if lo is not None)
    assert (
        main(
            [
                "calibrate",
                "--candidates",
                str(cands),
                "--qrels",
                str(DL19 / "qrels.txt"),
                "--rel-level",
                "2",
                "-o",
                str(tmp_path / "c.json"),
                "--no-progress",
                "--json",
            ]
        )
        == 0
    )
    reliability = json.loads(capsys.readouterr().out)["reliability"]
    assert len(reliability["before"]) == len(reliability["after"]) == 10
    counted = sum(b["chunks"] for b in reliability["before"])
    assert counted == sum(b["chunks"] for b in reliability["after"]) > 0


def test_a_missing_report_extra_is_named_before_any_work(pages: dict[str, Path], monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if `pip install rag-rerank[report]` had not run
    from rag_rerank.charts import require_charts

    with pytest.raises(MissingDependencyError, match=r"report"):
        require_charts()
    cands = pages["eval"].parent / "candidates.jsonl"
    code = main(
        ["bias", "--candidates", str(cands), "--no-progress", "--html", str(pages["bias"].parent / "x.html")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "rag-rerank[report]" in err and "matplotlib" in err, err
    assert not (pages["bias"].parent / "x.html").exists()


def test_an_unwritable_html_path_is_named(pages: dict[str, Path], capsys) -> None:
    qrels = DL19 / "qrels.txt"
    code = main(
        [
            "compare",
            str(DL19 / "bm25.run"),
            str(DL19 / "bm25.run"),
            "--qrels",
            str(qrels),
            "--resamples",
            "200",
            "--html",
            str(pages["bias"].parent),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--html" in err and "cannot write" in err, err


CHROMIUM = find_chromium()


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (Debian: apt-get install chromium)")
def test_a_real_browser_renders_each_page_and_no_request_leaves_it(
    pages: dict[str, Path], tmp_path: Path
) -> None:
    leak = tmp_path / "leak.html"  # the check itself must see a request when there is one
    leak.write_text('<p>x</p><img src="http://127.0.0.1:9/pixel.png">', encoding="utf-8")
    assert CHROMIUM is not None
    with Browser(CHROMIUM) as browser:
        seen = browser.visit(page_url(leak))
        assert seen.requests == (page_url(leak), "http://127.0.0.1:9/pixel.png")
        for name, path in pages.items():
            visit = browser.visit(page_url(path))
            assert visit.requests == (page_url(path),), (name, visit.requests)
            want_sections, figures = PAGES[name]
            assert visit.facts["sections"] == want_sections and visit.facts["svgs"] == figures
            assert visit.facts["scripts"] == 0 and visit.facts["links"] == 0
            assert visit.screenshot.startswith(b"\x89PNG") and len(visit.screenshot) > 10_000


def test_eval_json_with_html_carries_the_pages_comparison(pages: dict[str, Path], tmp_path: Path,
                                                           capsys) -> None:
    cands = pages["eval"].parent / "candidates.jsonl"
    argv = ["eval", "--candidates", str(cands), "--qrels", str(DL19 / "qrels.txt"), "--rel-level", "2",
            "--no-progress", "--json"]
    assert main(argv) == 0
    assert "comparison" not in json.loads(capsys.readouterr().out)
    assert main([*argv, "--html", str(tmp_path / "e.html")]) == 0
    data = json.loads(capsys.readouterr().out)
    ndcg = data["comparison"]["metrics"][0]
    assert ndcg["metric"] == "nDCG@10" and len(ndcg["per_query"]) == len(QIDS)
    assert ndcg["mean_a"] == pytest.approx(data["input"]["nDCG@10"])
    assert ndcg["mean_b"] == pytest.approx(data["reranked"]["nDCG@10"])
