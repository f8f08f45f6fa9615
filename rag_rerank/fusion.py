"""Scoring-side options on chunk metadata: metadata fusion and `embed_meta_fields`.

**Metadata fusion** (what Haystack users know as `MetaFieldRanker`, formerly `RecentnessRanker`)
blends the scorer's order with the order of one metadata field (a date, a rating, a version).
It runs after the backend's guarded answer and before the post-pass (MMR, duplicates), on the
candidates the scorer ranked; chunks it dropped (below the minimum score) stay dropped, so
metadata can reorder relevant chunks but never make an irrelevant one relevant.

Both sides enter as ranks (1 = best), because relevance scores and metadata values have no
common scale:

* `reciprocal_rank_fusion` (default): f = ((1 - w) / (60 + r_score) + w / (60 + r_meta)) * 61,
  so f is 1 for a chunk first on both sides and RRF's usual k = 60 keeps one outlier rank from
  deciding alone;
* `linear_score`: f = (1 - w) * s + w * m, with s the scorer's score rescaled from (0.2, 1] to
  (0, 1] and m = (n - r_meta) / (n - 1), 1 for the best metadata value and 0 for the worst.

`w` is `meta_weight` in [0, 1]: 0 leaves the scorer's answer untouched (fusion is skipped), 1
orders by metadata only (ties broken by the scorer's order). The fused order then decides which
chunk gets which score: the scorer's own scores, sorted best first, are handed out in fused order
(the first chunk gets the best score, and so on). So scores stay on the scorer's scale, every
one stays above the minimum score, and MMR's lambda trades the same quantities as without fusion
while its relevance order is the fused one. (A reason keeps the figure the scorer gave its
chunk.) Chunks without the field sort to the `bottom` (default) or the `top`, or are dropped
(`missing_meta: <field>` in `dropped`). Equal values share a rank.

**embed_meta_fields** puts the values of the listed meta keys on lines before the chunk's text in
the copy of the request that the scorers see (the LLM prompt, the local and cross-encoder
scorers, the rerank API, the post-pass embedder), as Haystack's rankers do; the caller's chunks and
the output (ids, scores, reasons) are never changed.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from . import reasons
from .errors import InputError, Violation
from .models import Chunk, Dropped, Ranked, RerankRequest

RANKING_MODES = ("reciprocal_rank_fusion", "linear_score")
SORT_ORDERS = ("descending", "ascending")
MISSING_META = ("bottom", "top", "drop")
VALUE_TYPES = ("float", "int", "date")
RRF_K = 60
MISSING_META_TOKEN = reasons.MISSING_META


@dataclass(frozen=True)
class MetaFusion:
    """The metadata-fusion options of one request (see the module docstring)."""

    field: str
    weight: float = 1.0
    ranking_mode: str = "reciprocal_rank_fusion"
    sort_order: str = "descending"
    missing: str = "bottom"
    value_type: str = "float"


def meta_fusion(
    meta_field: Any = None,
    meta_weight: Any = 1.0,
    meta_ranking_mode: Any = "reciprocal_rank_fusion",
    meta_sort_order: Any = "descending",
    missing_meta: Any = "bottom",
    meta_value_type: Any = "float",
) -> MetaFusion | None:
    """The options checked together (every problem at once), or None when `meta_field` is None."""
    bad: list[Violation] = []

    def choose(name: str, value: Any, allowed: Sequence[str]) -> None:
        if value not in allowed:
            bad.append(Violation(path=name, value=value,
                                 message=f"{name} must be one of {', '.join(allowed)}, got {value!r}"))

    choose("meta_ranking_mode", meta_ranking_mode, RANKING_MODES)
    choose("meta_sort_order", meta_sort_order, SORT_ORDERS)
    choose("missing_meta", missing_meta, MISSING_META)
    choose("meta_value_type", meta_value_type, VALUE_TYPES)
    weight_ok = (isinstance(meta_weight, numbers.Real) and not isinstance(meta_weight, bool)
                 and math.isfinite(meta_weight) and 0.0 <= meta_weight <= 1.0)
    if not weight_ok:
        bad.append(Violation(path="meta_weight", value=meta_weight,
                             message=f"meta_weight must be a number in [0, 1], got {meta_weight!r}"))
    if meta_field is not None and (not isinstance(meta_field, str) or not meta_field.strip()):
        bad.append(Violation(path="meta_field", value=meta_field,
                             message=f"meta_field must be a non-empty meta key, got {meta_field!r}"))
    if bad:
        raise InputError(bad, headline="invalid metadata fusion options")
    if meta_field is None:
        return None
    return MetaFusion(meta_field, float(meta_weight), meta_ranking_mode, meta_sort_order, missing_meta,
                      meta_value_type)


_YEAR = re.compile(r"\A\d{4}\Z")
_YEAR_MONTH = re.compile(r"\A\d{4}-(?:0[1-9]|1[0-2])\Z")


# ISO 8601 forms Python 3.11's `fromisoformat` reads and 3.10's (the oldest we support) refuses, so the
# same data would rank on one and be "not a valid date" on the other: a basic-format date `20240301`,
# a fraction other than 3 or 6 digits or after a comma (`10:00:00.5`, `10:00:00,5`), a zone without
# a colon or without minutes (`+0000`, strftime's %z; `+01`). Rewritten to the extended form 3.10 reads.
_BASIC_DATE = re.compile(r"\A(\d{4})(\d{2})(\d{2})(?=\Z|[T ])")
_FRACTION = re.compile(r"(?<=:\d{2})[.,](\d+)")
_ZONE = re.compile(r"(?<=\d)([+-])(\d{2})(\d{2})?\Z")


def _extended_iso(text: str) -> str:
    """`text` with the ISO 8601 spellings above rewritten so `fromisoformat` reads them on 3.10 too."""
    text = _BASIC_DATE.sub(r"\1-\2-\3", text)
    if len(text) <= 10:  # a date alone: nothing below applies
        return text
    date, time = text[:10], text[10:]
    time = _FRACTION.sub(lambda m: "." + (m.group(1) + "000000")[:6], time)
    time = _ZONE.sub(lambda m: f"{m.group(1)}{m.group(2)}:{m.group(3) or '00'}", time)
    return date + time


def _parse_date(value: Any) -> float:
    if not isinstance(value, str):
        raise ValueError(f"expected an ISO 8601 date string, got {type(value).__name__}")
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    # ISO 8601's reduced precisions, a year or a year and month (publication years, "2024-05"), which
    # `fromisoformat` refuses: the start of the period, so "2024" sorts before "2024-03-01".
    if _YEAR.match(text):
        text += "-01-01"
    elif _YEAR_MONTH.match(text):
        text += "-01"
    when = datetime.fromisoformat(_extended_iso(text))
    if when.tzinfo is None:  # a date without a zone is read as UTC, so naive and aware values compare
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def _parse(value: Any, value_type: str) -> float:
    """A metadata value as a sortable float, or ValueError saying why not."""
    if value_type == "date":
        return _parse_date(value)
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    if value_type == "int":
        if isinstance(value, numbers.Integral):
            return float(value)
        if isinstance(value, float) and value.is_integer():
            return value
        if isinstance(value, str):
            return float(int(value.strip()))
        raise ValueError(f"expected an integer, got {type(value).__name__}")
    if isinstance(value, numbers.Real):
        number = float(value)
    elif isinstance(value, str):
        number = float(value.strip())
    else:
        raise ValueError(f"expected a number, got {type(value).__name__}")
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    return number


def meta_values(request: RerankRequest, fusion: MetaFusion) -> dict[str, float | None]:
    """Each chunk's parsed value of the field (None when absent or null), keyed by id; an
    `InputError` naming every chunk whose value does not parse as `value_type`, or the field
    when no chunk has it at all."""
    metas = [c.meta if isinstance(c.meta, Mapping) else {} for c in request.chunks]
    if metas and not any(fusion.field in m for m in metas):
        # Every chunk would be `missing_meta` (with "drop": nothing ranked at all): almost surely a typo.
        seen = sorted({str(k) for m in metas for k in m})
        hint = f"; keys seen: {', '.join(seen[:8])}{', ...' if len(seen) > 8 else ''}" if seen else ""
        raise InputError([Violation(path="meta_field", value=fusion.field,
                                    message=f"no chunk has meta field {fusion.field!r} (meta_field); "
                                    f"probably a typo{hint}")])
    out: dict[str, float | None] = {}
    bad: list[Violation] = []
    for index, chunk in enumerate(request.chunks):
        meta = chunk.meta if isinstance(chunk.meta, Mapping) else {}
        raw = meta.get(fusion.field)
        if raw is None:
            out[chunk.id] = None
            continue
        try:
            out[chunk.id] = _parse(raw, fusion.value_type)
        except (ValueError, OverflowError) as exc:
            shown = json.dumps(raw, ensure_ascii=False)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            bad.append(Violation(path=f"chunks[{index}].meta.{fusion.field}", id=chunk.id, value=raw,
                                 message=f"{shown} is not a valid {fusion.value_type} "
                                 f"(meta_value_type): {exc}"))
    if bad:
        raise InputError(bad, headline="invalid metadata values")
    return out


def _ranks(values: Sequence[float]) -> list[int]:
    """1-based competition ranks ("1224"): equal values share the better rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0] * len(values)
    for pos, i in enumerate(order):
        ranks[i] = pos + 1 if pos == 0 or values[i] != values[order[pos - 1]] else ranks[order[pos - 1]]
    return ranks


