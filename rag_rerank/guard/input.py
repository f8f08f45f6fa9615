"""The input guard: turns JSONL text, a file or a list of records into `Chunk`s, or explains
every problem at once (line numbers, ids, fields and limits), never a traceback.

Everything that could later break rendering or a backend call is caught here, where the caller
can still be told which line / id / field is at fault: text that cannot be encoded as UTF-8
(lone surrogates), values JSON cannot carry (NaN, sets, numbers too large for a float), and
nesting so deep that a JSON codec would recurse out of stack.

The context budget (`max_context_tokens`) is counted as the shortening counts it
(`shortening.prompt_tokens`: the query and each chunk's text, id, score and metadata, by the one
estimator or the caller's `tokenizer`), a cheap byte bound first; so the guard and the shortening
never disagree about whether a request fits (docs/long-chunks.md, "Counting tokens").
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import numbers
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from operator import attrgetter
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from ..errors import InputError, Violation
from ..models import Chunk, RerankRequest
from ..shortening import chunk_tokens, token_counter, tokens_over
from ..tokens import Tokenizer
from ..wording import closest, counted
from .limits import Limits, as_limits, load_schema

ChunkSource = str | bytes | os.PathLike[str] | Iterable[Mapping[str, Any] | Chunk]

_TYPE_NAMES = {"string": "a string", "number": "a number", "object": "an object", "array": "an array"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, numbers.Real):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _finite_real(value: Any) -> bool:
    """A real number a float can hold: not bool, not NaN/Infinity, not an int beyond 1.8e308."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(value)
    except (OverflowError, ValueError, TypeError):
        return False


def _surrogate_at(text: str) -> int | None:
    """Index of the first code point UTF-8 cannot encode (a lone surrogate), or None."""
    if text.isascii():  # no surrogate, and no copy made to find none
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _surrogate_message(field: str, at: int) -> str:
    return f"{field} holds a lone surrogate at index {at} (not valid Unicode; it cannot be sent as UTF-8)"


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


class _KeyCounter:
    """object_pairs_hook that builds each object as json does (the last value of a key wins) and
    remembers every key written twice, so the guard can refuse an ambiguous record instead of
    silently reading `{"id": "a", "id": "b"}` as id `b`."""

    def __init__(self) -> None:
        self.duplicates: list[str] = []

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen and key not in self.duplicates:
                    self.duplicates.append(key)
                seen.add(key)
        return out


def loads_line(line: str) -> tuple[Any, list[str]]:
    """One JSONL line: (value, keys that appear twice in one of its objects). Raises ValueError
    (not JSON, NaN / Infinity) or RecursionError like `json.loads`."""
    counter = _KeyCounter()
    value = json.loads(line, parse_constant=_reject_constant, object_pairs_hook=counter)
    return value, counter.duplicates


