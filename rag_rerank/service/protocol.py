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
(`{"path": "documents[3]", "message": ...}`) when there are several. The rules of the query,
`top_n`, `max_tokens_per_doc` and the number of documents are the library's (its input guard and
options table, with the service's limits: `library_limits`); this module checks only what Cohere's
shape adds, and words the library's errors as the client named things (`client_violation`).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..cost import usage_tokens
from ..errors import BackendError, BudgetError, InputError, Violation
from ..guard.input import normal_top_k, top_k_violations, validate_params
from ..guard.limits import Limits as ContractLimits
from ..guard.limits import as_limits
from ..models import RerankResult
from ..options import OPTION, REQUEST_OPTIONS
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
    top_n = normal_top_k(body.get("top_n"))
    max_tokens = body.get("max_tokens_per_doc")
    bad.extend(map(client_violation, library_violations(query, top_n, max_tokens, limits)))
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


# --------------------------------------------------------------------------- the library's rules


def library_limits(limits: Limits, base: Any = None) -> ContractLimits:
    """The contract's limits (`base`: a model's own `limits` option, else `guard/limits.json`) with
    the service's `max_query_chars` and `max_documents` (as `max_total_chunks`, the most one
    windowed request ranks): passed with every session call, so the library's input guard is the
    one judge of a query and of the number of documents, and the service's configured limits are
    the ones it applies."""
    return as_limits(base).with_overrides(
        max_query_chars=limits.max_query_chars, max_total_chunks=limits.max_documents
    )


def library_violations(query: Any, top_n: Any, max_tokens: Any, limits: Limits) -> list[Violation]:
    """What the library's own rules say of the request's query, `top_n` (its `top_k`) and
    `max_tokens_per_doc` (its `max_tokens_per_chunk`), in the library's words: judged while the
    request is read, so one 400 names these with the fields only Cohere's shape has (a missing
    `model`, a document that is not a string). The library judges them again when called, by the
    same rules."""
    out: list[Violation] = []
    if isinstance(query, str):
        try:
            validate_params(query, top_n, limits=library_limits(limits))
        except InputError as exc:
            out.extend(exc.violations)
    elif top_n is not None:
        out.extend(top_k_violations(top_n))
    check = OPTION[TRUNCATION_OPTION].check if TRUNCATION_OPTION in OPTION else None
    if max_tokens is not None and check is not None:
        out.extend(check(max_tokens))
    return out


# The library's names of what a Cohere client sent under another name: its errors are answered in
# the client's words (`chunks[3].text` is `documents[3]`, `top_k` is `top_n`, ...).
_CLIENT_NAMES = {
    "max_tokens_per_chunk": "max_tokens_per_doc",
    "max_total_chunks": "max_documents",
    "top_k": "top_n",
    "chunks": "documents",
    "chunk": "document",
}
_LIBRARY_NAME = re.compile(r"\b(" + "|".join(sorted(_CLIENT_NAMES, key=len, reverse=True)) + r")\b")
_CHUNK_FIELD = re.compile(r"\bchunks\[(\d+)\]\.text\b")
_PYTHON_NONE = re.compile(r"\bNone\b")


def client_words(text: str) -> str:
    """`text` (a library error's path or message) with the library's names as the client's, and
    Python's `None` as JSON's `null`."""
    text = _CHUNK_FIELD.sub(r"documents[\1]", text)
    text = _PYTHON_NONE.sub("null", text)
    return _LIBRARY_NAME.sub(lambda m: _CLIENT_NAMES[m.group(1)], text)


def client_violation(v: Violation) -> Violation:
    """A library violation in the client's words (`client_words`), its value kept."""
    return Violation(path=client_words(v.path), message=client_words(v.message), value=v.value)


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
    call: RerankCall, accepted: Sequence[str] = REQUEST_OPTIONS, limits: ContractLimits | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keyword options of the session call for `call` (top_k from top_n, truncation, the
    `limits` the library applies: `library_limits`), and the notes the answer carries about fields
    not applied."""
    options, note = truncation(call.max_tokens_per_doc, accepted)
    if limits is not None:
        options["limits"] = limits
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
        # the kept passages of each shortened document ([start, end) offsets into its text)
        **({"evidence": body["meta"]["evidence"]} if "evidence" in body["meta"] else {}),
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
    """A bad request: every violation, in the client's words (`client_violation`: `chunks[3].text`
    is `documents[3]`, `max_total_chunks` is `max_documents`)."""
    violations = [client_violation(v) for v in exc.violations]
    first = "; ".join(str(v) for v in violations[:3])
    more = f" (and {len(violations) - 3} more)" if len(violations) > 3 else ""
    return Failure(
        status, f"invalid request: {first}{more}", details={"errors": [v.to_dict() for v in violations]}
    )


def budget_failure(exc: BudgetError | str) -> Failure:
    return Failure(429, f"budget exceeded: {exc}", details={"reason": "budget"})


def upstream_failure(exc: BackendError) -> Failure:
    """A backend that failed after its retries, as the gateway statuses: 503 when the upstream said
    it was overloaded or down (429 / 5xx; its Retry-After passed on), 504 when it did not answer in
    time (a timeout, a dropped connection), 502 for any other failure: unreachable (the connection
    refused, the host unknown: nothing is there to wait for, as a proxy answers), an invalid answer,
    a refused key upstream. The message names
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
    if last is not None and last.error_type == "UnreachableFailure":
        return Failure(
            502, "the upstream model is unreachable (connection refused, or its host name does not resolve)",
            headers, details,
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
    "client_violation",
    "client_words",
    "document_text",
    "input_failure",
    "library_limits",
    "library_violations",
    "parse_request",
    "response",
    "truncation",
    "upstream_failure",
]
