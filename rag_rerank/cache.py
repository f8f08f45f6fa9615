"""The response cache: a backend's guard-valid answer kept on disk, so an identical call is never paid twice.

Rerank calls repeat: an agent asks the same question again, an evaluation is re-run, two requests
of a batch share a window of candidates. A call's answer is decided by what is sent (the backend
kind, the server, the model, the rendered messages, the response format, temperature, max tokens,
seed) and by what the output guard accepts (top_k, limits, repair); `call_key` hashes all of that
(`Backend.cache_identity` says what the backend sends; credentials are never part of it), and
`ResponseCache` keeps the accepted answer's text under that key. Each window and the final pass
is a call of its own, so overlapping candidate lists reuse the windows they share.

What is stored is only an answer that passed the output guard: a failure never is. On a hit the
stored text is judged by the guard again (a file edited by hand, or a guard that grew stricter,
makes a miss, never a wrong answer), and no request is made; the answer's usage is kept, so
`meta.usage` still tells what the call would have cost and `meta.cache` counts what was saved.

Storage is one SQLite file (the standard library; WAL journal, a busy timeout): safe for threads,
asyncio (the async driver reads it in a worker thread), a batch's concurrency and several
processes at once. A size cap evicts the least recently used answers; an optional time-to-live
expires old ones; the folder is private to the user (0700) and the file too (0600), and a file
another user could have written is refused, as for the vector cache (`embed/disk_cache.py`): a
planted answer could steer rankings.

`replay=True` answers only from the cache and raises `CacheMissError` on a miss: a test suite can
pin its pipeline's reranking on answers recorded once (docs/cost.md). It is read-only: it writes,
evicts and creates nothing, so a folder with no recorded answers is a `ConfigError` naming it.

Why not `diskcache` (also SQLite, with its own retry on a locked database): measured with
`python bench/libraries.py` (2,000 answers of about 2 KB, load average 14-18 on a shared 2-core
machine), a put costs 0.75 ms here against its 0.50 ms and a get 0.27 ms against 0.41 ms, the
same order as a call that takes hundreds of milliseconds; what it would not bring is what this
module is for: folder and file refused unless private to the user (a planted answer steers
rankings), replay mode, and keys that cover the guard. The bench also found the put at 5.5-7 ms:
the size cap's `SUM(size)` read every stored answer; an index on `size` (`responses_size`) makes
it read the index alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CacheMissError, ConfigError, InputError, Violation
from .guard.limits import Limits, load_schema
from .guard.output import judge
from .models import RerankRequest
from .paths import default_cache_dir
from .retry import Outcome

log = logging.getLogger("rag_rerank.cache")

CACHE_ENV = "RAG_RERANK_CACHE"
FILE_NAME = "responses.sqlite3"
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
# Bumped when what a key covers or what an entry holds changes: old entries then simply miss.
FORMAT = 1
_OFF = ("", "0", "off", "false", "no", "none")
_ON = ("1", "on", "true", "yes")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    size INTEGER NOT NULL,
    created REAL NOT NULL,
    used REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_used ON responses(used);
CREATE INDEX IF NOT EXISTS responses_size ON responses(size);
"""


@dataclass(frozen=True)
class Entry:
    """One stored answer: the accepted text (after repairs) and what the call reported."""

    text: str
    usage: Mapping[str, int] = field(default_factory=dict)
    model: str | None = None
    repairs: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    created: float = 0.0

    def dumps(self) -> str:
        return json.dumps({"text": self.text, "usage": dict(self.usage), "model": self.model,
                           "repairs": list(self.repairs), "notes": list(self.notes)}, ensure_ascii=False)

    @classmethod
    def loads(cls, raw: str, created: float) -> Entry | None:
        """The entry, or None for a value that is not what `dumps` writes (then it is a miss)."""
        try:
            data = json.loads(raw)
            usage = {str(k): int(v) for k, v in dict(data.get("usage") or {}).items()}
            model = data.get("model")
            entry = cls(text=data["text"], usage=usage, model=model if isinstance(model, str) else None,
                        repairs=tuple(str(r) for r in data.get("repairs") or ()),
                        notes=tuple(str(n) for n in data.get("notes") or ()), created=float(created))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        return entry if isinstance(entry.text, str) else None