def json_problem(exc: BaseException) -> str:
    """Why one JSONL line does not decode, by column: the decoder's own "line 1 column 5 (char 4)"
    would put a second line numbering (always 1, inside the line) next to the file's."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg.removesuffix(' at')} at column {exc.colno}"
    text = str(exc)
    if "integer string conversion" in text:
        # Python's advice (raise an interpreter-wide limit) is wrong for a data file: no score or
        # meta value needs thousands of digits; the line is what is wrong.
        return "a number of more than 4300 digits"
    return text


def duplicate_keys_message(keys: list[str]) -> str:
    named = ", ".join(repr(k) for k in keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
    return (f"duplicate key{'s' if len(keys) != 1 else ''} {named} in one JSON object "
            "(which value is meant is ambiguous; write each key once)")


_validator_cache: dict[str, Draft202012Validator] = {}


def _chunk_validator() -> Draft202012Validator:
    if "chunk" not in _validator_cache:
        _validator_cache["chunk"] = Draft202012Validator(load_schema("chunk"))
    return _validator_cache["chunk"]


def _plainly_valid(record: Any) -> bool:
    """The common case checked by hand, equivalent to the schema for it: an object with a non-empty
    string id, a string text and well-typed optional fields. Only records failing this go through
    jsonschema (which is what explains the error), so a clean request skips its overhead."""
    if type(record) is not dict or type(record.get("id")) is not str or not record["id"]:
        return False
    if type(record.get("text")) is not str:
        return False
    score, meta, emb = record.get("score", 0), record.get("meta", {}), record.get("embedding", [0])
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not isinstance(meta, dict):
        return False
    return type(emb) is list and len(emb) > 0 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in emb
    )


def _schema_violations(record: Any, index: int, line: int | None) -> list[Violation]:
    """Schema errors turned into sentences a person can act on."""
    if _plainly_valid(record):
        return []
    out: list[Violation] = []
    rid = record.get("id") if isinstance(record, dict) and isinstance(record.get("id"), str) else None
    if rid is not None and _surrogate_at(rid) is not None:
        rid = rid.encode("utf-8", "backslashreplace").decode("ascii", "replace")
    for err in _chunk_validator().iter_errors(record):
        field = ".".join(str(p) for p in err.absolute_path)
        path = f"chunks[{index}]" + (f".{field}" if field else "")
        if err.validator == "type" and not err.absolute_path:
            msg = f"a chunk must be a JSON object, got {_json_type(record)}"
        elif err.validator == "required":
            missing = err.message.split("'")[1] if "'" in err.message else "?"
            msg = f"missing required field '{missing}'" + _rename_hint(record, missing)
            path = f"chunks[{index}].{missing}"
        elif err.validator == "type":
            want = err.validator_value
            msg = f"field '{field}' must be {_TYPE_NAMES.get(want, want)}, got {_json_type(err.instance)}"
            if field == "id" and isinstance(err.instance, int) and not isinstance(err.instance, bool):
                # Vector stores (Qdrant, Milvus, a SQL key) hand out integer ids; we return ids
                # byte for byte and will not guess the caller's string form.
                shown = str(err.instance)[:20]
                how = f'write "{shown}"' if line is not None else f'str(id), e.g. "{shown}"'  # JSONL / Python
                msg += f" (ids come back byte for byte, so they must be strings: {how})"
        elif err.validator == "minLength":
            msg = f"field '{field}' must not be empty"
        elif err.validator == "minItems":
            msg = f"field '{field}' must not be an empty array"
        else:
            msg = err.message.replace("\n", " ")
        out.append(Violation(path=path, message=msg, value=err.instance, line=line, id=rid))
    return sorted(out, key=lambda v: v.path)


# What other tools call a chunk's required fields: a record shaped like theirs (a LangChain or
# Haystack document written out as JSON, a search index's hit) lacks `text` or `id` only by name.
_ALIASES: dict[str, dict[str, str]] = {
    "text": {"page_content": " (a LangChain Document's text)", "content": " (a Haystack Document's text)",
             "body": "", "contents": "", "passage": "", "document": "", "chunk": ""},
    "id": {"id_": " (a LlamaIndex node's id)", "doc_id": "", "_id": "", "uuid": "", "docid": ""},
}


def _rename_hint(record: Any, missing: str) -> str:
    """For a record missing `text` (or `id`) that has the field under another name (`page_content`,
    `content`, `body`, a misspelling such as `txt` or `Text`): which of its fields to rename. A
    bare "missing required field 'text'" left a LangChain or Haystack user to guess that their
    text was there all along, under the framework's name for it."""
    if not isinstance(record, Mapping) or missing not in _ALIASES:
        return ""
    properties = load_schema("chunk")["properties"]
    others = [k for k in record if isinstance(k, str) and k not in properties]
    other_aliases = {a for field, names in _ALIASES.items() if field != missing for a in names}
    found = next((k for k in others if k in _ALIASES[missing]), None)
    why = _ALIASES[missing].get(found, "") if found is not None else ""
    if found is None:
        found = closest(missing, [k for k in others if k not in other_aliases], ignore_case=True)
    if found is None:
        return ""
    hint = f"; this record has {found!r}{why}: rename it to {missing!r}"
    if "metadata" in others and "meta" not in record:  # LangChain's and LlamaIndex's name for it
        hint += " (and 'metadata' to 'meta', or it is ignored)"
    return hint


def _value_violations(rec: Mapping[str, Any], index: int, line: int | None) -> list[Violation]:
    """What the schema cannot see: unencodable text, non-finite numbers, meta JSON cannot carry."""
    out: list[Violation] = []
    rid = rec["id"]
    at = _surrogate_at(rid)
    shown_id = rid if at is None else rid.encode("utf-8", "backslashreplace").decode("ascii", "replace")
    if at is not None:
        out.append(Violation(path=f"chunks[{index}].id", message=_surrogate_message("id", at),
                             line=line, id=shown_id))
    at = _surrogate_at(rec["text"])
    if at is not None:
        out.append(Violation(path=f"chunks[{index}].text", message=_surrogate_message("text", at),
                             line=line, id=shown_id))
    score = rec.get("score")
    if score is not None and not _finite_real(score):
        out.append(Violation(path=f"chunks[{index}].score", message="score must be a finite number",
                             line=line, id=shown_id))
    emb = rec.get("embedding")
    if emb is not None and not all(_finite_real(x) for x in emb):
        out.append(Violation(path=f"chunks[{index}].embedding", message="embedding holds NaN, Infinity or a "
                             "number too large for a float", line=line, id=shown_id))
    if rec.get("meta") is not None:
        try:
            json.dumps(rec["meta"], ensure_ascii=False, allow_nan=False).encode("utf-8")
        except UnicodeEncodeError:
            out.append(Violation(path=f"chunks[{index}].meta", line=line, id=shown_id,
                                 message="meta holds a lone surrogate (not valid Unicode)"))
        except (TypeError, ValueError, RecursionError, OverflowError) as exc:
            out.append(Violation(path=f"chunks[{index}].meta", message=f"meta is not plain JSON: {exc}",
                                 line=line, id=shown_id))
    return out


