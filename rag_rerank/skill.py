"""The skill card (`skills/<name>/SKILL.md`) as a typed object.

The card is the single source of truth for inputs, defaults, triggers and the not-for list;
tool schemas, the MCP registration and the router are all derived from what this returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from .errors import RerankError
from .paths import skills_dir

# The Agent Skills format allows these top-level front-matter keys and no others.
ALLOWED_TOP_LEVEL = frozenset({"name", "description", "license", "compatibility", "metadata", "allowed-tools"})
DEFAULT_SKILL = "rag-chunk-reranker"


class SkillCardError(RerankError):
    """A SKILL.md that does not follow the format; names the file and the key."""


@dataclass(frozen=True)
class InputSpec:
    name: str
    required: bool
    type: str
    description: str
    default: Any = None


@dataclass(frozen=True)
class Example:
    name: str
    query: str
    chunks: str  # JSONL, exactly as the card gives it
    top_k: int
    lambda_: float


@dataclass(frozen=True)
class SkillCard:
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
    front = yaml.safe_load(text[4:end])
    if not isinstance(front, dict):
        raise SkillCardError(f"{path}: front matter must be a mapping")
    return front, text[end + 5 :]


def _need(mapping: dict[str, Any], key: str, path: Path, where: str = "") -> Any:
    if key not in mapping:
        raise SkillCardError(f"{path}: missing key {where}{key}")
    return mapping[key]


def parse_skill(path: Path) -> SkillCard:
    front, body = _split_front_matter(path.read_text(encoding="utf-8"), path)
    extra = set(front) - ALLOWED_TOP_LEVEL
    if extra:
        raise SkillCardError(f"{path}: top-level keys not allowed by the Agent Skills format: {sorted(extra)}")
    name = _need(front, "name", path)
    if name != path.parent.name:
        raise SkillCardError(f"{path}: name {name!r} must match its folder {path.parent.name!r}")
    meta = _need(front, "metadata", path)
    routing = _need(meta, "routing", path, "metadata.")
    inputs = tuple(
        InputSpec(
            name=i["name"],
            required=bool(i["required"]),
            type=i["type"],
            description=i.get("description", ""),
            default=i.get("default"),
        )
        for i in _need(meta, "inputs", path, "metadata.")
    )
    examples = tuple(
        Example(name=e["name"], query=e["query"], chunks=e["chunks"], top_k=int(e["top_k"]), lambda_=float(e["lambda"]))
        for e in meta.get("examples", [])
    )
    return SkillCard(
        name=name,
        description=" ".join(str(_need(front, "description", path)).split()),
        title=meta.get("title", name),
        summary=" ".join(str(meta.get("summary", "")).split()),
        tool_name=meta.get("tool_name", name.replace("-", "_")),
        inputs=inputs,
        triggers=tuple(routing.get("triggers", [])),
        not_for=tuple(routing.get("not_for", [])),
        max_chunks=int(routing.get("max_chunks", 50)),
        examples=examples,
        body=body,
        path=path,
    )


@cache
def load_skill(name: str = DEFAULT_SKILL) -> SkillCard:
    path = skills_dir() / name / "SKILL.md"
    if not path.is_file():
        raise SkillCardError(f"no skill card {name!r} at {path}")
    return parse_skill(path)


def load_all_skills(root: Path | None = None) -> list[SkillCard]:
    """Every card under `skills/`, sorted by name; the router chooses among these."""
    base = root or skills_dir()
    return [parse_skill(p) for p in sorted(base.glob("*/SKILL.md"))]
