"""The diversity post-pass: turns relevance scores into a result that keeps the card's promises.

The card asks the LLM to apply MMR, but a language model cannot compute similarities, so this
stage recomputes the final selection from the (guarded) scores and real embeddings:

1. chunks scored at or below the minimum score (0.2) never enter `ranked` (`below_min_score`);
2. greedy selection over the remaining candidates, by default MMR
   `lambda * relevance - (1 - lambda) * max_sim(candidate, selected)` with relevance = the
   LLM's score, cosine similarity between chunk vectors, the most relevant chunk first and every
   tie broken by input order. One similarity matrix, then O(k·n) numpy work (a running max
   vector), no per-pair Python loops;
3. redundancy: when a chunk is picked, every remaining candidate redundant with it
   (`redundancy.py` by default) joins it, one member of that group takes the place and the others
   go to `dropped` as `redundant_with:<kept id>`. Which one: a member that contains another (says
   all it says and more: dropping it would lose that) over the one it contains; among members
   stating the same thing (copies, restatements), the more concise one, as the card asks; then the
   more relevant. So no two ranked chunks are redundant, and a `redundant_with:` reason always
   names a ranked id. The selection goes on until `top_k` are picked or no candidate is left: a
   merge never leaves a slot empty while a candidate waits;
4. accounting: every input id exactly once, in `ranked` or in `dropped` with a machine-readable
   reason in the grammar of `reasons.py` (`redundant_with:<id>`, `below_min_score: 0.150`,
   `not_selected: 0.410`, `over_word_budget`) or the LLM's own reason for a chunk it dropped
   itself (kept as is when it follows the grammar, else as `dropped_by_model: <its words>`; an
   LLM `redundant_with:` that no longer names a ranked id is re-pointed at the kept chunk of its
   group, or becomes `not_selected`);
5. a `diversity_note` on each ranked chunk whose place differs from plain relevance order;
6. a note in `meta.notes` when fewer than `top_k` are ranked, counting why the other chunks are not
   (`short_list_note`): the caller learns whether the list is short because few chunks are
   relevant, because many say the same, or because the scorer returned few.

Layouts: `mmr` (default), `diversity` (Haystack's greedy order: the chunk closest to the query
first, then the one least similar on average to those already picked; lambda unused) and
`lost_in_the_middle` (MMR selection laid out best-at-both-ends, `[1 3 5 7 9 10 8 6 4 2]`).
`word_budget` keeps whole chunks in selection order up to and including the one that reaches or crosses it.

The pipeline asks the model for `candidate_k = min(n, max(2*top_k, top_k+5) + copies)` scored
chunks (`windows.candidate_k`), so that MMR and de-duplication have something to promote; this
module accepts any number of scored chunks and returns at most `request.top_k`. When merges use
up the candidates of a scored backend (which scores every chunk) the engine asks it again for
all of them (`engine`: the refill), so a scored list is short only when too few chunks are left.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any

import numpy as np

from . import reasons
from .embed import (
    CALLER_DUPLICATE_THRESHOLD,
    Embedder,
    chunk_vectors,
    embed_texts,
    get_embedder,
    query_vector,
)
from .embed.lexical import LexicalEmbedder
from .embed.memo import TextRows
from .embed.static import SINGLE_THREAD_MNK, SINGLE_THREAD_SYRK, StaticEmbedder
from .errors import InputError, Violation
from .guard.limits import load_limits
from .models import Dropped, Ranked, RerankRequest, RerankResult, RunMeta
from .redundancy import redundancy, rules_for

LAYOUTS = ("mmr", "diversity", "lost_in_the_middle")
BELOW_MIN = reasons.BELOW_MIN_SCORE
NOT_SELECTED = reasons.NOT_SELECTED
# The detail of `not_selected` for a chunk the scorer left out of its answer altogether.
UNSCORED_DETAIL = "the model neither ranked nor dropped it"
OVER_BUDGET = reasons.OVER_WORD_BUDGET
DUPLICATES_BY = ("text", "embedding")
LEXICAL_NAME = "lexical"


# --------------------------------------------------------------------------- the algorithms


def lost_in_the_middle(order: Sequence[int]) -> list[int]:
    """Best items at both ends: ranks 1..10 become [1 3 5 7 9 10 8 6 4 2] (odd counts alike)."""
    items = list(order)
    return items[0::2] + items[1::2][::-1]


@dataclass(frozen=True)
class Selection:
    """What the greedy loop decided, in candidate-local indices."""

    picked: tuple[int, ...]
    redundant: dict[int, int]  # candidate -> kept candidate it duplicates
    replaced: dict[int, int]  # kept candidate -> the pick it stood in for (container, or more concise)
    # kept -> (more relevant skipped, its max_sim, to whom, the kept one's own max_sim, to whom)
    promoted_over: dict[int, tuple[int, float, int, float, int]]
    containing: frozenset[int] = frozenset()  # kept candidates that stood in because they contain the pick
    # Every candidate, most relevant first (ties in input order): the order `select` sorted once,
    # which the post-pass reads again for each ranked chunk's place by relevance alone.
    by_relevance: Sequence[int] = field(default=(), compare=False)


def select(
    rel: np.ndarray | list[float],
    sim: np.ndarray,
    k: int,
    *,
    lambda_: float,
    lengths: np.ndarray | Sequence[int],
    threshold: float,
    layout: str = "mmr",
    query_sim: np.ndarray | None = None,
    dup_sim: np.ndarray | None = None,
    duplicate: np.ndarray | None = None,
    prefer: np.ndarray | None = None,
) -> Selection:
    """Greedy selection with near-duplicate grouping (see the module docstring, steps 2-3).

    Invariant: no still-available candidate is a duplicate of a picked one, because picking a
    chunk removes its duplicates. Duplicates are `duplicate[i, j]` (a judgement, `redundancy.py`)
    when given, else `dup_sim` (default: `sim`, the MMR one) at or above `threshold`. Of a group of
    duplicates the one kept is a member that contains others (`prefer[i, j]`: i says all j says and
    more), else the most concise, then the most relevant.

    The loop runs on Python floats taken from the arrays once (`tolist`): a few dozen candidates
    and at most `k` steps, where a numpy call per step would cost more than the arithmetic it
    does. The operations are numpy's elementwise ones on the same float64 values (the score
    `lambda * rel - (1 - lambda) * max_sim`, a strict `>` for the running maximum, the first of
    the largest scores), so the picks and every number reported are the same bits. (The post-pass
    hands `rel` over as the list of its candidates' scores, and `lengths` as a sequence that
    measures a text only when asked: only the members of a group of duplicates are.)
    """
    dsim = sim if dup_sim is None else dup_sim
    dup = dsim >= threshold if duplicate is None else duplicate
    rel_of: list[float] = rel.tolist() if isinstance(rel, np.ndarray) else rel
    length_of = lengths.tolist() if isinstance(lengths, np.ndarray) else lengths
    n = len(rel_of)
    dup_of: dict[int, list[int]] = {}  # a candidate with duplicates -> them, ascending
    for i, j in _true_cells(dup):
        dup_of.setdefault(i, []).append(j)
    contained: dict[int, set[int]] = {}  # i -> the candidates i contains (`prefer`)
    if prefer is not None:
        for i, j in _true_cells(prefer):
            contained.setdefault(i, set()).add(j)
    available = [True] * n
    open_ = list(range(n))  # the available candidates, ascending
    max_sim = [-math.inf] * n
    max_src = [-1] * n
    sum_sim = [0.0] * n
    weighted_rel = [lambda_ * r for r in rel_of]
    score = [0.0] * n  # each candidate's MMR score, made when its `max_sim` is (`_updated_trade_off`)
    by_rel = sorted(range(n), key=rel_of.__getitem__, reverse=True)  # most relevant first, ties in order
    top = 0  # by_rel[top]: the most relevant candidate left (`_first_max` of rel; only moves on)
    weight = 1.0 - lambda_
    picked: list[int] = []
    redundant: dict[int, int] = {}
    replaced: dict[int, int] = {}
    promoted: dict[int, tuple[int, float, int, float, int]] = {}
    containing: set[int] = set()
    following = -1  # the next MMR choice, found while the last pick's similarities were read
    while len(picked) < k and open_:
        if not picked:
            opener = query_sim.tolist() if layout == "diversity" and query_sim is not None else rel_of
            choice = _first_max(open_, opener)
        elif layout == "diversity":  # least similar on average to those picked (same divisor for all)
            choice = _first_max(open_, [-s for s in sum_sim])
        else:
            choice = following
        near = dup_of.get(choice)
        members = [j for j in near if available[j] and j != choice] if near else None
        if members:
            members = sorted([*members, choice])
            contains = {m: len(contained.get(m, set()).intersection(members)) for m in members}
            keep = min(members, key=lambda m: (-contains[m], length_of[m], -rel_of[m], m))
        else:  # no duplicate of the choice left: it is kept (most picks)
            members, keep = [choice], choice
        if picked:
            while not available[by_rel[top]]:
                top += 1
            best = by_rel[top]
            if rel_of[best] > rel_of[choice] and best != keep and best not in members:
                promoted[keep] = (best, max_sim[best], max_src[best], max_sim[keep], max_src[keep])
        if keep != choice:
            replaced[keep] = choice
            if choice in contained.get(keep, ()):
                containing.add(keep)
        picked.append(keep)
        available[keep] = False
        near = dup_of.get(keep)
        gone = [j for j in near if available[j]] if near else []
        if keep != choice and choice not in gone:
            gone = sorted([*gone, choice])
        open_.remove(keep)
        for j in gone:
            redundant[j] = keep
            available[j] = False
            open_.remove(j)
        if len(picked) < k and open_:  # the next step reads the similarities to this pick
            row = sim[keep].tolist()
            if layout == "diversity":
                for j in open_:  # only an available candidate's running figures are read again
                    if row[j] > max_sim[j]:
                        max_sim[j] = row[j]
                        max_src[j] = keep
                    sum_sim[j] += row[j]
            else:
                following = _updated_trade_off(open_, row, keep, weighted_rel, weight, max_sim, max_src,
                                               score)
    return Selection(tuple(picked), redundant, replaced, promoted, frozenset(containing), by_rel)


def _true_cells(matrix: np.ndarray) -> list[tuple[int, int]]:
    """The (row, column) of each True cell of a 2-d bool matrix, row by row: `zip(*matrix.nonzero())`.
    Found in the matrix's bytes (numpy keeps a bool in one byte, 0 or 1) with `bytes.find`: a list's
    duplicate and containment matrices hold a few True cells among hundreds, and `nonzero` with
    its two conversions to lists costs several times the search."""
    if matrix.dtype != np.bool_:  # any other dtype: its non-zero cells
        matrix = matrix != 0
    data = matrix.tobytes()  # row by row, whatever the matrix's own layout
    width = matrix.shape[1]
    cells = []
    at = data.find(1)
    while at >= 0:
        cells.append(divmod(at, width))
        at = data.find(1, at + 1)
    return cells


def _first_max(indices: list[int], values: list[float]) -> int:
    """The first of `indices` (ascending) with the largest value: numpy's `argmax` over them."""
    best = indices[0]
    top = values[best]
    for j in indices:
        if values[j] > top:
            best, top = j, values[j]
    return best