@dataclass(frozen=True)
class CacheStats:
    """What `rag-rerank cache stats` prints: the file, its entries and bytes, the limits, and this
    process's hits and misses."""

    path: str
    entries: int
    bytes: int
    file_bytes: int
    max_bytes: int
    ttl_s: float | None
    expired: int
    oldest: float | None
    newest: float | None
    hits: int
    misses: int
    replay: bool

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class ResponseCache:
    """Guard-valid answers on disk, shared by threads and processes (module docstring).

    `folder`: where `responses.sqlite3` lives (default: `$RAG_RERANK_CACHE_DIR`, else
    `$XDG_CACHE_HOME/rag-rerank`, else `~/.cache/rag-rerank`). `max_bytes`: the stored answers'
    size cap, least recently used evicted first. `ttl_s`: seconds an answer stays valid (None:
    forever). `replay`: answer only from the answers recorded in `folder`, a miss raises
`CacheMissError`; a folder without them is a `ConfigError` (nothing is created).

    One object may be shared by many sessions; it pickles as its settings (a Ray worker or a copied
    framework component opens its own connection)."""

    def __init__(self, folder: str | os.PathLike[str] | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 ttl_s: float | None = None, replay: bool = False) -> None:
        bad = []
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            bad.append(Violation(path="cache.max_bytes", value=max_bytes, message="must be an int >= 1"))
        if ttl_s is not None and (isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float))
                                  or ttl_s <= 0):
            bad.append(Violation(path="cache.ttl_s", value=ttl_s, message="must be None or seconds > 0"))
        if bad:
            raise InputError(bad, headline="invalid cache options")
        if folder is None:
            folder = default_cache_dir()
            if folder is None:
                raise ConfigError("no folder for the response cache: RAG_RERANK_CACHE_DIR is off and there "
                                  "is no home folder; pass a folder (CLI --cache DIR)")
        self.folder = Path(folder).expanduser()
        self.path = self.folder / FILE_NAME
        self.max_bytes, self.ttl_s, self.replay = max_bytes, ttl_s, bool(replay)
        self._lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        self.hits = 0
        self.misses = 0
        with self._connection():  # a folder that cannot be used is reported now, not at the first call
            pass

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.folder)!r}{', replay=True' if self.replay else ''})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (str(self.folder), self.max_bytes, self.ttl_s, self.replay))

    # --- storage ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """A connection for one operation: an idle one of this process, else a new one, opened
        after checking that the folder and the file are this user's alone. Connections are pooled,
        not kept per thread: a window's thread pool lives for one request, its threads' would leak."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's connections are not its own
                self._idle, self._pid = [], os.getpid()
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._open()
        try:
            yield conn
        finally:
            with self._lock:
                self._idle.append(conn)

    def _open(self) -> sqlite3.Connection:
        if self.replay and not self.path.is_file():
            # Replay is read-only: it creates neither folder nor file, and a folder with nothing
            # recorded (most often a mistyped path) is named now rather than as every call's miss.
            where = "does not exist" if not self.folder.exists() else f"holds no {FILE_NAME}"
            raise ConfigError(f"replay: no recorded answers in {self.folder} (the folder {where}); record "
                              "them first without replay into that folder (CLI --cache DIR), or point "
                              "replay at the folder they were recorded in")
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            _check_private(self.folder, folder=True)
            if not self.path.exists():
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o600))
            _check_private(self.path, folder=False)
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 30000")
            _retry(lambda: conn.execute("PRAGMA journal_mode = WAL"))
            conn.execute("PRAGMA synchronous = NORMAL")
            _retry(lambda: conn.executescript(_SCHEMA))
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"the response cache {self.path} cannot be used: {exc}") from None
        return conn

    def get(self, key: str) -> Entry | None:
        """The answer stored under `key`, or None (absent, expired, unreadable)."""
        now = time.time()
        entry = None
        with self._connection() as conn:
            row = _retry(lambda: conn.execute("SELECT value, created FROM responses WHERE key = ?", (key,))
                         .fetchone())
            if row is not None:
                if self.ttl_s is not None and row[1] < now - self.ttl_s:
                    if not self.replay:
                        _retry(lambda: conn.execute("DELETE FROM responses WHERE key = ?", (key,)))
                else:
                    entry = Entry.loads(row[0], row[1])
                    if entry is not None and not self.replay:
                        _retry(lambda: conn.execute("UPDATE responses SET used = ? WHERE key = ?",
                                                    (now, key)))
        with self._lock:
            if entry is None:
                self.misses += 1
            else:
                self.hits += 1
        return entry

    def contains(self, key: str) -> bool:
        """Whether an unexpired answer is stored under `key` (counts neither a hit nor a miss)."""
        with self._connection() as conn:
            row = _retry(lambda: conn.execute("SELECT created FROM responses WHERE key = ?",
                                              (key,)).fetchone())
        return row is not None and (self.ttl_s is None or row[0] >= time.time() - self.ttl_s)

    def discard(self, key: str) -> None:
        """Forget `key` (an entry the guard no longer accepts)."""
        if not self.replay:
            with self._connection() as conn:
                _retry(lambda: conn.execute("DELETE FROM responses WHERE key = ?", (key,)))

    def put(self, key: str, entry: Entry) -> None:
        """Store `entry` under `key`, then evict the least recently used answers past `max_bytes`.
        A replay cache is read-only."""
        if self.replay:
            return
        value = entry.dumps()
        size = len(value.encode("utf-8", "surrogatepass")) + len(key)
        now = time.time()

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("INSERT OR REPLACE INTO responses (key, value, size, created, used) "
                             "VALUES (?, ?, ?, ?, ?)", (key, value, size, now, now))
                total = conn.execute("SELECT COALESCE(SUM(size), 0) FROM responses").fetchone()[0]
                if total > self.max_bytes:
                    _evict(conn, total - self.max_bytes)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        with self._connection() as conn:
            _retry(lambda: write(conn))

    def stats(self) -> CacheStats:
        with self._connection() as conn:
            entries, size, oldest, newest = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0), MIN(created), MAX(created) FROM responses"
            ).fetchone()
            expired = 0
            if self.ttl_s is not None:
                expired = conn.execute("SELECT COUNT(*) FROM responses WHERE created < ?",
                                       (time.time() - self.ttl_s,)).fetchone()[0]
        file_bytes = sum(p.stat().st_size for p in self.folder.glob(FILE_NAME + "*") if p.is_file())
        return CacheStats(str(self.path), int(entries), int(size), file_bytes, self.max_bytes, self.ttl_s,
                          int(expired), oldest, newest, self.hits, self.misses, self.replay)

    def clear(self, older_than_s: float | None = None) -> int:
        """Delete every entry (or those created more than `older_than_s` ago); returns how many."""
        with self._connection() as conn:
            if older_than_s is None:
                cur = _retry(lambda: conn.execute("DELETE FROM responses"))
            else:
                cur = _retry(lambda: conn.execute("DELETE FROM responses WHERE created < ?",
                                                  (time.time() - older_than_s,)))
            _retry(lambda: conn.execute("VACUUM"))
        return int(cur.rowcount)

    def close(self) -> None:
        """Close the idle connections (the file stays; the cache reopens one when used again)."""
        with self._lock:
            conns, self._idle = self._idle, []
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def __enter__(self) -> ResponseCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reopen(folder: str, max_bytes: int, ttl_s: float | None, replay: bool) -> ResponseCache:
    return ResponseCache(folder, max_bytes=max_bytes, ttl_s=ttl_s, replay=replay)


