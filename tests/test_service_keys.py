"""Bearer keys and the per-key daily ledger (`rag_rerank.service.keys`), shared through SQLite."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from rag_rerank.cost import Budget
from rag_rerank.service.config import ApiKey, KeyBudget
from rag_rerank.service.keys import Ledger, Usage, authenticate, bearer_token


def _key(secret: str, **budget: int) -> ApiKey:
    spend = {k: v for k, v in budget.items() if k != "max_requests"}
    return ApiKey(
        hashlib.sha256(secret.encode()).digest(),
        secret,
        KeyBudget(budget.get("max_requests"), Budget(**spend) if spend else None),
    )


def test_authenticate_compares_digests() -> None:
    keys = [_key("a"), _key("b")]
    assert (
        authenticate(keys, "b") is keys[1]
        and authenticate(keys, "c") is None
        and authenticate(keys, None) is None
    )
    assert (
        bearer_token("Bearer  tok ") == "tok"
        and bearer_token("Basic tok") is None
        and bearer_token(None) is None
    )


def test_two_ledgers_on_one_file_share_a_limit(tmp_path: Path) -> None:
    """Two workers (two connections) reserving at once cannot both pass a limit that leaves room for one."""
    key = _key("k", max_tokens=100)
    ledgers = [Ledger(tmp_path / "l.sqlite3"), Ledger(tmp_path / "l.sqlite3")]
    outcomes: list[str | None] = []

    def reserve(ledger: Ledger) -> None:
        outcomes.append(ledger.reserve(key, Usage(calls=1, tokens=60), day="2026-01-01"))

    threads = [threading.Thread(target=reserve, args=(ledger,)) for ledger in ledgers for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sum(o is None for o in outcomes) == 1 and all("max_tokens=100" in o for o in outcomes if o)
    ledgers[0].settle(key, Usage(calls=1, tokens=60), Usage(calls=1, tokens=20), day="2026-01-01")
    assert ledgers[1].spent(key, day="2026-01-01") == {"requests": 1, "calls": 1, "tokens": 20, "cost": 0.0}
    assert ledgers[1].reserve(key, Usage(tokens=60), day="2026-01-01") is None  # 20 + 60 <= 100
    assert ledgers[1].reserve(key, Usage(tokens=60), day="2026-01-02") is None  # a new day
    for ledger in ledgers:
        ledger.close()
