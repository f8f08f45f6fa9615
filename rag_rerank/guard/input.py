"""The input guard: turns JSONL text, a file or a list of records into `Chunk`s, or explains
every problem at once (line numbers, ids, fields and limits), never a traceback."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from ..errors import InputError, Violation
from ..models import Chunk, RerankRequest
from .limits import Limits, load_limits, load_schema

ChunkSource = str | bytes | os.PathLike[str] | Iterable[Mapping[str, Any] | Chunk]

_TYPE_NAMES = {"string": "a string", "number": "a number", "object": "an object", "array": "an array"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


_validator_cache: dict[str, Draft202012Validator] = {}


def _chunk_validator() -> Draft202012Validator:
    if "chunk" not in _validator_cache:
        _validator_cache["chunk"] = Draft202012Validator(load_schema("chunk"))
    return _validator_cache["chunk"]


def _schema_violations(record: Any, index: int, line: int | None) -> list[Violation]:
    """Schema errors turned into sentences a person can act on."""
    out: list[Violation] = []
    rid = record.get("id") if isinstance(record, dict) and isinstance(record.get("id"), str) else None
    for err in sorted(_chunk_validator().iter_errors(record), key=lambda e: list(e.path)):
        field = ".".join(str(p) for p in err.absolute_path)
        path = f"chunks[{index}]" + (f".{field}" if field else "")
        if err.validator == "type" and not err.absolute_path:
            msg = f"a chunk must be a JSON object, got {_json_type(record)}"
        elif err.validator == "required":
            missing = err.message.split("'")[1] if "'" in err.message else "?"
            msg = f"missing required field '{missing}'"
            path = f"chunks[{index}].{missing}"
        elif err.validator == "type":
            want = err.validator_value
            msg = f"field '{field}' must be {_TYPE_NAMES.get(want, want)}, got {_json_type(err.instance)}"
        elif err.validator == "minLength":
            msg = f"field '{field}' must not be empty"
        elif err.validator == "minItems":
            msg = f"field '{field}' must not be an empty array"
        else:
            msg = err.message
        out.append(Violation(path=path, message=msg, value=err.instance, line=line, id=rid))
    return out


def _finite_embedding(value: Any) -> bool:
    return all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in value)


def _records_from(source: ChunkSource) -> tuple[list[tuple[Any, int | None]], list[Violation]]:
    """(record, line number or None) pairs, plus the lines that are not JSON."""
    if isinstance(source, os.PathLike):
        path = Path(source)
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError([Violation(path=str(path), message=f"cannot read chunks file: {exc}")]) from None
    if isinstance(source, bytes):
        try:
            source = source.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError([Violation(path="chunks", message=f"not UTF-8 text: {exc}")]) from None
    if isinstance(source, str):
        records: list[tuple[Any, int | None]] = []
        bad: list[Violation] = []
        # Only \n separates records: JSON itself escapes it, whereas str.splitlines would also
        # split on characters (U+2028, \x1c ...) that may legally sit inside a JSON string.
        for lineno, line in enumerate(source.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                records.append((json.loads(line, parse_constant=_reject_constant), lineno))
            except ValueError as exc:
                shown = line if len(line) <= 60 else line[:57] + "..."
                bad.append(Violation(path="chunks", message=f"not valid JSON ({exc}): {shown!r}", line=lineno))
        return records, bad
    if isinstance(source, Mapping):
        raise InputError([Violation(path="chunks", message="chunks must be a list of records, not one object")])
    try:
        items = list(source)
    except TypeError:
        raise InputError(
            [Violation(path="chunks", message=f"chunks must be JSONL text, a path or a list, got {_json_type(source)}")]
        ) from None
    return [(item, None) for item in items], []


def parse_chunks(source: ChunkSource, *, limits: Limits | None = None, query: str = "") -> list[Chunk]:
    """Every chunk, or an `InputError` listing every problem found."""
    lim = limits or load_limits()
    records, violations = _records_from(source)
    chunks: list[Chunk] = []
    for index, (rec, line) in enumerate(records):
        if isinstance(rec, Chunk):
            rec = {**rec.prompt_record(), **({"embedding": list(rec.embedding)} if rec.embedding else {})}
        problems = _schema_violations(rec, index, line)
        if not problems and "embedding" in rec and not _finite_embedding(rec["embedding"]):
            problems.append(
                Violation(path=f"chunks[{index}].embedding", message="embedding holds NaN or Infinity",
                          line=line, id=rec["id"])
            )
        if problems:
            violations.extend(problems)
            continue
        score = rec.get("score")
        if score is not None and not math.isfinite(score):
            violations.append(Violation(path=f"chunks[{index}].score", message="score is not finite", line=line,
                                        id=rec["id"]))
            continue
        emb = rec.get("embedding")
        chunks.append(
            Chunk(
                id=rec["id"],
                text=rec["text"],
                score=float(score) if score is not None else None,
                meta=rec.get("meta"),
                embedding=tuple(float(x) for x in emb) if emb is not None else None,
            )
        )
    violations.extend(_collection_violations(chunks, len(records), lim, query))
    if violations:
        raise InputError(violations, headline="invalid chunks")
    return chunks


def _collection_violations(chunks: list[Chunk], n_records: int, lim: Limits, query: str) -> list[Violation]:
    out: list[Violation] = []
    counts = Counter(c.id for c in chunks)
    dupes = [i for i, n in counts.items() if n > 1]
    if dupes:
        out.append(Violation(path="chunks", message=f"duplicate ids: {', '.join(repr(d) for d in dupes)}",
                             value=dupes))
    if n_records > lim.max_chunks:
        out.append(
            Violation(
                path="chunks",
                message=f"{n_records} chunks is over the limit of {lim.max_chunks} (max_chunks); "
                "split the set or pre-filter it",
                value=n_records,
            )
        )
    n_chars = sum(len(c.text) for c in chunks) + len(query)
    est = lim.estimate_tokens(n_chars)
    if est > lim.max_context_tokens:
        out.append(
            Violation(
                path="chunks",
                message=f"about {est} tokens of text is over the budget of {lim.max_context_tokens} "
                "(max_context_tokens); send fewer or shorter chunks or raise the budget",
                value=est,
            )
        )
    dims = {len(c.embedding) for c in chunks if c.embedding is not None}
    if len(dims) > 1:
        out.append(Violation(path="chunks[*].embedding", message=f"embeddings have different dimensions: "
                             f"{sorted(dims)}", value=sorted(dims)))
    return out


def _param_violations(query: Any, top_k: Any, lambda_: Any, lim: Limits) -> list[Violation]:
    out: list[Violation] = []
    if not isinstance(query, str):
        out.append(Violation(path="query", message=f"query must be a string, got {_json_type(query)}"))
    elif not query.strip():
        out.append(Violation(path="query", message="query is empty"))
    elif len(query) > lim.max_query_chars:
        out.append(Violation(path="query", message=f"query has {len(query)} characters, over the limit of "
                             f"{lim.max_query_chars} (max_query_chars)", value=len(query)))
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        out.append(Violation(path="top_k", message=f"top_k must be a positive integer, got {top_k!r}", value=top_k))
    if (
        isinstance(lambda_, bool)
        or not isinstance(lambda_, (int, float))
        or not math.isfinite(lambda_)
        or not 0.0 <= lambda_ <= 1.0
    ):
        out.append(Violation(path="lambda", message=f"lambda must be a number in [0, 1], got {lambda_!r}",
                             value=lambda_))
    return out


def validate_request(
    query: Any,
    chunks: ChunkSource,
    top_k: Any = None,
    lambda_: Any = None,
    *,
    limits: Limits | None = None,
) -> RerankRequest:
    """Check everything about a request at once; raise one `InputError` naming every problem."""
    lim = limits or load_limits()
    top_k = lim.default_top_k if top_k is None else top_k
    lambda_ = lim.default_lambda if lambda_ is None else lambda_
    violations = _param_violations(query, top_k, lambda_, lim)
    parsed: list[Chunk] = []
    try:
        parsed = parse_chunks(chunks, limits=lim, query=query if isinstance(query, str) else "")
    except InputError as exc:
        violations.extend(exc.violations)
    if violations:
        raise InputError(violations)
    return RerankRequest(query=query, chunks=tuple(parsed), top_k=int(top_k), lambda_=float(lambda_))
