"""The `--html` reports opened in a real headless Chromium: every figure there, no request leaving
the page, and the screenshots of docs/compare.md.

On TREC DL19 (BM25 top 100 with passage text, 43 judged queries, grade >= 2 relevant for Recall
and MRR), with the local backend (offline, deterministic), the CLI writes four pages into
bench/out/report/:

* `compare.html`: `compare input rerank:lambda=0.7 --fail-if-worse nDCG@10:0` (the known
  regression of the local backend against BM25 on DL19, docs/quality.md);
* `eval.html`, `bias.html` (depth 20) and `calibrate.html` (half the queries fit, half measure).

Each page is opened in Debian's Chromium (headless, fresh profile, background networking off)
driven over the DevTools protocol (tests/support/browser.py): the page's own requests (the
protocol's Network.requestWillBeSent events for its tab, not the browser's update checks) must be
the page itself and nothing else, and its DOM must hold each section and figure. A control page
with one remote image must show that image's request, so a check that sees nothing cannot pass
for one that looked. The screenshots go to docs/img/ (palette PNG, to keep the repository small).

    python bench/report_browser.py                 # needs chromium (apt-get install chromium)
    python bench/report_browser.py --no-screenshots
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.browser import Browser, find_chromium, page_url  # noqa: E402
from tests.support.shared_data import data_dir, need  # noqa: E402

DL19 = data_dir() / "trec-dl19"
OUT = ROOT / "bench" / "out" / "report"
SHOTS = ROOT / "docs" / "img"
EXPECTED = {
    "compare": (["comparison"], 3),
    "eval": (["eval", "comparison"], 3),
    "bias": (["bias"], 1),
    "calibrate": (["calibration"], 1),
}


def candidates() -> Path:
    need(DL19 / "bm25-top100.json")
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "dl19-candidates.jsonl"
    rows = []
    for item in json.loads((DL19 / "bm25-top100.json").read_text(encoding="utf-8")):
        hits = sorted(item["hits"], key=lambda h: h["rank"])
        rows.append(
            {
                "qid": str(hits[0]["qid"]),
                "query": item["query"],
                "chunks": [{"id": h["docid"], "text": h["content"]} for h in hits],
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_pages(cands: Path) -> dict[str, Path]:
    qrels = str(DL19 / "qrels.txt")
    quiet = ["--no-progress"]
    commands = {
        "compare": [
            "compare",
            "input",
            "rerank:lambda=0.7",
            "--candidates",
            str(cands),
            "--qrels",
            qrels,
            "--rel-level",
            "2",
            "--fail-if-worse",
            "nDCG@10:0",
            *quiet,
        ],
        "eval": ["eval", "--candidates", str(cands), "--qrels", qrels, "--rel-level", "2", *quiet],
        "bias": ["bias", "--candidates", str(cands), "--depth", "20", *quiet],
        "calibrate": [
            "calibrate",
            "--candidates",
            str(cands),
            "--qrels",
            qrels,
            "--rel-level",
            "2",
            "-o",
            str(OUT / "calibration.json"),
            *quiet,
        ],
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    pages = {}
    for name, argv in commands.items():
        pages[name] = OUT / f"{name}.html"
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "rag_rerank", *argv, "--html", str(pages[name])],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode not in (0, 1) or not pages[name].is_file():
            raise SystemExit(f"rag-rerank {name} failed ({done.returncode}): {done.stderr.strip()}")
        print(
            f"wrote {pages[name].relative_to(ROOT)} ({pages[name].stat().st_size // 1024} KiB) with "
            f"`rag-rerank {name}` in {time.perf_counter() - started:.1f} s (exit {done.returncode})"
        )
    return pages


def small_png(data: bytes) -> bytes:
    """The screenshot as a 64-colour palette PNG (text and flat charts lose nothing visible)."""
    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGB").quantize(colors=64)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--no-screenshots", action="store_true", help="check the pages, write no image into docs/"
    )
    args = ap.parse_args()
    binary = find_chromium()
    if binary is None:
        raise SystemExit("no chromium found: apt-get install chromium (Debian), then run this again")
    pages = write_pages(candidates())
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    print(f"\nbrowser: {version}, headless, fresh profile; load average {os.getloadavg()}")
    print(
        f"{'page':<12}{'requests':>9}{'other than the page':>21}{'svg':>5}{'sections':>22}{'height px':>11}"
    )
    failures = []
    with Browser(binary) as browser:
        control = OUT / "control-with-a-remote-image.html"
        control.write_text('<p>control</p><img src="http://127.0.0.1:9/pixel.png">', encoding="utf-8")
        seen = browser.visit(page_url(control))
        leaked = [u for u in seen.requests if u != page_url(control)]
        print(
            f"{'control':<12}{len(seen.requests):>9}{len(leaked):>21}{seen.facts['svgs']:>5}{'-':>22}"
            f"{seen.facts['height']:>11}"
        )
        if leaked != ["http://127.0.0.1:9/pixel.png"]:
            failures.append(f"the control page's remote image was not seen: {seen.requests}")
        for name, path in pages.items():
            visit = browser.visit(page_url(path))
            others = [u for u in visit.requests if u != page_url(path)]
            facts = visit.facts
            print(
                f"{name:<12}{len(visit.requests):>9}{len(others):>21}{facts['svgs']:>5}"
                f"{','.join(facts['sections']):>22}{facts['height']:>11}"
            )
            want_sections, figures = EXPECTED[name]
            if others:
                failures.append(f"{name}: requests leave the page: {others}")
            if facts["sections"] != want_sections or facts["svgs"] != figures or facts["scripts"]:
                failures.append(
                    f"{name}: expected sections {want_sections} and {figures} figures, got {facts}"
                )
            if not args.no_screenshots:
                SHOTS.mkdir(parents=True, exist_ok=True)
                shot = SHOTS / f"report-{name}.png"
                shot.write_bytes(small_png(visit.screenshot))
                print(f"{'':<12}screenshot {shot.relative_to(ROOT)} ({shot.stat().st_size // 1024} KiB)")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        raise SystemExit(1)
    print("every page: its sections and figures rendered, no request but the page itself")


if __name__ == "__main__":
    main()