def _read_path(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        msg = f"cannot read chunks file: {exc.strerror or exc}"
        raise InputError([Violation(path=str(path), message=msg)]) from None
    return _decode(data, str(path))


def utf16_hint(data: bytes) -> str:
    """` (it looks like UTF-16; save it as UTF-8)` when the bytes start with a UTF-16 byte-order
    mark: what Windows PowerShell 5 writes with `>` / `Out-File`, and a newcomer's likeliest cause
    of undecodable input. Else nothing."""
    return " (it looks like UTF-16; save it as UTF-8)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""


def not_utf8(data: bytes, exc: UnicodeDecodeError) -> str:
    """`not UTF-8 text (byte N)`, with the UTF-16 hint when it applies."""
    return f"not UTF-8 text (byte {exc.start}){utf16_hint(data)}"


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError([Violation(path=where, message=not_utf8(data, exc), line=line)]) from None


def _records_from(source: Any) -> tuple[list[tuple[Any, int | None, int]], list[Violation], int]:
    """(record, line number or None, index) triples, the lines that are not JSON, and the count of
    records including those bad lines. The index counts every non-blank line, so `chunks[3]` is
    the fourth record the caller wrote even when an earlier line was not JSON."""
    if type(source) is list or type(source) is tuple:  # a Python caller's records: no ABC checks first
        return [(item, None, i) for i, item in enumerate(source)], [], len(source)
    if isinstance(source, os.PathLike):
        source = _read_path(Path(source))
    if isinstance(source, (bytes, bytearray)):
        source = _decode(bytes(source), "chunks")
    if isinstance(source, str):
        source = source.removeprefix("\ufeff")  # a BOM (Windows editors) is not part of line 1's JSON
        records: list[tuple[Any, int | None, int]] = []
        bad: list[Violation] = []
        index = 0
        # Only \n separates records: JSON itself escapes it, whereas str.splitlines would also
        # split on characters (U+2028, \x1c ...) that may legally sit inside a JSON string.
        for lineno, line in enumerate(source.split("\n"), start=1):
            if not line.strip():
                continue
            index += 1
            try:
                record, dupes = loads_line(line)
                if dupes:
                    bad.append(Violation(path=f"chunks[{index - 1}]", line=lineno,
                                         message=duplicate_keys_message(dupes), value=dupes))
                    continue
                records.append((record, lineno, index - 1))
            except (ValueError, RecursionError) as exc:
                reason = json_problem(exc)
                shown = line if len(line) <= 60 else line[:57] + "..."
                shown = shown.encode("utf-8", "backslashreplace").decode("utf-8")
                msg = f"not valid JSON ({reason}): {shown!r}"
                if lineno == 1 and "\n" not in source.strip() and _looks_like_a_path(line):
                    msg += PATH_HINT.get()
                bad.append(Violation(path=f"chunks[{index - 1}]", message=msg, line=lineno))
        whole = _one_json_document(source, records, bad)
        if whole is not None:
            return [], [whole], 1
        return records, bad, index
    if isinstance(source, Mapping):
        msg = "chunks must be a list of records, not one object"
        raise InputError([Violation(path="chunks", message=msg)])
    try:
        items = list(source)
    except TypeError:
        msg = f"chunks must be JSONL text, a path or a list, got {_json_type(source)}"
        raise InputError([Violation(path="chunks", message=msg)]) from None
    return [(item, None, i) for i, item in enumerate(items)], [], len(items)


def _one_json_document(source: str, records: list[tuple[Any, int | None, int]],
                       bad: list[Violation]) -> Violation | None:
    """One violation for text that is a single JSON array or a pretty-printed object instead of
    JSONL: read line by line, a `chunks.json` array gives a wall of "not valid JSON" lines (one
    per line of the file) or "a chunk must be a JSON object, got array", none of which says
    what is wrong. Only text that failed as JSONL is re-read whole, so valid JSONL costs nothing."""
    one_array = not bad and len(records) == 1 and isinstance(records[0][0], list)
    if not (bad or one_array) or source.lstrip()[:1] not in ("[", "{"):
        return None
    try:
        value, _ = loads_line(source)
    except (ValueError, RecursionError):
        return None
    lines = source.strip().count("\n") + 1
    spread = f" spread over {lines} lines" if lines > 1 else ""
    if isinstance(value, list):
        msg = (f"the chunks are one JSON array of {counted(len(value), 'item')} as text{spread}, not JSONL "
               '(one {"id", "text"} object per line): pass the array itself as a list, or convert a file '
               "with jq -c '.[]'")
    elif isinstance(value, dict) and lines > 1:
        # One object on one line is a JSONL record already: its own line's problem (a key written
        # twice) is the accurate message, not "write each record on one line".
        msg = (f"the chunks are one JSON object{spread}, not JSONL; write each "
               '{"id", "text"} record on one line')
    else:
        return None
    return Violation(path="chunks", message=msg, line=1)


# What to add when a one-line str that is not JSON looks like a file name. Python callers are told
# how to read a file; `call_tool`, the MCP server and `batch` set it to "" because their callers
# cannot pass a Path. It never depends on whether the file exists: a tool caller must not learn
# which files are on the server from the answer.
PATH_HINT: contextvars.ContextVar[str] = contextvars.ContextVar(
    "PATH_HINT", default="; a str is JSONL text: to read a file, pass pathlib.Path(...)")
_PATHISH = re.compile(r"\A\s*(?:[~.]?[/\\]|[A-Za-z]:[/\\]|[^{\[\"\s]\S*\.(?:jsonl|ndjson|json|txt)\s*\Z)")


def window_advice(lim: Limits, *, cli: bool = True) -> str:
    """What to do about more than max_chunks chunks: pass window_size. `cli=False` names only the
    argument, for a tool caller (a calling model or an MCP host cannot pass a CLI flag)."""
    example = f"e.g. {min(lim.max_chunks, 20)}; at most {lim.max_chunks}"
    how = f"window_size (CLI --window-size N, {example})" if cli else f"the argument window_size ({example})"
    return f"pass {how} to rank up to {lim.max_total_chunks} in windows, or split the set or pre-filter it"


# The advice for more than max_chunks chunks, from the limits in force. The default suits rerank,
# batch and eval; the tools name their own argument, and a command that works on one prompt's
# chunks (`render`, `check`) says so, so a user is not sent to a --window-size flag it refuses.
MAX_CHUNKS_ADVICE: contextvars.ContextVar[Callable[[Limits], str]] = contextvars.ContextVar(
    "MAX_CHUNKS_ADVICE", default=window_advice)


def _looks_like_a_path(line: str) -> bool:
    """`/data/chunks.jsonl`, `./x`, `C:\\x`, `chunks.jsonl`: judged from the text alone."""
    return _PATHISH.match(line) is not None


def _as_list(emb: Any) -> Any:
    """A Python caller's vector as the JSON array it stands for: a tuple or a numpy array (what a
    vector store hands back) becomes a list; anything else is left for the schema to judge."""
    if isinstance(emb, tuple):
        return list(emb)
    if type(emb).__module__ == "numpy" and hasattr(emb, "tolist"):
        return emb.tolist()
    return emb


def _as_record(item: Any) -> Any:
    """A `Chunk` back as the plain record it stands for; anything else unchanged (a mapping whose
    embedding is a tuple or numpy array is copied with a list, never modified)."""
    if isinstance(item, Chunk):
        rec: dict[str, Any] = {"id": item.id, "text": item.text}
        if item.score is not None:
            rec["score"] = item.score
        if item.meta is not None:
            rec["meta"] = dict(item.meta) if isinstance(item.meta, Mapping) else item.meta
        if item.embedding is not None:
            rec["embedding"] = _as_list(item.embedding)
        return rec
    if isinstance(item, Mapping):
        emb = item.get("embedding")
        if _as_list(emb) is not emb:
            return {**item, "embedding": _as_list(emb)}
        if not isinstance(item, dict):
            return dict(item)
    return item


_OPTIONAL = ("score", "meta", "embedding")


def _without_nones(rec: Any) -> Any:
    """A Python caller's record with `score` / `meta` / `embedding` set to None read as absent, as
    `Chunk` itself has them: `dataclasses.asdict(chunk)` and a pydantic `model_dump()` write every
    optional field as None, and were refused field by field ('must be a number, got null'). JSONL
    text keeps the schema's rule (a number, an object, an array where the key is written).
    A new dict is made; the caller's is only read."""
    if isinstance(rec, dict) and any(k in rec and rec[k] is None for k in _OPTIONAL):
        return {k: v for k, v in rec.items() if not (k in _OPTIONAL and v is None)}
    return rec


def parse_chunks(
    source: ChunkSource, *, limits: Limits | None = None, query: str = "", window_size: int | None = None,
    tokenizer: Any = None,
) -> list[Chunk]:
    """Every chunk, or an `InputError` listing every problem found.

    With `window_size` the candidates are ranked in windows of that many (`rag_rerank.windows`):
    the size limit is then `max_total_chunks` and the token budget holds for each window's prompt
    instead of for all the text at once. Tokens are counted by `tokenizer` (a callable text ->
    count, or an object with `encode`) when given, else by the package's one estimator
    (`tokens.estimate_tokens`), exactly as `shortening` counts them."""
    lim = as_limits(limits)
    violations: list[Violation] = []
    try:
        count = token_counter(tokenizer)
    except InputError as exc:
        violations.extend(exc.violations)
        count = token_counter(None)
    known = _all_known_plain(source)
    if known is not None:  # every record plain and valid (most calls): no entries, no second loop
        problems = _collection_violations(known, _Entries(source), len(known), lim, query, window_size, count,
                                          embedded=False)  # plain records: {"id", "text"[, "score"]}
        violations.extend(problems)
        if violations:
            raise InputError(violations, headline="invalid chunks")
        return known
    records, found, n_records = _records_from(source)
    violations.extend(found)
    chunks: list[Chunk] = []
    where: list[tuple[Any, int | None, int]] = []  # each chunk's record entry: its place, named on error
    others: list[Any] = []  # the items that were not plain records (the framework hint reads them)
    for entry in records:
        item, line, index = entry
        if line is None and type(item) is dict and (chunk := _known_plain(item)) is not None:
            chunks.append(chunk)
            where.append(entry)
            continue
        others.append(item)
        rec = _as_record(item)
        if line is None:
            rec = _without_nones(rec)
        problems = _schema_violations(rec, index, line)
        if not problems:
            problems = _value_violations(rec, index, line)
        if problems:
            violations.extend(problems)
            continue
        score, emb = rec.get("score"), rec.get("embedding")
        chunks.append(
            Chunk(
                id=rec["id"],
                text=rec["text"],
                score=float(score) if score is not None else None,
                meta=rec.get("meta"),
                embedding=tuple(float(x) for x in emb) if emb is not None else None,
            )
        )
        where.append(entry)
    violations.sort(key=lambda v: v.line if v.line is not None else 0)  # in the caller's line order
    violations.extend(_framework_hint(others))
    if not n_records:
        msg = 'no chunks: give at least one {"id", "text"} record'
        violations.append(Violation(path="chunks", message=msg))
    violations.extend(_collection_violations(chunks, where, n_records, lim, query, window_size, count))
    if violations:
        raise InputError(violations, headline="invalid chunks")
    return chunks


def _all_known_plain(source: Any) -> list[Chunk] | None:
    """The chunks of a non-empty list (or tuple) of records that are all plain and valid
    (`_known_plain`), else None: then `parse_chunks` reads the source record by record, and finds
    the same chunks for the plain ones and explains the rest."""
    if (type(source) is not list and type(source) is not tuple) or not source:
        return None
    chunks: list[Chunk] = []
    for item in source:
        if type(item) is not dict:
            return None
        if len(item) == 2 and type(cid := item.get("id")) is str and type(text := item.get("text")) is str:
            chunk = _plain_chunk(cid, text)  # `_known_plain`'s first case, without its call
        else:
            chunk = _known_plain(item)
        if chunk is None:
            return None
        chunks.append(chunk)
    return chunks


class _Entries(Sequence[tuple[Any, None, int]]):
    """The record entries (`_records_from`) of a list whose every record became a chunk, made only
    when a violation names a place (`_place`): the i-th is (source[i], None, i)."""

    def __init__(self, source: Sequence[Any]) -> None:
        self._source = source

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, i: int) -> tuple[Any, None, int]:  # type: ignore[override]  (no slices)
        i = range(len(self._source))[i]  # a negative index counts from the end; past it, IndexError
        return self._source[i], None, i


