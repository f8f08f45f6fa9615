"""The `--html` reports opened in a real headless Chromium: every figure there, no request leaving
the page, and the screenshots of docs/compare.md.

On TREC DL19 (BM25 top 100 with passage text, 43 judged queries, grade >= 2 relevant for Recall
and MRR), with the local backend (offline, deterministic), the CLI writes four pages into
bench/out/report/:

* `compare.html`: `compare input rerank:lambda=0.3 --fail-if-worse nDCG@10:0` (the known
  regression of the local backend at lambda 0.3 against BM25 on DL19, docs/compare.md);
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
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.browser import Browser, find_chromium, page_url  # noqa: E402
from tests.support.dl19 import DL19, PAGES, page_commands, write_candidates  # noqa: E402
from tests.support.shared_data import need  # noqa: E402

OUT = ROOT / "bench" / "out" / "report"
SHOTS = ROOT / "docs" / "img"


def write_pages() -> dict[str, Path]:
    need(DL19 / "bm25-top100.json")
    cands = write_candidates(OUT / "dl19-candidates.jsonl")
    commands = page_commands(cands, OUT, bias_depth=20)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    pages = {}
    for name, argv in commands.items():
        pages[name] = OUT / f"{name}.html"
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "rag_rerank", *argv, "--no-progress", "--html", str(pages[name])],
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
    pages = write_pages()
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
            want_sections, figures = PAGES[name]
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
