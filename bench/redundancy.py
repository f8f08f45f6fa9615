"""Redundancy: does the post-pass merge only the same fact, and catch a fact restated in other words?

Judged data (golden/redundancy/, written by hand before any algorithm saw it; see its README):
pairs labelled redundant (copy, near-copy, restatement, containment) or distinct (template,
number, negation, aspect, topic), and sets of same-topic chunks labelled by claim. Development
files tune `rag_rerank.redundancy.RULES`; held-out files (other domains) are only reported.

    python bench/redundancy.py --fit        # the tau grid on the development data, and the choice
    python bench/redundancy.py              # dev and held-out figures, both embedder families,
                                            # clough-stevenson, top-5 claims on the sets, DL19
    python bench/redundancy.py --skip-dl19  # without the (slow) DL19 part

"Before" is the rule this replaced: lexical cosine at or above 0.49 (still what an explicit
`duplicate_threshold=0.49` does). Exits 1, saying so on stdout, if any call failed.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from duplicates import load_corpus  # noqa: E402

from rag_rerank import Reranker  # noqa: E402
from rag_rerank.embed import embed_texts, get_embedder  # noqa: E402
from rag_rerank.redundancy import RULES, Rules, judge, read  # noqa: E402
from tests.support.shared_data import data_dir  # noqa: E402

GOLDEN = ROOT / "golden" / "redundancy"
FAMILIES = {"lexical (default)": "static", "sentence-transformers": "sentence-transformers"}
DISTINCT = ("template", "number", "negation", "aspect", "topic")
OLD_THRESHOLD = 0.49
FAILED: list[str] = []

Pair = tuple[str, str, bool, str]  # a, b, redundant, kind


def pairs(split: str) -> list[Pair]:
    out = []
    for line in (GOLDEN / f"pairs-{split}.jsonl").read_text(encoding="utf-8").splitlines():
        p = json.loads(line)
        out.append((p["a"], p["b"], bool(p["redundant"]), p["kind"]))
    return out


def sets(split: str) -> list[dict[str, Any]]:
    text = (GOLDEN / f"sets-{split}.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def set_pairs(split: str) -> list[Pair]:
    out: list[Pair] = []
    for s in sets(split):
        chunks = [c for c in s["chunks"] if c.get("relevant", True)]
        out += [(a["text"], b["text"], a["claim"] == b["claim"], "set")
                for a, b in itertools.combinations(chunks, 2)]
    return out


def cosines(family: str, data: Sequence[Pair]) -> np.ndarray:
    emb = get_embedder(family)
    a = embed_texts(emb, [p[0] for p in data]).astype(np.float64)
    b = embed_texts(emb, [p[1] for p in data]).astype(np.float64)
    return np.einsum("ij,ij->i", a, b)


def verdicts(data: Sequence[Pair], semantic: np.ndarray, rules: Rules) -> list[bool]:
    lexical = cosines("lexical", data)
    return [judge(read(a), read(b), float(s), rules, float(lex)).redundant
            for (a, b, _, _), s, lex in zip(data, semantic, lexical, strict=True)]


def rates(data: Sequence[Pair], said: Sequence[bool]) -> dict[str, Any]:
    by_kind: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for (_, _, redundant, kind), v in zip(data, said, strict=True):
        by_kind[kind][0] += int(v == redundant)
        by_kind[kind][1] += 1
    distinct = [(v, r) for (_, _, r, _), v in zip(data, said, strict=True) if not r]
    merged = sum(1 for v, _ in distinct if v)
    return {"by_kind": dict(by_kind), "merged": merged, "distinct": len(distinct),
            "caught": sum(1 for (_, _, r, _), v in zip(data, said, strict=True) if r and v),
            "redundant": sum(1 for p in data if p[2])}


def old_rule(data: Sequence[Pair]) -> list[bool]:
    return [bool(c >= OLD_THRESHOLD) for c in cosines("lexical", data)]


def fit() -> None:
    dev, dev_sets = pairs("dev"), set_pairs("dev")
    print("| family | tau | dev pairs: distinct merged | restatements caught | dev sets: distinct merged "
          "| same claim caught |")
    print("|---|---:|---:|---:|---:|---:|")
    for family in ("static", "sentence-transformers"):
        sp, ss = cosines(family, dev), cosines(family, dev_sets)
        chosen = None
        for tau in np.round(np.arange(0.60, 0.92, 0.02), 2):
            rules = Rules(tau=float(tau))
            a, b = rates(dev, verdicts(dev, sp, rules)), rates(dev_sets, verdicts(dev_sets, ss, rules))
            rest = a["by_kind"]["restatement"]
            ok = a["merged"] / a["distinct"] <= 0.04 and b["merged"] / b["distinct"] <= 0.005
            if ok and chosen is None:
                chosen = float(tau)
            mark = " <- chosen" if chosen == tau else ""
            print(f"| {family} | {tau:.2f} | {a['merged']}/{a['distinct']} | {rest[0]}/{rest[1]} | "
                  f"{b['merged']}/{b['distinct']} | {b['caught']}/{b['redundant']} |{mark}")
        print(f"\n{family}: the lowest tau with at most 1 in 25 distinct pairs and 1 in 200 same-topic set "
              f"pairs of distinct claims merged: {chosen} (shipped: {RULES[family].tau})\n")


def report_pairs() -> None:
    for split in ("dev", "heldout"):
        data, sdata = pairs(split), set_pairs(split)
        kinds = sorted({p[3] for p in data})
        print(f"\n#### {split} pairs ({len(data)}) and same-topic set pairs ({len(sdata)})\n")
        print("| rule | " + " | ".join(kinds) + " | distinct merged | restatements caught | copies routed | "
              "set pairs: distinct merged | same claim caught |")
        print("|---|" + "---:|" * (len(kinds) + 5))
        rows = [("before: lexical cosine >= 0.49", old_rule(data), old_rule(sdata))]
        for label, family in FAMILIES.items():
            rules = RULES[family]
            rows.append((f"{label} (tau {rules.tau})", verdicts(data, cosines(family, data), rules),
                         verdicts(sdata, cosines(family, sdata), rules)))
        for label, said, ssaid in rows:
            r, s = rates(data, said), rates(sdata, ssaid)
            cells = [f"{r['by_kind'][k][0]}/{r['by_kind'][k][1]}" for k in kinds]
            rest = r["by_kind"]["restatement"]
            copies = [r["by_kind"][k] for k in ("copy", "near-copy")]
            print(f"| {label} | " + " | ".join(cells) + f" | {r['merged']}/{r['distinct']} "
                  f"({r['merged'] / r['distinct']:.1%}) | {rest[0]}/{rest[1]} ({rest[0] / rest[1]:.0%}) | "
                  f"{sum(c[0] for c in copies)}/{sum(c[1] for c in copies)} | {s['merged']}/{s['distinct']} "
                  f"({s['merged'] / s['distinct']:.1%}) | {s['caught']}/{s['redundant']} |")


def report_clough() -> None:
    tasks = load_corpus(data_dir() / "clough-stevenson")
    print("\n#### clough-stevenson: each answer against its source, judged redundant\n")
    print("| rule | cut | light | heavy | non |")
    print("|---|---:|---:|---:|---:|")
    data = [(text, items[0][2], cat != "non", cat) for items in tasks.values() for _, cat, text in items[1:]]
    rows = [("before: lexical cosine >= 0.49", old_rule(data))]
    for label, family in FAMILIES.items():
        rows.append((label, verdicts(data, cosines(family, data), RULES[family])))
    for label, said in rows:
        cells = []
        for cat in ("cut", "light", "heavy", "non"):
            got = [v for (_, _, _, c), v in zip(data, said, strict=True) if c == cat]
            cells.append(f"{sum(got)}/{len(got)}")
        print(f"| {label} | " + " | ".join(cells) + " |")


def _same_claim_pairs(ranked: Sequence[str], claim_of: dict[str, Any]) -> int:
    claims = [claim_of[i] for i in ranked if claim_of.get(i)]
    return sum(n * (n - 1) // 2 for n in collections.Counter(claims).values())


def report_top5() -> None:
    print("\n#### top 5 of the default pipeline on the sets: pairs of one claim among the five kept\n")
    print("| split | embedder | before (duplicate_threshold 0.49) | after (default) "
          "| distinct claims in the top 5, before / after |")
    print("|---|---|---:|---:|---:|")
    for split in ("dev", "heldout"):
        for label, spec in (("lexical", "lexical"), ("sentence-transformers", "sentence-transformers")):
            before = after = claims_b = claims_a = 0
            with Reranker(embedder=spec) as reranker:
                for s in sets(split):
                    chunks = [{"id": c["id"], "text": c["text"]} for c in s["chunks"]]
                    claim_of = {c["id"]: c["claim"] for c in s["chunks"]}
                    try:
                        old = reranker.rerank(s["query"], chunks, 5, duplicate_threshold=OLD_THRESHOLD).ids
                        new = reranker.rerank(s["query"], chunks, 5).ids
                    except Exception as exc:  # a failed call fails the bench
                        FAILED.append(f"{split} {s['set_id']}: {type(exc).__name__}: {exc}")
                        continue
                    before += _same_claim_pairs(old, claim_of)
                    after += _same_claim_pairs(new, claim_of)
                    claims_b += len({claim_of[i] for i in old if claim_of.get(i)})
                    claims_a += len({claim_of[i] for i in new if claim_of.get(i)})
            print(f"| {split} | {label} | {before} | {after} | {claims_b} / {claims_a} |")


def report_dl19(sample: int) -> None:
    from quality import build_dl19  # the same candidates file bench/quality.py writes

    from rag_rerank.evaluate import evaluate

    path = data_dir() / "trec-dl19"
    candidates, qrels = build_dl19()
    print("\n#### TREC DL19 at the defaults (local backend, depth 50, top 10)\n")
    print("| rule | nDCG@10 | novelty-nDCG@10 |")
    print("|---|---:|---:|")
    for label, extra in (("before (duplicate_threshold 0.49)", {"duplicate_threshold": OLD_THRESHOLD}),
                         ("after (default)", {})):
        report = evaluate(candidates, qrels, k=10, rel_level=2, **extra)
        if report.failed:
            FAILED.extend(f"DL19 {q}: {m}" for q, m in report.failed.items())
        print(f"| {label} | {report.reranked['nDCG@10']:.4f} | {report.reranked['novelty-nDCG@10']:.4f} |")
    data = json.loads((path / "bm25-top100.json").read_text(encoding="utf-8"))
    rng = random.Random(7)
    found: list[tuple[str, str, str]] = []
    with Reranker() as reranker:
        for q in data:
            chunks = [{"id": str(h["docid"]), "text": h["content"]} for h in q["hits"][:50]]
            text = {c["id"]: c["text"] for c in chunks}
            result = reranker.rerank(q["query"], chunks, 10)
            for d in result.dropped:
                if d.reason.startswith("redundant_with:"):
                    found.append((q["query"], text[d.id], text[d.reason.split(":", 1)[1]]))
    shown = min(sample, len(found))
    print(f"\n{len(found)} redundant_with pairs over the 43 queries; a random sample of {shown} to read "
          "(dropped | kept):\n")
    for query, dropped, kept in rng.sample(found, shown):
        print(f"- [{query}] {dropped[:160]!r} | {kept[:160]!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="print the tau grid on the development data")
    ap.add_argument("--skip-dl19", action="store_true")
    ap.add_argument("--sample", type=int, default=20, help="DL19 redundant_with pairs to print")
    args = ap.parse_args()
    if args.fit:
        fit()
        return 0
    report_pairs()
    report_clough()
    report_top5()
    if not args.skip_dl19:
        report_dl19(args.sample)
    if FAILED:
        print(f"\nFAILED: {len(FAILED)} call(s) raised; first: {FAILED[0]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
