"""`rag-rerank eval`: measured quality of a backend on a judged collection, input order vs reranked.

Inputs are a candidates file (JSONL, one `{qid, query, chunks: [{id, text}, ...]}` per line, ids
being the collection's document ids, chunks in first-stage order) and TREC qrels. Every query is
reranked through the product's own batch machinery (`arerank_many`: bounded concurrency, the same
guards and post-pass as any call), then both orders are scored with ir-measures.

How the reranked run is built, so that it compares like with like with the input order: the
reranker returns only `top_k` ids, and nDCG@10 / Recall@k over a list shorter than the input's
would punish it for the ids it was never asked to order. The reranked run is therefore **the
ranked ids, then every other candidate in its input order** (dropped ones included). Candidates
beyond `depth` (default: the card's limit of 50) are not sent to the reranker and keep their input
positions after the reranked part. A query whose rerank failed keeps its input order and is
counted in `failed`.

Diversity is the average pairwise cosine distance (1 - cosine) of the `k` ids each order puts
first, with the evaluation's embedder. With subtopic judgments (TREC diversity qrels:
`qid subtopic docid rel`), subtopic recall and alpha-nDCG (alpha 0.5) at `k` are added (ir-measures'
pyndeval provider).

**Novelty-aware nDCG@k** (`novelty-nDCG@k`) is nDCG@k in which a chunk that is a near-duplicate
of one listed above it gains nothing, and the ideal list is built the same way from the judged
candidates (copies of a picked document are skipped). Plain nDCG counts a reranker's duplicate
removal as a loss on collections full of near-copies (MS MARCO); this one does not reward listing
the same passage twice. The duplicate criterion is fixed, whatever embedder is under test: cosine
of the `lexical` embedder's hashed word + character 5-gram vectors at or above 0.49, the
near-verbatim threshold measured on clough-stevenson (copied and lightly edited answers above it,
independent answers below; `embed/lexical.py`). Judged documents that are not among the candidates
have no text and count as distinct.

`--resume FILE` keeps one line per finished query (plus a header with the configuration) and skips
those queries on the next run, so an interrupted evaluation picks up where it stopped.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError, MissingDependencyError, RerankError, Violation
from .guard.limits import as_limits, load_limits
from .redaction import display_url
from .runconfig import EMBED_URL, config_difference, embedder_server
from .wording import counted

SLICE = 16  # queries per resume checkpoint


@dataclass(frozen=True)
class CandidateQuery:
    """One line of a candidates file."""

    qid: str
    query: str
    chunks: tuple[Mapping[str, Any], ...]

    @property
    def ids(self) -> list[str]:
        return [str(c["id"]) for c in self.chunks]


@dataclass(frozen=True)
class EvalReport:
    """Metrics of both orders, plus what was run and what failed."""

    input: Mapping[str, float]
    reranked: Mapping[str, float]
    n_queries: int
    failed: Mapping[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    config: Mapping[str, Any] = field(default_factory=dict)
    # Per failed qid: "input", "backend" or "internal"; the CLI's exit code follows the worst.
    failure_kinds: Mapping[str, str] = field(default_factory=dict)
    # The lowest grade counted relevant by Recall and MRR: kept out of `config` (the resume
    # header), since it changes the scoring, not the reranking.
    rel_level: int = 1
    # How many of the queries the qrels judge: nDCG, Recall, MRR and novelty-nDCG average over
    # those only, distance@k over all of them (None: all judged).
    n_judged: int | None = None

    def to_dict(self) -> dict[str, Any]:
        info = {"queries": self.n_queries, "failed": dict(self.failed),
                "failure_kinds": dict(self.failure_kinds), "wall_s": round(self.wall_s, 3),
                "judged_queries": self.n_queries if self.n_judged is None else self.n_judged,
                "rel_level": self.rel_level}
        return {"input": dict(self.input), "reranked": dict(self.reranked),
                "info": {**info, **dict(self.config)}}


def _ir_measures() -> Any:
    try:
        import ir_measures
    except ImportError:
        raise MissingDependencyError("rag-rerank eval", "eval", "ir-measures") from None
    return ir_measures


# ----------------------------------------------------------------------------------------- reading


def read_candidates(path: str | Path) -> list[CandidateQuery]:
    """Every line of a candidates file, or an `InputError` naming each bad line."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError([Violation(path="candidates", message=f"cannot read {path}: {exc}")]) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        from .guard.input import not_utf8

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
    """TREC qrels (`qid iter docid rel`) as ir-measures Qrel tuples.

    Parsed here rather than by `ir_measures.read_trec_qrels` so that a bad line is named by its
    number, and a UTF-8 BOM (Windows editors) does not silently become part of the first qid,
    whose judgments would then never match a candidate query.
    """
    irm = _ir_measures()
    text = _read_judgments(path, "qrels", "TREC qrels ('qid iter docid rel' per line)")
    out = []
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
        out.append(irm.Qrel(parts[0], parts[2], grade, parts[1]))
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
        from .guard.input import utf16_hint

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
    irm = _ir_measures()
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


