"""The skill as an LLM tool: OpenAI / Anthropic tool definitions and the function that runs a call.

Everything a calling model sees (tool name, description, parameter descriptions, defaults,
limits) is generated from the skill card and `guard/limits.json`, so the card stays the single
source of truth. The generated definitions are also committed as data (`guard/tools/openai.json`,
`guard/tools/anthropic.json`) for non-Python agents; `python -m rag_rerank.tools --write`
regenerates them and a test fails when they drift from the card.

Why the OpenAI definition looks the way it does: strict function calling (structured outputs)
requires `additionalProperties: false` on every object and every property listed in `required`;
optional parameters are therefore required-but-nullable (`["integer", "null"]`), and `null`
means "use the card's default". Keywords strict mode may reject (minLength, minimum, maxItems
...) are left out of that definition; the limits are stated in the descriptions and enforced by
the input guard in `call_tool` anyway. The Anthropic `input_schema` carries them.

`call_tool` never raises for bad arguments: a calling model gets back
`{"error": {"type": "invalid_input", "violations": [{"path", "message"}, ...]}}`, naming each
field at fault, so it can correct itself and call again.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .api import rerank
from .errors import (
    BackendError,
    InputError,
    MissingDependencyError,
    RerankError,
    Violation,
    whole_argument_first,
)
from .evidence import MIN_TOKENS_PER_CHUNK
from .guard.input import MAX_CHUNKS_ADVICE, PATH_HINT, loads_line, window_advice
from .guard.limits import Limits, as_limits
from .models import RunMeta
from .options import Options, check_request, split_options
from .paths import guard_dir
from .session import SessionCache
from .skill import SkillCard, load_skill

# The card's input name -> the Python keyword of `rerank()` (`lambda` is a Python keyword).
_PARAM = {"query": "query", "chunks": "chunks", "top_k": "top_k", "lambda": "lambda_"}
_JSON_TYPE = {"string": "string", "integer": "integer", "number": "number", "strings": "array"}


def _limits(limits: Limits | None) -> Limits:
    return as_limits(limits)


def _describe(card: SkillCard, name: str, lim: Limits) -> str:
    """The card's own description of an input, plus its default and limits in words."""
    spec = card.input(name)
    text = " ".join(spec.description.split())
    if spec.default is not None:
        text += f" Null means the default, {spec.default}."
    if spec.enum:
        text += f" One of: {', '.join(str(v) for v in spec.enum)}."
    if name == "chunks":
        text += (
            f" Through this tool each record is an object {{id, text}} (plus an optional `meta` object "
            f"where the schema allows it); send between 1 and "
            f"{min(card.max_chunks, lim.max_chunks)} records with unique ids, or up to "
            f"{lim.max_total_chunks} with window_size."
        )
    if name == "top_k":
        text += " A positive integer."
    return text


def _chunk_item_schema(strict: bool = True) -> dict[str, Any]:
    """A chunk record. The conventional shape (Anthropic, MCP) also takes `meta`, a free-form
    object for meta_field / embed_meta_fields; OpenAI strict mode cannot express an object with
    caller-chosen keys, so that definition keeps {id, text} only."""
    props: dict[str, Any] = {
        "id": {"type": "string", "description": "The chunk's id; returned byte for byte."},
        "text": {"type": "string", "description": "The chunk's text."},
    }
    if not strict:
        props["meta"] = {"type": "object", "description": "The chunk's metadata (title, date, ...), "
                         "read by meta_field and embed_meta_fields."}
    return {"type": "object", "properties": props, "required": ["id", "text"], "additionalProperties": False}


def parameters_schema(
    card: SkillCard | None = None, *, strict: bool = True, limits: Limits | None = None
) -> dict[str, Any]:
    """JSON Schema of the tool's arguments, from the card's `inputs`.

    `strict=True` is the OpenAI strict-mode shape (all required, optional ones nullable, no
    range keywords); `strict=False` is the conventional shape used for Anthropic and MCP:
    optional parameters may be omitted and the ranges are spelled out.
    """
    card = card or load_skill()
    lim = _limits(limits)
    props: dict[str, Any] = {}
    required: list[str] = []
    for spec in card.inputs:
        desc = _describe(card, spec.name, lim)
        if spec.type == "chunks":
            prop: dict[str, Any] = {"type": "array", "description": desc, "items": _chunk_item_schema(strict)}
            if not strict:
                prop["minItems"] = 1
                prop["maxItems"] = lim.max_total_chunks  # over max_chunks only with window_size
                prop["items"]["properties"]["id"]["minLength"] = 1
        else:
            json_type = _JSON_TYPE.get(spec.type, "string")
            # An optional input is nullable in both shapes: its description says null means the
            # default, and a schema-checking client (Anthropic, MCP) must accept what it promises.
            prop = {
                "type": json_type if spec.required else [json_type, "null"],
                "description": desc,
            }
            if spec.type == "strings":
                prop["items"] = {"type": "string"}
            if spec.enum:
                prop["enum"] = [*spec.enum] if (spec.required or not strict) else [*spec.enum, None]
            if not strict:
                if spec.name == "top_k":
                    prop["minimum"] = 1
                elif spec.name in ("lambda", "meta_weight"):
                    prop["minimum"], prop["maximum"] = 0, 1
                elif spec.name == "window_size":
                    prop["minimum"], prop["maximum"] = 1, lim.max_chunks
                elif spec.name == "max_tokens_per_chunk":
                    prop["minimum"] = MIN_TOKENS_PER_CHUNK
                elif spec.name == "query":
                    prop["minLength"] = 1
                    prop["maxLength"] = lim.max_query_chars
                if spec.default is not None:
                    prop["default"] = spec.default
        props[spec.name] = prop
        if spec.required or strict:
            required.append(spec.name)
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def openai_tool(card: SkillCard | None = None, *, limits: Limits | None = None) -> dict[str, Any]:
    """One entry of the Chat Completions `tools` list, strict-mode compatible."""
    card = card or load_skill()
    return {
        "type": "function",
        "function": {
            "name": card.tool_name,
            "description": card.description,
            "strict": True,
            "parameters": parameters_schema(card, strict=True, limits=limits),
        },
    }