def _known_plain(item: dict[str, Any]) -> Chunk | None:
    """The `Chunk` of a Python caller's plain record (`{"id", "text"}` and maybe a number `score`,
    exact types) from `_scored_chunk`'s memo, or None for any other record (the full checks then
    explain or accept it). A zero score is left to the full path: 0.0 and -0.0 share a memo key."""
    cid, text = item.get("id"), item.get("text")
    if type(cid) is not str or type(text) is not str:
        return None
    size = len(item)
    if size == 2:  # exactly {"id", "text"}: the commonest record, settled first
        return _plain_chunk(cid, text)
    if size != 3 or "score" not in item:
        return None
    score = item["score"]
    kind = type(score)
    if kind is float or kind is int:
        return _scored_chunk(cid, text, score) if score else None
    return _plain_chunk(cid, text) if score is None else None


@lru_cache(maxsize=4096)
def _plain_chunk(cid: str, text: str) -> Chunk | None:
    """`_scored_chunk` of a record without a score, in a memo of its own: both arguments are exact
    `str`s, so the memo's key is the call's own argument tuple (no typed key of six items to build
    and hash for each of a request's records). Its checks written out: of `_value_violations`, only
    the lone surrogates concern a record of an id and a text (a test holds the two alike)."""
    if not cid or _surrogate_at(cid) is not None or _surrogate_at(text) is not None:
        return None
    return Chunk(cid, text)  # positional: keywords would build a dict for the call