def _updated_trade_off(indices: list[int], row: list[float], pick: int, weighted_rel: list[float],
                       weight: float, max_sim: list[float], max_src: list[int], score: list[float]) -> int:
    """Each of `indices`' running maximum similarity raised by its similarity to `pick` (`row`,
    strictly greater: the first source of a maximum stays) and its MMR score `weighted_rel -
    weight * max_sim` (a product, then a difference, as numpy computes it elementwise) made
    again when it was, and, in the same pass, `_first_max` of the scores over them: the next
    choice. One pass instead of two, and a score is only made when its maximum moved."""
    it = iter(indices)
    best = next(it)  # `indices` is not empty
    r = row[best]
    if r > max_sim[best]:
        max_sim[best] = r
        max_src[best] = pick
        score[best] = weighted_rel[best] - weight * r
    top = score[best]
    for j in it:
        r = row[j]
        if r > max_sim[j]:
            max_sim[j] = r
            max_src[j] = pick
            score[j] = weighted_rel[j] - weight * r
        if score[j] > top:
            best, top = j, score[j]
    return best


# --------------------------------------------------------------------------- the post-pass


def layout_violations(layout: object) -> list[Violation]:
    """The one check of a `layout` (the options' table uses it for `rerank(layout=...)`)."""
    if isinstance(layout, str) and layout in LAYOUTS:
        return []
    return [Violation(path="layout", value=layout,
                      message=f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")]


def _check_args(
    request: RerankRequest,
    scored: Sequence[Ranked],
    llm_dropped: Sequence[Dropped],
    layout: str,
    word_budget: Any,
    duplicate_threshold: Any,
    min_score: Any,
) -> list[Violation]:
    problems = layout_violations(layout)
    if word_budget is not None and (
        isinstance(word_budget, bool) or not isinstance(word_budget, int) or word_budget < 1
    ):
        problems.append(
            Violation(
                path="word_budget",
                value=word_budget,
                message=f"word_budget must be a positive integer or None, got {word_budget!r}",
            )
        )
    for name, value in (("duplicate_threshold", duplicate_threshold), ("min_score", min_score)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
        ):
            problems.append(
                Violation(path=name, value=value, message=f"{name} must be a finite number, got {value!r}")
            )
    ids = set(request.ids)
    seen: dict[str, str] = {}
    for section, items in (("scored", scored), ("dropped", llm_dropped)):
        for i, item in enumerate(items):
            where = f"{section}[{i}]"
            if item.id not in ids:
                problems.append(
                    Violation(path=f"{where}.id", id=item.id, message=f"{item.id!r} is not an input id")
                )
            elif item.id in seen:
                problems.append(
                    Violation(
                        path=f"{where}.id",
                        id=item.id,
                        message=f"id {item.id!r} appears twice (first at {seen[item.id]})",
                    )
                )
            else:
                seen[item.id] = where
            if section == "scored":
                score = item.score  # type: ignore[union-attr]
                if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
                    problems.append(
                        Violation(
                            path=f"{where}.score",
                            id=item.id,
                            value=score,
                            message="score must be a finite number",
                        )
                    )
    return problems


def _per_text(embedder: Any) -> bool:
    """Whether `embedder` gives each text a vector of its own, the same bits whatever else is
    embedded with it and never an error (the numpy embedders): then only the rows the post-pass
    reads are embedded. A model's vectors depend on its batch (padding), and an embeddings server
    may fail on any text: those embed every chunk, as they always did."""
    return isinstance(embedder, (LexicalEmbedder, StaticEmbedder))


# The unit rows (`embed_texts`) of the chunks the post-pass compared last, per numpy embedder
# setting: the lexical embedder's are sparse (~2.5 KB a text), the static table's 1.5 KB.
UNIT_ROWS = {"lexical": TextRows(4096, sparse=True), "static": TextRows(4096)}
# A number per numpy embedder setting, the first part of its `UNIT_ROWS` keys: the setting is
# hashed once per call instead of once per text (a frozen dataclass hashes all its fields). Numbers
# are never reused, so forgetting the settings (past 64 of them) only costs their rows' cache hits.
_SETTING: dict[Any, int] = {}
_NUMBERS = itertools.count()


def _embed_rows(embedder: Any, texts: Sequence[str], rows: Sequence[int]) -> np.ndarray:
    """The unit vectors of `texts[rows]` under `embedder` (`embed_texts`), float64 (the same
    values: what `_similarity` multiplies); a numpy embedder's rows of texts compared recently
    come from `UNIT_ROWS` (a row is the same bits alone)."""
    if not _per_text(embedder):
        return embed_texts(embedder, list(texts))[list(rows)].astype(np.float64)
    sub = [texts[i] for i in rows]
    kind = "lexical" if isinstance(embedder, LexicalEmbedder) else "static"
    setting = _SETTING.get(embedder)
    if setting is None:
        if len(_SETTING) >= 64:
            _SETTING.clear()
        setting = _SETTING.setdefault(embedder, next(_NUMBERS))
    # the lexical embedder's own unit rows: `embed_texts`' bits, made from the touched cells alone
    compute = embedder.unit_entries if type(embedder) is LexicalEmbedder else partial(embed_texts, embedder)
    return UNIT_ROWS[kind].rows([(setting, t) for t in sub], sub, compute, embedder.dim, dtype=np.float64)


def _resolve_vectors(
    request: RerankRequest, texts: list[str], embedder: str | Embedder | None, need_query: bool,
    query_vec: Any, rows: list[int],
) -> tuple[np.ndarray, np.ndarray | None, str, float, list[str]]:
    """(the vectors of the chunks at `rows`, float64, query vector or None, embedder name,
    default duplicate threshold, notes); `texts` are the chunks' texts. Caller vectors are checked
    for every chunk."""
    notes: list[str] = []
    vectors = chunk_vectors(request.chunks)
    if vectors is not None:
        q = query_vector(query_vec, vectors.shape[1])
        if need_query and q is None:
            notes.append("layout diversity without a query vector: opened with the most relevant chunk")
        return vectors[rows].astype(np.float64), q, "caller", CALLER_DUPLICATE_THRESHOLD, notes
    emb = get_embedder(embedder)
    if need_query and not _per_text(emb):
        both = embed_texts(emb, [request.query, *texts])
        q_row: np.ndarray | None = both[:1]
        vectors = both[1:][rows].astype(np.float64)
    elif need_query:
        q_row, vectors = embed_texts(emb, [request.query]), _embed_rows(emb, texts, rows)
    else:
        vectors, q_row = _embed_rows(emb, texts, rows), None
    threshold = float(getattr(emb, "duplicate_threshold", CALLER_DUPLICATE_THRESHOLD))
    return vectors, q_row, str(getattr(emb, "name", type(emb).__name__)), threshold, notes


def _similarity(vectors: np.ndarray) -> np.ndarray:
    """Cosine matrix in float64 (`_gram` of the unit rows)."""
    v = np.asarray(vectors, dtype=np.float64)  # float32 values are exact in float64
    if not len(v):
        return np.zeros((0, 0))
    return _gram(v)


def _gram(v: np.ndarray) -> np.ndarray:
    """`v @ v.T`, exactly symmetric, in products small enough that the BLAS runs each on the
    calling thread (`SINGLE_THREAD_SYRK`, `SINGLE_THREAD_MNK`).

    Why not one product: above the threshold the BLAS wakes its threads, which on a busy 2-core
    machine wait for a core (the post-pass's p95 at 50 chunks was once 128 ms against a 2.6 ms
    median, `bench/overhead.py`) and, idle, spin on the core a local model server needs.

    A list of up to about 60 rows is summed over slices of columns, each slice's `x @ x.T` one
    symmetric product of all the rows (numpy's syrk: half the multiplications, both halves filled
    alike): the few products read each row once in all. A longer list is cut into square blocks of
    rows (a slice of columns would be too thin to pay for its call): a block on the diagonal is its
    symmetric product, one above it is mirrored below. Either way `sim[i, j] == sim[j, i]`."""
    n, k = v.shape
    step = SINGLE_THREAD_SYRK // max(n * (n + 1), 1)
    if step >= k:
        return v @ v.T
    return _column_slices(v, step) if step >= _MIN_SLICE else _row_blocks(v)


def _column_slices(v: np.ndarray, step: int) -> np.ndarray:
    """`v @ v.T` summed over slices of `step` columns, each slice's symmetric product of all rows."""
    x = v[:, :step]
    out = x @ x.T
    for a in range(step, v.shape[1], step):
        x = v[:, a:a + step]
        out += x @ x.T
    return out


def _row_blocks(v: np.ndarray) -> np.ndarray:
    """`v @ v.T` in square blocks of rows, each under `SINGLE_THREAD_MNK`; mirrored below the diagonal."""
    n, k = v.shape
    side = max(1, math.isqrt(SINGLE_THREAD_MNK // max(k, 1)))
    out = np.empty((n, n))
    for a in range(0, n, side):
        rows = v[a:a + side]
        out[a:a + side, a:a + side] = rows @ rows.T
        for b in range(a + side, n, side):
            block = rows @ v[b:b + side].T
            out[a:a + side, b:b + side] = block
            out[b:b + side, a:a + side] = block.T
    return out


# The thinnest slice of columns `_gram` sums over (about 60 rows at most): thinner ones cost more
# in calls than the row blocks they replace (`bench/gram.py`, 10 to 100 rows of 4096 columns).
_MIN_SLICE = 128


def _redundancy(texts: list[str], emb_name: str, embedder: Any, vectors: np.ndarray | None,
                lexical: np.ndarray | None, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """`redundancy.redundancy` over `texts[rows]` with the embedder family's sentence vectors: the
    sentence-transformers model's own (`vectors` when they are of these texts), the static
    table's for the lexical embedder and any other (its threshold is measured for those)."""
    family = "sentence-transformers" if emb_name.startswith("sentence-transformers") else "static"

    def semantic() -> np.ndarray:  # made only when a short text is among them (`redundancy`)
        if family == "static" or vectors is None:
            source = _STATIC if family == "static" else get_embedder(embedder)
            return _similarity(_embed_rows(source, texts, rows))
        return _similarity(vectors)

    if lexical is None:
        lexical = _similarity(_embed_rows(_LEXICAL, texts, rows))
    return redundancy([texts[i] for i in rows], semantic, rules_for(family), lexical)


# The embedders the redundancy judgement reads with, whatever the post-pass's own (stateless values).
_STATIC = StaticEmbedder()
_LEXICAL = LexicalEmbedder()


@lru_cache(maxsize=4096)
def _concise_length(text: str) -> int:
    return len(" ".join(text.split()))


class _ConciseLengths:
    """The candidates' concise lengths (`_concise_length` of each one's own text), as `select` reads
    them: measured when asked, and it asks only of the members of a group of duplicates."""

    __slots__ = ("_cand", "_own")

    def __init__(self, own: Sequence[str], cand: Sequence[int]) -> None:
        self._own = own
        self._cand = cand

    def __getitem__(self, j: int) -> int:
        return _concise_length(self._own[self._cand[j]])


# What the post-pass reads of a scored chunk: a mapping with its "score", the model's "reason" and
# its "diversity_note" (absent or None without one): the guarded answer's own items, as they are.
Said = Mapping[str, Any]


def postpass(
    request: RerankRequest,
    scored: Sequence[Ranked],
    llm_dropped: Sequence[Dropped] = (),
    *,
    embedder: str | Embedder | None = "lexical",
    duplicate_threshold: float | None = None,
    layout: str = "mmr",
    word_budget: int | None = None,
    min_score: float | None = None,
    query_vector: Sequence[float] | np.ndarray | None = None,
    duplicates_by: str = "text",
) -> RerankResult:
    """The final `RerankResult` from relevance scores (module docstring: what and why).

    `scored` may hold more than `request.top_k` items; `llm_dropped` are the chunks the model
    dropped itself. Chunk vectors come from the chunk records when every chunk carries one
    (`query_vector` is then the optional query vector for layout "diversity"), else from
    `embedder`. `duplicate_threshold` defaults to the embedder's (0.95 for caller vectors); a
    value above 1 disables de-duplication. `min_score` defaults to the limits' 0.2. Bad
    arguments raise `InputError` naming each one; `meta` holds only the embedder and notes.

    `duplicates_by="text"` (default) judges redundancy by what the texts say (`redundancy.py`: a
    copy, the same words, containment (the container kept), or a restatement whose every differing
    word has a close substitute and whose sentence vectors are close: the static table's for the
    lexical embedder and any other, the sentence-transformers model's own for that family).
    A `duplicate_threshold` given by the caller keeps its old meaning: near-duplicates are the
    pairs whose lexical vectors' cosine is at or above it. `"embedding"` uses the MMR vectors and
    the embedder's own threshold. Caller vectors always decide with themselves (cosine at or
    above `duplicate_threshold`, 0.95 by default).
    """
    problems = _check_args(request, scored, llm_dropped, layout, word_budget, duplicate_threshold, min_score)
    if duplicates_by not in DUPLICATES_BY:
        problems.append(Violation(path="duplicates_by", value=duplicates_by,
                                  message=f"duplicates_by must be one of {', '.join(DUPLICATES_BY)}"))
    if problems:
        raise InputError(problems, headline="invalid post-pass arguments")
    said = {r.id: {"score": r.score, "reason": r.reason, "diversity_note": r.diversity_note} for r in scored}
    return _postpass(request, said, {d.id: d.reason for d in llm_dropped}, embedder=embedder,
                     duplicate_threshold=duplicate_threshold, layout=layout, word_budget=word_budget,
                     min_score=min_score, query_vector=query_vector, duplicates_by=duplicates_by,
                     float_scores=False)


def postpass_guarded(
    request: RerankRequest,
    answer: Mapping[str, Any],
    *,
    embedder: str | Embedder | None = "lexical",
    duplicate_threshold: float | None = None,
    layout: str = "mmr",
    min_score: float | None = None,
) -> RerankResult:
    """`postpass` of an answer object the output guard passed (`guard.output.judge`: every id an
    input id of `request`, each once, every score a number in [0, 1]), with settings the options
    table checked: the engine's call. Nothing is checked again, and the answer's items are read
    as they are, without a `Ranked` / `Dropped` made for each. Anyone else calls `postpass`."""
    scored = {r["id"]: r for r in answer.get("ranked", ())}
    said = {d["id"]: d["reason"] for d in answer.get("dropped", ()) or ()}
    return _postpass(request, scored, said, embedder=embedder, duplicate_threshold=duplicate_threshold,
                     layout=layout, word_budget=None, min_score=min_score, query_vector=None,
                     duplicates_by="text", float_scores=True)


def _postpass(
    request: RerankRequest,
    scored: dict[str, Said],
    llm_reason: dict[str, str],
    *,
    embedder: str | Embedder | None,
    duplicate_threshold: float | None,
    layout: str,
    word_budget: int | None,
    min_score: float | None,
    query_vector: Sequence[float] | np.ndarray | None,
    duplicates_by: str,
    float_scores: bool,
) -> RerankResult:
    """The post-pass on checked arguments: `scored` maps a scored id to what the scorer said of it,
    `llm_reason` a dropped id to the scorer's reason; `float_scores`: a ranked chunk's score is
    given as a float (an answer's JSON may write 1 for 1.0), else as the caller's `Ranked` had it."""
    floor = load_limits().min_score if min_score is None else float(min_score)
    chunks = request.chunks
    if not chunks:
        return RerankResult(ranked=(), dropped=(), meta=RunMeta(embedder=None))

    # One pass over the chunks: the candidates (scored above the floor) in input order with their
    # scores; the orphans, left without a standing reason of their own, which are compared with the
    # ranked ones (`_unscored_reason`); and every other chunk's reason, which no selection changes.
    # Vectors, similarities and the redundancy judgement are needed for the candidates' and the
    # orphans' rows alone: every pair's answer is the same whichever other chunks are compared.
    cand: list[int] = []
    rel_of: list[float] = []  # the candidates' scores
    orphans: list[int] = []
    why: list[str | None] = [None] * len(chunks)  # each dropped chunk's reason (reasons.py grammar)
    said_of = scored.get
    for i, chunk in enumerate(chunks):
        said = said_of(chunk.id)
        if said is not None:
            score = said["score"]
            if score > floor:
                cand.append(i)
                rel_of.append(score)
            else:
                why[i] = _score_reason(BELOW_MIN, score)
        elif (llm := llm_reason.get(chunk.id)) is None or (standing := _standing(llm)) is None:
            orphans.append(i)
        else:  # the model's own words, filed under a listed token if need be
            why[i] = standing
    rows = sorted([*cand, *orphans]) if orphans else cand

    texts = [c.text for c in chunks]
    vectors, q_row, emb_name, default_thr, notes = _resolve_vectors(
        request, texts, embedder, layout == "diversity", query_vector, rows
    )
    sim_all = _similarity(vectors)
    # Near-duplicates, conciseness and the word budget are about the chunks' own texts: with
    # `embed_meta_fields` the texts here carry the meta values too, and sibling chunks of one
    # document (one title) would otherwise be judged copies of each other and dropped as redundant.
    embedded = request.own_texts is not None
    own = [request.own_text(c) for c in chunks] if embedded else texts
    threshold = default_thr if duplicate_threshold is None else float(duplicate_threshold)
    prefer_all: np.ndarray | None = None
    if emb_name == "caller" or duplicates_by == "embedding":
        dup_all = sim_all >= threshold
    elif duplicate_threshold is not None:  # the caller's cosine on lexical vectors, as it always meant
        lexical = sim_all if (emb_name == LEXICAL_NAME and not embedded) else \
            _similarity(_embed_rows(_LEXICAL, own, rows))
        dup_all = lexical >= threshold
    else:
        mine = emb_name == LEXICAL_NAME and not embedded  # the MMR vectors are these texts' lexical ones
        dup_all, prefer_all = _redundancy(own, emb_name, embedder, vectors if not embedded else None,
                                          sim_all if mine else None, rows)

    at: dict[int, int] = {}  # with orphans: chunk index -> row of the matrices above
    if orphans:  # the candidates' rows of the matrices
        at = {g: k for k, g in enumerate(rows)}
        local = np.array([at[g] for g in cand], dtype=np.int64)
        pick = np.ix_(local, local)
        sim, dup, prefer = sim_all[pick], dup_all[pick], None if prefer_all is None else prefer_all[pick]
    else:  # the rows are the candidates
        sim, dup, prefer = sim_all, dup_all, prefer_all
    q_sim = None
    if q_row is not None:
        q_sim = vectors @ q_row.astype(np.float64).ravel()
        if orphans:
            q_sim = q_sim[local]
    sel = select(rel_of, sim, request.top_k, lambda_=request.lambda_, lengths=_ConciseLengths(own, cand),
                 threshold=threshold, layout=layout, query_sim=q_sim, duplicate=dup, prefer=prefer)

    picked = list(sel.picked)
    if word_budget is not None:
        used, cut = 0, len(picked)
        for pos, j in enumerate(picked):
            used += len(own[cand[j]].split())
            if used >= word_budget:
                cut = pos + 1
                break
        for j in picked[cut:]:
            why[cand[j]] = OVER_BUDGET
        picked = picked[:cut]
    final = lost_in_the_middle(picked) if layout == "lost_in_the_middle" else picked
    ranked = _ranked_items(chunks, cand, scored, sel, picked, final, rel_of, layout, float_scores)

    # The candidates left out: a duplicate of a ranked chunk names it; any other has its score.
    kept = set(final)
    kept_of = sel.redundant  # a duplicate -> the one kept for it (candidates' places)
    for j, i in enumerate(cand):
        if j in kept or why[i] is not None:  # ranked, or over the word budget
            continue
        keep = kept_of.get(j)
        if keep is None:
            score = rel_of[j]  # `_score_reason`, without its frame
            why[i] = _score_reason_memo(NOT_SELECTED, score) if score else _score_reason(NOT_SELECTED, score)
        else:
            why[i] = reasons.redundant_with(chunks[cand[keep]].id) if keep in kept else NOT_SELECTED
    if orphans:
        index = {c.id: i for i, c in enumerate(chunks)}
        ranked_set = {cand[j] for j in final}
        kept_at = {cand[j]: cand[keep] for j, keep in kept_of.items()}  # a duplicate -> its kept one
        for i in orphans:
            why[i] = _unscored_reason(i, llm_reason.get(chunks[i].id), chunks, index, kept_at, ranked_set,
                                      dup_all, sim_all, at)
    dropped = tuple([Dropped(c.id, r) for c, r in zip(chunks, why, strict=True) if r is not None])
    short = short_list_note(request.top_k, len(ranked), [d.reason for d in dropped]) \
        if len(ranked) < request.top_k else None
    meta = RunMeta(embedder=emb_name, notes=(*notes, short) if short else (*notes,))
    return RerankResult(ranked, dropped, meta)


# How `short_list_note` names each reason token, in the order it lists them.
_SHORT_WHY = ((reasons.REDUNDANT_WITH, "redundant with a ranked chunk"),
              (reasons.BELOW_MIN_SCORE, "at or below the minimum score"),
              (reasons.NOT_SELECTED, "not among the scored candidates"),
              (reasons.NO_CITABLE_PHRASE, "without a phrase to quote"),
              (reasons.OVER_WORD_BUDGET, "over the word budget"))


def short_list_note(top_k: int, ranked: int, dropped_reasons: Sequence[str]) -> str | None:
    """`meta.notes`' line for a list shorter than `top_k` (None when it is not, or when there was
    nothing more to rank): how many are ranked and why each other chunk is not, by reason token
    ("the scorer's own reasons" for a model's words)."""
    if ranked >= top_k or not dropped_reasons:
        return None
    counts: dict[str, int] = {}
    for text in dropped_reasons:
        parts = reasons.split(text)
        counts[parts[0] if parts else ""] = counts.get(parts[0] if parts else "", 0) + 1
    named = [f"{counts.pop(token)} {words}" for token, words in _SHORT_WHY if token in counts]
    if counts:
        named.append(f"{sum(counts.values())} dropped by the scorer for reasons of its own")
    return f"short list: {ranked} ranked of top_k={top_k}; the other chunks: " + ", ".join(named)


def _ranked_items(chunks: Sequence[Any], cand: Sequence[int], scored: dict[str, Said], sel: Selection,
                  picked: Sequence[int], final: Sequence[int], rel: Sequence[float], layout: str,
                  float_scores: bool) -> tuple[Ranked, ...]:
    """The ranked chunks in their final order (`final`, candidates' places; `picked` in selection
    order): the model's score and reason verbatim, and its own note unless this stage moved the
    chunk (`_diversity_note`)."""
    # Where each one stands by relevance alone (ties in input order): `select` sorted them so.
    rel_at = [0] * len(cand)
    for pos, j in enumerate(sel.by_relevance):
        rel_at[j] = pos
    sel_at = {j: pos for pos, j in enumerate(picked)} if final is not picked else None
    replaced, promoted = sel.replaced, sel.promoted_over
    out = []
    for pos, j in enumerate(final):
        sel_pos = pos if sel_at is None else sel_at[j]
        cid = chunks[cand[j]].id
        said = scored[cid]
        score = float(said["score"]) if float_scores else said["score"]
        if sel_pos == pos and sel_pos <= rel_at[j] and j not in replaced and j not in promoted:
            # none of `_diversity_note`'s cases: the model's words as they are
            out.append(Ranked(cid, score, said["reason"], said.get("diversity_note")))
        else:
            note = _diversity_note(chunks, cand, sel, sel_pos, pos, rel_at[j], j, rel, layout)
            out.append(Ranked(cid, score, said["reason"], note or said.get("diversity_note")))
    return tuple(out)


def _diversity_note(chunks: Sequence[Any], cand: Sequence[int], sel: Selection, sel_pos: int, pos: int,
                    rel_pos: int, local: int, rel: Sequence[float], layout: str) -> str:
    """Why this stage moved a ranked chunk ("" when it did not): it is `sel_pos`-th in the
    selection, `pos`-th in the final layout and `rel_pos`-th by relevance (`local`: its place among
    the candidates `cand`, chunk indices; `rel`: their scores)."""
    notes: list[str] = []
    if local in sel.replaced:
        other = sel.replaced[local]
        gone = f"{chunks[cand[other]].id} (score {_hundredths(rel[other])})"
        notes.append(f"kept as it contains {gone}, dropped as redundant" if local in sel.containing
                     else f"kept as the more concise of near-duplicates; {gone} dropped as redundant")
    if local in sel.promoted_over:
        # This chunk's own numbers first (its score, how close it is to what was already chosen),
        # then the more relevant chunk it went ahead of: several chunks may go ahead of the same
        # one, and each note must still say why *this* chunk got its place.
        skipped, s, src_sel, own, own_src = sel.promoted_over[local]
        via = f" with {chunks[cand[src_sel]].id}" if src_sel >= 0 else ""
        closest = ""
        if own_src >= 0:
            closest = f"; closest chunk above it: {chunks[cand[own_src]].id}, cosine {_hundredths(own)}"
        what = "MMR" if layout != "diversity" else "diversity order"
        notes.append(
            f"{what} placed this at rank {sel_pos + 1} (score {_hundredths(rel[local])}{closest}) "
            f"ahead of {chunks[cand[skipped]].id} (score {_hundredths(rel[skipped])}, "
            f"cosine {_hundredths(s)}{via})"
        )
    if not notes and sel_pos > rel_pos and layout != "lost_in_the_middle":
        notes.append(f"demoted from relevance rank {rel_pos + 1} to {sel_pos + 1} for diversity")
    if layout == "lost_in_the_middle" and pos != sel_pos:
        notes.append(f"lost-in-the-middle layout: selection rank {sel_pos + 1} placed at position {pos + 1}")
    return "; ".join(notes)


def _hundredths(x: float) -> str:
    """`f"{x:.2f}"`: a note's scores and cosines. Formatting a float is the dearest part of a note,
    and the same scores and cosines come back call after call, so each is formatted once and kept
    in `_HUNDREDTHS` (a dict: half the cost of an `lru_cache` hit for a float, whose key is a tuple
    hashed each time); a zero each time, as 0.0 and -0.0 are one key but two texts. The dict is
    emptied when full: forgetting costs only the formatting again."""
    text = _HUNDREDTHS.get(x)
    if text is None:
        text = f"{x:.2f}"
        if x:
            if len(_HUNDREDTHS) >= 4096:
                _HUNDREDTHS.clear()
            _HUNDREDTHS[x] = text
    return text


_HUNDREDTHS: dict[float, str] = {}


def _score_reason(token: str, score: float) -> str:
    """`token: 0.410`: the same few thousand strings come back call after call (scores have three
    decimals), so each is formatted once (`_score_reason_memo`); a zero is formatted each time, as
    0.0 and -0.0 are one key to a memo but two texts."""
    return _score_reason_memo(token, score) if score else reasons.reason(token, reasons.score_detail(score))


@lru_cache(maxsize=4096)
def _score_reason_memo(token: str, score: float) -> str:
    return reasons.reason(token, reasons.score_detail(score))


@lru_cache(maxsize=4096)
def _standing(reason: str) -> str | None:
    """The reason a model gave for a chunk it dropped, as it stands in the result (`_normalised`),
    or None for a `redundant_with:` reason, which holds only if it names a ranked chunk
    (`_unscored_reason`). Memoised as `_normalised` is: one lookup per chunk the model dropped."""
    return None if reasons.redundant_target(reason) is not None else _normalised(reason)


@lru_cache(maxsize=4096)
def _normalised(reason: str) -> str:
    """`reasons.normalise`, memoised: a scorer's reasons for what it dropped repeat (`not_selected:
    0.410`), and parsing one is a regular expression and a few checks."""
    return reasons.normalise(reason)


def _unscored_reason(
    i: int,
    llm: str | None,
    chunks: Sequence[Any],
    index: dict[str, int],
    kept_of: dict[int, int],
    ranked_set: set[int],
    dup_all: np.ndarray,
    sim_all: np.ndarray,
    at: dict[int, int],
) -> str:
    """The LLM's own reason when it still holds; otherwise a duplicate of a ranked chunk, or not
    selected. A chunk the model neither ranked nor dropped says so: a bare `not_selected` reads
    'relevant enough, but top_k and MMR chose others', which nobody judged."""
    if llm is not None and reasons.redundant_target(llm) is None:
        return _normalised(llm)  # the model's own words, filed under a listed token if need be
    if llm is not None:
        target = index.get(reasons.redundant_target(llm))
        if target in ranked_set:
            return llm
        if target is not None and kept_of.get(target) in ranked_set:
            return reasons.redundant_with(chunks[kept_of[target]].id)
    if ranked_set:  # `dup_all` and `sim_all` hold row `at[i]` for chunk i (`postpass`)
        ranked_idx = np.array(sorted(ranked_set))
        ranked_rows = np.array([at[int(j)] for j in ranked_idx], dtype=np.int64)
        same = dup_all[at[i], ranked_rows]
        if same.any():  # a duplicate of a ranked chunk: the closest one
            closest = int(np.argmax(sim_all[at[i], ranked_rows[same]]))
            return reasons.redundant_with(chunks[int(ranked_idx[same][closest])].id)
    return NOT_SELECTED if llm is not None else reasons.reason(NOT_SELECTED, UNSCORED_DETAIL)
