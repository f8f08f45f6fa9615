"""The numeric limits of the contract, read from `guard/limits.json` so other languages share them."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from ..paths import guard_dir


@dataclass(frozen=True)
class Limits:
    max_chunks: int = 50
    max_context_tokens: int = 32000
    chars_per_token: int = 4
    max_query_chars: int = 4000
    min_score: float = 0.2
    default_top_k: int = 5
    default_lambda: float = 0.7

    def estimate_tokens(self, n_chars: int) -> int:
        """A cheap, offline token estimate; a real tokenizer would need a download."""
        return -(-n_chars // self.chars_per_token)

    def with_overrides(self, **changes: Any) -> Limits:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


@cache
def load_limits() -> Limits:
    data = json.loads((guard_dir() / "limits.json").read_text(encoding="utf-8"))
    return Limits(**data)


@cache
def load_schema(name: str) -> dict[str, Any]:
    """`name` is `chunk` or `output`."""
    return json.loads((guard_dir() / f"{name}.schema.json").read_text(encoding="utf-8"))
