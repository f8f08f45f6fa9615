"""How a bench script reports failed calls: on stdout, and in its exit code.

A bench whose calls fail measures something else than it says: a query that raised keeps its input
order (or is left out of a total), a timing loop stops half-way. Such a run must not look like a
clean one. Every script under `bench/` counts the calls it makes through one `Tally`, and ends
through `finish`, which

* prints, as the last line on stdout, `FAILED: 3 of 86 calls raised; first: <where>: <error>` when
  any call failed (stderr alone is lost when the table is piped into a file), and
* returns 1 then (0 otherwise), the script's exit code.

A script that cannot go on after a failure (a timing loop, a fit) lets the exception escape:
`run_bench(main)` catches it, records it as one more failed call, and ends the same way, so a crash is
never only a traceback on stderr.

    from failures import TALLY, run_bench
    ...
    TALLY.call("query 1037798", rerank, query, chunks)   # counted; a failure is recorded, None returned
    TALLY.add(43, {"1037798": "InternalError: ..."}, where="local + lexical, top-50")
    ...
    if __name__ == "__main__":
        sys.exit(run_bench(main))
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def describe(error: BaseException) -> str:
    """`Type: message` on one line, cut to 300 characters."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}"[:300]


class Tally:
    """Calls made and calls failed by one bench run."""

    def __init__(self) -> None:
        self.calls = 0
        self.failures: list[str] = []

    def call(self, where: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """`fn(*args, **kwargs)`, counted; an exception is recorded (with `where`) and None returned."""
        self.calls += 1
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # every failure is counted and reported, never swallowed
            self.failures.append(f"{where}: {describe(exc)}")
            return None

    def count(self, n: int = 1) -> None:
        """`n` calls made (and succeeded, unless `fail` says otherwise)."""
        self.calls += n

    def fail(self, where: str, error: BaseException | str) -> None:
        """One counted call failed."""
        self.failures.append(f"{where}: {error if isinstance(error, str) else describe(error)}")

    def add(self, calls: int, failed: Mapping[str, str], where: str = "") -> None:
        """`calls` calls made, of which `failed` (what -> error message) failed: an `evaluate()`
        report's `n_queries` and `failed`."""
        self.calls += calls
        prefix = f"{where}, " if where else ""
        self.failures += [f"{prefix}{what}: {' '.join(str(msg).split())[:300]}"
                          for what, msg in failed.items()]

    @property
    def failed(self) -> int:
        return len(self.failures)

    def summary(self) -> str | None:
        """The FAILED line, or None when every call succeeded."""
        if not self.failures:
            return None
        calls = max(self.calls, self.failed)
        return f"FAILED: {self.failed} of {calls} calls raised; first: {self.failures[0]}"

    def finish(self, code: int | None = 0) -> int:
        """Print the FAILED line on stdout if any call failed; the exit code (1 then, else `code`)."""
        line = self.summary()
        if line is None:
            return code or 0
        sys.stdout.flush()
        print(line, flush=True)
        return 1


TALLY = Tally()


def run_bench(main: Callable[[], int | None], tally: Tally = TALLY) -> int:
    """Run a bench's `main` and end it through `tally`: an exception that escapes `main` is one
    more failed call (its traceback still goes to stderr), reported on stdout with the others."""
    try:
        code = main()
    except Exception as exc:  # a crash is a failed run: say so on stdout, exit 1
        traceback.print_exc()
        tally.calls += 1
        tally.fail("the run stopped", exc)
        return tally.finish(1)
    return tally.finish(code if isinstance(code, int) else 0)