def _evict(conn: sqlite3.Connection, excess: int) -> None:
    """Delete the least recently used entries until at least `excess` bytes are gone: the cache
    ends at or just under its cap, so once full, each write evicts again (no headroom is kept)."""
    freed = 0
    rows = conn.execute("SELECT key, size FROM responses ORDER BY used ASC").fetchall()
    target = excess
    for key, size in rows:
        if freed >= target:
            break
        conn.execute("DELETE FROM responses WHERE key = ?", (key,))
        freed += int(size)


def _retry(op: Any, tries: int = 5) -> Any:
    """`op()`, tried again when another process holds the write lock past the busy timeout."""
    for i in range(tries):
        try:
            return op()
        except sqlite3.OperationalError as exc:
            if ("locked" not in str(exc) and "busy" not in str(exc)) or i == tries - 1:
                raise
            time.sleep(0.05 * (i + 1))
    return None  # pragma: no cover (the loop returns or raises)


def _check_private(path: Path, *, folder: bool) -> None:
    """Refuse a folder or file another user owns or may write (a planted answer would steer
    rankings), or a symlink in place of the file."""
    st = os.lstat(path)
    kind_ok = stat.S_ISDIR(st.st_mode) if folder else stat.S_ISREG(st.st_mode)
    getuid = getattr(os, "getuid", None)  # POSIX; Windows has no owner bits to check here
    owner_ok = getuid is None or (st.st_uid == getuid() and not st.st_mode & 0o022)
    if not (kind_ok and owner_ok):
        what = "folder" if folder else "file"
        raise OSError(f"the {what} is not private to this user (another owner, writable by group or "
                      "others, or a symlink): fix it with chmod 700 (folder) / 600 (file) or use another "
                      "folder")