def anthropic_tool(card: SkillCard | None = None, *, limits: Limits | None = None) -> dict[str, Any]:
    """One entry of the Messages API `tools` list: `{name, description, input_schema}`."""
    card = card or load_skill()
    return {
        "name": card.tool_name,
        "description": card.description,
        "input_schema": parameters_schema(card, strict=False, limits=limits),
    }


MAX_VIOLATIONS = 20  # a tool result is read by a model: 40,000 violations would flood its context


def invalid_input(violations: list[Violation] | tuple[Violation, ...]) -> dict[str, Any]:
    """The structured error a calling model receives for arguments it can fix.

    At most `MAX_VIOLATIONS` are listed, whole-argument ones (a limit, duplicate ids, a bad
    `top_k`) first, since fixing those usually fixes the rest; a last entry counts the others.
    """
    shown = list(violations)
    if len(shown) > MAX_VIOLATIONS:
        shown = whole_argument_first(shown)[: MAX_VIOLATIONS - 1]
        more = len(violations) - len(shown)
        shown.append(Violation(path="arguments", message=f"... and {more} more problems not listed"))
    return {
        "error": {
            "type": "invalid_input",
            "violations": [{"path": v.path, "message": v.message} for v in shown],
        }
    }


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message}}


def parse_arguments(arguments: Any, card: SkillCard | None = None) -> tuple[dict[str, Any], list[Violation]]:
    """Tool-call arguments (a dict, or the JSON string a model emitted) as `rerank()` keywords.

    Only the shape is checked here (an object, known names, required ones present); values are
    judged by the input guard inside `rerank`, which names the record and field at fault.
    """
    card = card or load_skill()
    if isinstance(arguments, (bytes, bytearray)):
        try:
            arguments = arguments.decode("utf-8")
        except UnicodeDecodeError as exc:
            return {}, [Violation(path="arguments", message=f"not UTF-8 text (byte {exc.start})")]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            return {}, [Violation(path="arguments", message=f"not valid JSON: {reason}")]
    if not isinstance(arguments, Mapping):
        return {}, [
            Violation(
                path="arguments", message=f"arguments must be a JSON object, got {type(arguments).__name__}"
            )
        ]
    problems: list[Violation] = []
    known = {spec.name for spec in card.inputs}
    for key in arguments:
        if key not in known:
            problems.append(
                Violation(
                    path=str(key) or "arguments",
                    message=f"unknown argument {key!r}; expected one of {sorted(known)}",
                )
            )
    kwargs: dict[str, Any] = {}
    for spec in card.inputs:
        value = arguments.get(spec.name)
        if value is None:
            if spec.required:
                problems.append(Violation(path=spec.name, message=f"missing required argument '{spec.name}'"))
            continue  # null or absent: rerank() applies the card's default
        if spec.type == "chunks" and isinstance(value, str) and value.lstrip().startswith("["):
            value = _encoded_array(value)
        if spec.type == "chunks" and not isinstance(value, (list, str)):
            problems.append(
                Violation(path=spec.name, message="chunks must be an array of {id, text} objects")
            )
            continue
        kwargs[_PARAM.get(spec.name, spec.name)] = value
    return kwargs, problems


def _names_an_argument(path: str) -> bool:
    """Whether a violation's path is (inside) one of the tool's arguments: `chunks[3].id`, `top_k`."""
    root = re.split(r"[.\[]", path, maxsplit=1)[0]
    return root == "arguments" or root in {spec.name for spec in load_skill().inputs}