def fuse(
    ranked: Sequence[Ranked],
    dropped: Sequence[Dropped],
    values: Mapping[str, float | None],
    fusion: MetaFusion,
    min_score: float,
) -> tuple[list[Ranked], list[Dropped]]:
    """The scorer's ranked candidates re-scored and re-ordered by fusion with the metadata field,
    and `dropped` extended with the candidates dropped for a missing value (module docstring)."""
    dropped = list(dropped)
    if fusion.weight == 0.0 or not ranked:
        return list(ranked), dropped
    keep: list[Ranked] = []
    for r in ranked:
        if values.get(r.id) is None and fusion.missing == "drop":
            dropped.append(Dropped(r.id, reasons.reason(MISSING_META_TOKEN, fusion.field)))
        else:
            keep.append(r)
    if not keep:
        return keep, dropped
    n = len(keep)
    sign = -1.0 if fusion.sort_order == "descending" else 1.0
    present = [values[r.id] for r in keep if values.get(r.id) is not None]
    # A missing value sorts after (bottom) or before (top) every present one.
    edge = (max(sign * v for v in present) + 1.0 if fusion.missing != "top" else
            min(sign * v for v in present) - 1.0) if present else 0.0
    keys = [sign * v if (v := values.get(r.id)) is not None else edge for r in keep]
    meta_rank = _ranks(keys)
    score_order = sorted(range(n), key=lambda i: -keep[i].score)  # stable: the scorer's ties stay
    score_rank = [0] * n
    for pos, i in enumerate(score_order):
        score_rank[i] = pos + 1
    w = fusion.weight
    fused: list[float] = []
    for i, r in enumerate(keep):
        if fusion.ranking_mode == "reciprocal_rank_fusion":
            f = ((1.0 - w) / (RRF_K + score_rank[i]) + w / (RRF_K + meta_rank[i])) * (RRF_K + 1)
        else:
            s = (r.score - min_score) / (1.0 - min_score)
            m = (n - meta_rank[i]) / (n - 1) if n > 1 else 1.0
            f = (1.0 - w) * s + w * m
        fused.append(f)
    order = sorted(range(n), key=lambda i: (-fused[i], score_rank[i]))
    slots = slot_scores(keep, min_score)
    return [replace(keep[i], score=s) for i, s in zip(order, slots, strict=True)], dropped


