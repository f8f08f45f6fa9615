"""The ranked runs `rag-rerank compare` reads: TREC run files, `batch` output files and `eval
--resume` files, each as one order of document ids per query, every bad line named.

Formats, told apart by the first non-blank line:

* **TREC run** (`qid Q0 docid rank score tag`, whitespace-separated): per query, documents by
  decreasing score, ties by decreasing docid (trec_eval's order; the rank column is ignored, as
  trec_eval ignores it).
* **`batch` output** (JSONL records `{"line", "query_id", "result": {"ranked", "dropped"}, "meta"}`):
  the ranked ids of each record, keyed by its `query_id` (a record without one is an error: it
  cannot be matched to the qrels). A record with `error` is a failed query. `meta.usage` is kept:
  it is what a query cost.
* **`eval --resume` file** (a `{"config"}` header, then `{"qid", "ranked"}` or `{"qid", "error"}`).

A reranker returns only its top k; with `candidates` each order is completed as `eval` completes
it (the ranked ids, then every other candidate in input order), and a failed query keeps its
input order, so that two runs are compared on the same lists. Without candidates, a failed query
has no order and is left out (and listed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError, Violation
from .judgments import CandidateQuery
from .metrics import reranked_order
from .options import ALL_OPTIONS
from .wording import near_miss

# A spec's keys as the docs spell them (`lambda`, `window-size`), each with the option it sets;
# `k` and `depth` are the evaluation's own (`k` is the cut-off: no `top-k`). Not taken: an API key
# (never on a command line) and a tokenizer (a Python object).
SPEC_KEYS = {"k": "k", "depth": "depth",
             **{("lambda" if n == "lambda_" else n.replace("_", "-")): n for n in ALL_OPTIONS
                if n not in ("api_key", "top_k", "tokenizer")}}

FORMATS = ("trec", "batch", "eval")
MAX_PROBLEMS = 20  # bad lines named before the rest are counted


@dataclass(frozen=True)
class Run:
    """One system's ranked ids per query, what failed, and per query the tokens it used when known."""

    label: str
    orders: Mapping[str, tuple[str, ...]]
    format: str
    failed: Mapping[str, str] = field(default_factory=dict)
    usage: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)


def read_run(
    path: str | Path, *, label: str | None = None, candidates: Sequence[CandidateQuery] | None = None
) -> Run:
    """The run in `path` (any of the module docstring's formats), completed by `candidates` when given."""
    name = label or str(path)
    where = Path(path)
    if where.is_dir():
        raise InputError([Violation(path=name, message=f"{path} is a directory, not a run file")])
    try:
        text = where.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise InputError(
            [Violation(path=name, message=f"cannot read {path}: {exc.strerror or exc}")]
        ) from None
    except UnicodeDecodeError as exc:
        raise InputError(
            [
                Violation(
                    path=name,
                    message=f"{path} is not UTF-8 text (byte {exc.start}); "
                    "expected a TREC run, a batch output or an eval --resume file",
                )
            ]
        ) from None
    lines = text.splitlines()
    first = next((line.strip() for line in lines if line.strip()), "")
    if not first:
        raise InputError(
            [
                Violation(
                    path=name,
                    message=f"{path} is empty; expected a TREC run, a batch output or an eval --resume file",
                )
            ]
        )
    run = _read_jsonl(lines, name) if first.startswith("{") else _read_trec(lines, name)
    return complete(run, candidates) if candidates is not None else run


def complete(run: Run, candidates: Sequence[CandidateQuery]) -> Run:
    """Each order completed by its query's candidates in input order; a failed query, or one the
    run does not hold, takes the input order (eval's convention)."""
    orders = dict(run.orders)
    for q in candidates:
        orders[q.qid] = tuple(reranked_order(q.ids, orders.get(q.qid, ())))
    return Run(run.label, orders, run.format, run.failed, run.usage, run.config)


def _problem(problems: list[Violation], name: str, lineno: int, message: str) -> None:
    problems.append(Violation(path=name, line=lineno, message=message))


def _raise(problems: list[Violation], name: str, what: str) -> None:
    if problems:
        raise InputError(problems, headline=f"invalid {what} {name}")


def _read_trec(lines: Sequence[str], name: str) -> Run:
    scored: dict[str, dict[str, float]] = {}
    problems: list[Violation] = []
    for lineno, line in enumerate(lines, start=1):
        parts = line.split()
        if not parts:
            continue
        if len(problems) >= MAX_PROBLEMS:
            break
        if len(parts) != 6:
            shown = line if len(line) <= 60 else line[:57] + "..."
            _problem(
                problems,
                name,
                lineno,
                f"expected 'qid Q0 docid rank score tag' (6 columns), got {len(parts)}: {shown!r}",
            )
            continue
        qid, _, doc, _, score, _ = parts
        try:
            value = float(score)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            _problem(problems, name, lineno, f"score (column 5) must be a finite number, got {score!r}")
            continue
        per_query = scored.setdefault(qid, {})
        if doc in per_query:
            _problem(problems, name, lineno, f"query {qid} lists document {doc} twice")
            continue
        per_query[doc] = value
    _raise(problems, name, "TREC run")
    orders = {
        qid: tuple(sorted(docs, key=lambda d: (docs[d], d), reverse=True)) for qid, docs in scored.items()
    }
    return Run(name, orders, "trec")