# ----------------------------------------------------------------------------------------- runs


def reranked_order(input_ids: Sequence[str], ranked_ids: Sequence[str]) -> list[str]:
    """The ranked ids, then every other input id in input order (see the module docstring)."""
    chosen = set(ranked_ids)
    return [*ranked_ids, *(i for i in input_ids if i not in chosen)]


def _run(orders: Mapping[str, Sequence[str]]) -> list[Any]:
    """Strictly decreasing scores by position, so no metric library re-sorts ties by docid."""
    irm = _ir_measures()
    return [irm.ScoredDoc(qid, doc, float(len(ids) - pos)) for qid, ids in orders.items()
            for pos, doc in enumerate(ids)]


def measure(qrels: Sequence[Any], orders: Mapping[str, Sequence[str]], *, k: int = 10, rel_level: int = 1,
            subtopics: Sequence[Any] | None = None) -> dict[str, float]:
    """nDCG@10, Recall@k and MRR@10 (trec_eval definitions via ir-measures), averaged over the
    queries that have judgments; plus subtopic recall and alpha-nDCG at k with subtopics."""
    irm = _ir_measures()
    from ir_measures import RR, R, StRecall, alpha_nDCG, nDCG

    judged = {q.query_id for q in qrels}
    orders = {q: ids for q, ids in orders.items() if q in judged}
    # Judgments of queries that were not run would count as zeros in ir-measures' mean.
    qrels = [q for q in qrels if q.query_id in orders]
    if subtopics:
        subtopics = [q for q in subtopics if q.query_id in orders]
    recall = R(rel=rel_level) @ k if rel_level != 1 else R @ k
    rr = RR(rel=rel_level) @ 10 if rel_level != 1 else RR @ 10
    agg = irm.calc_aggregate([nDCG @ 10, recall, rr], qrels, _run(orders))
    out = {"nDCG@10": agg[nDCG @ 10], f"Recall@{k}": agg[recall], "MRR@10": agg[rr]}
    if subtopics:
        sub_judged = {q.query_id for q in subtopics}
        sub_orders = {q: ids for q, ids in orders.items() if q in sub_judged}
        try:
            agg = irm.calc_aggregate([StRecall @ k, alpha_nDCG @ k], subtopics, _run(sub_orders))
        except ValueError as exc:  # the pyndeval provider is missing
            raise MissingDependencyError("subtopic metrics (alpha-nDCG)", "eval", "pyndeval") from exc
        out[f"St-recall@{k}"] = agg[StRecall @ k]
        out[f"alpha-nDCG@{k}"] = agg[alpha_nDCG @ k]
    return {name: float(v) for name, v in out.items()}


def _judged_gains(qrels: Sequence[Any]) -> dict[str, dict[str, float]]:
    gains: dict[str, dict[str, float]] = {}
    for j in qrels:
        gains.setdefault(str(j.query_id), {})[str(j.doc_id)] = float(max(j.relevance, 0))
    return gains