@lru_cache(maxsize=4096, typed=True)
def _scored_chunk(cid: str, text: str, score: float | None) -> Chunk | None:
    """A plain record's `Chunk` when it passes every check of `parse_chunks` (its id non-empty, no
    lone surrogate, a finite score), else None. Memoised per (id, text, score), typed, as a chunk's
    prompt line and vectors are: a service sees the same passages again, and a chunk's checks
    depend on nothing but the record."""
    rec: dict[str, Any] = {"id": cid, "text": text}
    if score is not None:
        rec["score"] = score
    if not cid or _value_violations(rec, 0, None):
        return None
    return Chunk(id=cid, text=text, score=float(score) if score is not None else None)


def _place(entry: tuple[Any, int | None, int]) -> str:
    """Where a record is, as a violation names it: its line in a file, else its index."""
    _, line, index = entry
    return f"line {line}" if line is not None else f"chunks[{index}]"


# A framework's document objects handed to rerank() itself: the component that takes them.
_COMPONENTS = {
    "langchain_core": "rag_rerank.integrations.langchain.RagRerankCompressor",
    "llama_index": "rag_rerank.integrations.llama_index.RagRerankPostprocessor",
    "haystack": "rag_rerank.integrations.haystack.RagRerankRanker",
}


def _framework_hint(items: Iterable[Any]) -> list[Violation]:
    """One violation naming the drop-in component when the chunks are LangChain, LlamaIndex or
    Haystack objects: "a chunk must be a JSON object, got Document" alone leaves a newcomer to
    guess that a component exists which keeps their ids and metadata."""
    for item in items:
        if isinstance(item, (Mapping, Chunk)):
            continue
        root = type(item).__module__.split(".", 1)[0]
        if root in _COMPONENTS:
            msg = (f"these are {root} {type(item).__name__} objects: rerank them with {_COMPONENTS[root]} "
                   '(it keeps your objects and metadata), or pass {"id", "text"} dicts')
            return [Violation(path="chunks", message=msg)]
    return []