def _read_jsonl(lines: Sequence[str], name: str) -> Run:
    orders: dict[str, tuple[str, ...]] = {}
    failed: dict[str, str] = {}
    usage: dict[str, dict[str, int]] = {}
    config: dict[str, Any] = {}
    problems: list[Violation] = []
    fmt = None
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if len(problems) >= MAX_PROBLEMS:
            break
        try:
            row = json.loads(line)
        except ValueError as exc:
            _problem(problems, name, lineno, f"not valid JSON ({exc})")
            continue
        if not isinstance(row, dict):
            _problem(problems, name, lineno, "a line must be a JSON object")
            continue
        if fmt is None:
            fmt = "batch" if "line" in row else "eval"
        if fmt == "eval" and set(row) == {"config"}:
            config = dict(row["config"]) if isinstance(row["config"], dict) else {}
            continue
        qid = row.get("query_id") if fmt == "batch" else row.get("qid")
        key = "query_id" if fmt == "batch" else "qid"
        if not isinstance(qid, (str, int)) or isinstance(qid, bool) or str(qid) == "":
            _problem(
                problems,
                name,
                lineno,
                f"'{key}' must be a non-empty string or integer (the qid the "
                "qrels judge)" + (": give each batch input line a query_id" if fmt == "batch" else ""),
            )
            continue
        qid = str(qid)
        if qid in orders or qid in failed:
            _problem(problems, name, lineno, f"query {qid} appears twice")
            continue
        if "error" in row:
            error = row["error"]
            failed[qid] = str(error.get("message", error) if isinstance(error, dict) else error)[:500]
            continue
        ids = _ranked_ids(row, fmt)
        if ids is None:
            what = "'result': {'ranked': [{'id': ...}, ...]}" if fmt == "batch" else "'ranked': [ids]"
            _problem(problems, name, lineno, f"expected {what} or 'error'")
            continue
        if len(set(ids)) != len(ids):
            _problem(problems, name, lineno, f"query {qid} ranks a document twice")
            continue
        orders[qid] = ids
        meta = row.get("meta")
        spent = meta.get("usage") if isinstance(meta, dict) else None
        if isinstance(spent, dict) and spent:
            usage[qid] = {
                str(k): int(v) for k, v in spent.items() if isinstance(v, int) and not isinstance(v, bool)
            }
        if fmt == "batch" and not config and isinstance(row.get("config"), dict):
            config = dict(row["config"])
    _raise(problems, name, f"{fmt or 'JSONL'} file")
    if not orders and not failed:
        raise InputError(
            [
                Violation(
                    path=name,
                    message="holds no query (expected batch records or an eval --resume file's query lines)",
                )
            ]
        )
    return Run(name, orders, fmt or "eval", failed, usage, config)


def _ranked_ids(row: Mapping[str, Any], fmt: str) -> tuple[str, ...] | None:
    if fmt == "eval":
        ranked = row.get("ranked")
        if isinstance(ranked, list) and all(
            isinstance(i, (str, int)) and not isinstance(i, bool) for i in ranked
        ):
            return tuple(str(i) for i in ranked)
        return None
    result = row.get("result")
    ranked = result.get("ranked") if isinstance(result, dict) else None
    if isinstance(ranked, list) and all(
        isinstance(r, dict) and isinstance(r.get("id"), (str, int)) for r in ranked
    ):
        return tuple(str(r["id"]) for r in ranked)
    return None


def rerank_spec(text: str) -> dict[str, Any] | None:
    """`rerank:KEY=VALUE,...` (a configuration `compare` runs on the candidates) as rerank options,
    each value read as a YAML scalar (`0.5`, `true`, `null`, `gpt-4o-mini`) and `lambda` as
    `lambda_`; None when `text` is not such a spec (a file name). An `InputError` names a bad pair."""
    if not text.startswith("rerank:"):
        return None
    import yaml

    options: dict[str, Any] = {}
    problems = []
    for pair in filter(None, (p.strip() for p in text.removeprefix("rerank:").split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            problems.append(Violation(path=text, value=pair, message=f"expected KEY=VALUE, got {pair!r}"))
            continue
        try:
            parsed = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError:
            parsed = value
        spelled = key.strip().replace("_", "-")
        if spelled not in SPEC_KEYS:
            problems.append(Violation(path=text, value=pair, message=_unknown_key(key.strip())))
            continue
        options[SPEC_KEYS[spelled]] = parsed
    if problems:
        raise InputError(problems)
    return options


def _unknown_key(key: str) -> str:
    if key.replace("-", "_") == "api_key":
        return ("an API key is not taken on the command line (it would stay in the shell's history); "
                "set the backend's environment variable, e.g. OPENAI_API_KEY")
    known = ", ".join(sorted(SPEC_KEYS))
    return f"unknown key {key!r}{near_miss(key.replace('_', '-'), SPEC_KEYS)} (known: {known})"


def run_from_orders(
    label: str,
    orders: Mapping[str, Sequence[str]],
    fmt: str,
    failed: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> Run:
    """A run built in memory (the candidates' input order, or a rerank done by `compare`)."""
    return Run(
        label, {q: tuple(ids) for q, ids in orders.items()}, fmt, dict(failed or {}), {}, dict(config or {})
    )


__all__ = ["FORMATS", "MAX_PROBLEMS", "SPEC_KEYS", "Run", "complete", "read_run", "rerank_spec",
           "run_from_orders"]
