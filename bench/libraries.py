"""Our hand-written pieces against the well-kept library that does the same job, measured.

Issue 31 asked, for each place where a library exists, to use it or to state the measured reason
not to. Each section prints what decides it: agreement with the library on our data (exactness),
the time per call on our sizes, the import time, and the installed size of the library with what
it pulls in. The decisions and their figures are in each module's docstring (`ranks.py`,
`calibration_map.py`, `logistic.py`, `backends/terms.py`, `embed/static.py`, `cache.py`).

    python bench/libraries.py [--data PATH] [--repeat 5]

Ours against the library, on what data:

- `ranks.kendall_tau` / `scipy.stats.kendalltau`: 2,000 seeded pairs of 20 / 50 scores with ties;
- `calibration_map.pav`, `fit_platt` / `sklearn.isotonic.IsotonicRegression`, `LogisticRegression`:
  squashed scores of 40 queries x 25 chunks, fitted on half, measured on the rest, 10 seeds;
- `logistic.fit_kernel_logistic` / `sklearn.linear_model.LogisticRegression` (same C and sample
  weights): the router's own fits, one per packaged card;
- `backends.terms.lexical_scores` / `bm25s.BM25` (lucene idf, same k1 and b, given our stems):
  TREC DL19 queries with their top 20 / 50 passages;
- `embed.static.token_ids` / `tokenizers` WordPiece (BERT normaliser and pre-tokeniser, the
  table's vocabulary): the distinct DL19 passages;
- `cache.ResponseCache` / `diskcache.Cache` (least-recently-used eviction): 2,000 answers of 2 KB.

A library that is not installed is named and its section skipped: scipy, scikit-learn and
tokenizers come with the `st` / `cross-encoder` extras, bm25s with `eval`; diskcache is in no
extra (`pip install diskcache` to measure it). Timings are medians over `--repeat` runs on a
shared machine: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rag_rerank import calibration_map, ranks  # noqa: E402
from tests.support.shared_data import data_dir, need  # noqa: E402

DEFAULT_DATA = data_dir() / "trec-dl19" / "bm25-top100.json"


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """Median seconds of `fn()` over `repeat` runs."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def installed_kb(*dists: str) -> str:
    """The installed size of these distributions (their RECORD), in MB, or why not."""
    total = 0
    for name in dists:
        try:
            total += sum(f.size or 0 for f in importlib.metadata.distribution(name).files or [])
        except importlib.metadata.PackageNotFoundError:
            return f"{name} not installed"
    return f"{total / 1e6:.1f} MB ({' + '.join(dists)})"


