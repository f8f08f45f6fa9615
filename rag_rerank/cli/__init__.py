"""`rag-rerank`: argument parsing and exit codes; each command lives in a module of its own here
(`rerank`, `render`, `check`, `route`, `golden`, `batch`, `eval`, `compare`, `bias`, `calibrate`, `mcp`,
`cache`, `serve`), and the work happens in the library, which never imports this package.

Exit codes: 0 ok · 1 invalid LLM output (`check`), a golden regression, a failed `compare` gate ·
2 bad input or usage · 3 backend failure · 4 internal error · 130 interrupted. Errors go to
stderr, one line each, naming the line / id / field / limit at fault (`common.py`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from ..errors import (
    BackendError,
    CacheMissError,
    InputError,
    MissingDependencyError,
    OutputError,
    RerankError,
    UsageError,
)
from ..guard.input import PATH_HINT
from . import batch, bias, cache, calibrate, check, compare, golden, mcp, render, rerank, route, serve
from . import eval as eval_command
from .common import (
    EXIT_BACKEND,
    EXIT_BAD_INPUT,
    EXIT_INTERNAL,
    EXIT_INVALID_OUTPUT,
    EXIT_OK,
    err,
    print_violations,
)

DESCRIPTION = """\
Rerank retrieved chunks for a query with an LLM (or the offline local scorer): the best top-k
with a score and a concrete reason each, MMR-diverse, ids kept byte for byte, and every chunk
left out listed in `dropped` with its reason."""

EPILOG = """\
examples:
  rag-rerank rerank -q "When should I prefer IVF over HNSW?" -c chunks.jsonl -k 3
  rag-rerank rerank -q "..." -c chunks.jsonl --backend openai --base-url http://127.0.0.1:8000/v1
  rag-rerank check -c chunks.jsonl -k 3 answer.json

exit codes: 0 ok, 1 invalid LLM output (check) or a golden regression (or a failed compare
gate), 2 bad input or usage, 3 backend failure, 4 internal error (RAG_RERANK_DEBUG=1 shows the
traceback), 130 interrupted.
Run `rag-rerank COMMAND --help` for a command's options."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (and exit 2) instead of a usage block."""

    def error(self, message: str) -> NoReturn:
        hint = ""
        if re.search(r"(?:^|\s)--api[-_]?key\b", message.partition("unrecognized arguments:")[2]):
            # `--api-key KEY` is what every SDK user tries first. Keys come from the environment
            # only (on the command line a key is visible in `ps` and kept in the shell history);
            # the key itself is not echoed back.
            message = _KEY_FLAG.sub(r"\1\2***", message)
            hint = ("; the CLI takes no API key flag: set OPENAI_API_KEY, ANTHROPIC_API_KEY or "
                    "RERANK_API_KEY (a server on 127.0.0.1 / localhost needs none)")
        err(f"{self.prog.removeprefix('rag-rerank').strip() or 'usage'}: error: {message} "
             f"(see {self.prog} --help){hint}")
        raise SystemExit(EXIT_BAD_INPUT)


_KEY_FLAG = re.compile(r"((?:^|\s)--api[-_]?key)([=\s])\S+")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = _Parser(prog="rag-rerank", description=DESCRIPTION, epilog=EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def command(name: str, summary: str, description: str | None = None) -> argparse.ArgumentParser:
        # The summary is the line in `rag-rerank --help`; `rag-rerank NAME --help` shows it too.
        # A description is laid out as written (so a pip command is never broken across lines).
        if description is not None:
            return sub.add_parser(name, help=summary, description=description,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        return sub.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".")

    for module in (rerank, render, check, route, golden, batch, eval_command, compare, bias, calibrate, mcp,
                   cache, serve):
        module.register(command)
    return parser


def _dispatch(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return func(args)
    except InputError as exc:
        print_violations(exc.violations)
        return EXIT_BAD_INPUT
    except OutputError as exc:
        print_violations(exc.violations, prefix="invalid")
        return EXIT_INVALID_OUTPUT
    except (BackendError, CacheMissError) as exc:
        err(f"backend failure: {exc}")
        return EXIT_BACKEND
    except (UsageError, MissingDependencyError) as exc:
        err(f"error: {exc}")
        return EXIT_BAD_INPUT
    except RerankError as exc:
        err(f"error: {exc}")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        err("interrupted")
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_OK
    except OSError as exc:  # the environment, not a bug: stdout on a full disk, an unreadable stdin
        if os.environ.get("RAG_RERANK_DEBUG"):
            raise
        where = f": {exc.filename}" if exc.filename else ""
        err(f"error: I/O error: {exc.strerror or exc}{where}")
        return EXIT_BAD_INPUT
    except Exception as exc:  # never a traceback for a user; RAG_RERANK_DEBUG=1 shows it
        if os.environ.get("RAG_RERANK_DEBUG"):
            raise
        err(f"internal error: {type(exc).__name__}: {exc} (set RAG_RERANK_DEBUG=1 for the traceback)")
        return EXIT_INTERNAL


def _quiet_stdout() -> None:
    """The reader of stdout went away (`rag-rerank batch | head`): point stdout at /dev/null so
    the interpreter's final flush does not print a BrokenPipeError of its own."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout replaced by an object without a descriptor
        pass


def _utf8_stdout() -> None:
    """Results are JSON on stdout, and JSON between programs is UTF-8 (RFC 8259). A stdout whose
    encoding cannot carry every character (a pipe on Windows in cp1252, PYTHONIOENCODING=ascii)
    ended a run at the first non-ASCII id with a UnicodeEncodeError (exit 4), after the work was
    done: such a pipe or file is switched to UTF-8; a terminal keeps its encoding and shows what it
    cannot display escaped. (stderr already escapes: Python opens it with backslashreplace.)"""
    import codecs

    stream = sys.stdout
    try:
        if codecs.lookup(stream.encoding or "").name == "utf-8":
            return
    except (LookupError, AttributeError, TypeError):
        pass
    try:
        if stream.isatty():
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        else:
            stream.reconfigure(encoding="utf-8")  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):  # not a TextIOWrapper (replaced by a caller): leave it
        pass


def main(argv: Sequence[str] | None = None) -> int:
    _utf8_stdout()
    parser = build_parser()
    try:
        args, extras = parser.parse_known_args(argv)
        if extras:
            # An unknown flag is the subcommand's usage error: its name and `--help` list the flags
            # it does take (argparse leaves it to the top-level parser: "see rag-rerank --help").
            commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extras)}")
    except SystemExit as exc:  # --help (0) or a usage error (2): a return code, so main() is testable
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    # A file name piped to `-c -` gets advice for the command line, not for Python callers.
    hint = PATH_HINT.set("; the chunks must be JSONL text: pass the file itself with -c FILE")
    try:
        return _dispatch(args.func, args)
    finally:
        PATH_HINT.reset(hint)


if __name__ == "__main__":
    sys.exit(main())
