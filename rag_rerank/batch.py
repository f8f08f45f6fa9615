"""Many reranks at once: bounded concurrency on one event loop, results in input order, resumable.

`arerank_many` runs requests through `arerank` with at most `concurrency` in flight
(an `asyncio.Semaphore`), sharing one backend instance (one HTTP connection pool) and one
embedder. A failed request becomes an exception in its slot instead of stopping the others.

`rag-rerank batch` reads one `{query, chunks, top_k?, lambda?, window_size?, query_id?}` object per
input line and writes one JSONL line per input line, in input order:

    {"line": n, "query_id": ..., "result": {ranked, dropped}, "meta": {...}}
    {"line": n, "query_id": ..., "error": {"kind": "input"|"backend"|"internal", "message": ..., ...}}

Lines are written as soon as every earlier line is done, so the output file is always a prefix
of the input: `--resume` keeps the complete lines already there (cutting off a half-written last
line from a crash), skips their line numbers, and appends the rest. Nothing is done twice or lost.
The CLI adds `"config": {...}` to every record (`record_config`: backend, model, base_url without
credentials, embedder, ... whatever decides a result), so `--resume` refuses a file written with
other settings, and an existing non-empty `--output` is replaced only with `--overwrite`.
Exit code: 0 every line ok, 3 some line had a backend failure, otherwise 2 some line had bad input
(4 an internal error). It is computed over the whole output file, resumed lines included.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from .backends.factory import backend_kwargs, make_backend, resolve_embedder
from .concurrency import CALL_LIMIT
from .errors import BackendError, InputError, RerankError, Violation
from .guard.input import PATH_HINT, duplicate_keys_message, json_problem, loads_line
from .models import RerankResult
from .redaction import display_url, scrub, secrets_of
from .rerank import aclose_built, arerank
from .runconfig import config_difference, embedder_server
from .wording import near_miss

EXIT_OK, EXIT_BAD_INPUT, EXIT_BACKEND, EXIT_INTERNAL = 0, 2, 3, 4
# Per-request scoring options a batch line (or an `arerank_many` request) may set for itself; they
# override the options given for the whole run.
SCORING_KEYS = ("meta_field", "meta_weight", "meta_ranking_mode", "meta_sort_order", "missing_meta",
                "meta_value_type", "embed_meta_fields")
_LINE_KEYS = frozenset({"query", "chunks", "top_k", "lambda", "query_id", "qid", "window_size",
                        *SCORING_KEYS})
MAX_MESSAGE_VIOLATIONS = 10  # violations quoted in one error record's one-line `message`

Outcome = RerankResult | Exception


def _shared_options(options: dict[str, Any]) -> dict[str, Any]:
    """Resolve the embedder and backend once, so every request reuses them (and their pools).

    Options that went through here already are returned as they are: a long-lived worker (a Ray
    actor) builds them once and hands them to `_run` for every batch."""
    if "_backend_name" in options:
        return dict(options)
    opts = dict(options)
    opts["embedder"] = resolve_embedder(
        opts.get("embedder", "lexical"), opts.get("backend", "local"), opts.get("base_url")
    )
    backend = opts.get("backend", "local")
    opts["backend"] = make_backend(
        backend,
        model=opts.get("model"),
        base_url=opts.get("base_url"),
        api_key=opts.get("api_key"),
        embedder=opts["embedder"],
        **backend_kwargs(backend, opts.pop("backend_options", None)),
    )
    name = options.get("backend", "local")
    opts["_backend_name"] = name if isinstance(name, str) else None
    return opts


# Keys of a request that are not `arerank` keywords; every other key of a request is passed to
# `arerank` as a keyword (a new per-request option such as `window_size` needs no change here).
_REQUEST_KEYS = frozenset({"query", "chunks", "top_k", "lambda", "lambda_", "query_id", "qid"})
# Built once per run and shared by every request (one model load, one connection pool): not per request.
_PER_RUN_KEYS = frozenset({"backend", "model", "base_url", "api_key", "embedder"})


# Added to an unknown request key's message; rerank_dataset sets it to name passthrough_columns, the
# way to keep a dataset column that is not a rerank option.
UNKNOWN_KEY_HINT: contextvars.ContextVar[str] = contextvars.ContextVar("UNKNOWN_KEY_HINT", default="")


def _extra_args(item: Mapping[str, Any], opts: Mapping[str, Any]) -> dict[str, Any]:
    """The request's keys beyond the basics, as `arerank` keywords.

    A key `arerank` does not take, one that is built once per run, or one already set for the
    whole run is an `InputError` naming it (a TypeError from deep inside would be an internal error).
    """
    extra = {k: v for k, v in item.items() if k not in _REQUEST_KEYS}
    if not extra:
        return extra
    params = inspect.signature(arerank).parameters
    per_request = sorted(
        k
        for k, p in params.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and k not in _PER_RUN_KEYS and k not in opts
    )
    bad = [k for k in extra if k not in per_request]
    if bad:
        takes = sorted({"query", "chunks", "top_k", "lambda", "query_id", *per_request})
        allowed = ", ".join(takes)

        def message(k: Any) -> str:
            # A key arerank() does not take at all is a typo to name as such ('topk' -> 'top_k'), not
            # an option that "cannot be set per request".
            if k not in params and k not in opts:
                return (f"unknown key {k!r}{near_miss(str(k), takes)} (a request takes: {allowed})"
                        f"{UNKNOWN_KEY_HINT.get()}")
            return (f"{k!r} cannot be set per request (a request takes: {allowed}"
                    + (f"; {k!r} is set for the whole run" if k in opts or k in _PER_RUN_KEYS else "") + ")")

        raise InputError([Violation(path=str(k), message=message(k)) for k in bad])
    return extra


def _request_args(item: Any) -> tuple[Any, Any, Any, Any]:
    if not isinstance(item, Mapping):
        raise InputError(
            [
                Violation(
                    path="request",
                    message="a request must be a mapping "
                    f"{{query, chunks, top_k?, lambda?}}, got {type(item).__name__}",
                )
            ]
        )
    # An absent key is named as missing, as a batch file's line is (not "got null": the caller
    # wrote no null; a Ray row's null column reaches here as an absent key too).
    missing = [Violation(path=key, message=f"missing required field '{key}'")
               for key in ("query", "chunks") if key not in item]
    if missing:
        raise InputError(missing)
    lam = item.get("lambda", item.get("lambda_"))
    return item.get("query"), item.get("chunks"), item.get("top_k"), lam


async def _run(
    items: Sequence[Mapping[str, Any] | Exception],
    *,
    concurrency: int,
    on_done: Callable[[int, Outcome], Awaitable[None] | None],
    options: dict[str, Any],
) -> None:
    """Run every item (an Exception item is already a failure), calling `on_done(index, outcome)`
    as each finishes, in completion order."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InputError(
            [
                Violation(
                    path="concurrency",
                    value=concurrency,
                    message=f"concurrency must be an integer of at least 1, got {concurrency!r}",
                )
            ]
        )
    # Built here from names (not handed over built, as a Ray actor does): closed here when done.
    specs = None if "_backend_name" in options else (options.get("backend", "local"),
                                                     options.get("embedder", "lexical"))
    opts = _shared_options(options)
    name = opts.pop("_backend_name")
    sem = asyncio.Semaphore(concurrency)
    # The same bound on backend calls: a request with window_size makes several (concurrency.py).
    token = CALL_LIMIT.set(asyncio.Semaphore(concurrency))

    async def one(index: int, item: Mapping[str, Any] | Exception) -> None:
        outcome: Outcome
        if isinstance(item, Exception):
            outcome = item
        else:
            async with sem:
                try:
                    query, chunks, top_k, lam = _request_args(item)
                    # a line's own window_size and scoring options win over the run's
                    own = {k: item[k] for k in (*SCORING_KEYS, "window_size") if k in item}
                    rest = {k: v for k, v in item.items() if k not in own}
                    kwargs = {**opts, **own, **_extra_args(rest, opts)}
                    outcome = await arerank(query, chunks, top_k, lam, **kwargs)
                except Exception as exc:  # recorded per line; one bad request never stops the rest
                    outcome = exc
            if name is not None and isinstance(outcome, RerankResult) and outcome.meta.backend != name:
                outcome = _rename(outcome, name)
        res = on_done(index, outcome)
        if asyncio.iscoroutine(res):
            await res

    try:
        await asyncio.gather(*(one(i, it) for i, it in enumerate(items)))
    finally:
        CALL_LIMIT.reset(token)
        if specs is not None:
            await aclose_built(((opts["backend"], specs[0]), (opts["embedder"], specs[1])))


