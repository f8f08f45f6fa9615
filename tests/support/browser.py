"""A real headless Chromium driven over the DevTools protocol (stdlib only, `--remote-debugging-pipe`):
open a page, record every request *the page* makes, read its DOM, take a screenshot.

Why the protocol rather than a net log: the browser itself talks to its update and account servers
whatever the flags (its `--log-net-log` shows clients2.google.com and accounts.google.com), which
says nothing about the page. The page's own `Network.requestWillBeSent` events are exactly what
the page asks for: its document, and nothing else for a self-contained report.

Used by `bench/report_browser.py` (screenshots for the docs) and `tests/test_report.py` (skipped
without a browser).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
)
PAGE_FACTS = """JSON.stringify({
  svgs: document.querySelectorAll('svg').length,
  sections: Array.from(document.querySelectorAll('section')).map(s => s.id),
  scripts: document.scripts.length,
  links: document.querySelectorAll('link').length,
  title: document.title,
  width: document.documentElement.scrollWidth,
  height: document.documentElement.scrollHeight})"""


def find_chromium() -> str | None:
    """The Chromium binary (Debian's `chromium`), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


@dataclass(frozen=True)
class PageVisit:
    """What the browser saw: every URL the page requested, the DOM's facts, the screenshot (PNG)."""

    requests: tuple[str, ...]
    facts: dict[str, Any]
    screenshot: bytes


class Browser:
    """One headless Chromium process with a fresh profile, spoken to over a pipe (fds 3 and 4)."""

    def __init__(self, binary: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="rag-rerank-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds() -> None:  # the child's fd 3 reads our commands, fd 4 writes its answers
            import fcntl

            high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)  # out of the way of 3 and 4 first
            high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=fds,
            pass_fds=(3, 4),
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a browser that already died still gets reaped below
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for fd in (self._to_child, self._from_child):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)

    def _read_message(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_child], [], [], left)[0]:
                raise TimeoutError("the browser did not answer in time")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise ConnectionError("the browser closed its pipe")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def send(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its answer; events met meanwhile are kept in `events`."""
        self._next += 1
        ident = self._next
        message: dict[str, Any] = {"id": ident, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == ident:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, session: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not any(e.get("method") == method and e.get("sessionId") == session for e in self.events):
            self.events.append(self._read_message(deadline))

    def visit(self, url: str, width: int = 1100, settle: float = 0.5) -> PageVisit:
        """Open `url` in a new tab: the page's requests, its DOM facts, a full-page screenshot."""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Network.enable", session)
        self.send("Page.enable", session)
        self.send(
            "Emulation.setDeviceMetricsOverride",
            session,
            width=width,
            height=900,
            deviceScaleFactor=1,
            mobile=False,
        )
        self.events.clear()
        self.send("Page.navigate", session, url=url)
        self.wait_for("Page.loadEventFired", session, self.timeout)
        end = time.monotonic() + settle  # late requests (a lazy image, a timer) still get counted
        while time.monotonic() < end:
            try:
                self.events.append(self._read_message(end))
            except TimeoutError:
                break
        facts = json.loads(
            self.send("Runtime.evaluate", session, expression=PAGE_FACTS, returnByValue=True)["result"][
                "value"
            ]
        )
        self.send(
            "Emulation.setDeviceMetricsOverride",
            session,
            width=width,
            height=int(facts["height"]),
            deviceScaleFactor=1,
            mobile=False,
        )
        shot = self.send("Page.captureScreenshot", session, format="png")["data"]
        requests = tuple(
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent" and e.get("sessionId") == session
        )
        self.send("Target.closeTarget", targetId=target)
        return PageVisit(requests, facts, base64.b64decode(shot))


def page_url(path: Path) -> str:
    return path.resolve().as_uri()


__all__ = ["FLAGS", "Browser", "PageVisit", "find_chromium", "page_url"]
