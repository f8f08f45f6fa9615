"""The output guard: judges a raw LLM answer against the card's contract.

It is strict on purpose: exactly one JSON object and nothing else, schema-conformant, ids
verbatim, no id twice, at most top_k ranked, scores in [0, 1] and above the minimum, reasons that
cite the chunk. It reports every violation with a JSON path so a re-ask can quote them all; it
never edits content. Formatting salvage is a separate, explicit step (`repair.py`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from jsonschema import Draft202012Validator

from ..errors import OutputError, Violation
from ..models import Chunk
from .limits import Limits, load_limits, load_schema

REDUNDANT_PREFIX = "redundant_with:"

_WORD = re.compile(r"\w+", re.UNICODE)
_STOPWORDS = frozenset(
    """a about above after again against all also am an and any are as at be because been before being below
    between both but by can could did do does doing down during each either few for from further had has have
    having he her here hers him his how i if in into is it its itself just me more most my no nor not now of off
    on once only or other our out over own same she should so some such than that the their them then there
    these they this those through to too under until up very was we were what when where which while who whom
    why will with would you your yours use used using one two per via""".split()
)
# Words that say a chunk is relevant without saying why; they do not count as a citation.
_GENERIC = frozenset(
    """relevant relevance highly high query question chunk chunks passage passages document documents text
    matches match matching information info content topic topics related relates discusses discussed mentions
    mentioned useful answer answers good directly direct addresses address contains contain provides provide
    describes describe explains explain talks score scored relevantly pertinent important covers cover
    helpful best strong strongly context user users request asks asked""".split()
)


def _stem(word: str) -> str:
    return word[:5]


def _content_tokens(text: str) -> set[str]:
    out = set()
    for w in _WORD.findall(text.lower()):
        if w in _STOPWORDS or w in _GENERIC:
            continue
        if len(w) >= 3 or any(ch.isdigit() for ch in w):
            out.add(_stem(w))
    return out


def _non_ascii_runs(text: str) -> set[str]:
    """Bigrams of non-Latin word characters (CJK and the like have no spaces to split on)."""
    runs = re.findall(r"[^\x00-\u024f\s\W]{2,}", text)
    return {r[i : i + 2] for r in runs for i in range(len(r) - 1)}


def cites_chunk(reason: str, chunk_text: str) -> bool:
    """True when the reason names something concrete (a word, entity, number) from the chunk."""
    if _content_tokens(reason) & _content_tokens(chunk_text):
        return True
    grams = _non_ascii_runs(reason)
    return bool(grams) and any(g in chunk_text for g in grams)


class _DuplicateKeys:
    """object_pairs_hook that remembers duplicate keys instead of silently keeping the last."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                self.found.append(key)
            seen[key] = value
        return seen


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in JSON output")


def parse_output(raw: str) -> tuple[dict[str, Any] | None, list[Violation]]:
    """Strict parse: one JSON object, nothing before or after it (surrounding whitespace aside)."""
    if not isinstance(raw, str):
        return None, [Violation(path="$", message=f"output must be text, got {type(raw).__name__}")]
    text = raw.strip()
    if not text:
        return None, [Violation(path="$", message="output is empty")]
    if not text.startswith("{"):
        if text.startswith("```"):
            msg = "output is wrapped in a Markdown code fence; return the bare JSON object"
        elif text.lower().startswith("<think>"):
            msg = "output starts with a <think> block; return only the JSON object"
        elif "{" in text:
            msg = f"text before the JSON object: {text[: min(text.index('{'), 40)]!r}"
        else:
            msg = "output holds no JSON object"
        return None, [Violation(path="$", message=msg)]
    hook = _DuplicateKeys()
    decoder = json.JSONDecoder(object_pairs_hook=hook, parse_constant=_reject_constant)
    try:
        obj, end = decoder.raw_decode(text)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text) - 1 or "Unterminated" in exc.msg:
            msg = f"output is truncated or unterminated JSON ({exc.msg} at char {exc.pos})"
        else:
            msg = f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        return None, [Violation(path="$", message=msg)]
    except ValueError as exc:
        return None, [Violation(path="$", message=str(exc))]
    violations: list[Violation] = []
    rest = text[end:].strip()
    if rest:
        violations.append(Violation(path="$", message=f"text after the JSON object: {rest[:40]!r}"))
    if hook.found:
        violations.append(Violation(path="$", message=f"duplicate keys in an object: {sorted(set(hook.found))}"))
    return obj, violations