def novelty_ndcg(qrels: Sequence[Any], orders: Mapping[str, Sequence[str]],
                 texts: Mapping[str, Mapping[str, str]], k: int = 10, lexical: Any = None) -> float:
    """Mean novelty-aware nDCG@k over the judged queries of `orders` (see the module docstring).

    `texts[qid][docid]` is each candidate's text; the near-duplicate test is the lexical
    embedder's cosine at or above its threshold, the same for every system compared. `lexical`
    may be a memoised `LexicalEmbedder`, so that scoring several orders of the same candidates
    embeds each text once."""
    from .embed.lexical import LexicalEmbedder

    lexical = lexical or LexicalEmbedder()
    judged = _judged_gains(qrels)
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    values = []
    for qid, order in orders.items():
        gains = judged.get(str(qid))
        if not gains:
            continue
        text_of = texts.get(qid, {})
        pool = list(dict.fromkeys([*order[:k], *sorted(text_of, key=lambda d: -gains.get(d, 0.0))]))
        with_text = [d for d in pool if d in text_of]
        vecs = lexical.embed([text_of[d] for d in with_text]) if with_text else np.zeros((0, 1))
        row = {d: i for i, d in enumerate(with_text)}
        sim = vecs @ vecs.T

        seen: list[int] = []
        got = []
        for d in order[:k]:  # a copy of a document listed above gains nothing
            r = row.get(d)
            copy = r is not None and any(sim[r, s] >= lexical.duplicate_threshold for s in seen)
            got.append(0.0 if copy else gains.get(d, 0.0))
            if r is not None:
                seen.append(r)
        dcg = float(np.dot(got, discount[: len(got)]))
        # Ideal: the judged candidates best first, each copy of a picked one skipped, then the
        # judged documents that are not among the candidates (no text: distinct by assumption).
        picked: list[str] = []
        for d in sorted((d for d in with_text if gains.get(d, 0.0) > 0), key=lambda d: -gains[d]):
            if all(sim[row[d], row[p]] < lexical.duplicate_threshold for p in picked):
                picked.append(d)
        ideal = sorted([gains[d] for d in picked]
                       + [g for d, g in gains.items() if g > 0 and d not in text_of], reverse=True)[:k]
        idcg = float(np.dot(ideal, discount[: len(ideal)]))
        values.append(dcg / idcg if idcg > 0 else 0.0)
    return float(np.mean(values)) if values else float("nan")


def pairwise_distance(embedder: Any, texts_by_query: Sequence[Sequence[str]]) -> float:
    """Mean over queries of the average pairwise cosine distance of each query's selected texts."""
    values = []
    for texts in texts_by_query:
        if len(texts) < 2:
            continue
        vecs = np.asarray(embedder.embed(list(texts)), dtype=np.float64)
        sim = vecs @ vecs.T
        n = len(texts)
        values.append(float((n * n - sim.sum() - (n - np.trace(sim))) / (n * (n - 1))))
    return float(np.mean(values)) if values else 0.0


# ----------------------------------------------------------------------------------------- reranking


def default_depth(lim: Any, window_size: Any) -> int:
    """How many candidates per query are reranked when `depth` is not given: one prompt's worth,
    or with windows every candidate up to `max_total_chunks`."""
    return lim.max_chunks if window_size is None else lim.max_total_chunks


def _config(k: int, lambda_: float | None, depth: int, options: Mapping[str, Any], embedder: Any
            ) -> dict[str, Any]:
    backend = options.get("backend", "local")
    config = {"backend": backend if isinstance(backend, str) else str(getattr(backend, "model", backend)),
              "model": options.get("model"), "embedder": str(getattr(embedder, "name", embedder)), "k": k,
              "lambda": lambda_, "depth": depth, "duplicate_threshold": options.get("duplicate_threshold")}
    from .batch import SCORING_KEYS  # the metadata options: they change which chunks rank first

    # Each of these is recorded only when set, so older resume files still match.
    for name in ("window_size", *SCORING_KEYS):
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


def _error_kind_of(record: Mapping[str, Any]) -> str:
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


