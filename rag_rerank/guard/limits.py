"""The numeric limits of the contract, read from `guard/limits.json` so other languages share them."""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from functools import cache
from typing import Any

from ..errors import InputError, Violation
from ..paths import guard_dir
from ..tokens import tokens_in_chars


@dataclass(frozen=True)
class Limits:
    max_chunks: int = 50  # chunks in one prompt (one window)
    max_total_chunks: int = 1000  # candidates of one request split into windows (`window_size`)
    max_context_tokens: int = 32000
    chars_per_token: int = 4
    max_query_chars: int = 4000
    min_score: float = 0.2
    default_top_k: int = 5
    default_lambda: float = 0.7

    def estimate_tokens(self, n_chars: int) -> int:
        """A token bound from a length alone (`tokens.tokens_in_chars`): for a caller that has only
        lengths (the windows' final-pass packing). The input guard counts the text itself
        (`shortening.prompt_tokens`)."""
        return tokens_in_chars(n_chars, self.chars_per_token)

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


_FRACTIONS = frozenset({"min_score", "default_lambda"})


def as_limits(limits: Any) -> Limits:
    """`limits` as a `Limits`: None is the contract's own (`guard/limits.json`), a `Limits` is used
    as is, and a mapping overrides the named fields of the contract's, e.g. `{"max_chunks": 100}`.

    Anything else, an unknown key or a value of the wrong kind is an `InputError` naming each
    one, as a bad `policy` is, rather than an AttributeError deep inside a guard.
    """
    if limits is None:
        return load_limits()
    if isinstance(limits, Limits):
        return limits
    if not isinstance(limits, Mapping):
        msg = f"limits must be None, a Limits or a mapping of its fields, got {type(limits).__name__}"
        raise InputError([Violation(path="limits", message=msg)])
    names = [f.name for f in fields(Limits)]
    problems: list[Violation] = []
    for key, value in limits.items():
        path = f"limits.{key}"
        if key not in names:
            problems.append(Violation(path=path, message=f"unknown limit {key!r}; known: {', '.join(names)}"))
        elif key in _FRACTIONS:
            ok = (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
                  and 0 <= value <= 1)
            if not ok:
                msg = f"{key} must be a number in [0, 1]"
                problems.append(Violation(path=path, value=value, message=msg))
        elif isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            problems.append(Violation(path=path, value=value, message=f"{key} must be a positive integer"))
    if problems:
        raise InputError(problems, headline="invalid limits")
    return replace(load_limits(), **{k: (float(v) if k in _FRACTIONS else int(v)) for k, v in limits.items()})