def import_ms(module: str) -> str:
    """Milliseconds to import `module` in a fresh interpreter (numpy already imported, as in ours)."""
    code = ("import time, numpy; t = time.perf_counter(); import " + module +
            "; print((time.perf_counter() - t) * 1000)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return f"{float(out.stdout):.0f} ms" if out.returncode == 0 else "not importable"


def available(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        print(f"  {module} is not installed: section skipped\n")
        return False
    return True


# --------------------------------------------------------------------------- Kendall tau


def kendall(repeat: int) -> None:
    print("## Kendall tau-b: ranks.kendall_tau vs scipy.stats.kendalltau")
    if not available("scipy"):
        return
    from scipy.stats import kendalltau

    rng = np.random.default_rng(0)
    worst = 0.0
    for n in (20, 50):
        pairs = [(np.round(rng.uniform(size=n), 1), np.round(rng.uniform(size=n), 1)) for _ in range(1000)]
        for x, y in pairs:
            worst = max(worst, abs(ranks.kendall_tau(x, y) - kendalltau(x, y).statistic))
        x, y = pairs[0]
        ours = timed(lambda x=x, y=y: [ranks.kendall_tau(x, y) for _ in range(200)], repeat) / 200
        theirs = timed(lambda x=x, y=y: [kendalltau(x, y) for _ in range(200)], repeat) / 200
        print(f"  n={n}: ours {ours * 1e6:.0f} us, scipy {theirs * 1e6:.0f} us per call")
    print(f"  largest |difference| over 2,000 pairs with ties: {worst:.1e}")
    print(f"  import scipy.stats: {import_ms('scipy.stats')}; installed: {installed_kb('scipy')}\n")


# --------------------------------------------------------------------------- calibration


def squashed(seed: int, queries: int = 40, per_query: int = 25) -> tuple[np.ndarray, np.ndarray]:
    """Raw scores squashed into [0.6, 0.9] whose true probability is the unsquashed score
    (the calibration tests' synthetic judge)."""
    rng = np.random.default_rng(seed)
    truth = rng.uniform(size=queries * per_query)
    return 0.6 + 0.3 * truth, (rng.uniform(size=truth.size) < truth).astype(float)


def calibration(repeat: int) -> None:
    print("## Isotonic and Platt fits: calibration_map.pav / fit_platt vs scikit-learn")
    if not available("sklearn"):
        return
    from sklearn.isotonic import IsotonicRegression
    from sklearn.linear_model import LogisticRegression

    iso_gap, platt_gap = [], []
    briers: dict[str, list[float]] = {"ours isotonic": [], "sklearn isotonic": [], "ours platt": [],
                                      "sklearn logistic": []}
    for seed in range(10):
        x, y = squashed(seed)
        half = len(x) // 2
        fx, fy, tx, ty = x[:half], y[:half], x[half:], y[half:]
        ours_iso = calibration_map.apply(calibration_map.fit(fx, fy, "isotonic"), tx)
        sk_iso = IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1).fit(fx, fy).predict(tx)
        iso_gap.append(float(np.abs(ours_iso - sk_iso).max()))
        ours_platt = calibration_map.apply(calibration_map.fit(fx, fy, "platt"), tx)
        sk_platt = LogisticRegression(C=np.inf).fit(fx[:, None], fy).predict_proba(tx[:, None])[:, 1]
        platt_gap.append(float(np.abs(ours_platt - sk_platt).max()))
        for name, p in (("ours isotonic", ours_iso), ("sklearn isotonic", sk_iso), ("ours platt", ours_platt),
                        ("sklearn logistic", sk_platt)):
            briers[name].append(calibration_map.brier(p, ty))
    x, y = squashed(0)
    t_iso = timed(lambda: calibration_map.pav(x, y), repeat)
    t_sk_iso = timed(lambda: IsotonicRegression(out_of_bounds="clip").fit(x, y), repeat)
    t_platt = timed(lambda: calibration_map.fit_platt(x, y), repeat)
    t_sk = timed(lambda: LogisticRegression(C=np.inf).fit(x[:, None], y), repeat)
    print(f"  isotonic: largest |difference| of held-out predictions over 10 seeds {max(iso_gap):.3f} "
          f"(median {statistics.median(iso_gap):.3f}); fit of 1,000 scores: ours {t_iso * 1e3:.2f} ms, "
          f"sklearn {t_sk_iso * 1e3:.2f} ms")
    print(f"  platt: largest |difference| {max(platt_gap):.3f} (ours fits Platt's smoothed targets, "
          f"sklearn the 0/1 labels); fit: ours {t_platt * 1e3:.2f} ms, sklearn {t_sk * 1e3:.2f} ms")
    print("  held-out Brier, mean over 10 seeds: " + ", ".join(
        f"{name} {statistics.mean(v):.5f}" for name, v in briers.items()))
    modules = "sklearn.isotonic, sklearn.linear_model"
    print(f"  import {modules}: {import_ms(modules)}; "
          f"installed: {installed_kb('scikit-learn', 'scipy', 'joblib', 'threadpoolctl', 'narwhals')}\n")


# --------------------------------------------------------------------------- the router's classifier


def classifier(repeat: int) -> None:
    print("## The router's logistic regression: logistic.fit_kernel_logistic vs sklearn LogisticRegression")
    if not available("sklearn"):
        return
    from scipy.sparse import csr_matrix
    from sklearn.linear_model import LogisticRegression

    from rag_rerank import logistic, router

    fits: list[dict[str, Any]] = []
    real_gram, real_fit = router.sparse_gram, router.fit_kernel_logistic

    def gram(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n: int) -> np.ndarray:
        fits.append({"rows": rows, "cols": cols, "vals": vals, "n": n})
        return real_gram(rows, cols, vals, n)

    def fit(g: np.ndarray, y: np.ndarray, w: np.ndarray, *, lam: float) -> tuple[np.ndarray, float]:
        fits[-1].update(gram=g, y=y, w=w, lam=lam)
        return real_fit(g, y, w, lam=lam)

    router.sparse_gram, router.fit_kernel_logistic = gram, fit  # record the fits the router makes
    try:
        router.Router(embedder="lexical")
    finally:
        router.sparse_gram, router.fit_kernel_logistic = real_gram, real_fit
    gaps, ours_t, sk_t, flips = [], 0.0, 0.0, 0
    for f in fits:
        x = csr_matrix((f["vals"], (f["rows"], f["cols"])), shape=(f["n"], int(f["cols"].max()) + 1))
        alpha, bias = logistic.fit_kernel_logistic(f["gram"], f["y"], f["w"], lam=f["lam"])
        ours = 1 / (1 + np.exp(-(f["gram"] @ alpha + bias)))
        model = LogisticRegression(C=1 / f["lam"], tol=1e-12, max_iter=10_000)
        sk = model.fit(x, f["y"], sample_weight=f["w"]).predict_proba(x)[:, 1]
        gaps.append(float(np.abs(ours - sk).max()))
        flips += int(((ours >= 0.5) != (sk >= 0.5)).sum())
        def ours_fit(f: dict[str, Any] = f) -> None:
            g = logistic.sparse_gram(f["rows"], f["cols"], f["vals"], f["n"])
            logistic.fit_kernel_logistic(g, f["y"], f["w"], lam=f["lam"])

        def sk_fit(f: dict[str, Any] = f, x: Any = x) -> None:
            LogisticRegression(C=1 / f["lam"]).fit(x, f["y"], sample_weight=f["w"])

        ours_t += timed(ours_fit, repeat)
        sk_t += timed(sk_fit, repeat)
    sizes = ", ".join(f"{f['n']} examples x {int(f['cols'].max()) + 1} features" for f in fits)
    print(f"  {len(fits)} fits ({sizes})")
    print(f"  largest |difference| of a training example's probability: {max(gaps):.1e}; decisions at 0.5 "
          f"that differ: {flips}")
    print(f"  time for all fits: ours {ours_t * 1e3:.0f} ms, sklearn (default tol) {sk_t * 1e3:.0f} ms\n")


# --------------------------------------------------------------------------- BM25


def dl19(path: Path, depth: int) -> list[tuple[str, list[str]]]:
    data = json.loads(need(path).read_text(encoding="utf-8"))
    return [(q["query"], [h["content"] for h in q["hits"][:depth]]) for q in data]


def bm25(path: Path, repeat: int) -> None:
    print("## BM25 over a candidate set: backends.terms.lexical_scores vs bm25s")
    if not available("bm25s"):
        return
    import bm25s

    from rag_rerank.backends import terms

    plain = terms.Bm25(stopword_weight=1.0)  # bm25s weighs every term alike
    for depth in (20, 50):
        sets = dl19(path, depth)
        worst, same_order, clipped = 0.0, 0, 0
        for query, texts in sets:
            scores, qterms, weights, _ = terms.lexical_scores(query, texts, plain)
            ours = scores * weights.sum()  # undo the [0, 1] normalisation: raw BM25
            docs = [[terms.stem(w) for w in terms.words(t)] for t in texts]
            index = bm25s.BM25(k1=plain.k1, b=plain.b, method="lucene")
            index.index(docs, show_progress=False)
            # bm25s leaves out Lucene's constant (k1 + 1) factor of the term frequency part
            theirs = _bm25s_scores(index, qterms, len(texts)) * (plain.k1 + 1.0)
            kept = scores < 1.0  # ours clips at 1 (a chunk above the ideal one): compare the rest
            worst = max(worst, float(np.abs(ours - theirs)[kept].max(initial=0.0)))
            clipped += int((~kept).sum())
            same_order += list(np.argsort(-ours[kept], kind="stable")) == list(
                np.argsort(-theirs[kept], kind="stable"))

        def run_ours(sets: list[tuple[str, list[str]]] = sets) -> None:
            for query, texts in sets:
                terms.lexical_scores(query, texts)

        def run_bm25s(sets: list[tuple[str, list[str]]] = sets) -> None:
            for query, texts in sets:
                index = bm25s.BM25(method="lucene")
                index.index([[terms.stem(w) for w in terms.words(t)] for t in texts], show_progress=False)
                _bm25s_scores(index, terms.query_terms(query)[0], len(texts))

        ours_t, theirs_t = timed(run_ours, repeat) / len(sets), timed(run_bm25s, repeat) / len(sets)
        print(f"  top {depth}: {len(sets)} queries; on the chunks ours does not clip at the ideal score "
              f"({clipped} of {len(sets) * depth} are), largest |raw score difference| {worst:.1e}, same "
              f"order on {same_order}/{len(sets)} queries")
        print(f"    per query: ours {ours_t * 1e3:.2f} ms (memoised reading), bm25s {theirs_t * 1e3:.2f} ms "
              "(index + score, given our stems)")
    print(f"  import bm25s: {import_ms('bm25s')}; installed: {installed_kb('bm25s')}\n")


def _bm25s_scores(index: Any, query_terms: list[str], n: int) -> np.ndarray:
    """bm25s's score of every document for these query terms (those no document holds add 0)."""
    known = [t for t in query_terms if t in index.vocab_dict]
    return np.asarray(index.get_scores(known), dtype=np.float64) if known else np.zeros(n)


# --------------------------------------------------------------------------- WordPiece


def wordpiece(path: Path, repeat: int) -> None:
    print("## WordPiece: embed.static.token_ids vs tokenizers (the table's vocabulary)")
    if not available("tokenizers"):
        return
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from rag_rerank.embed import static

    with np.load(static.TABLE, allow_pickle=False) as table:
        vocab = {str(t): i for i, t in enumerate(table["vocab"])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    unk = vocab["[UNK]"]
    texts = list(dict.fromkeys(t for _, ts in dl19(path, 100) for t in ts))
    start = time.perf_counter()
    ours = [static.token_ids(t) for t in texts]  # first sight: the per-word memo is empty
    first = time.perf_counter() - start
    warm = timed(lambda: [static.token_ids(t) for t in texts], repeat)
    theirs = [[i for i in e.ids if i != unk][: static.MAX_TOKENS]
              for e in tok.encode_batch(texts, add_special_tokens=False)]
    one = timed(lambda: [tok.encode(t, add_special_tokens=False) for t in texts], repeat)
    batch = timed(lambda: tok.encode_batch(texts, add_special_tokens=False), repeat)
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    n = len(texts)
    print(f"  {n} DL19 passages: identical ids for {same}/{n}")
    print(f"  per passage: ours {first / n * 1e6:.0f} us first sight, {warm / n * 1e6:.0f} us seen before; "
          f"tokenizers {one / n * 1e6:.0f} us one by one, {batch / n * 1e6:.0f} us in a batch (its threads)")
    print(f"  import tokenizers: {import_ms('tokenizers')}; installed: "
          f"{installed_kb('tokenizers', 'huggingface-hub')}\n")


# --------------------------------------------------------------------------- the response cache


def cache(repeat: int) -> None:
    print("## The response cache: cache.ResponseCache vs diskcache.Cache")
    if not available("diskcache"):
        return
    import diskcache

    from rag_rerank.cache import Entry, ResponseCache

    n = 2000
    rng = np.random.default_rng(0)
    keys = [f"{rng.integers(1 << 62):016x}" * 4 for _ in range(n)]
    entry = Entry(json.dumps({"ranked": [{"id": "c1", "score": 0.9, "reason": "x" * 1800}], "dropped": []}),
                  {"prompt_tokens": 900, "completion_tokens": 120}, "m")

    def ours(folder: str) -> tuple[float, float]:
        with ResponseCache(folder) as c:
            put = timed_once(lambda: [c.put(k, entry) for k in keys])
            get = timed_once(lambda: [c.get(k) for k in keys])
        return put, get

    def theirs(folder: str) -> tuple[float, float]:
        with diskcache.Cache(folder, eviction_policy="least-recently-used", size_limit=256 * 2**20) as c:
            put = timed_once(lambda: [c.set(k, entry.dumps()) for k in keys])
            get = timed_once(lambda: [c.get(k) for k in keys])
        return put, get

    for name, fn in (("ours", ours), ("diskcache", theirs)):
        runs = []
        for _ in range(repeat):
            with tempfile.TemporaryDirectory() as folder:
                runs.append(fn(folder))
        put, get = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        print(f"  {name}: put {put / n * 1e6:.0f} us, get {get / n * 1e6:.0f} us per answer ({n} answers)")
    print(f"  import diskcache: {import_ms('diskcache')}; installed: {installed_kb('diskcache')}\n")


def timed_once(fn: Callable[[], Iterable[Any]]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="DL19 bm25-top100.json")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} (a shared machine: timings are noisy)\n")
    kendall(args.repeat)
    calibration(args.repeat)
    classifier(args.repeat)
    bm25(args.data, args.repeat)
    wordpiece(args.data, args.repeat)
    cache(args.repeat)
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