def _load_resume(path: Path, config: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
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


def _drop_partial_line(path: Path) -> None:
    """Cut a half-written last line (an interrupted run) that `_load_resume` skipped: the records
    appended next would otherwise continue it, and the next resume would find a broken line in the
    middle of the file and refuse it."""
    if not path.is_file():
        return
    with path.open("rb+") as fh:
        data = fh.read()
        if data and not data.endswith(b"\n"):
            fh.truncate(data.rfind(b"\n") + 1)


def _check_resumed(done: Mapping[str, Mapping[str, Any]], where: Mapping[str, int],
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


def rerank_queries(
    queries: Sequence[CandidateQuery],
    *,
    k: int = 10,
    lambda_: float | None = None,
    depth: int | None = None,
    concurrency: int = 4,
    progress: Callable[[int, int], None] | None = None,
    resume: str | Path | None = None,
    **options: Any,
) -> tuple[dict[str, list[str]], dict[str, str], dict[str, str]]:
    """Ranked ids per qid (failed queries absent), and per failed qid its error message and kind
    ("input", "backend" or "internal", as in `batch`)."""
    from .backends.factory import resolve_embedder
    from .batch import arerank_many, error_kind
    from .concurrency import run_coroutine

    lim = as_limits(options.get("limits"))
    depth = default_depth(lim, options.get("window_size")) if depth is None else depth
    opts = dict(options)
    embedder_spec = opts.get("embedder", "lexical")
    opts["embedder"] = resolve_embedder(
        opts.get("embedder", "lexical"), opts.get("backend", "local"), opts.get("base_url")
    )
    config = _config(k, lambda_, depth, opts, opts["embedder"])
    path = Path(resume) if resume else None
    done, where = _load_resume(path, config) if path else ({}, {})
    if path:
        _check_resumed(done, where, queries, depth, path)
        _drop_partial_line(path)
    if path and (not path.is_file() or path.stat().st_size == 0):  # new, or only a half-written header
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"config": config}) + "\n", encoding="utf-8")
    todo = [q for q in queries if q.qid not in done]
    total, finished = len(queries), len(queries) - len(todo)
    if progress is not None and finished:
        progress(finished, total)
    # One event loop and one shared backend for all slices; a slice is a checkpoint for --resume.
    from .backends.factory import backend_kwargs, make_backend

    backend = opts.get("backend", "local")
    opts["backend"] = make_backend(backend, model=opts.get("model"),
                                   base_url=opts.get("base_url"), api_key=opts.get("api_key"),
                                   embedder=opts["embedder"],
                                   **backend_kwargs(backend, opts.pop("backend_options", None)))

    async def run_slices() -> None:
        # One event loop for every slice: the shared backend's async client (bound to its loop) keeps
        # its connections from slice to slice, and is closed on that loop when the run ends.
        nonlocal finished
        try:
            for start in range(0, len(todo), SLICE):
                part = todo[start : start + SLICE]
                requests = [{"query": q.query, "chunks": list(q.chunks[:depth]), "top_k": k,
                             "lambda": lambda_} for q in part]

                def tick(n: int, _total: int, base: int = finished) -> None:
                    if progress is not None:
                        progress(base + n, total)

                outcomes = await arerank_many(requests, concurrency=concurrency, progress=tick, **opts)
                records = []
                for q, outcome in zip(part, outcomes, strict=True):
                    if isinstance(outcome, Exception):
                        # one line: the CLI prints it as one stderr line per failed query
                        text = " ".join(part.strip() for part in str(outcome).splitlines())
                        records.append({"qid": q.qid, "error": f"{type(outcome).__name__}: {text}"[:500],
                                        "kind": error_kind(outcome)})
                    else:
                        records.append({"qid": q.qid, "ranked": outcome.ids})
                finished += len(part)
                for rec in records:
                    done[rec["qid"]] = rec
                if path:
                    with path.open("a", encoding="utf-8") as fh:
                        fh.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        finally:  # what was built here from a name: nobody else will close its connections
            aclose = getattr(opts["backend"], "aclose", None)
            if isinstance(backend, str) and callable(aclose):
                await aclose()
            close = getattr(opts["embedder"], "close", None)
            if isinstance(embedder_spec, str) and callable(close):
                close()

    run_coroutine(run_slices())
    # Only this run's queries: a resume file may hold others (a larger candidates file).
    ours = {q.qid for q in queries}
    ranked = {q: list(r["ranked"]) for q, r in done.items() if "ranked" in r and q in ours}
    failed = {q: str(r["error"]) for q, r in done.items() if "error" in r and q in ours}
    kinds = {q: _error_kind_of(r) for q, r in done.items() if "error" in r and q in ours}
    return ranked, failed, kinds


