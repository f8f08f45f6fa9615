"""The contract every final result must keep, as one checker shared by the property tests and the
real-text sweep.

Why a list of violations instead of asserts: the sweep runs hundreds of calls and must report
every failing one in a single assertion message, and a property test's failure message should
name every broken promise of the shrunk example, not only the first.

The promises (docs/contract.md, DESIGN.md "Contract"):

* every ranked / dropped id is, byte for byte, an input id, and every input id appears exactly
  once in ranked ∪ dropped;
* len(ranked) <= top_k;
* every ranked score is a finite number in [0, 1] and strictly above the minimum score in force;
* no two ranked chunks are near-duplicates, and a dropped `redundant_with:<id>` names a ranked id;
* with a scored backend (`scored=True`: the local one), no short list while a chunk waits: fewer
  than top_k ranked only when no chunk is left `not_selected` (every other one is redundant with a
  ranked one, at or below the minimum score, or has nothing to quote), i.e. len(ranked) ==
  min(top_k, the chunks above the minimum score that are neither redundant nor unquotable).

"Near-duplicate" is judged two ways. Independently of the library: two texts with the same words
after NFKC and case folding are copies of one fact whatever their spacing, punctuation or Unicode
form. And by the library's own judgement (`rag_rerank.redundancy`, with the embedder family's
sentence vectors): the post-pass must never rank two chunks it judges redundant, whatever the
order in which it met them.
"""

from __future__ import annotations

import itertools
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from rag_rerank.models import RerankResult

REDUNDANT = "redundant_with:"
TOLERANCE = 1e-9  # float noise allowed when a score is read back from a framework's copy
_WORD = re.compile(r"\w+")

Chunk = Mapping[str, Any]


def entries(result: RerankResult | Mapping[str, Any]) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
    """(ranked (id, score) pairs, dropped (id, reason) pairs) of a `RerankResult` or of its
    `to_dict()` form (what `call_tool` returns), so every surface is checked by one function."""
    if isinstance(result, RerankResult):
        return [(r.id, r.score) for r in result.ranked], [(d.id, d.reason) for d in result.dropped]
    ranked = [(r.get("id"), r.get("score")) for r in result.get("ranked", [])]
    dropped = [(d.get("id"), d.get("reason")) for d in result.get("dropped", [])]
    return ranked, dropped


def fingerprint(text: str) -> str:
    """A text's words after NFKC and case folding: equal fingerprints mean the same words in the
    same order, i.e. a copy, whatever the spacing, punctuation, case or Unicode form."""
    return " ".join(_WORD.findall(unicodedata.normalize("NFKC", text).casefold()))


def _redundant_pairs(texts: Sequence[str], family: str) -> list[tuple[int, int]]:
    """Pairs (i, j) of `texts` the library's redundancy judgement calls redundant."""
    import numpy as np

    from rag_rerank.embed import embed_texts, get_embedder
    from rag_rerank.redundancy import redundancy, rules_for

    if len(texts) < 2:
        return []
    vectors = np.asarray(embed_texts(get_embedder(family), list(texts)), dtype=np.float64)
    lexical = np.asarray(embed_texts(get_embedder("lexical"), list(texts)), dtype=np.float64)
    redundant, _ = redundancy(list(texts), vectors @ vectors.T, rules_for(family), lexical @ lexical.T)
    return [(i, j) for i, j in itertools.combinations(range(len(texts)), 2) if redundant[i, j]]


def violations(result: RerankResult | Mapping[str, Any], chunks: Sequence[Chunk], top_k: int,
               min_score: float = 0.2, family: str = "static", scored: bool = False) -> list[str]:
    """Every way `result` breaks the contract for these input `chunks` ({"id", "text"} records);
    `family` is the embedder family whose sentence vectors the redundancy judgement read ("static"
    for the default lexical embedder, "sentence-transformers"); `scored` when a scored backend
    answered (it scored every chunk: a short list must have nothing left to add)."""
    out: list[str] = []
    ranked, dropped = entries(result)
    inputs = [c["id"] for c in chunks]
    text_of = {c["id"]: c["text"] for c in chunks}
    known = set(inputs)
    seen = [cid for cid, _ in ranked] + [cid for cid, _ in dropped]
    for cid in seen:
        if not isinstance(cid, str) or cid not in known:
            out.append(f"id {cid!a} is not, byte for byte, an input id")
    counts = Counter(c for c in seen if isinstance(c, str))
    missing = [c for c in inputs if counts[c] == 0]
    twice = sorted(c for c, n in counts.items() if n > 1)
    if missing:
        out.append(f"input ids missing from ranked and dropped: {missing[:5]!a}"
                   + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    if twice:
        out.append(f"ids appearing more than once: {twice[:5]!a}")
    if len(ranked) > top_k:
        out.append(f"{len(ranked)} ranked, more than top_k={top_k}")
    for cid, score in ranked:
        ok_type = isinstance(score, (int, float)) and not isinstance(score, bool)
        if not ok_type or not math.isfinite(score) or not 0.0 <= score <= 1.0:
            out.append(f"ranked {cid!a}: score {score!r} is not a finite number in [0, 1]")
        elif not score > min_score:
            out.append(f"ranked {cid!a}: score {score!r} is not above the minimum score {min_score!r}")
    ranked_ids = {cid for cid, _ in ranked}
    for cid, reason in dropped:
        if not isinstance(reason, str) or not reason.strip():
            out.append(f"dropped {cid!a}: reason {reason!r} is not a non-empty string")
        elif reason.startswith(REDUNDANT) and reason[len(REDUNDANT):] not in ranked_ids:
            out.append(f"dropped {cid!a}: {reason!a} does not name a ranked id")
    if scored and len(ranked) < top_k:
        waiting = [cid for cid, reason in dropped if isinstance(reason, str)
                   and reason.split(":", 1)[0] in ("not_selected", "not_in_final")]
        if waiting:
            out.append(f"{len(ranked)} ranked of top_k={top_k} while {len(waiting)} scored chunk(s) wait "
                       f"(not_selected), e.g. {waiting[:3]!a}")
    kept = [cid for cid, _ in ranked if cid in text_of]
    prints: dict[str, str] = {}
    for cid in kept:
        fp = fingerprint(text_of[cid])
        if fp and fp in prints:
            out.append(f"ranked {prints[fp]!a} and {cid!a} are copies (same words: {fp[:60]!a})")
        prints.setdefault(fp, cid)
    for i, j in _redundant_pairs([text_of[c] for c in kept], family):
        out.append(f"ranked {kept[i]!a} and {kept[j]!a} are redundant (rag_rerank.redundancy)")
    return out


def assert_contract(result: RerankResult | Mapping[str, Any], chunks: Sequence[Chunk], top_k: int,
                    min_score: float = 0.2) -> None:
    """Fail with every broken promise at once (see `violations`)."""
    problems = violations(result, chunks, top_k, min_score)
    assert not problems, "contract broken:\n  " + "\n  ".join(problems)
