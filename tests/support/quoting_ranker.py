"""A fake-LLM handler whose answers always pass the output guard, for pipeline tests and benches.

Why not `fake_llm.auto_ranker`: its reasons name the query words a chunk shares, which can be a
stopword only ("mentions when") and is then, rightly, rejected by the guard's citation rule, so a
throughput bench would measure re-asks. Here every ranked reason quotes the chunk's own opening
words, and the score falls with the input position: what matters to these callers is that the
answer is contract-valid and deterministic, not that it is a good ranking.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from rag_rerank.text import STOPWORDS

from .fake_llm import RecordedRequest, Reply, ranking_reply

_CHUNKS = re.compile(r"<chunks>(.*?)</chunks>", re.DOTALL)
_TOP_K = re.compile(r"<top_k>(\d+)</top_k>")


def _content(word: str) -> bool:
    letters = "".join(ch for ch in word.casefold() if ch.isalnum())
    return len(letters) >= 4 and letters not in STOPWORDS


def _opening(text: str) -> str:
    """Eight words of the chunk to quote: its opening, or, when the opening is mostly function words
    ("What about me, what about you"), which the guard rightly refuses as citing nothing concrete,
    the first eight words holding two content words. Quotation marks and backslashes left out:
    json.dumps would escape them into a quote the chunk does not hold."""
    words = text.replace('"', " ").replace("\\", " ").split()
    for start in range(max(1, len(words) - 7)):
        if sum(_content(w) for w in words[start:start + 8]) >= 2:
            return " ".join(words[start:start + 8])
    return " ".join(words[:8])


def answer_for(prompt: str) -> dict:
    """A valid output object for a rendered task: the first top_k chunks ranked, the rest dropped."""
    top_k = int(m.group(1)) if (m := _TOP_K.search(prompt)) else 5
    body = m.group(1) if (m := _CHUNKS.search(prompt)) else ""
    records = [json.loads(line) for line in body.split("\n") if line.strip()]
    ranked, dropped = [], []
    for i, rec in enumerate(records):
        if i < top_k:
            words = _opening(rec["text"])
            ranked.append(
                {
                    "id": rec["id"],
                    "score": round(0.95 - 0.7 * i / max(1, len(records)), 3),
                    "reason": f"opens with {json.dumps(words, ensure_ascii=False)}",
                }
            )
        else:
            dropped.append({"id": rec["id"], "reason": "outside top_k"})
    return {"ranked": ranked, "dropped": dropped}


def quoting_ranker(latency: float = 0.0) -> Callable[[RecordedRequest], Reply]:
    """A FakeLLM handler answering OpenAI or Anthropic requests with `answer_for` after `latency` s."""

    def handle(req: RecordedRequest) -> Reply:
        return ranking_reply(req, answer_for(req.prompt), latency)

    return handle