# One violation is one stderr line: 5,000 copies of three ids once made a 54,000-character line.
_SHOWN = 5


def _first(items: list[str], what: str) -> str:
    shown = ", ".join(items[:_SHOWN])
    return shown + (f" and {len(items) - _SHOWN} {what}" if len(items) > _SHOWN else "")


Places = Sequence[tuple[Any, int | None, int]]  # each chunk's record entry (`_records_from`), for `_place`


def _collection_violations(
    chunks: list[Chunk], where: Places, n_records: int, lim: Limits, query: str, window_size: int | None,
    count: Tokenizer, *, embedded: bool = True,
) -> list[Violation]:
    """The rules about the chunks together: unique ids, the count and token limits, one embedding
    dimension (`embedded=False`: the caller knows no chunk has an embedding, as for plain records)."""
    out: list[Violation] = []
    # The fields read in a comprehension: Python 3.11 reads a frozen value's field there for a
    # fraction of what `map` of an `attrgetter` costs per item.
    if len({chunk.id for chunk in chunks}) < len(chunks):
        places: dict[str, list[str]] = defaultdict(list)
        for chunk, entry in zip(chunks, where, strict=True):
            places[chunk.id].append(_place(entry))
        dupes = {cid: at for cid, at in places.items() if len(at) > 1}
        named = "; ".join(f"{cid!r} at {_first(at, 'more')}" for cid, at in list(dupes.items())[:_SHOWN])
        more = f"; and {counted(len(dupes) - _SHOWN, 'more duplicated id')}" if len(dupes) > _SHOWN else ""
        out.append(Violation(path="chunks", message=f"duplicate ids (ids must be unique): {named}{more}",
                             value=list(dupes)))
    out.extend(_size_violations(chunks, where, n_records, lim, query, window_size, count))
    dims = {len(chunk.embedding) for chunk in chunks if chunk.embedding is not None} if embedded else set()
    if len(dims) > 1:
        out.append(Violation(path="chunks[*].embedding", message=f"embeddings have different dimensions: "
                             f"{sorted(dims)}", value=sorted(dims)))
    return out


def _prompt_chars(chunk: Chunk) -> int:
    """The characters a chunk puts in the prompt: its text, and its id and `meta`, which the
    prompt shows too. Counting the text alone let a 5 MB `meta` or id through the budget into
    every LLM call."""
    n = len(chunk.text) + len(chunk.id)
    if chunk.meta:
        # A meta that is not plain JSON is named by the meta check; here it counts as nothing.
        with contextlib.suppress(TypeError, ValueError, RecursionError):
            n += len(json.dumps(chunk.meta, ensure_ascii=False, default=str))
    return n


_ID, _TEXT, _META = (attrgetter(name) for name in ("id", "text", "meta"))


def _chars(chunks: list[Chunk]) -> int:
    """`_prompt_chars` summed over `chunks` (the texts and ids counted in C, a meta's JSON only
    for a chunk that has one)."""
    n = sum(map(len, map(_TEXT, chunks))) + sum(map(len, map(_ID, chunks)))
    if any(map(_META, chunks)):
        n += sum(_prompt_chars(c) - len(c.text) - len(c.id) for c in chunks if c.meta)
    return n


def _longest(chunks: list[Chunk], where: Places, lim: Limits, count: Tokenizer) -> str:
    """The (at most 3) longest chunks that each take a tenth of the budget or more, with their place
    and estimated tokens: an over-budget error must say which chunk to shorten, not only the total
    (one 200,000-character document among fifty short ones is the usual cause)."""
    size = {i: chunk_tokens(c, count) for i, c in enumerate(chunks)}
    big = sorted((i for i in size if size[i] * 10 >= lim.max_context_tokens), key=lambda i: -size[i])[:3]
    named = ", ".join(f"id {_short(chunks[i].id)} ({_place(where[i])}) about {size[i]} tokens" for i in big)
    return f"; the longest: {named}" if named else ""


