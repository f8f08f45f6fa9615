"""The batch file format: one request per input line, one record per output line, in input order.

`rag-rerank batch` (the local engine and Ray's) reads one `{query, chunks, top_k?, lambda?,
window_size?, query_id?, ...}` object per input line and writes one JSONL line per input line:

    {"line": n, "query_id": ..., "result": {ranked, dropped}, "meta": {...}, "config": {...}}
    {"line": n, "query_id": ..., "error": {"kind": "input"|"backend"|"internal", "message": ..., ...}, ...}

Lines are written as soon as every earlier line is done (`OrderedWriter`), so the output file is
always a prefix of the input: `--resume` keeps the complete lines already there (`read_done`,
cutting off a half-written last line from a crash), skips their line numbers, and appends the rest.
Nothing is done twice or lost. Every record carries the run's `config` (`record_config`: backend,
model, base_url without credentials, embedder, ... whatever decides a result), so `--resume`
refuses a file written with other settings (`check_config`).
Exit code (`exit_code`): 0 every line ok, 3 some line had a backend failure, otherwise 2 some
line had bad input (4 an internal error), over the whole output file, resumed lines included.

One module for the format, with public names, because two engines write it: the local one
(`cli/batch.py`) and Ray's (`integrations/ray.py`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from .backends.factory import name_of, resolve_embedder
from .errors import BackendError, CacheMissError, InputError, RerankError, Violation
from .guard.input import duplicate_keys_message, json_problem, loads_line
from .guard.limits import as_limits, load_limits
from .models import RerankResult
from .options import SCORING_OPTIONS
from .redaction import display_url, scrub
from .runconfig import config_difference, embedder_server
from .textio import violation_lines
from .wording import near_miss

EXIT_OK, EXIT_BAD_INPUT, EXIT_BACKEND, EXIT_INTERNAL = 0, 2, 3, 4
LINE_KEYS = frozenset({"query", "chunks", "top_k", "lambda", "query_id", "qid", "window_size",
                       "max_tokens_per_chunk", *SCORING_OPTIONS})
_ALLOWED = ", ".join(sorted(LINE_KEYS))  # named in an unknown key's message (sorted once, not per line)
MAX_MESSAGE_VIOLATIONS = 10  # violations quoted in one error record's one-line `message`

Outcome = RerankResult | Exception


@dataclass(frozen=True)
class Line:
    number: int
    query_id: Any
    item: Mapping[str, Any] | Exception


def parse_input(text: str) -> list[Line]:
    """One `Line` per non-blank input line; a line that is not a valid request object carries an
    `InputError` naming the line instead of stopping the batch."""
    out: list[Line] = []
    text = text.removeprefix("\ufeff")  # a BOM from some editors is not part of line 1's JSON
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            obj, dupes = loads_line(raw)
        except (ValueError, RecursionError) as exc:
            reason = json_problem(exc)
            out.append(
                Line(
                    number,
                    None,
                    InputError([Violation(path="$", message=f"not valid JSON ({reason})", line=number)]),
                )
            )
            continue
        if dupes:
            # json would keep the last value: `{"id": "a", "id": "b"}` silently read as id b
            qid = obj.get("query_id", obj.get("qid")) if isinstance(obj, dict) else None
            bad = Violation(path="$", message=duplicate_keys_message(dupes), line=number, value=dupes)
            out.append(Line(number, qid, InputError([bad])))
            continue
        if not isinstance(obj, dict):
            msg = f"a batch line must be a JSON object, got {type(obj).__name__}"
            out.append(Line(number, None, InputError([Violation(path="$", message=msg, line=number)])))
            continue
        qid = obj.get("query_id", obj.get("qid"))
        problems = [
            Violation(path="$", message=f"unknown key {k!r}{near_miss(k, LINE_KEYS)} (allowed: {_ALLOWED})",
                      line=number)
            for k in obj
            if k not in LINE_KEYS
        ]
        for key in ("query", "chunks"):
            if key not in obj:
                problems.append(Violation(path=key, message=f"missing required field '{key}'", line=number))
        out.append(Line(number, qid, InputError(problems) if problems else obj))
    return out


def looks_like_chunks(text: str) -> bool:
    """Whether `text` reads as a chunks file (`{id, text, ...}` per line, as `rerank -c` takes) rather
    than batch requests: every non-blank line an object with `id` and `text` and neither `query`
    nor `chunks`. Then one message says so, instead of the same "unknown key 'id'" on every line.
    Stops at the first line that is not a chunk."""
    seen = False
    for raw in text.removeprefix("\ufeff").split("\n"):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            return False
        chunk = isinstance(obj, dict) and "id" in obj and "text" in obj
        if not chunk or {"query", "chunks"} & set(obj):
            return False
        seen = True
    return seen


def error_kind(exc: Exception) -> str:
    """"input" (the caller can fix it), "backend" (every attempt failed, or a replay found no
    recorded answer) or "internal" (a bug)."""
    if isinstance(exc, (BackendError, CacheMissError)):
        return "backend"
    return "input" if isinstance(exc, RerankError) else "internal"


def error_record(exc: Exception, secrets: Sequence[str | None]) -> dict[str, Any]:
    if isinstance(exc, InputError):

        # One numbering: the record's "line" is the input line; a violation's own line (of a
        # chunks value given as JSONL text inside that line) is left out, its path
        # (`chunks[3]`) already names the record.
        violations = [replace(v, line=None) for v in exc.violations]
        # `message` becomes one stderr line, so it is capped harder than the CLI's line-per-violation
        # lists (a request of 10,000 bad chunks must not print a megabyte on one line); the count
        # of the rest is kept, and `violations` keeps every one for programs.
        return {
            "kind": "input",
            "message": "; ".join(violation_lines(violations, MAX_MESSAGE_VIOLATIONS)) or exc.headline,
            "violations": [v.to_dict() for v in violations],
        }
    if isinstance(exc, BackendError):
        head = str(exc).split(" [#", 1)[0]
        if exc.attempts:  # the cause (an HTTP status, a timeout), not only "no valid answer"
            last = exc.attempts[-1]
            head += f"; last attempt #{last.number} {last.kind}: {last.detail}"
        return {
            "kind": "backend",
            "message": scrub(head, secrets),
            "attempts": [
                {"number": a.number, "kind": a.kind, "detail": scrub(a.detail, secrets), "wait_s": a.wait_s}
                for a in exc.attempts
            ],
        }
    if isinstance(exc, RerankError):
        return {"kind": error_kind(exc), "message": scrub(str(exc), secrets)}
    return {"kind": "internal", "message": scrub(f"{type(exc).__name__}: {exc}", secrets)}


def record(line: Line, outcome: Outcome, secrets: Sequence[str | None],
           scores: bool = False) -> dict[str, Any]:
    """One output line for `line`: the card's object under "result" and "meta", or "error"; with
    `scores` (`batch --scores`), every input id's score under "scores" beside them."""
    rec: dict[str, Any] = {"line": line.number}
    if line.query_id is not None:
        rec["query_id"] = line.query_id
    if isinstance(outcome, RerankResult):
        rec["result"] = outcome.to_dict()
        rec["meta"] = outcome.meta.to_dict()
        if scores:
            rec["scores"] = dict(outcome.scores)
    else:
        rec["error"] = error_record(outcome, secrets)
    return rec