_validator: list[Draft202012Validator] = []


def _output_validator() -> Draft202012Validator:
    if not _validator:
        _validator.append(Draft202012Validator(load_schema("output")))
    return _validator[0]


def _json_path(parts: Sequence[Any]) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _schema_message(err: Any) -> str:
    if err.validator == "additionalProperties":
        return f"unknown key(s): {err.message.split('(')[-1].rstrip(')')}"
    if err.validator == "type":
        return f"must be {err.validator_value}, got {json.dumps(err.instance)[:40]}"
    if err.validator in ("minimum", "maximum"):
        return f"score {err.instance} is outside [0, 1]"
    if err.validator in ("minLength", "pattern"):
        return "must be a non-empty string"
    return err.message


def output_violations(
    obj: Any,
    chunks: Sequence[Chunk],
    top_k: int,
    *,
    limits: Limits | None = None,
) -> list[Violation]:
    """Every way a parsed output object breaks the contract for these chunks."""
    lim = limits or load_limits()
    out: list[Violation] = []
    for err in _output_validator().iter_errors(obj):
        out.append(Violation(path=_json_path(err.absolute_path), message=_schema_message(err), value=err.instance))
    if not isinstance(obj, Mapping):
        return out
    texts = {c.id: c.text for c in chunks}
    folded: dict[str, str] = {}
    for cid in texts:
        folded.setdefault(cid.strip().casefold(), cid)
    seen: dict[str, str] = {}
    ranked = obj.get("ranked") if isinstance(obj.get("ranked"), list) else []
    dropped = obj.get("dropped") if isinstance(obj.get("dropped"), list) else []
    ranked_ids = {item.get("id") for item in ranked if isinstance(item, Mapping)}
    for section, items in (("ranked", ranked), ("dropped", dropped)):
        for i, item in enumerate(items):
            if not isinstance(item, Mapping) or not isinstance(item.get("id"), str):
                continue
            path = f"$.{section}[{i}]"
            cid = item["id"]
            if cid not in texts:
                near = folded.get(cid.strip().casefold())
                hint = f" (did you mean {near!r}? ids are kept byte for byte)" if near else ""
                out.append(Violation(path=f"{path}.id", message=f"{cid!r} is not an input id{hint}", value=cid,
                                     id=cid))
            if cid in seen:
                out.append(Violation(path=f"{path}.id", message=f"id {cid!r} appears twice (first at {seen[cid]})",
                                     value=cid, id=cid))
            else:
                seen[cid] = path
            reason = item.get("reason")
            if section == "ranked":
                score = item.get("score")
                if isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score) \
                        and 0 <= score <= 1 and score <= lim.min_score:
                    out.append(Violation(path=f"{path}.score", message=f"score {score} is not above the minimum "
                                         f"{lim.min_score}; such a chunk belongs in dropped", value=score, id=cid))
                if isinstance(reason, str) and reason.strip() and cid in texts and not cites_chunk(reason, texts[cid]):
                    out.append(Violation(path=f"{path}.reason", message=f"reason {reason[:60]!r} cites nothing "
                                         "concrete from the chunk's text (name a phrase, entity or claim)",
                                         value=reason, id=cid))
            elif isinstance(reason, str) and reason.startswith(REDUNDANT_PREFIX):
                target = reason[len(REDUNDANT_PREFIX):]
                if target not in ranked_ids:
                    out.append(Violation(path=f"{path}.reason", message=f"{reason!r} must name a ranked id",
                                         value=reason, id=cid))
    if len(ranked) > top_k:
        out.append(Violation(path="$.ranked", message=f"{len(ranked)} ranked items is more than top_k={top_k}",
                             value=len(ranked)))
    return out


def judge(raw: str, chunks: Sequence[Chunk], top_k: int, *, limits: Limits | None = None
          ) -> tuple[dict[str, Any] | None, list[Violation]]:
    """Parse and check in one go: (object or None, every violation)."""
    obj, violations = parse_output(raw)
    if obj is not None:
        violations += output_violations(obj, chunks, top_k, limits=limits)
    return obj, violations


def check_output(raw: str, chunks: Sequence[Chunk], top_k: int, *, limits: Limits | None = None
                 ) -> dict[str, Any]:
    """The validated object, or an `OutputError` carrying every violation."""
    obj, violations = judge(raw, chunks, top_k, limits=limits)
    if violations or obj is None:
        raise OutputError(violations, raw=raw)
    return obj