def slot_scores(ranked: Sequence[Ranked], min_score: float) -> list[float]:
    """The scorer's scores, best first, made strictly decreasing at 3 decimals (a tie would let
    the post-pass break it by input order, undoing the fused order) and kept above `min_score`."""
    out: list[float] = []
    for s in sorted((r.score for r in ranked), reverse=True):
        if out and s >= out[-1]:
            s = out[-1] - 0.001
        out.append(round(max(s, min_score + 0.001), 3))
    return out


# --------------------------------------------------------------------------- embed_meta_fields


def check_embed_meta_fields(fields: Any) -> tuple[str, ...]:
    """The listed meta keys as a tuple, or an `InputError` (a bare string is refused rather than
    read as one key per character)."""
    if fields is None:
        return ()
    if isinstance(fields, str) or not isinstance(fields, Sequence):
        msg = f"embed_meta_fields must be a list of meta keys, got {type(fields).__name__}"
        if isinstance(fields, str):
            msg += f" (for one key write [{fields!r}])"
        raise InputError([Violation(path="embed_meta_fields", message=msg, value=fields)])
    bad = [Violation(path=f"embed_meta_fields[{i}]", value=f,
                     message=f"a meta key must be a non-empty string, got {f!r}")
           for i, f in enumerate(fields) if not isinstance(f, str) or not f.strip()]
    if bad:
        raise InputError(bad)
    return tuple(dict.fromkeys(fields))


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def embedded_text(chunk: Chunk, fields: Sequence[str]) -> str:
    """The chunk's text with the listed meta values on lines before it (absent or null skipped)."""
    meta = chunk.meta if isinstance(chunk.meta, Mapping) else {}
    head = [_as_text(meta[f]) for f in fields if meta.get(f) is not None]
    return "\n".join([*head, chunk.text]) if head else chunk.text


def with_embedded_meta(request: RerankRequest, fields: Sequence[str]) -> RerankRequest:
    """The request the scorers see: each chunk's text prefixed with its listed meta values (the
    caller's texts kept in `own_texts`, which reasons quote)."""
    if not fields:
        return request
    chunks = tuple(replace(c, text=embedded_text(c, fields)) for c in request.chunks)
    return replace(request, chunks=chunks, own_texts={c.id: c.text for c in request.chunks})


__all__ = ["MISSING_META_TOKEN", "MetaFusion", "check_embed_meta_fields", "embedded_text", "fuse",
           "meta_fusion", "meta_values", "with_embedded_meta"]