def read_done(path: Path) -> tuple[dict[int, dict[str, Any]], int]:
    """The records already in an output file, keyed by input line number, and the byte length of
    its complete lines. Only a last line without its newline (a write cut short by a crash) is
    left out, to be cut off; a complete line that is not one of our records means the file is not
    a batch output, and it is refused (`InputError`) rather than truncated."""
    done: dict[int, dict[str, Any]] = {}
    if not path.exists():
        return done, 0
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(
            [Violation(path=str(path), message=f"cannot read --output for --resume: {exc.strerror}")]
        ) from None
    valid_end = data.rfind(b"\n") + 1
    for number, raw in enumerate(data[:valid_end].split(b"\n")[:-1], start=1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw.decode("utf-8"))
        except ValueError:
            rec = None
        if not (
            isinstance(rec, dict) and isinstance(rec.get("line"), int) and ("result" in rec or "error" in rec)
        ):
            raise InputError(
                [
                    Violation(
                        path=str(path),
                        line=number,
                        message="not a rag-rerank batch record; "
                        "--resume only continues a file written by `rag-rerank batch`",
                    )
                ]
            )
        done.setdefault(rec["line"], rec)
    return done, valid_end


def exit_code(records: Iterable[Mapping[str, Any]]) -> int:
    return exit_code_for({r["error"].get("kind") for r in records if isinstance(r.get("error"), Mapping)})


def exit_code_for(kinds: set[Any]) -> int:
    """The CLI exit code for a run whose failures were of these kinds: the worst one decides."""
    if "internal" in kinds:
        return EXIT_INTERNAL
    if "backend" in kinds:
        return EXIT_BACKEND
    if kinds:
        return EXIT_BAD_INPUT
    return EXIT_OK


class OrderedWriter:
    """Writes records in input order as soon as each one's predecessors are written."""

    def __init__(self, stream: IO[str], order: Sequence[int]) -> None:
        self.stream, self.order, self.pending, self.next = stream, order, {}, 0
        self.written: list[dict[str, Any]] = []

    def add(self, index: int, rec: dict[str, Any]) -> None:
        self.pending[index] = rec
        while self.next < len(self.order) and self.next in self.pending:
            out = self.pending.pop(self.next)
            self.stream.write(json.dumps(out, ensure_ascii=False) + "\n")
            self.stream.flush()
            self.written.append(out)
            self.next += 1