def evaluate(
    candidates: str | Path | Sequence[CandidateQuery],
    qrels: str | Path | Sequence[Any],
    *,
    k: int = 10,
    lambda_: float | None = None,
    depth: int | None = None,
    subtopics: str | Path | Sequence[Any] | None = None,
    rel_level: int = 1,
    concurrency: int = 4,
    progress: Callable[[int, int], None] | None = None,
    resume: str | Path | None = None,
    distance_embedder: Any = None,
    **options: Any,
) -> EvalReport:
    """Rerank every candidate query and score input vs reranked order (see the module docstring).

    `options` are `rerank`'s keywords: backend, model, base_url, api_key, embedder,
    duplicate_threshold, limits, ... `distance_embedder` (default: `embedder`) measures the
    pairwise distance, so tables comparing several embedders can share one yardstick.
    """
    from .backends.factory import resolve_embedder
    from .embed import get_embedder
    from .embed.lexical import LexicalEmbedder
    from .embed.memo import Memo

    _ir_measures()
    if k < 1:
        raise InputError([Violation(path="k", value=k, message=f"k must be a positive integer, got {k}")])
    # Options shared by every query are checked once: a bad one is bad input (exit 2), not one
    # "failed" rerank per query (which the CLI reports as a backend failure, exit 3).
    from .guard.input import duplicate_threshold_violations, lambda_violations

    problems = [*([] if lambda_ is None else lambda_violations(lambda_)),
                *duplicate_threshold_violations(options.get("duplicate_threshold"))]
    if problems:
        raise InputError(problems)
    queries = read_candidates(candidates) if isinstance(candidates, (str, Path)) else list(candidates)
    judgments = read_qrels(qrels) if isinstance(qrels, (str, Path)) else list(qrels)
    subs = read_subtopics(subtopics) if isinstance(subtopics, (str, Path)) else subtopics
    embedder = resolve_embedder(
        options.pop("embedder", "lexical"), options.get("backend", "local"), options.get("base_url")
    )
    lim = as_limits(options.get("limits"))
    window_size = options.get("window_size")
    if window_size is not None:  # checked once, not once per query
        from .guard.input import window_size_violations

        if problems := window_size_violations(window_size, k, lim):
            raise InputError(problems)
    depth_used = default_depth(lim, window_size) if depth is None else depth
    if depth_used < 1:
        raise InputError([Violation(path="depth", value=depth, message="depth must be a positive integer")])
    if window_size is None and depth_used > lim.max_chunks:  # every query would fail the input guard
        raise InputError([Violation(path="depth", value=depth,
                                    message=f"depth {depth_used} is over the limit of {lim.max_chunks} "
                                    "chunks per rerank (max_chunks); pass window_size (--window-size N) "
                                    f"to rerank up to {lim.max_total_chunks} in windows")])
    if depth_used > lim.max_total_chunks:
        raise InputError([Violation(path="depth", value=depth,
                                    message=f"depth {depth_used} is over the limit of "
                                    f"{lim.max_total_chunks} chunks per rerank (max_total_chunks)")])
    problems = rel_level_violations(rel_level, judgments, qrels if isinstance(qrels, (str, Path)) else None)
    if problems:
        raise InputError(problems)
    judged = {j.query_id for j in judgments} & {q.qid for q in queries}
    if not judged:
        # Every metric would be NaN (and `--json` would print invalid JSON): a mismatch of files.
        where = qrels if isinstance(qrels, (str, Path)) else "the qrels"
        shown = counted(len(queries), "candidate query", "candidate queries")
        raise InputError([Violation(path="qrels", message=f"{where} judges none of the {shown} "
                                    "(check the qid columns)")])
    if subs is not None and not {j.query_id for j in subs} & judged:
        # The subtopic rows would be left out of the table without a word.
        where = subtopics if isinstance(subtopics, (str, Path)) else "the subtopics"
        shown = counted(len(judged), "candidate query", "candidate queries")
        raise InputError([Violation(path="subtopics", message=f"{where} judges none of the {shown} "
                                    "the qrels judge (check the qid columns)")])
    yardstick = embedder if distance_embedder is None else get_embedder(distance_embedder)
    started = time.perf_counter()
    ranked, failed, kinds = rerank_queries(queries, k=k, lambda_=lambda_, depth=depth_used,
                                           concurrency=concurrency, progress=progress, resume=resume,
                                           embedder=embedder, **options)
    wall = time.perf_counter() - started
    input_orders = {q.qid: q.ids for q in queries}
    reranked_orders = {q.qid: reranked_order(q.ids, ranked.get(q.qid, [])) for q in queries}
    text_of = {q.qid: {str(c["id"]): str(c["text"]) for c in q.chunks} for q in queries}
    # Both orders hold the same candidates: their near-duplicate vectors are computed once.
    lexical = Memo(LexicalEmbedder(), max_texts=max(1, sum(len(t) for t in text_of.values())))
    result = {}
    for label, orders in (("input", input_orders), ("reranked", reranked_orders)):
        metrics = measure(judgments, orders, k=k, rel_level=rel_level, subtopics=subs)
        metrics[f"novelty-nDCG@{k}"] = novelty_ndcg(judgments, orders, text_of, k, lexical)
        metrics[f"distance@{k}"] = pairwise_distance(
            yardstick, [[text_of[q][i] for i in ids[:k]] for q, ids in orders.items()])
        result[label] = metrics
    config = _config(k, lambda_, depth_used, options, embedder)
    return EvalReport(result["input"], result["reranked"], len(queries), failed, wall, config, kinds,
                      rel_level, len(judged))


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


# ----------------------------------------------------------------------------------------- CLI