def _encoded_array(text: str) -> Any:
    """`chunks` sent as the JSON text of an array (models often encode a nested array as a string
    where the schema says array) is that array; anything else stays text for the input guard, which
    reads it as JSONL and names what is wrong."""
    try:
        value, duplicates = loads_line(text)
    except (ValueError, RecursionError):
        return text
    return value if isinstance(value, list) and not duplicates else text


def call_tool(arguments: Any, **options: Any) -> dict[str, Any]:
    """Run one tool call: the result object, or `{"error": {...}}`; never raises for bad input.

    `options` go to `rerank()` (backend, model, base_url, api_key, embedder, fallback, ...);
    the default is the offline `local` backend. Error types: `invalid_input` (with violations),
    `backend_failure`, `missing_dependency`, `error`.
    """
    return run_tool(arguments, **options)[0]


def fallback_field(meta: RunMeta) -> dict[str, Any] | None:
    """What a calling model is told when `fallback="local"` answered (None when it did not): the
    result object alone looks exactly like the backend's own ranking. `backend` is "local" when
    the local backend ranked instead of the one configured, `embedder` is "lexical" when lexical
    vectors replaced a failed embedder's, and `notice` says why in one line."""
    notice = meta.fallback_notice()
    if notice is None:
        return None
    return {"backend": meta.fallback, "embedder": meta.embedder_fallback, "notice": notice}


def run_tool(arguments: Any, *, sessions: SessionCache | None = None,
             **options: Any) -> tuple[dict[str, Any], RunMeta | None]:
    """`call_tool`'s answer and, when the rerank ran, its `RunMeta` (the MCP server reports a
    fallback from it). With `sessions` (what a long-lived server holds), every call reranks with the
    one `Reranker` built from `options`; without, the call is a one-shot `rerank()`."""
    kwargs, problems = parse_arguments(arguments)
    if problems:
        return invalid_input(problems), None
    hint = PATH_HINT.set("")  # a calling model cannot pass a pathlib.Path: no Python advice
    # A calling model has this tool's arguments, not the CLI's flags: advise its own window_size.
    advice = MAX_CHUNKS_ADVICE.set(functools.partial(window_advice, cli=False))
    try:
        # The calling model's arguments are judged before the operator's settings build anything: a
        # bad argument is `invalid_input` whatever the setup, a bad setup is not the model's to fix.
        _, request_options = split_options(options)
        own = {k: v for k, v in kwargs.items() if k not in ("query", "chunks")}
        check_request(kwargs.get("query"), kwargs.get("chunks"), Options().merged({**request_options, **own}))
        if sessions is None:
            result = rerank(**kwargs, **options)
        else:
            reranker, request = sessions.get(options)
            result = reranker.rerank(**kwargs, **request)
    except InputError as exc:
        if not any(_names_an_argument(v.path) for v in exc.violations):
            # The operator's options (a missing model or server URL, a bad embedder or limits), not
            # the arguments: `invalid_input` would have the calling model retry with other arguments.
            problems = "; ".join(f"{v.path}: {v.message}" for v in exc.violations)
            return _error("error", "the tool is misconfigured (not a problem with the arguments): "
                          f"{problems}"), None
        return invalid_input(exc.violations), None
    except BackendError as exc:
        return _error("backend_failure", str(exc)), None
    except MissingDependencyError as exc:
        return _error("missing_dependency", str(exc)), None
    except RerankError as exc:
        return _error("error", str(exc)), None
    finally:
        MAX_CHUNKS_ADVICE.reset(advice)
        PATH_HINT.reset(hint)
    return result.to_dict(), result.meta


TOOL_FILES = {"openai": "openai.json", "anthropic": "anthropic.json"}


def generated() -> dict[str, dict[str, Any]]:
    """What the committed files under guard/tools/ must contain."""
    return {"openai": openai_tool(), "anthropic": anthropic_tool()}


def dumps(obj: Mapping[str, Any]) -> str:
    """The canonical text of a committed definition (stable key order, trailing newline)."""
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def write_tool_files(folder: Path | None = None) -> list[Path]:
    """Regenerate guard/tools/*.json from the card; returns the paths written."""
    out = folder or guard_dir() / "tools"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, definition in generated().items():
        path = out / TOOL_FILES[kind]
        path.write_text(dumps(definition), encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m rag_rerank.tools",
        description="print or regenerate the tool definitions from the skill card",
    )
    ap.add_argument("--write", action="store_true", help="rewrite guard/tools/openai.json and anthropic.json")
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed files differ from the card")
    args = ap.parse_args(argv)
    if args.write:
        for path in write_tool_files():
            print(path)
        return 0
    if args.check:
        stale = [
            name
            for kind, name in TOOL_FILES.items()
            if not (guard_dir() / "tools" / name).is_file()
            or (guard_dir() / "tools" / name).read_text(encoding="utf-8") != dumps(generated()[kind])
        ]
        for name in stale:
            print(
                f"guard/tools/{name} is out of date; run: python -m rag_rerank.tools --write", file=sys.stderr
            )
        return 1 if stale else 0
    print(dumps(generated()), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