def _rename(result: RerankResult, name: str) -> RerankResult:
    """meta.backend names the backend the caller chose, not the instance's class."""
    return replace(result, meta=replace(result.meta, backend=name))


async def arerank_many(
    requests: Iterable[Mapping[str, Any]],
    *,
    concurrency: int = 4,
    progress: Callable[[int, int], None] | None = None,
    **options: Any,
) -> list[Outcome]:
    """Rerank every `{query, chunks, top_k?, lambda?, window_size?}` mapping with at most `concurrency`
    requests, and as many backend calls, in flight (a request's windows share the bound).
    A request may also carry its own metadata options (`meta_field`, ..., `embed_meta_fields`).

    Returns one entry per request, in input order: a `RerankResult`, or the exception that request
    raised (`InputError`, `BackendError`, ...). `options` are `arerank`'s keyword arguments; the
    backend and embedder are built once and shared. `progress(done, total)` is called after each.
    """
    items = list(requests)
    results: list[Outcome | None] = [None] * len(items)
    done = 0

    def on_done(index: int, outcome: Outcome) -> None:
        nonlocal done
        results[index] = outcome
        done += 1
        if progress is not None:
            progress(done, len(items))

    await _run(items, concurrency=concurrency, on_done=on_done, options=options)
    return [r for r in results if r is not None]