def format_table(report: EvalReport) -> str:
    """Metrics as rows, input and reranked side by side with the difference."""
    lines = [f"{'metric':<16}{'input':>10}{'reranked':>10}{'delta':>10}"]
    for name, before in report.input.items():
        after = report.reranked.get(name, float("nan"))
        lines.append(f"{name:<16}{before:>10.4f}{after:>10.4f}{after - before:>+10.4f}")
    cfg = report.config
    k = cfg.get("k")
    # What the columns and the less common rows are: a table pasted into a report must stand alone.
    lines += [f"input: the candidates' order; reranked: the reranker's top {k}, then the rest in input order",
              f"Recall, MRR: grade >= {report.rel_level} is relevant; "
              "novelty-nDCG: no gain for a near-copy of a chunk above",
              f"distance@{k}: mean pairwise cosine distance of the first {k} (higher = more varied)"]
    lam = cfg.get("lambda")
    lam_text = f"{load_limits().default_lambda:g} (default)" if lam is None else f"{lam:g}"
    unjudged = report.n_queries - (report.n_queries if report.n_judged is None else report.n_judged)
    if unjudged:
        lines.append(f"{unjudged} of the {counted(report.n_queries, 'query', 'queries')} "
                     f"{'has' if unjudged == 1 else 'have'} no judgments in the qrels: nDCG, "
                     "Recall, MRR and novelty-nDCG average over the others")
    lines.append(f"{counted(report.n_queries, 'query', 'queries')}, backend {cfg.get('backend')}, "
                 f"embedder {cfg.get('embedder')}, "
                 f"k {cfg.get('k')}, lambda {lam_text}, depth {cfg.get('depth')}, "
                 + (f"windows of {cfg['window_size']}, " if cfg.get("window_size") else "")
                 + f"{report.wall_s:.1f} s" + (f", {len(report.failed)} failed" if report.failed else ""))
    return "\n".join(lines)


def _progress_printer(enabled: bool) -> tuple[Callable[[int, int], None] | None, Any]:
    if not enabled or not sys.stderr.isatty():
        return None, None
    try:
        from tqdm import tqdm
    except ImportError:
        return None, None
    bar = tqdm(unit="query", file=sys.stderr, leave=False)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return update, bar


def run_eval_cli(args: Any, backend_options: Mapping[str, Any]) -> int:
    """`rag-rerank eval`: metrics, then one stderr line per failed query; exit 0, or as `batch`
    does, by the worst failure: 2 bad input only, 3 a backend failure, 4 an internal error."""
    for name in ("candidates", "qrels", "subtopics"):
        value = getattr(args, name, None)
        if value is not None and Path(value).is_dir():
            raise InputError([Violation(path=f"--{name}", message=f"{value} is a directory, not a file")])
        if value is not None and not Path(value).exists():  # a pipe (`<(...)`) is read like a file
            raise InputError([Violation(path=f"--{name}", message=f"no such file: {value}")])
    if args.concurrency < 1:
        raise InputError([Violation(path="--concurrency", message="must be at least 1",
                                    value=args.concurrency)])
    rel_level = getattr(args, "rel_level", 1)
    progress, bar = _progress_printer(not args.no_progress)
    opts = {key: v for key, v in backend_options.items() if v is not None}
    try:
        report = evaluate(args.candidates, args.qrels, k=args.k, lambda_=args.lambda_,
                          depth=getattr(args, "depth", None), subtopics=args.subtopics,
                          rel_level=rel_level, concurrency=args.concurrency,
                          duplicate_threshold=getattr(args, "duplicate_threshold", None),
                          progress=progress, resume=args.resume, **opts)
    except InputError as exc:  # the CLI's user knows the flag, not the keyword
        named = [replace(v, path="--rel-level", message=v.message.replace("rel_level ", "", 1))
                 if v.path == "rel_level" else v for v in exc.violations]
        raise InputError(named, exc.headline) from None
    finally:
        if bar is not None:
            bar.close()
    print(json.dumps(report.to_dict(), ensure_ascii=False) if args.json else format_table(report))
    for qid, message in report.failed.items():
        print(f"rag-rerank: query {qid} kept its input order: {message}", file=sys.stderr)
    from .batch import exit_code_for

    return exit_code_for(set(report.failure_kinds.values()))


__all__ = ["CandidateQuery", "EvalReport", "RerankError", "evaluate", "measure", "read_candidates",
           "read_qrels", "read_subtopics", "reranked_order", "run_eval_cli"]