# --------------------------------------------------------------------------- keys


def call_key(identity: Mapping[str, Any], guard_top_k: int, limits: Limits | None, repair: bool) -> str:
    """The key of one call: what the backend sends (`identity`) and what the guard accepts."""
    doc = {"format": FORMAT, "identity": identity, "guard_top_k": guard_top_k,
           "limits": None if limits is None else dict(limits.__dict__), "repair": bool(repair),
           "schema": _schema_digest()}
    blob = json.dumps(doc, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


_DIGEST: list[str] = []


def _schema_digest() -> str:
    if not _DIGEST:
        text = json.dumps(load_schema("output"), sort_keys=True)
        _DIGEST.append(hashlib.sha256(text.encode()).hexdigest()[:16])
    return _DIGEST[0]


# --------------------------------------------------------------------------- a call's answer


def recall(cache: ResponseCache, key: str, ask: RerankRequest, guard_top_k: int, limits: Limits | None,
           what: str) -> Outcome | None:
    """The stored answer of a call as an `Outcome` (`cached=True`, no attempts), judged by the
    output guard again; None on a miss, or `CacheMissError` in replay mode. `what` names the call."""
    entry = cache.get(key)
    if entry is not None:
        obj, violations = judge(entry.text, ask.chunks, guard_top_k, limits=limits, query=ask.query)
        if obj is not None and not violations:
            return Outcome(obj=obj, attempts=(), repairs=entry.repairs, usage=dict(entry.usage),
                           model=entry.model, notes=entry.notes, text=entry.text, cached=True)
        log.warning("a cached answer the output guard now refuses was discarded (%s)", what)
        cache.discard(key)
    if cache.replay:
        raise CacheMissError(what, key)
    return None


def remember(cache: ResponseCache, key: str, outcome: Outcome) -> None:
    """Store a call's guard-valid answer (a failure never reaches here). A cache that cannot be
    written (a full disk) loses the entry, not the answer."""
    if outcome.cached:
        return
    try:
        entry = Entry(outcome.text, dict(outcome.usage), outcome.model, outcome.repairs, outcome.notes)
        cache.put(key, entry)
    except (sqlite3.Error, OSError, ConfigError) as exc:
        log.warning("the response cache %s could not store an answer: %s", cache.path, exc)


# --------------------------------------------------------------------------- the option


def resolve_cache(value: Any) -> ResponseCache | None:
    """The `cache=` option as a cache or None: a `ResponseCache` as is; True, the default folder;
    a path, that folder; False, none; None, what `RAG_RERANK_CACHE` says (`1` / `on`: the default
    folder, a path: that folder, `replay:PATH` or `replay`: replay from it; unset or `off`: none)."""
    if isinstance(value, ResponseCache):
        return value
    if value is None:
        env = os.environ.get(CACHE_ENV)
        if env is None or env.strip().lower() in _OFF:
            return None
        text = env.strip()
        replay = text.lower() == "replay" or text.lower().startswith("replay:")
        if replay:
            text = text.partition(":")[2]
        return ResponseCache(None if not text or text.lower() in _ON else text, replay=replay)
    if value is True:
        return ResponseCache()
    if value is False:
        return None
    if isinstance(value, (str, os.PathLike)) and str(value):
        return ResponseCache(value)
    raise InputError([Violation(path="cache", value=repr(value)[:80],
                                message="cache must be True, False, None, a folder or a ResponseCache")])


__all__ = ["CACHE_ENV", "DEFAULT_MAX_BYTES", "CacheStats", "Entry", "ResponseCache", "call_key", "recall",
           "remember", "resolve_cache"]
