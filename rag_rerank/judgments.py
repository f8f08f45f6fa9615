"""The judged collection `rag-rerank eval` reads: candidates (one query and its first-stage chunks
per JSONL line), TREC qrels and subtopic judgments, each bad line named."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputError, MissingDependencyError, Violation
from .guard.input import not_utf8, utf16_hint


@dataclass(frozen=True)
class CandidateQuery:
    """One line of a candidates file."""

    qid: str
    query: str
    chunks: tuple[Mapping[str, Any], ...]

    @property
    def ids(self) -> list[str]:
        return [str(c["id"]) for c in self.chunks]


def ir_measures_module() -> Any:
    try:
        import ir_measures
    except ImportError:
        raise MissingDependencyError("rag-rerank eval", "eval", "ir-measures") from None
    return ir_measures




def read_candidates(path: str | Path) -> list[CandidateQuery]:
    """Every line of a candidates file, or an `InputError` naming each bad line."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError([Violation(path="candidates", message=f"cannot read {path}: {exc}")]) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:

        line = data[: exc.start].count(b"\n") + 1
        raise InputError([Violation(path="candidates", line=line,
                                    message=f"{path}: {not_utf8(data, exc)}")]) from None
    out: list[CandidateQuery] = []
    problems: list[Violation] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            problems.append(Violation(path="candidates", line=lineno, message=f"not valid JSON ({exc})"))
            continue
        if not isinstance(row, dict):
            problems.append(Violation(path="candidates", line=lineno, message="a line must be a JSON object"))
            continue
        qid, query, chunks = row.get("qid"), row.get("query"), row.get("chunks")
        bad = []
        if not isinstance(qid, (str, int)) or isinstance(qid, bool) or str(qid) == "":
            bad.append("'qid' must be a non-empty string or integer")
        if not isinstance(query, str) or not query.strip():
            bad.append("'query' must be a non-empty string")
        if not isinstance(chunks, list) or not all(isinstance(c, dict) and isinstance(c.get("id"), (str, int))
                                                   and isinstance(c.get("text"), str) for c in chunks):
            bad.append("'chunks' must be a list of {id, text} objects")
        if bad:
            problems += [Violation(path="candidates", line=lineno, message=m) for m in bad]
            continue
        if not chunks:  # nothing to rerank: bad input (exit 2), not a failed rerank (exit 3)
            problems.append(Violation(path="candidates.chunks", line=lineno, id=str(qid),
                                      message="'chunks' is empty; give at least one {id, text} candidate"))
            continue
        ids = [str(c["id"]) for c in chunks]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            problems.append(Violation(path="candidates.chunks", line=lineno, id=str(qid),
                                      message=f"duplicate chunk ids: {dupes[:5]}"))
            continue
        if str(qid) in seen:
            problems.append(Violation(path="candidates.qid", line=lineno, id=str(qid),
                                      message="qid appears twice"))
            continue
        seen.add(str(qid))
        out.append(CandidateQuery(str(qid), query, tuple({**c, "id": str(c["id"])} for c in chunks)))
    if not out and not problems:
        problems.append(Violation(path="candidates", message=f"{path} holds no queries"))
    if problems:
        raise InputError(problems, headline=f"invalid candidates file {path}")
    return out


def read_qrels(path: str | Path) -> list[Any]:
    """TREC qrels (`qid iter docid rel`) as ir-measures Qrel tuples (see `qrels_rows`)."""
    irm = ir_measures_module()
    return [irm.Qrel(qid, docid, grade, iteration) for qid, iteration, docid, grade in qrels_rows(path)]


def read_grades(path: str | Path) -> dict[str, dict[str, int]]:
    """TREC qrels as `{qid: {docid: grade}}` (see `qrels_rows`), without ir-measures: what
    `rag-rerank calibrate` needs of them."""
    grades: dict[str, dict[str, int]] = {}
    for qid, _, docid, grade in qrels_rows(path):
        grades.setdefault(qid, {})[docid] = grade
    return grades


