"""Who may call the service, and what each key may still spend today.

**Keys.** A request carries `Authorization: Bearer KEY` (as the Cohere SDK, LiteLLM and the
framework components send it). The key is hashed with SHA-256 and compared with every configured
digest by `hmac.compare_digest`, all of them every time, so neither the answer nor its timing says
which key, or which prefix, came close. Only digests are held; the key itself is never logged, put
in a metric label or echoed in an error.

**Budgets.** A key may have a daily budget (UTC days): service requests, and the library's
`cost.Budget` over backend calls, tokens and cost. Before a request its plan (`Reranker.plan`,
made offline) is *reserved* against what the key spent today; a request that would cross a limit is
refused (429) and nothing is sent. After it, the reservation is replaced by what the request really
used (`meta.usage`). The ledger is a SQLite file, so every worker process of `serve --workers N`
counts against the same totals; each reserve is one `BEGIN IMMEDIATE` transaction, so two workers
checking at once cannot both pass a limit that leaves room for one.
"""

from __future__ import annotations

import hashlib
import hmac
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .config import ApiKey, KeyBudget

_SCHEMA = """CREATE TABLE IF NOT EXISTS spend (
  key TEXT NOT NULL, day TEXT NOT NULL, requests INTEGER NOT NULL DEFAULT 0, calls INTEGER NOT NULL DEFAULT 0,
  tokens INTEGER NOT NULL DEFAULT 0, cost REAL NOT NULL DEFAULT 0, PRIMARY KEY (key, day))"""


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header, or None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def authenticate(keys: Sequence[ApiKey], token: str | None) -> ApiKey | None:
    """The configured key `token` is, or None; every digest is compared, in constant time each."""
    if token is None:
        return None
    digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
    found = None
    for key in keys:
        if hmac.compare_digest(digest, key.digest) and found is None:
            found = key
    return found


@dataclass(frozen=True)
class Usage:
    """One request's spending: 1 request, its backend calls, its tokens, its cost."""

    calls: int = 0
    tokens: int = 0
    cost: float = 0.0


def utc_day(now: float | None = None) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(time.time() if now is None else now))


class Ledger:
    """What each key spent per UTC day (module docstring), in a SQLite file shared by workers."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._conn() as conn:
            conn.execute(_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            self._local.conn = conn
        return conn

    def reserve(self, key: ApiKey, planned: Usage, day: str | None = None) -> str | None:
        """Why `key` may not make a request that would use about `planned` today, or None; then one
        request and `planned` are counted until `settle` replaces them with what was used."""
        budget: KeyBudget = key.budget
        day = day or utc_day()
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(
                "SELECT requests, calls, tokens, cost FROM spend WHERE key=? AND day=?", (key.ident, day)
            ).fetchone() or (0, 0, 0, 0.0)
            reason = over(budget, row, planned)
            if reason is None:
                conn.execute(
                    "INSERT INTO spend (key, day, requests, calls, tokens, cost) VALUES (?, ?, 1, ?, ?, ?) "
                    "ON CONFLICT(key, day) DO UPDATE SET requests=requests+1, calls=calls+excluded.calls, "
                    "tokens=tokens+excluded.tokens, cost=cost+excluded.cost",
                    (key.ident, day, planned.calls, planned.tokens, planned.cost),
                )
            conn.execute("COMMIT")
            return reason
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def settle(self, key: ApiKey, planned: Usage, used: Usage, day: str) -> None:
        """Replace a reservation (`planned`) by what the request used."""
        self._conn().execute(
            "UPDATE spend SET calls=MAX(0, calls+?), tokens=MAX(0, tokens+?), cost=MAX(0, cost+?) "
            "WHERE key=? AND day=?",
            (
                used.calls - planned.calls,
                used.tokens - planned.tokens,
                used.cost - planned.cost,
                key.ident,
                day,
            ),
        )

    def spent(self, key: ApiKey, day: str | None = None) -> dict[str, float]:
        """Today's totals of `key` (requests, calls, tokens, cost)."""
        row = self._conn().execute(
            "SELECT requests, calls, tokens, cost FROM spend WHERE key=? AND day=?",
            (key.ident, day or utc_day()),
        ).fetchone() or (0, 0, 0, 0.0)
        return dict(zip(("requests", "calls", "tokens", "cost"), row, strict=True))

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def over(budget: KeyBudget, spent: Sequence[float], planned: Usage) -> str | None:
    """The limit of `budget` one more request of `planned` would cross, in words, or None."""
    requests, calls, tokens, cost = spent
    if budget.max_requests is not None and requests + 1 > budget.max_requests:
        return f"this key's daily max_requests={budget.max_requests} is reached ({int(requests)} today)"
    spend = budget.spend
    if spend is None:
        return None
    if spend.max_calls is not None and calls + planned.calls > spend.max_calls:
        return (
            f"this key's daily max_calls={spend.max_calls} would be crossed ({int(calls)} backend calls "
            f"today, this request makes {planned.calls})"
        )
    if spend.max_tokens is not None and tokens + planned.tokens > spend.max_tokens:
        return (
            f"this key's daily max_tokens={spend.max_tokens} would be crossed ({int(tokens)} tokens today, "
            f"this request needs about {planned.tokens})"
        )
    if spend.max_cost is not None and cost + planned.cost > spend.max_cost:
        return f"this key's daily max_cost={spend.max_cost:g} would be crossed ({cost:.6g} spent today)"
    return None


__all__ = ["Ledger", "Usage", "authenticate", "bearer_token", "over", "utc_day"]
