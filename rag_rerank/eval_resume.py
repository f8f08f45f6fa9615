"""`rag-rerank eval --resume FILE`: a header with the run's configuration, then one line per finished
query; a resumed run skips those queries, and refuses a file written with other settings or for
other candidates (the rules it shares with `batch --resume` are `runconfig.py`'s)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .backends.factory import model_of
from .errors import InputError, RerankError, Violation
from .judgments import CandidateQuery
from .options import SCORING_OPTIONS
from .redaction import display_url
from .runconfig import EMBED_URL, config_difference, embedder_server


def eval_config(k: int, lambda_: float | None, depth: int, options: Mapping[str, Any], embedder: Any
            ) -> dict[str, Any]:
    backend = options.get("backend", "local")
    config = {"backend": backend if isinstance(backend, str) else str(model_of(backend, backend)),
              "model": options.get("model"), "embedder": str(getattr(embedder, "name", embedder)), "k": k,
              "lambda": lambda_, "depth": depth, "duplicate_threshold": options.get("duplicate_threshold")}
    # Each of these is recorded only when set, so older resume files still match; the metadata
    # options change which chunks rank first.
    for name in ("window_size", *SCORING_OPTIONS):
        if options.get(name) is not None:
            config[name] = options[name]
    config.update(embedder_server(embedder))
    return config



_KINDS = ("input", "backend", "internal")

def _with_embed_url(written: Mapping[str, Any], config: Mapping[str, Any]) -> Mapping[str, Any]:
    """A header from before `embed_base_url` was recorded: such an embedder used OPENAI_BASE_URL."""
    if EMBED_URL in config and EMBED_URL not in written:
        return {**written, EMBED_URL: display_url(os.environ.get("OPENAI_BASE_URL")) or None}
    return written


def _same_config(written: Any, config: Mapping[str, Any]) -> bool:
    if isinstance(written, dict):
        written = _with_embed_url(written, config)
    return bool(written == dict(config))


def _config_difference(written: Any, config: Mapping[str, Any]) -> str:
    """Which settings differ between a resume file's header and this run, as `name: file X, now Y`."""
    if not isinstance(written, Mapping):
        return f"its header is {str(written)[:80]!r}"
    return config_difference(_with_embed_url(written, config), config)


def error_kind_of(record: Mapping[str, Any]) -> str:
    """The record's kind; a record from before kinds were written is classified by the exception
    name its message starts with, as `batch.error_kind` would have classified the exception."""
    kind = record.get("kind")
    if kind in _KINDS:
        return str(kind)
    name = str(record["error"]).split(":", 1)[0].strip()
    if name == "BackendError":
        return "backend"
    ours, todo = {"RerankError"}, list(RerankError.__subclasses__())
    while todo:
        cls = todo.pop()
        ours.add(cls.__name__)
        todo += cls.__subclasses__()
    return "input" if name in ours else "internal"


def _resume_record_problem(rec: Mapping[str, Any]) -> str | None:
    if not isinstance(rec.get("qid"), (str, int)) or isinstance(rec.get("qid"), bool):
        return "'qid' must be a string or an integer"
    ranked = rec.get("ranked", [])
    if not (isinstance(ranked, list) and all(isinstance(i, str) for i in ranked)):
        return "'ranked' must be a list of id strings"
    if "error" in rec and not isinstance(rec["error"], str):
        return "'error' must be a string"
    return None


def load_resume(path: Path, config: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """The finished records by qid, and the line each came from."""
    if path.is_dir():
        raise InputError([Violation(path="resume", message=f"{path} is a directory, not a file")])
    if not path.is_file():
        return {}, {}
    done: dict[str, dict[str, Any]] = {}
    where: dict[str, int] = {}
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError([Violation(path="resume", message=f"cannot read {path}: {exc}")]) from None
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            if lineno == len(lines) or not any(x.strip() for x in lines[lineno:]):
                break  # a half-written last line from an interrupted run
            raise InputError([Violation(path="resume", line=lineno, message=f"{path} is not a resume file")]
                             ) from None
        is_result = isinstance(rec, dict) and "qid" in rec and ("ranked" in rec or "error" in rec)
        if not (is_result or (isinstance(rec, dict) and "config" in rec)):
            raise InputError([Violation(path="resume", line=lineno, message=f"{path} is not a resume file")])
        if "config" in rec:
            if not _same_config(rec["config"], config):
                raise InputError([Violation(path="resume", value=rec["config"],
                                            message=f"{path} was written for another configuration "
                                            f"({_config_difference(rec['config'], config)}); use a new "
                                            "file or the same settings")])
            continue
        problem = _resume_record_problem(rec)
        if problem:
            raise InputError([Violation(path="resume", line=lineno, message=f"{path}: {problem}")])
        done[str(rec["qid"])] = rec
        where[str(rec["qid"])] = lineno
    return done, where


def drop_partial_line(path: Path) -> None:
    """Cut a half-written last line (an interrupted run) that `load_resume` skipped: the records
    appended next would otherwise continue it, and the next resume would find a broken line in the
    middle of the file and refuse it."""
    if not path.is_file():
        return
    with path.open("rb+") as fh:
        data = fh.read()
        if data and not data.endswith(b"\n"):
            fh.truncate(data.rfind(b"\n") + 1)


def check_resumed(done: Mapping[str, Mapping[str, Any]], where: Mapping[str, int],
                   queries: Sequence[CandidateQuery], depth: int, path: Path) -> None:
    """Ranked ids a query does not have mean the file was written for other candidates (same
    configuration, another candidates file): its rankings would be scored against the wrong docs."""
    for q in queries:
        rec = done.get(q.qid)
        if rec is None or "ranked" not in rec:
            continue
        sent = set(q.ids[:depth])
        foreign = [i for i in rec["ranked"] if i not in sent]
        if foreign:
            raise InputError([Violation(path="resume", line=where.get(q.qid), id=q.qid,
                                        message=f"{path}: query {q.qid}'s ranked ids {foreign[:3]} are not "
                                        "among its candidates; the file was written for another "
                                        "candidates file, use a new one")])


__all__ = ["check_resumed", "drop_partial_line", "error_kind_of", "eval_config", "load_resume"]