def qrels_rows(path: str | Path) -> list[tuple[str, str, str, int]]:
    """TREC qrels (`qid iter docid rel`) as (qid, iter, docid, grade) rows, each bad line named.

    Parsed here rather than by `ir_measures.read_trec_qrels` so that a bad line is named by its
    number, and a UTF-8 BOM (Windows editors) does not silently become part of the first qid,
    whose judgments would then never match a candidate query.
    """
    text = _read_judgments(path, "qrels", "TREC qrels ('qid iter docid rel' per line)")
    out: list[tuple[str, str, str, int]] = []
    seen: dict[tuple[str, str], tuple[int, int]] = {}  # (qid, docid) -> (line, grade)
    conflicts: list[Violation] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 4 or not parts[3].lstrip("-").isdigit():
            shown = line if len(line) <= 60 else line[:57] + "..."
            raise InputError([Violation(path="qrels", line=lineno, message="expected 'qid iter docid rel' "
                                        f"with an integer rel, got {shown!r}")])
        key, grade = (parts[0], parts[2]), int(parts[3])
        if key in seen:
            # ir-measures' measures disagree on which of two grades they read (nDCG one, MRR the
            # other): a conflict is named; a repeat of the same grade changes nothing and is skipped.
            first, was = seen[key]
            if was != grade:
                msg = (f"query {parts[0]} document {parts[2]} is judged {grade} here and {was} on line "
                       f"{first}; keep one judgment")
                conflicts.append(Violation(path="qrels", line=lineno, value=grade, message=msg))
            continue
        seen[key] = (lineno, grade)
        out.append((parts[0], parts[1], parts[2], grade))
    if conflicts:
        raise InputError(conflicts, headline=f"conflicting judgments in {path}")
    return out


def _read_judgments(path: str | Path, option: str, expected: str) -> str:
    """A judgments file as text, or an `InputError` saying what it is instead: a directory, a
    binary file (a gzip file without `.gz`, a spreadsheet), bytes that are not UTF-8."""
    where = Path(path)
    if where.is_dir():
        msg = f"{path} is a directory, not a file; expected {expected}"
        raise InputError([Violation(path=option, message=msg)])
    try:
        data = where.read_bytes()
        if str(path).endswith(".gz"):
            import gzip

            data = gzip.decompress(data)
    except (OSError, EOFError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise InputError([Violation(path=option, message=f"cannot read {path}: {reason}")]) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:

        line = data[: exc.start].count(b"\n") + 1
        msg = (f"{path} is not a text file (byte {exc.start} is not UTF-8){utf16_hint(data)}; "
               f"expected {expected}")
        raise InputError([Violation(path=option, line=line, message=msg)]) from None
    if "\x00" in text:
        at = text.index("\x00")
        raise InputError([Violation(path=option, line=text[:at].count("\n") + 1, message=f"{path} is a "
                                    f"binary file (a NUL byte at {at}); expected {expected}")])
    return text


def read_subtopics(path: str | Path) -> list[Any]:
    """TREC diversity qrels (`qid subtopic docid rel`) as Qrels with the subtopic as iteration."""
    irm = ir_measures_module()
    out = []
    lines = _read_judgments(path, "subtopics", "TREC diversity qrels ('qid subtopic docid rel' per "
                            "line)").splitlines()
    for lineno, line in enumerate(lines, start=1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 4 or not parts[3].lstrip("-").isdigit():
            raise InputError([Violation(path="subtopics", line=lineno,
                                        message="expected 'qid subtopic docid rel' with an integer rel")])
        out.append(irm.Qrel(parts[0], parts[2], int(parts[3]), parts[1]))
    return out


def rel_level_violations(rel_level: Any, judgments: Sequence[Any], source: str | Path | None = None
                         ) -> list[Violation]:
    """`rel_level` must be a grade the qrels use for relevant documents: from 1 (0 is the grade of
    judged non-relevant ones, and ir-measures refuses it) to the highest grade in the qrels (above
    it nothing is relevant and Recall and MRR would be 0 for every query, silently)."""
    top = max((int(j.relevance) for j in judgments), default=1)
    where = f" in {source}" if source is not None else ""
    allowed = f"from 1 to {top} (the highest grade{where})" if top > 1 else f"1 (the highest grade{where})"
    if isinstance(rel_level, bool) or not isinstance(rel_level, int):
        return [Violation(path="rel_level", value=rel_level,
                          message=f"rel_level must be an integer {allowed}, got {rel_level!r}")]
    if not 1 <= rel_level <= max(top, 1):
        return [Violation(path="rel_level", value=rel_level,
                          message=f"rel_level must be {allowed}, got {rel_level}")]
    return []


__all__ = ["CandidateQuery", "ir_measures_module", "qrels_rows", "read_candidates", "read_grades",
           "read_qrels", "read_subtopics", "rel_level_violations"]
