"""The skill card (`skills/<name>/SKILL.md`) as a typed object.

The card is the single source of truth for inputs, defaults, triggers and the not-for list;
tool schemas, the MCP registration and the router are all derived from what this returns.

The Agent Skills format defines `metadata` as a map from string keys to string *values*, so the
structured parts of the card (`inputs`, `routing`, `examples`) are YAML documents held in string
values (`inputs: |`) that this loader parses. Any Agent Skills client sees a conformant card; we
still get typed inputs and triggers from one file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from .errors import RerankError
from .paths import skills_dir

# The Agent Skills format allows these top-level front-matter keys and no others.
ALLOWED_TOP_LEVEL = frozenset(
    {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}
)
DEFAULT_SKILL = "rag-chunk-reranker"
# Agent Skills: 1-64 lowercase letters, digits and single hyphens, not at either end.
_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_STRUCTURED = ("inputs", "routing", "examples")


class SkillCardError(RerankError):
    """A SKILL.md that does not follow the format; names the file and the key."""


@dataclass(frozen=True)
class InputSpec:
    name: str
    required: bool
    type: str
    description: str
    default: Any = None
    enum: tuple[Any, ...] | None = None  # the allowed values, when the card lists them


@dataclass(frozen=True)
class Example:
    name: str
    query: str
    chunks: str  # JSONL, exactly as the card gives it
    top_k: int
    lambda_: float


@dataclass(frozen=True)
class RoutingExample:
    """One labelled request from the card's routing examples file: should it route to this card?

    `n_chunks` is the candidate count the request came with (a request over the card's
    `max_chunks` is refused by the size precondition, whatever its words); `source` names the
    set it was written in, so a benchmark can hold one set out at a time.
    """

    utterance: str
    route: bool
    n_chunks: int | None = None
    category: str = ""
    source: str = ""


@dataclass(frozen=True)
class SkillCard:
    """A parsed, checked `SKILL.md`: the one source of the inputs, defaults, routing phrases and
    examples the prompt, the tool definitions and the router are generated from."""

    name: str
    description: str
    title: str
    summary: str
    tool_name: str
    inputs: tuple[InputSpec, ...]
    triggers: tuple[str, ...]
    not_for: tuple[str, ...]
    max_chunks: int
    examples: tuple[Example, ...]
    body: str
    path: Path
    # Example utterances from the card's routing block: more reference points for the router than
    # the four seed triggers (route_examples) and the four not-for items (reject_examples).
    route_examples: tuple[str, ...] = ()
    reject_examples: tuple[str, ...] = ()
    # Nouns a count in a request may refer to ("rerank these 200 hits"), for the size precondition.
    count_nouns: tuple[str, ...] = ()
    # Labelled requests from the file named by `routing.examples_file` (JSON Lines, next to the card).
    routing_examples: tuple[RoutingExample, ...] = ()

    def input(self, name: str) -> InputSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def default(self, name: str) -> Any:
        return self.input(name).default

    def example(self, name: str) -> Example:
        for ex in self.examples:
            if ex.name == name:
                return ex
        raise KeyError(name)


def _split_front_matter(text: str, path: Path) -> tuple[dict[str, Any], str]:
    if not text.startswith("---\n"):
        raise SkillCardError(f"{path}: must start with a '---' YAML front matter line")
    end = text.find("\n---\n", 4)
    if end < 0:
        raise SkillCardError(f"{path}: front matter is not closed by a '---' line")
    try:
        front = yaml.safe_load(text[4:end])
    except yaml.YAMLError as exc:
        raise SkillCardError(f"{path}: front matter is not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(front, dict):
        raise SkillCardError(f"{path}: front matter must be a mapping")
    return front, text[end + 5 :]


def _need(mapping: dict[str, Any], key: str, path: Path, where: str = "") -> Any:
    if key not in mapping:
        raise SkillCardError(f"{path}: missing key {where}{key}")
    return mapping[key]


def parse_skill(path: Path) -> SkillCard:
    """The card at `path`, or a `SkillCardError` naming the file and the key at fault."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SkillCardError(f"{path}: cannot read the skill card: {exc}") from None
    front, body = _split_front_matter(text.replace("\r\n", "\n"), path)
    try:
        return _build(front, body, path)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SkillCardError(f"{path}: malformed metadata ({type(exc).__name__}: {exc})") from None


