"""Cohere's rerank API, as data: a request body into one rerank call, a `RerankResult` back into a
response body, a failure into a status and an error body. No I/O and no ranking decision here: the
ranking is the session's, this module only translates.

**Requests.** v2 (`POST /v2/rerank`): `{model, query, documents: [str], top_n?, max_tokens_per_doc?,
return_documents?, priority?}`. v1 (`POST /v1/rerank`): the same, `model` optional (the default
model), `documents` strings or objects (`{"text": ...}`, or any fields with `rank_fields` naming
which to rank on, written `field: value` one per line), `return_documents`, `max_chunks_per_doc`
(accepted, reported as not applied). Fields a client sends that neither version defines are
ignored, as Cohere does. Document `i` becomes the chunk with id `"i"`.

**Responses.** `{id, results: [{index, relevance_score, document?}], meta}`: `results` are the
chunks the reranker kept, in its order (MMR), at most `top_n` (absent: the model's `top_k`);
`meta` has `api_version`, `billed_units` (search units as Cohere counts them, one per query of up to
100 documents; the input and output tokens billed, cache hits excepted) and `tokens` (what the calls
consumed) from the result's real usage (`RerankResult.to_cohere`), and `cached_tokens` when the
response cache answered. Everything of ours (each kept document's reason, the dropped documents
with their reasons, the status, calls, attempts, cache, notes) is under the one key `rag_rerank`,
which Cohere clients ignore.

**Errors** have Cohere's body `{"message": ...}`, and under `rag_rerank` the violations
(`{"path": "documents[3]", "message": ...}`) when there are several.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..cost import usage_tokens
from ..errors import BackendError, BudgetError, InputError, Violation
from ..models import RerankResult
from ..options import REQUEST_OPTIONS
from .config import Limits

NAMESPACE = "rag_rerank"
# The library option `max_tokens_per_doc` maps to, when the library has it.
TRUNCATION_OPTION = "max_tokens_per_chunk"
_V1_ONLY = ("rank_fields", "max_chunks_per_doc")


@dataclass(frozen=True)
class RerankCall:
    """One Cohere rerank request, checked: what the session is called with, and what the answer echoes."""

    version: int
    model: str | None
    query: str
    texts: tuple[str, ...]
    documents: tuple[Any, ...]  # as the client sent them (echoed with return_documents)
    top_n: int | None
    return_documents: bool
    max_tokens_per_doc: int | None
    ignored: tuple[str, ...] = ()  # fields accepted but not applied (max_chunks_per_doc)

    def chunks(self) -> list[dict[str, str]]:
        return [{"id": str(i), "text": t} for i, t in enumerate(self.texts)]


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_request(body: Any, version: int, limits: Limits) -> RerankCall:
    """The request `body` (parsed JSON) of `/v{version}/rerank` as a `RerankCall`; an `InputError`
    naming every field at fault, each document by its index, each limit by its value."""
    if not isinstance(body, Mapping):
        raise InputError(
            [
                Violation(
                    path="body",
                    message="the request body must be a JSON object {model, query, documents, top_n?}",
                )
            ]
        )
    bad: list[Violation] = []
    model = body.get("model")
    if model is None and version == 2:
        bad.append(Violation(path="model", message="missing required field 'model'"))
    elif model is not None and not isinstance(model, str):
        bad.append(Violation(path="model", message="must be a string"))
    query = body.get("query")
    if not isinstance(query, str):
        bad.append(
            Violation(
                path="query",
                message="missing required field 'query'" if query is None else "must be a string",
            )
        )
    elif not query.strip():
        bad.append(Violation(path="query", message="must not be empty"))
    elif len(query) > limits.max_query_chars:
        bad.append(
            Violation(
                path="query",
                message=f"{len(query)} characters is over the limit of "
                f"{limits.max_query_chars} (max_query_chars)",
            )
        )
    rank_fields = body.get("rank_fields") if version == 1 else None
    if rank_fields is not None and not (
        isinstance(rank_fields, list) and rank_fields and all(isinstance(f, str) for f in rank_fields)
    ):
        bad.append(Violation(path="rank_fields", message="must be a non-empty list of field names"))
        rank_fields = None
    documents = body.get("documents")
    texts: list[str] = []
    if not isinstance(documents, list):
        bad.append(
            Violation(
                path="documents",
                message="missing required field 'documents'"
                if documents is None
                else "must be a list of strings",
            )
        )
        documents = []
    elif not documents:
        bad.append(Violation(path="documents", message="must hold at least one document"))
    elif len(documents) > limits.max_documents:
        bad.append(
            Violation(
                path="documents",
                message=f"{len(documents)} documents is over the limit of "
                f"{limits.max_documents} (max_documents)",
            )
        )
        documents = []
    for i, doc in enumerate(documents):
        text = document_text(doc, version, rank_fields, f"documents[{i}]", bad)
        if text is None:
            continue
        if len(text) > limits.max_document_chars:
            bad.append(
                Violation(
                    path=f"documents[{i}]",
                    message=f"{len(text)} characters is over the limit of "
                    f"{limits.max_document_chars} (max_document_chars)",
                )
            )
        texts.append(text)
    top_n = body.get("top_n")
    if top_n is not None and (not _whole(top_n) or top_n < 1):
        bad.append(Violation(path="top_n", value=top_n, message="must be an integer >= 1"))
    max_tokens = body.get("max_tokens_per_doc")
    if max_tokens is not None and (not _whole(max_tokens) or max_tokens < 1):
        bad.append(Violation(path="max_tokens_per_doc", value=max_tokens, message="must be an integer >= 1"))
    return_documents = body.get("return_documents", False)
    if return_documents is None:
        return_documents = False
    if not isinstance(return_documents, bool):
        bad.append(Violation(path="return_documents", message="must be true or false"))
    if bad:
        raise InputError(bad)
    ignored = tuple(f for f in ("max_chunks_per_doc",) if version == 1 and body.get(f) is not None)
    return RerankCall(
        version=version,
        model=model,
        query=str(query),
        texts=tuple(texts),
        documents=tuple(documents),
        top_n=top_n,
        return_documents=bool(return_documents),
        max_tokens_per_doc=max_tokens,
        ignored=ignored,
    )


def document_text(
    doc: Any, version: int, rank_fields: Sequence[str] | None, path: str, bad: list[Violation]
) -> str | None:
    """The text ranked for one document: a string as is; in v1 an object's `text`, or with
    `rank_fields` its named fields as `field: value` lines."""
    if isinstance(doc, str):
        if not doc.strip():
            bad.append(Violation(path=path, message="must not be empty"))
            return None
        return doc
    if version == 1 and isinstance(doc, Mapping):
        if rank_fields:
            missing = [f for f in rank_fields if f not in doc]
            if missing:
                bad.append(Violation(path=path, message=f"has no field {missing[0]!r} named in rank_fields"))
                return None
            return "\n".join(f"{f}: {doc[f]}" for f in rank_fields)
        text = doc.get("text")
        if isinstance(text, str) and text.strip():
            return text
        bad.append(
            Violation(path=path, message="a document object needs a non-empty 'text' (or rank_fields)")
        )
        return None
    what = "a string or an object with 'text'" if version == 1 else "a string"
    bad.append(Violation(path=path, message=f"must be {what}, got {type(doc).__name__}"))
    return None


def truncation(
    value: int | None, accepted: Sequence[str] = REQUEST_OPTIONS
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """`max_tokens_per_doc` as the library's option, and what the answer reports about it.

    The one place the field is mapped: to `max_tokens_per_chunk` when the library has that option
    (`accepted`), else not applied, and the answer says so (`rag_rerank.max_tokens_per_doc`) rather
    than pretending the documents were cut."""
    if value is None:
        return {}, None
    if TRUNCATION_OPTION in accepted:
        return {TRUNCATION_OPTION: value}, {"value": value, "applied": True, "option": TRUNCATION_OPTION}
    return {}, {
        "value": value,
        "applied": False,
        "reason": f"this rag-rerank has no {TRUNCATION_OPTION} option; documents were ranked whole "
        "(up to max_document_chars)",
    }


def call_options(
    call: RerankCall, accepted: Sequence[str] = REQUEST_OPTIONS
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keyword options of the session call for `call` (top_k from top_n, truncation), and the
    notes the answer carries about fields not applied."""
    options, note = truncation(call.max_tokens_per_doc, accepted)
    if call.top_n is not None:
        # Cohere's top_n caps the results: more than there are documents means all of them.
        options["top_k"] = min(call.top_n, len(call.texts))
    notes: dict[str, Any] = {}
    if note is not None:
        notes["max_tokens_per_doc"] = note
    for name in call.ignored:
        notes[name] = {"applied": False, "reason": "each document is ranked as one chunk"}
    return options, notes


