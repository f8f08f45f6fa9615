"""Text in and out for the commands: a user-named file (or stdin) read as UTF-8, and a list of
violations turned into a bounded list of lines.

The commands (`cli/`), the batch file format and the evaluation all need these; they live here,
below all of them, so the library never depends on the CLI (the CLI is a thin layer on top of it,
not the other way round).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import UsageError, Violation, whole_argument_first
from .guard.input import not_utf8

# A junk file can break the contract on every one of its lines; past this many, more lines only
# bury the first ones (usually the same mistake repeated) and make a terminal or a CI log unreadable.
MAX_SHOWN_VIOLATIONS = 50


def violation_lines(violations: Sequence[Violation], limit: int = MAX_SHOWN_VIOLATIONS) -> list[str]:
    """The first `limit` violations as text, then one line with how many were left out and the total,
    so a capped list still tells the user how much is wrong. A list that is cut shows the
    whole-argument problems (the size limit) first."""
    if len(violations) > limit:
        violations = whole_argument_first(violations)
    shown = [str(v) for v in violations[:limit]]
    hidden = len(violations) - len(shown)
    if hidden > 0:
        shown.append(f"... and {hidden} more violation{'s' if hidden != 1 else ''} "
                     f"({len(violations)} total)")
    return shown


def read_text(source: str, what: str = "chunks") -> str:
    """The contents of FILE, or of stdin for '-', as text; a `UsageError` naming the option otherwise.

    `what` names the option the path came from (`chunks` -> `--chunks`); a name in capitals is a
    positional argument and is shown as is (`OUTPUT_FILE`)."""
    label = what if what.isupper() else f"--{what}"
    if source == "-":
        if sys.stdin is None:  # started with stdin closed (`<&-`)
            raise UsageError(f"{label}: '-' reads stdin, but stdin is closed")
        if sys.stdin.isatty():  # nothing piped in: say what it waits for instead of hanging silently
            print(f"rag-rerank: reading {label} from the terminal; paste it, then press Ctrl-D "
                  "(Ctrl-Z Enter on Windows)", file=sys.stderr)
        data = sys.stdin.buffer.read()
        name = "<stdin>"
    else:
        path = Path(source)
        if path.is_dir():
            raise UsageError(f"{label}: {source} is a directory, not a file")
        if not path.exists():  # not is_file(): a pipe (`-c <(jq -c '.[]' chunks.json)`, a FIFO) is read too
            raise UsageError(f"{label}: no such file: {source}")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise UsageError(f"{label}: cannot read {source}: {exc.strerror}") from None
        name = source
    try:
        return data.decode("utf-8-sig")  # a BOM (Windows editors) is not part of the content
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1

        raise UsageError(f"{name}: line {line}: {not_utf8(data, exc)}") from None


__all__ = ["MAX_SHOWN_VIOLATIONS", "read_text", "violation_lines"]