NO_CONTEXT_BUDGET = 2**62
"""A `max_context_tokens` this large is no budget: the guard does not count the texts' tokens
against it. No prompt held in memory comes near it (4 EiB of text), so no count could cross it; a
request that may be shortened is checked so (`options.check_request_options`), and its texts
were counted twice a call, here for nothing and then by `shortening.shorten` for the real budget."""


def _size_violations(
    chunks: list[Chunk], where: Places, n_records: int, lim: Limits, query: str, window_size: int | None,
    count: Tokenizer,
) -> list[Violation]:
    """The count limit and the token budget: for the whole set in one prompt, or per window. Tokens
    are counted as `shortening` counts them (`shortening.tokens_over`: the query and each chunk's
    text, id, score and metadata, by the one estimator or the caller's tokenizer, the UTF-8 byte
    bound first), so the guard and the shortening never disagree about what fits."""
    out: list[Violation] = []
    if window_size is None and n_records > lim.max_chunks:
        advice = MAX_CHUNKS_ADVICE.get()(lim)
        out.append(
            Violation(
                path="chunks",
                message=f"{n_records} chunks is over the limit of {lim.max_chunks} (max_chunks); {advice}",
                value=n_records,
            )
        )
    elif window_size is not None and n_records > lim.max_total_chunks:
        out.append(
            Violation(
                path="chunks",
                message=f"{n_records} chunks is over the limit of {lim.max_total_chunks} (max_total_chunks), "
                "even in windows; pre-filter the set",
                value=n_records,
            )
        )
    size = len(chunks) if window_size is None else window_size
    over: list[tuple[int, int, int]] = []  # (first, end, estimated tokens) of each prompt over budget
    # No budget (`NO_CONTEXT_BUDGET`: a request whose long chunks may be shortened, which
    # `shortening.shorten` fits to the real budget): nothing to count the texts against.
    firsts = range(0, max(len(chunks), 1), max(size, 1)) if lim.max_context_tokens < NO_CONTEXT_BUDGET else ()
    for first in firsts:
        part = chunks[first : first + size]
        est = tokens_over(query, part, lim.max_context_tokens, count)
        if est is not None:
            over.append((first, first + len(part), est))
    if over and window_size is None:
        out.append(
            Violation(
                path="chunks",
                message=f"about {over[0][2]} tokens of text is over the budget of {lim.max_context_tokens} "
                f"(max_context_tokens){_longest(chunks, where, lim, count)}; send fewer or shorter chunks or "
                "raise the budget",
                value=over[0][2],
            )
        )
    elif over:
        named = ", ".join(f"chunks[{a}:{b}] about {est} tokens" for a, b, est in over[:_SHOWN])
        rest = f" and {len(over) - _SHOWN} more" if len(over) > _SHOWN else ""
        out.append(
            Violation(
                path="chunks",
                message=f"{counted(len(over), 'window')} of {window_size} over the budget of "
                f"{lim.max_context_tokens} tokens (max_context_tokens): {named}{rest}"
                f"{_longest(chunks, where, lim, count)}; pass a smaller window_size or shorter chunks",
                value=[est for _, _, est in over],
            )
        )
    return out


def window_size_violations(window_size: Any, top_k: Any, lim: Limits) -> list[Violation]:
    """`window_size` is None (one prompt) or an integer in [top_k, max_chunks]: the final pass ranks
    at most `window_size` survivors, so a smaller window could never return `top_k` chunks."""
    if window_size is None:
        return []
    if isinstance(window_size, bool) or not isinstance(window_size, numbers.Integral):
        msg = f"window_size must be a positive integer or None, got {_short(window_size)}"
        return [Violation(path="window_size", message=msg, value=window_size)]
    if not 1 <= window_size <= lim.max_chunks:
        msg = (f"window_size must be between 1 and {lim.max_chunks} (max_chunks, one prompt), "
               f"got {window_size}")
        return [Violation(path="window_size", message=msg, value=window_size)]
    top_k_ok = not isinstance(top_k, bool) and isinstance(top_k, numbers.Integral) and top_k >= 1
    if top_k_ok and window_size < top_k:
        msg = (f"window_size {window_size} is below top_k {top_k}: the final pass ranks at most window_size "
               "survivors; pass a window_size of at least top_k")
        return [Violation(path="window_size", message=msg, value=window_size)]
    return []


def duplicate_threshold_violations(value: Any) -> list[Violation]:
    """`duplicate_threshold` is None (the embedder's own) or a cosine in [0, 1]: the one rule for
    `rerank`, `arerank` and `eval`. A negative or NaN threshold would silently drop unrelated
    chunks as near-duplicates; 1.0 already keeps all but identical vectors."""
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
        msg = f"duplicate_threshold must be a cosine in [0, 1], got {_short(value)}"
        return [Violation(path="duplicate_threshold", message=msg, value=value)]
    return []