# Backend knobs that decide how fast it answers, not what (a cross-encoder's device and batch size,
# an HTTP backend's transport): a resumed run may change them.
SPEED_KNOBS = frozenset({"device", "batch_size", "http"})


def record_config(options: Mapping[str, Any]) -> dict[str, Any]:
    """What decides a batch record's result, as the CLI writes it in the record's `config`.

    `options` are the run's `arerank` options as the CLI passes them (backend, model, base_url, embedder,
    fallback, policy, backend_options, layout, strict, window_size, max_tokens_per_chunk and the metadata
    options). Recorded: the backend by name, its model and server, the embedder by name and, for an
    embeddings server, its URL; the fallback; the LLM's output budget (`policy.max_tokens`); the backend's
    scoring knobs; the layout, strict parsing, window size, the cap on a chunk's tokens and the metadata
    options; and the contract's default top_k and lambda, which a line without its own takes. A line's own
    settings are in its input line, not here. Left out: credentials (URLs are shown as `display_url` shows
    them; the api key never), and what only decides how fast a run goes or how long it waits (concurrency,
    the engine and workers, the deadline, a cross-encoder's device and batch size, the HTTP transport),
    which a resumed run may change. JSON values only, as they read back.
    """

    backend = options.get("backend", "local")
    embedder = resolve_embedder(options.get("embedder", "lexical"), backend, options.get("base_url"))
    limits = load_limits()
    name = backend if isinstance(backend, str) else name_of(backend)
    config: dict[str, Any] = {
        "backend": name,
        "model": options.get("model"),
        "base_url": display_url(options.get("base_url")),
        "embedder": str(getattr(embedder, "name", embedder)),
        **embedder_server(embedder),
        "fallback": options.get("fallback"),
        "max_tokens": getattr(options.get("policy"), "max_tokens", None),
        "layout": options.get("layout", "mmr"),
        "strict": bool(options.get("strict", False)),
        "window_size": options.get("window_size"),
        "default_top_k": limits.default_top_k,
        "default_lambda": limits.default_lambda,
    }
    knobs = {k: v for k, v in (options.get("backend_options") or {}).items() if k not in SPEED_KNOBS}
    if knobs:
        config["backend_options"] = knobs
    # The metadata options change which chunks rank first, the duplicate threshold and the minimum
    # score which are kept: recorded when set.
    # So does the cap on a chunk's tokens: a chunk shown as its evidence ranks differently.
    for name in (*SCORING_OPTIONS, "duplicate_threshold", "max_tokens_per_chunk"):
        if options.get(name) is not None:
            config[name] = options[name]
    if options.get("limits") is not None:
        config["min_score"] = as_limits(options["limits"]).min_score
    result: dict[str, Any] = json.loads(json.dumps(config))  # lists, not tuples: as the file reads back
    return result


def check_config(done: Mapping[int, Mapping[str, Any]], config: Mapping[str, Any], output: str) -> None:
    """Every record being resumed must have been written with this run's configuration: a file
    half written by one backend, model or embedder and finished by another would mix two systems'
    results without a word (as `eval --resume` refuses a header of another configuration)."""
    for number in sorted(done):
        rec = done[number]
        if rec.get("config") == config:
            continue
        if "config" not in rec:
            msg = (f"--resume: {output}'s record of input line {number} does not say which configuration "
                   "wrote it (written before batch records carried their 'config'), so this run cannot "
                   "tell whether its settings match; start again with --overwrite, or use a new --output")
        else:
            msg = (f"--resume: {output} was written with another configuration (record of input line "
                   f"{number}: {config_difference(rec['config'], config)}); resume with the same settings, "
                   "or start again with --overwrite, or use a new --output")
        raise InputError([Violation(path="--output", message=msg)])


def check_resumed(done: Mapping[int, Mapping[str, Any]], lines: Sequence[Line], output: str) -> None:
    """A record for a line the input does not have means --output was written for another input:
    resuming would skip the wrong lines and keep foreign results."""
    numbers = {ln.number for ln in lines}
    foreign = sorted(n for n in done if n not in numbers)
    if foreign:
        shown = ", ".join(str(n) for n in foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        last = max(numbers)
        which = "line" if len(foreign) == 1 else "lines"
        msg = (f"--resume: {output} holds records for input {which} {shown}, which the input (requests "
               f"on lines 1-{last}) does not have; it was written for another input, use a new --output")
        raise InputError([Violation(path="--output", message=msg, value=foreign)])


__all__ = ["EXIT_BACKEND", "EXIT_BAD_INPUT", "EXIT_INTERNAL", "EXIT_OK", "LINE_KEYS", "Line", "OrderedWriter",
           "Outcome", "check_config", "check_resumed", "error_kind", "error_record", "exit_code",
           "exit_code_for", "looks_like_chunks", "parse_input", "read_done", "record", "record_config"]