def _metadata(raw: Any, path: Path) -> dict[str, Any]:
    """metadata as the spec defines it (string keys, string values), structured entries parsed."""
    if not isinstance(raw, dict):
        raise SkillCardError(f"{path}: metadata must be a mapping")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise SkillCardError(f"{path}: metadata.{key} must be a string (Agent Skills metadata maps "
                                 f"strings to strings; write structured values as a YAML block: '{key}: |')")
        if key in _STRUCTURED:
            try:
                out[key] = yaml.safe_load(value)
            except yaml.YAMLError as exc:
                msg = " ".join(str(exc).split())
                raise SkillCardError(f"{path}: metadata.{key} is not valid YAML: {msg}") from None
        else:
            out[key] = value
    return out


def _build(front: dict[str, Any], body: str, path: Path) -> SkillCard:
    extra = set(front) - ALLOWED_TOP_LEVEL
    if extra:
        raise SkillCardError(
            f"{path}: top-level keys not allowed by the Agent Skills format: {sorted(extra)}"
        )
    name = _need(front, "name", path)
    if not isinstance(name, str) or len(name) > 64 or not _NAME.match(name):
        raise SkillCardError(f"{path}: name {name!r} must be 1-64 lowercase letters, digits and single "
                             "hyphens")
    if name != path.parent.name:
        raise SkillCardError(f"{path}: name {name!r} must match its folder {path.parent.name!r}")
    description = _need(front, "description", path)
    if not isinstance(description, str) or not description.strip() or len(description) > 1024:
        raise SkillCardError(f"{path}: description must be a non-empty string of at most 1024 characters")
    compatibility = front.get("compatibility")
    if compatibility is not None and not (isinstance(compatibility, str) and 1 <= len(compatibility) <= 500):
        raise SkillCardError(f"{path}: compatibility must be a string of 1-500 characters")
    meta = _metadata(_need(front, "metadata", path), path)
    routing = _need(meta, "routing", path, "metadata.")
    if not isinstance(routing, dict):
        raise SkillCardError(f"{path}: metadata.routing must be a YAML mapping (triggers:, not_for:, ...), "
                             f"got {type(routing).__name__}")
    inputs = tuple(
        InputSpec(
            name=i["name"],
            required=bool(i["required"]),
            type=i["type"],
            description=i.get("description", ""),
            default=i.get("default"),
            enum=tuple(i["enum"]) if isinstance(i.get("enum"), list) else None,
        )
        for i in _need(meta, "inputs", path, "metadata.")
    )
    examples = tuple(
        Example(
            name=e["name"], query=e["query"], chunks=e["chunks"], top_k=int(e["top_k"]),
            lambda_=float(e["lambda"]),
        )
        for e in meta.get("examples", [])
    )
    return SkillCard(
        name=name,
        description=" ".join(description.split()),
        title=meta.get("title", name),
        summary=" ".join(str(meta.get("summary", "")).split()),
        tool_name=meta.get("tool_name", name.replace("-", "_")),
        inputs=inputs,
        triggers=_strings(routing, "triggers", path),
        not_for=_strings(routing, "not_for", path),
        max_chunks=_max_chunks(routing, path),
        examples=examples,
        body=body,
        path=path,
        route_examples=_strings(routing, "route_examples", path),
        reject_examples=_strings(routing, "reject_examples", path),
        count_nouns=_strings(routing, "count_nouns", path),
        routing_examples=_routing_examples(routing, path),
    )


def _max_chunks(routing: dict[str, Any], path: Path) -> int:
    """The size precondition; `int()` would quietly turn `true` into 1 and `50.9` into 50, and a
    negative limit would refuse every request with a message about "0 stated"."""
    value = routing.get("max_chunks", 50)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SkillCardError(f"{path}: metadata.routing.max_chunks must be a positive integer, got {value!r}")
    return value