def _usable_window(window_size: Any, lim: Limits) -> bool:
    """A window size the count and budget checks can apply (it may still be below top_k)."""
    if window_size is None:  # one prompt (most calls)
        return False
    ok_type = not isinstance(window_size, bool) and isinstance(window_size, numbers.Integral)
    return ok_type and 1 <= window_size <= lim.max_chunks


def _param_violations(query: Any, top_k: Any, lambda_: Any, lim: Limits) -> list[Violation]:
    out: list[Violation] = []
    if not isinstance(query, str):
        out.append(Violation(path="query", message=f"query must be a string, got {_json_type(query)}"))
    elif not query.strip():
        out.append(Violation(path="query", message="query is empty"))
    elif len(query) > lim.max_query_chars:
        out.append(Violation(path="query", message=f"query has {len(query)} characters, over the limit of "
                             f"{lim.max_query_chars} (max_query_chars)", value=len(query)))
    elif (at := _surrogate_at(query)) is not None:
        out.append(Violation(path="query", message=_surrogate_message("query", at)))
    out.extend(top_k_violations(top_k))
    out.extend(lambda_violations(lambda_))
    return out


def lambda_violations(lambda_: Any) -> list[Violation]:
    """MMR's `lambda` is a finite number in [0, 1]: the one rule for `rerank`, `arerank` and `eval`."""
    if type(lambda_) is float and 0.0 <= lambda_ <= 1.0:  # most calls: no abstract-class check
        return []
    if not _finite_real(lambda_) or not 0.0 <= lambda_ <= 1.0:
        return [Violation(path="lambda", value=lambda_,
                          message=f"lambda must be a number in [0, 1], got {_short(lambda_)}")]
    return []


def normal_top_k(top_k: Any) -> Any:
    """An integral float (3.0, what tool-calling models and JSON Schema's integer often send) as an
    int; anything else unchanged, for `top_k_violations` to judge."""
    if isinstance(top_k, float) and top_k.is_integer():
        return int(top_k)
    return top_k


def top_k_violations(top_k: Any) -> list[Violation]:
    """Why `top_k` (after `normal_top_k`) is not a positive integer; empty when it is."""
    if type(top_k) is int and top_k >= 1:  # most calls: no abstract-class check
        return []
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1:
        return [Violation(path="top_k", message=f"top_k must be a positive integer, got {_short(top_k)}",
                          value=top_k)]
    return []


def _short(value: Any) -> str:
    """A repr that stays on one short line whatever the caller passed."""
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__ must not turn a bad argument into a crash
        text = f"<{type(value).__name__}>"
    text = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\n", "\\n")
    return text if len(text) <= 40 else text[:37] + "..."


def _defaults(query: Any, top_k: Any, lambda_: Any, lim: Limits) -> tuple[Any, Any, Any]:
    top_k = normal_top_k(lim.default_top_k if top_k is None else top_k)
    lambda_ = lim.default_lambda if lambda_ is None else lambda_
    return query, top_k, lambda_


def validate_params(
    query: Any, top_k: Any = None, lambda_: Any = None, *, limits: Limits | None = None
) -> None:
    """The query / top_k / lambda checks of `validate_request` without any chunks.

    For callers that answer an empty candidate list with an empty result (the framework
    components: a retriever may find nothing) yet must reject a missing query or a bad `top_k`
    exactly as `rerank()` would, so the error does not depend on whether anything was retrieved.
    """
    lim = as_limits(limits)
    violations = _param_violations(*_defaults(query, top_k, lambda_, lim), lim)
    if violations:
        raise InputError(violations)


def validate_request(
    query: Any,
    chunks: ChunkSource,
    top_k: Any = None,
    lambda_: Any = None,
    *,
    limits: Limits | None = None,
    window_size: Any = None,
    tokenizer: Any = None,
) -> RerankRequest:
    """Check everything about a request at once; raise one `InputError` naming every problem.

    `window_size` (see `parse_chunks`) is checked here too; the request itself does not carry it.
    `tokenizer` counts the context budget's tokens (see `parse_chunks`)."""
    lim = as_limits(limits)
    query, top_k, lambda_ = _defaults(query, top_k, lambda_, lim)
    if isinstance(window_size, float) and window_size.is_integer():
        window_size = int(window_size)
    violations = _param_violations(query, top_k, lambda_, lim)
    bad_window = window_size_violations(window_size, top_k, lim)
    violations.extend(bad_window)
    parsed: list[Chunk] = []
    try:
        parsed = parse_chunks(chunks, limits=lim, query=query if isinstance(query, str) else "",
                              window_size=window_size if _usable_window(window_size, lim) else None,
                              tokenizer=tokenizer)
    except InputError as exc:
        violations.extend(exc.violations)
    if violations:
        raise InputError(violations)
    return RerankRequest(query=query, chunks=tuple(parsed), top_k=int(top_k), lambda_=float(lambda_),
                         min_score=lim.min_score)
