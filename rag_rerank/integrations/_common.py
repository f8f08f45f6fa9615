"""What the three framework components share, so they behave alike and none re-implements `rerank`.

* **Options.** Every component takes `rerank()`'s options under `rerank()`'s names
  (`options.ALL_OPTIONS`), so an option added to `rerank()` later is accepted by every component
  without a change here, while a misspelt one is refused when the component is built instead of on
  the first query.
* **One session.** Each component reranks through a `Reranker` session (`SessionCache`) built on first
  use from its options and kept: one backend, one connection pool, one embedder model for every
  call, rebuilt only when a session option (backend, model, base_url, api_key, embedder) changes.
* **Ids.** Only an id and the text of each item go to the reranker; the result names ids, and
  `placed` maps them back to the caller's items by position, so metadata of any type (datetimes,
  objects) never passes through JSON and comes back untouched. The one exception is metadata the
  options name (`meta_field`, `embed_meta_fields`): those keys alone are sent as the chunk's
  `meta`, a `datetime` / `date` as its ISO 8601 text and a numpy scalar, `Decimal`, `UUID` or path
  as the plain value it stands for (`_plain`), so metadata fusion and embedded titles work from
  every framework.
* **Empty input.** A retriever may find nothing: an empty list gives an empty result, after the
  query and count are checked exactly as `rerank()` checks them.
* **Keys.** The same metadata keys in all three frameworks (below).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..backends.factory import name_of, unused_option_violations
from ..errors import InputError, Violation
from ..guard.input import validate_params
from ..models import Dropped, Ranked, RerankResult, RunMeta
from ..options import ALL_OPTIONS
from ..retry import RetryPolicy
from ..session import SessionCache

# Metadata keys written on the returned copies (LangChain metadata, LlamaIndex node metadata,
# Haystack meta). Prefixed so they never overwrite a caller's own "reason" or "note".
SCORE_KEY = "relevance_score"  # LangChain's convention for rerankers; the others have a score field
REASON_KEY = "rerank_reason"
NOTE_KEY = "rerank_diversity_note"
DROPPED_KEY = "rerank_dropped_reason"

# Arguments of rerank() a component supplies itself: the query and items come with each call, and
# the count has the framework's own name (top_n in LangChain and LlamaIndex, top_k in Haystack).
_SUPPLIED = ("query", "chunks", "top_k")

T = TypeVar("T")


def rerank_option_names() -> tuple[str, ...]:
    """The keyword options of `rerank()` a component may pass through (all but its own `top_k`)."""
    return tuple(name for name in ALL_OPTIONS if name not in _SUPPLIED)


def check_options(options: Mapping[str, Any], *, component: str, count_name: str) -> dict[str, Any]:
    """`options` as a dict when every name is a `rerank()` option; else one `InputError` naming all."""
    known = rerank_option_names()
    bad: list[Violation] = []
    for name in options:
        if name == "top_k" and count_name != "top_k":
            msg = f"{component} takes the count as {count_name!r} (the framework's name), not 'top_k'"
            bad.append(Violation(path=name, message=msg))
        elif name not in known:
            msg = f"{component} got an unknown option {name!r}; rerank() options are: {', '.join(known)}"
            bad.append(Violation(path=name, message=msg))
    if bad:
        raise InputError(bad)
    return dict(options)


def check_connection(backend: Any, *, model: Any, base_url: Any, api_key: Any) -> None:
    """A `model`, `base_url` or `api_key` the named backend would ignore is refused when the
    component is built (`RagRerankCompressor(model="gpt-4o-mini")` without `backend="openai"`),
    as `rerank()` refuses it, instead of on the first query."""
    if isinstance(backend, str):
        bad = unused_option_violations(backend, model=model, base_url=base_url, api_key=api_key)
        if bad:
            raise InputError(bad)


@dataclass(frozen=True)
class Reranked(Generic[T]):
    """Everything one call produced, for callers that need more than the kept items.

    `items` are copies of the kept items in ranked order (score, reason and note set); `dropped`
    are copies of every other item with `rerank_dropped_reason` in their metadata, in the order
    of `result.dropped`; `result` is the `RerankResult` itself (ids, reasons, and `result.meta`,
    the `RunMeta`: backend, model, attempts, repairs, usage, latency, fallback).
    """

    items: tuple[T, ...]
    dropped: tuple[T, ...]
    result: RerankResult

    @property
    def meta(self) -> RunMeta:
        return self.result.meta


def collect_options(data: Any, fields: set[str], *, component: str) -> Any:
    """A pydantic component's constructor keywords (LangChain, LlamaIndex): keywords that are not
    fields are rerank() options, checked by name now (an `InputError` naming any unknown one) and
    kept in `rerank_options` to pass on later; a field given inside `rerank_options` is refused."""
    if not isinstance(data, Mapping):
        return data
    extra = {k: v for k, v in data.items() if k not in fields}
    options = {**dict(data.get("rerank_options") or {}), **extra}
    check_options(options, component=component, count_name="top_n")
    clash = sorted(set(options) & fields)
    if clash:
        msg = f"give {', '.join(clash)} as a constructor argument, not in rerank_options"
        raise InputError([Violation(path="rerank_options", message=msg)])
    return {**{k: v for k, v in data.items() if k in fields}, "rerank_options": options}


def policy_data(policy: Any) -> Any:
    """A `RetryPolicy` as the dict of its numeric fields, for a component's JSON dump (`to_json`,
    `model_dump_json`): its clock and sleep functions are for tests, not configs, and cannot be
    written. Anything else as it is."""
    import dataclasses

    if isinstance(policy, RetryPolicy):
        return {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy) if f.repr}
    return policy


def policy_value(value: Any) -> Any:
    """A `policy` given to a component as such a dict (a reloaded dump) back as a `RetryPolicy`;
    an unknown key is an `InputError` naming it. Anything else as it is (rerank() judges it)."""
    import dataclasses

    if not isinstance(value, Mapping):
        return value
    known = [f.name for f in dataclasses.fields(RetryPolicy) if f.repr]
    bad = [k for k in value if k not in known]
    if bad:
        msg = f"unknown RetryPolicy field(s) {', '.join(map(repr, bad))}; known: {', '.join(known)}"
        raise InputError([Violation(path="policy", message=msg)])
    return RetryPolicy(**value)


def component_options(component: Any) -> dict[str, Any]:
    """The rerank() keywords of a pydantic component (LangChain, LlamaIndex): its option fields,
    the API key unwrapped from its SecretStr, then its further `rerank_options`."""
    key = component.api_key
    return {
        "lambda_": component.lambda_,
        "backend": component.backend,
        "model": component.model,
        "base_url": component.base_url,
        "api_key": key.get_secret_value() if key is not None else None,
        "embedder": component.embedder,
        "fallback": component.fallback,
        "policy": component.policy,
        "layout": component.layout,
        "strict": component.strict,
        **component.rerank_options,
    }


def records(ids: Sequence[str], texts: Sequence[Any], metas: Sequence[Mapping[str, Any] | None] | None = None,
            options: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """What goes to the reranker: id and text, plus the metadata keys the options name (module
    docstring); every other piece of metadata stays with the caller."""
    opts = options or {}
    fields = opts.get("embed_meta_fields")
    wanted = [*([opts["meta_field"]] if isinstance(opts.get("meta_field"), str) else []),
              *(fields if isinstance(fields, (list, tuple)) else [])]
    out: list[dict[str, Any]] = [{"id": i, "text": t} for i, t in zip(ids, texts, strict=True)]
    if wanted and metas is not None:
        for rec, meta in zip(out, metas, strict=True):
            if isinstance(meta, Mapping):
                rec["meta"] = {k: _plain(meta[k]) for k in wanted if isinstance(k, str) and k in meta}
    return out


def _plain(value: Any) -> Any:
    """A named metadata value as the JSON value it stands for, since frameworks hand back whatever
    the loader produced: a date, datetime or time as ISO 8601 text (what meta_value_type="date"
    reads); a numpy scalar (pandas / DataFrame loaders, vector-store scores) as its Python number;
    a Decimal (SQL loaders) as an int when integral, else a float; a UUID or a path as its text.
    Anything else as is (the input guard names it if it is not plain JSON)."""
    import datetime
    import decimal
    import pathlib
    import uuid

    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return value.isoformat()
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return value.item()
    if isinstance(value, decimal.Decimal) and value.is_finite():
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (uuid.UUID, pathlib.PurePath)):
        return str(value)
    return value


def _empty(query: Any, top_k: Any, options: Mapping[str, Any]) -> RerankResult:
    validate_params(query, top_k, options.get("lambda_"), limits=options.get("limits"))
    backend = options.get("backend", "local")
    name = backend if isinstance(backend, str) else name_of(backend)
    return RerankResult(ranked=(), dropped=(), meta=RunMeta(backend=name, attempts=0,
                                                            notes=("no candidates: nothing to rerank",)))


def run(sessions: SessionCache, query: Any, ids: Sequence[str], texts: Sequence[Any], top_k: Any,
        options: Mapping[str, Any], metas: Sequence[Mapping[str, Any] | None] | None = None) -> RerankResult:
    """The component's session reranking the items' ids and texts; an empty list gives an empty result."""
    if not ids:
        return _empty(query, top_k, options)
    reranker, request = sessions.get(options)
    return reranker.rerank(query, records(ids, texts, metas, options), top_k, **request)


async def arun(sessions: SessionCache, query: Any, ids: Sequence[str], texts: Sequence[Any], top_k: Any,
               options: Mapping[str, Any], metas: Sequence[Mapping[str, Any] | None] | None = None
               ) -> RerankResult:
    """`run` with the backend calls awaited, not run in a thread."""
    if not ids:
        return _empty(query, top_k, options)
    reranker, request = sessions.get(options)
    return await reranker.arerank(query, records(ids, texts, metas, options), top_k, **request)


def placed(result: RerankResult, ids: Sequence[str]) -> tuple[list[tuple[int, Ranked]],
                                                              list[tuple[int, Dropped]]]:
    """Each ranked and dropped entry with the position of the caller's item it names.

    The result's ids are byte-for-byte input ids and unique (the input guard refuses duplicates),
    so a dict from id to position is exact.
    """
    where = {cid: i for i, cid in enumerate(ids)}
    return ([(where[r.id], r) for r in result.ranked], [(where[d.id], d) for d in result.dropped])


def ranked_meta(entry: Ranked) -> dict[str, Any]:
    """The keys a kept item gets: the reason always, the diversity note when the model gave one."""
    out: dict[str, Any] = {REASON_KEY: entry.reason}
    if entry.diversity_note:
        out[NOTE_KEY] = entry.diversity_note
    return out