def _examples_lines(file: Path) -> list[str]:
    """The file's lines, split on "\n" only: JSON may hold U+2028, U+0085 or U+001E raw inside a
    string, which `str.splitlines` would also split on (and so misnumber every later line)."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise SkillCardError(f"{file}: cannot read the routing examples: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        hint = " (it looks like UTF-16; save it as UTF-8)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise SkillCardError(f"{file}:{line}: not UTF-8 text (byte {exc.start}){hint}") from None
    return [line.removesuffix("\r") for line in text.split("\n")]


def _routing_examples(routing: dict[str, Any], path: Path) -> tuple[RoutingExample, ...]:
    """The labelled requests of `routing.examples_file`; a bad line is a card error naming it."""
    name = routing.get("examples_file")
    if name is None:
        return ()
    if not isinstance(name, str) or not name.strip() or Path(name).is_absolute() or ".." in Path(name).parts:
        raise SkillCardError(
            f"{path}: metadata.routing.examples_file must be a file name inside the skill folder"
        )
    file = path.parent / name
    out = []
    for number, line in enumerate(_examples_lines(file), 1):
        if not line.strip():
            continue
        where = f"{file}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SkillCardError(f"{where}: not JSON ({exc.msg})") from None
        except ValueError as exc:  # an integer of over 4,300 digits (the rest is Python advice)
            raise SkillCardError(f"{where}: not JSON ({str(exc).split(';')[0]})") from None
        except RecursionError:
            raise SkillCardError(f"{where}: not JSON (nested too deeply)") from None
        if not isinstance(row, dict):
            raise SkillCardError(f"{where}: must be a JSON object")
        utterance, route, n_chunks = row.get("utterance"), row.get("route"), row.get("n_chunks")
        if not isinstance(utterance, str) or not utterance.strip():
            raise SkillCardError(f"{where}: utterance must be a non-empty string")
        if not isinstance(route, bool):
            raise SkillCardError(f"{where}: route must be true or false, got {route!r}")
        bad_count = isinstance(n_chunks, bool) or not isinstance(n_chunks, int) or n_chunks < 0
        if n_chunks is not None and bad_count:
            raise SkillCardError(
                f"{where}: n_chunks must be a non-negative integer or null, got {n_chunks!r}"
            )
        category, source = row.get("category", ""), row.get("source", "")
        if not isinstance(category, str) or not isinstance(source, str):
            raise SkillCardError(f"{where}: category and source must be strings")
        out.append(RoutingExample(" ".join(utterance.split()), route, n_chunks, category, source))
    return tuple(out)


def _strings(routing: dict[str, Any], key: str, path: Path) -> tuple[str, ...]:
    """An optional list of phrases in the routing block; a non-string item (YAML turned it into a
    number, a mapping, null) is a card error, not something the router should silently skip."""
    items = routing.get(key) or []
    if not isinstance(items, list) or not all(isinstance(x, str) and x.strip() for x in items):
        raise SkillCardError(f"{path}: metadata.routing.{key} must be a list of non-empty strings")
    return tuple(" ".join(x.split()) for x in items)


@cache
def load_skill(name: str = DEFAULT_SKILL) -> SkillCard:
    """The packaged card `skills/<name>/SKILL.md`, parsed once per process; a missing or
    malformed card is a `SkillCardError` naming the file and the key."""
    path = skills_dir() / name / "SKILL.md"
    if not path.is_file():
        raise SkillCardError(f"no skill card {name!r} at {path}")
    return parse_skill(path)


def load_all_skills(root: str | Path | None = None) -> list[SkillCard]:
    """Every card under `skills/`, sorted by name; the router chooses among these.

    A `root` that is not a folder is an error: a mistyped path would otherwise look like a
    folder without cards, and every utterance would quietly route nowhere."""
    base = skills_dir() if root is None else Path(root)
    if not base.is_dir():
        raise SkillCardError(f"{base}: no such skills folder (it should hold <name>/SKILL.md cards)")
    return [parse_skill(p) for p in sorted(base.glob("*/SKILL.md"))]