# ---------------------------------------------------------------------------------------------- CLI


@dataclass(frozen=True)
class _Line:
    number: int
    query_id: Any
    item: Mapping[str, Any] | Exception


def parse_input(text: str) -> list[_Line]:
    """One `_Line` per non-blank input line; a line that is not a valid request object carries an
    `InputError` naming the line instead of stopping the batch."""
    out: list[_Line] = []
    text = text.removeprefix("\ufeff")  # a BOM from some editors is not part of line 1's JSON
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            obj, dupes = loads_line(raw)
        except (ValueError, RecursionError) as exc:
            reason = json_problem(exc)
            out.append(
                _Line(
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
            out.append(_Line(number, qid, InputError([bad])))
            continue
        if not isinstance(obj, dict):
            msg = f"a batch line must be a JSON object, got {type(obj).__name__}"
            out.append(_Line(number, None, InputError([Violation(path="$", message=msg, line=number)])))
            continue
        qid = obj.get("query_id", obj.get("qid"))
        allowed = ", ".join(sorted(_LINE_KEYS))
        problems = [
            Violation(path="$", message=f"unknown key {k!r}{near_miss(k, _LINE_KEYS)} (allowed: {allowed})",
                      line=number)
            for k in obj
            if k not in _LINE_KEYS
        ]
        for key in ("query", "chunks"):
            if key not in obj:
                problems.append(Violation(path=key, message=f"missing required field '{key}'", line=number))
        out.append(_Line(number, qid, InputError(problems) if problems else obj))
    return out


def error_kind(exc: Exception) -> str:
    """"input" (the caller can fix it), "backend" (every attempt failed) or "internal" (a bug)."""
    if isinstance(exc, BackendError):
        return "backend"
    return "input" if isinstance(exc, RerankError) else "internal"


def _error_record(exc: Exception, secrets: Sequence[str | None]) -> dict[str, Any]:
    if isinstance(exc, InputError):
        from .textio import violation_lines

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
        return {"kind": "input", "message": scrub(str(exc), secrets)}
    return {"kind": "internal", "message": scrub(f"{type(exc).__name__}: {exc}", secrets)}


def _record(line: _Line, outcome: Outcome, secrets: Sequence[str | None]) -> dict[str, Any]:
    rec: dict[str, Any] = {"line": line.number}
    if line.query_id is not None:
        rec["query_id"] = line.query_id
    if isinstance(outcome, RerankResult):
        rec["result"] = outcome.to_dict()
        rec["meta"] = outcome.meta.to_dict()
    else:
        rec["error"] = _error_record(outcome, secrets)
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


class _OrderedWriter:
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


def _progress_bar(total: int, enabled: bool) -> Any:
    """A tqdm bar on stderr when it is a terminal and tqdm is installed; otherwise None."""
    if not enabled or total == 0 or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="query", file=sys.stderr)


# A cross-encoder's knobs that decide how fast it scores, not what: a resumed run may change them.
_SPEED_KNOBS = frozenset({"device", "batch_size"})


def record_config(options: Mapping[str, Any]) -> dict[str, Any]:
    """What decides a batch record's result, as the CLI writes it in the record's `config`.

    `options` are the run's `arerank` options as the CLI passes them (backend, model, base_url,
    embedder, fallback, policy, backend_options, layout, strict, window_size and the metadata
    options). Recorded: the backend by name, its model and server, the embedder by name and, for
    an embeddings server, its URL; the fallback; the LLM's output budget (`policy.max_tokens`);
    the backend's scoring knobs; the layout, strict parsing, window size and metadata options; and
    the contract's default top_k and lambda, which a line without its own takes. A line's own
    settings are in its input line, not here. Left out: credentials (URLs are shown as
    `display_url` shows them; the api key never), and what only decides how fast a run goes or
    how long it waits (concurrency, the engine and workers, the deadline, a cross-encoder's device
    and batch size), which a resumed run may change. JSON values only, as they read back.
    """
    from .guard.limits import load_limits

    backend = options.get("backend", "local")
    embedder = resolve_embedder(options.get("embedder", "lexical"), backend, options.get("base_url"))
    limits = load_limits()
    name = backend if isinstance(backend, str) else str(getattr(backend, "name", type(backend).__name__))
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
    knobs = {k: v for k, v in (options.get("backend_options") or {}).items() if k not in _SPEED_KNOBS}
    if knobs:
        config["backend_options"] = knobs
    for name in SCORING_KEYS:  # the metadata options: they change which chunks rank first
        if options.get(name) is not None:
            config[name] = options[name]
    result: dict[str, Any] = json.loads(json.dumps(config))  # lists, not tuples: as the file reads back
    return result


def _check_config(done: Mapping[int, Mapping[str, Any]], config: Mapping[str, Any], output: str) -> None:
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


def run_batch_cli(args: Any, backend_options: Mapping[str, Any]) -> int:
    """`rag-rerank batch`: see the module docstring for the file formats and exit codes."""
    from .textio import UsageError, read_text

    if args.concurrency < 1:
        raise UsageError(f"--concurrency must be at least 1, got {args.concurrency}")
    to_stdout = args.output in (None, "-")
    overwrite = bool(getattr(args, "overwrite", False))
    if args.resume and to_stdout:
        raise UsageError("--resume needs --output FILE (it skips the lines already in that file)")
    if overwrite and to_stdout:
        raise UsageError("--overwrite needs --output FILE (it replaces that file)")
    if overwrite and args.resume:
        raise UsageError("--resume and --overwrite exclude each other: --resume continues --output, "
                         "--overwrite replaces it")
    lines = parse_input(read_text(args.input, what="input"))
    if not lines:
        raise UsageError(f"--input: {args.input} holds no requests; write one JSON object "
                         "{query, chunks, top_k?, lambda?, query_id?} per line")
    done: dict[int, dict[str, Any]] = {}
    out_path = None if to_stdout else Path(args.output)
    if out_path is not None and out_path.is_dir():
        raise UsageError(f"--output: {args.output} is a directory, not a file")
    if out_path is not None and args.input != "-" and out_path.exists() and out_path.samefile(args.input):
        # "w" would replace the requests with their results: the input is lost
        raise UsageError(f"--output: {args.output} is the --input file; write the results to another file")
    if (out_path is not None and not args.resume and not overwrite and out_path.is_file()
            and out_path.stat().st_size > 0):
        # "w" would truncate it: results of an earlier run (hours of LLM calls) lost to a missing flag
        raise UsageError(f"--output: {args.output} already exists and is not empty; pass --resume to "
                         "continue it or --overwrite to replace it")
    config = record_config(backend_options)
    if out_path is not None and args.resume:
        done, valid_end = read_done(out_path)
        _check_resumed(done, lines, args.output)
        _check_config(done, config, args.output)
        if out_path.exists() and valid_end < out_path.stat().st_size:
            with out_path.open("r+b") as fh:
                fh.truncate(valid_end)
    todo = [ln for ln in lines if ln.number not in done]
    secrets = secrets_of(backend_options.get("api_key"), urls=[backend_options.get("base_url")])
    options = {k: v for k, v in backend_options.items() if v is not None}
    bar = _progress_bar(len(todo), not getattr(args, "no_progress", False))
    stream: IO[str]
    if out_path is None:
        stream = sys.stdout
    else:
        if out_path.parent and not out_path.parent.exists():
            raise UsageError(f"--output: no such directory: {out_path.parent}")
        try:
            stream = out_path.open("a" if args.resume else "w", encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--output: cannot write {args.output}: {exc.strerror}") from None
    writer = _OrderedWriter(stream, [ln.number for ln in todo])
    try:

        def on_record(index: int, rec: dict[str, Any]) -> None:
            writer.add(index, {**rec, "config": config})  # what `--resume` checks (record_config)
            if bar is not None:
                bar.update(1)

        def on_done(index: int, outcome: Outcome) -> None:
            on_record(index, _record(todo[index], outcome, secrets))

        hint = PATH_HINT.set("")  # a batch line cannot hold a pathlib.Path: no Python advice
        try:
            if getattr(args, "engine", "local") == "ray":
                from .integrations.ray import run_lines

                run_lines(
                    todo,
                    on_done=on_done,
                    on_record=on_record,
                    options=options,
                    concurrency=args.concurrency,
                    workers=args.workers,
                    address=args.ray_address,
                )
            else:
                asyncio.run(
                    _run([ln.item for ln in todo], concurrency=args.concurrency, on_done=on_done,
                         options=options)
                )
        finally:
            PATH_HINT.reset(hint)
    except BrokenPipeError:
        raise  # the reader went away (`batch | head`): the CLI ends quietly
    except OSError as exc:  # only the writer does I/O here (disk full, a device that refuses writes)
        raise UsageError(f"--output: cannot write {args.output}: {exc.strerror or exc}") from None
    finally:
        if bar is not None:
            bar.close()
        if stream is not sys.stdout:
            with contextlib.suppress(OSError):  # the write error above is what gets reported
                stream.close()
    records = [*done.values(), *writer.written]
    n_err = sum(1 for r in records if "error" in r)
    skipped = f", {len(done)} already done" if done else ""
    # A fallback answer is a success (exit 0) that did not come from the backend asked for.
    metas = [r["meta"] for r in records if isinstance(r.get("meta"), dict)]
    n_fell = sum(1 for m in metas if m.get("fallback"))
    n_lexical = sum(1 for m in metas if m.get("embedder_fallback"))
    said = []
    if n_fell:
        who = options.get("backend")
        said.append(f"{n_fell} ranked by the local backend after {who} failed: --fallback local")
    if n_lexical:
        emb = options.get("embedder")
        said.append(f"{n_lexical} on lexical vectors after the {getattr(emb, 'name', emb)} embedder failed: "
                    "--fallback local")
    fell = f" ({'; '.join(said)})" if said else ""
    print(f"rag-rerank: batch: {len(records) - n_err} ok{fell}, {n_err} failed{skipped}", file=sys.stderr)
    for r in writer.written:
        if "error" in r:
            print(
                f"rag-rerank: line {r['line']}: {r['error']['kind']} error: {r['error']['message']}",
                file=sys.stderr,
            )
    return exit_code(records)


def _check_resumed(done: Mapping[int, Mapping[str, Any]], lines: Sequence[_Line], output: str) -> None:
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