def billed(result: RerankResult, sends_requests: bool = True) -> dict[str, int]:
    """What the result cost: backend requests made (not cache hits; none for a backend that sends
    none, `Capabilities.makes_requests`), input and output tokens."""
    prompt, completion = usage_tokens(result.meta.usage)
    hits = (result.meta.cache or {}).get("hits", 0)
    requests = max(0, result.meta.attempts - hits) if sends_requests else 0
    return {"search_units": requests, "input_tokens": prompt, "output_tokens": completion}


def response(
    call: RerankCall,
    result: RerankResult,
    extras: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Cohere response body for `result` (module docstring): `RerankResult.to_cohere()` (the
    one writer of Cohere's shape, shared with library callers), with the documents when asked and
    our extras under `NAMESPACE`."""
    body = result.to_cohere(request_id=str(uuid.uuid4()))
    results = body["results"]
    if call.return_documents:
        for item in results:
            doc = call.documents[item["index"]]
            item["document"] = dict(doc) if isinstance(doc, Mapping) else {"text": doc}
    meta: dict[str, Any] = {"api_version": {"version": str(call.version)},
                            "billed_units": body["meta"]["billed_units"], "tokens": body["meta"]["tokens"]}
    saved = (result.meta.cache or {}).get("saved_tokens")
    if saved:
        meta["cached_tokens"] = saved
    ours: dict[str, Any] = {
        "status": result.meta.status,
        **({"fallback_reason": result.meta.fallback_reason} if result.meta.fallback_reason else {}),
        "ranked": [
            {
                "index": int(r.id),
                "reason": r.reason,
                **({"diversity_note": r.diversity_note} if r.diversity_note else {}),
            }
            for r in result.ranked
        ],
        "dropped": [{"index": int(d.id), "reason": d.reason} for d in result.dropped],
        "backend": result.meta.backend,
        "model": result.meta.model,
        "calls": result.meta.calls,
        "attempts": result.meta.attempts,
        "cache": None if result.meta.cache is None else dict(result.meta.cache),
        "fallback": result.meta.fallback,
        "notes": list(result.meta.notes),
        "latency_ms": round(result.meta.latency_ms, 3),
    }
    ours.update(extras or {})
    return {"id": body["id"], "results": results, "meta": meta, NAMESPACE: ours}


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class Failure:
    """An answer that is not a result: the HTTP status, the message, headers, and details."""

    status: int
    message: str
    headers: Mapping[str, str] | None = None
    details: Mapping[str, Any] | None = None

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": str(uuid.uuid4()), "message": self.message}
        if self.details:
            out[NAMESPACE] = dict(self.details)
        return out


def input_failure(exc: InputError, status: int = 400) -> Failure:
    """A bad request: every violation, chunk paths (`chunks[3].text`) renamed to the document's."""
    violations = [Violation(path=_document_path(v.path), message=v.message) for v in exc.violations]
    first = "; ".join(str(v) for v in violations[:3])
    more = f" (and {len(violations) - 3} more)" if len(violations) > 3 else ""
    return Failure(
        status, f"invalid request: {first}{more}", details={"errors": [v.to_dict() for v in violations]}
    )


def _document_path(path: str) -> str:
    return path.replace("chunks[", "documents[").replace("].text", "]") if path.startswith("chunks") else path


def budget_failure(exc: BudgetError | str) -> Failure:
    return Failure(429, f"budget exceeded: {exc}", details={"reason": "budget"})


def upstream_failure(exc: BackendError) -> Failure:
    """A backend that failed after its retries, as the gateway statuses: 503 when the upstream said
    it was overloaded or down (429 / 5xx; its Retry-After passed on), 504 when it did not answer in
    time, 502 for any other failure (an invalid answer, a refused key upstream). The message names
    the kind and the upstream status, never the upstream's URL, key or body."""
    last = exc.attempts[-1] if exc.attempts else None
    status = getattr(last, "status", None)
    retry_after = getattr(last, "retry_after", None)
    kinds = sorted({a.kind for a in exc.attempts})
    details = {
        "reason": "upstream",
        "attempts": len(exc.attempts),
        "kinds": kinds,
        **({"upstream_status": status} if status else {}),
    }
    headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after else None
    if last is not None and last.kind == "transient":
        if status is not None:
            return Failure(
                503,
                f"the upstream model is unavailable (HTTP {status} after {len(exc.attempts)} attempts)",
                headers,
                details,
            )
        return Failure(
            504, f"the upstream model did not answer ({len(exc.attempts)} attempts)", headers, details
        )
    what = f"HTTP {status}" if status else (last.kind.replace("_", " ") if last else "no answer")
    return Failure(502, f"the upstream model failed ({what})", headers, details)


__all__ = [
    "NAMESPACE",
    "TRUNCATION_OPTION",
    "Failure",
    "RerankCall",
    "billed",
    "budget_failure",
    "call_options",
    "document_text",
    "input_failure",
    "parse_request",
    "response",
    "truncation",
    "upstream_failure",
]
