"""Transform-result caches: `MemoryCache` (LRU) and `SQLiteCache` (persistent, TTL).

Pass one as ``cache=`` to any built-in transform. Entries are keyed by a hash of the
method, model, prompt, parameters and query (see `cache_key`), and hold the
`TransformResult` as JSON. Only successful results are stored, so an outage never
poisons the cache. Both caches are safe to share between threads and event loops.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

logger = logging.getLogger(__name__)


@runtime_checkable
class TransformCache(Protocol):
    """What a transform needs from a cache: values by string key (`cache_key`).

    What is stored: a successful `TransformResult` (never a fallback). By default
    `set` receives its JSON-able ``to_dict()`` form and `get` must return an equal
    dict (or None for a miss); such a cache may do blocking I/O, so the async path
    calls it in a worker thread. A cache whose class sets ``holds_objects = True``
    (like `MemoryCache`) receives the immutable `TransformResult` itself, must return
    the very object, and must never block (it is called on the event loop)."""

    def get(self, key: str) -> Any: ...

    def set(self, key: str, value: Any) -> None: ...


def holds_objects(cache: TransformCache) -> bool:
    """Whether ``cache`` keeps `TransformResult` objects in process (see
    `TransformCache`): no encoding, and no worker thread for its calls."""
    return getattr(cache, "holds_objects", False) is True


def cache_key(parts: dict[str, Any]) -> str:
    """A stable hash of ``parts`` (sorted JSON), used as the cache key."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class MemoryCache:
    """An in-process LRU of at most ``max_entries`` results (thread- and async-safe).

    Built-in transforms store their (immutable) `TransformResult` objects here rather
    than their dict form, so a hit costs no decoding; `get` returns what `set` got."""

    holds_objects = True

    def __init__(self, max_entries: int = 1024) -> None:
        # not _checks.is_int: this module imports nothing of ours (a test loads it alone)
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError("max_entries must be an int >= 1")
        self.max_entries = max_entries
        self._data: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Any:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def set(self, key: str, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


#: SQLite result codes that mean the file itself is damaged (not busy, not read-only).
_CORRUPT_CODES = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB


def is_corruption(exc: BaseException) -> bool:
    """True only for errors that mean the database file is damaged: "file is not a
    database" or "database disk image is malformed". Locks, read-only files, missing
    folders and I/O errors are not corruption."""
    if not isinstance(exc, sqlite3.DatabaseError) or isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return int(code) & 0xFF in _CORRUPT_CODES
    text = str(exc).lower()
    return "not a database" in text or "malformed" in text


class ForeignFileError(sqlite3.Error):
    """The cache path holds something this tool did not write (another file type, or a
    SQLite database with other tables): it is left untouched and the cache is skipped."""


_SQLITE_HEADER = b"SQLite format 3\x00"


def _check_sqlite_file(path: Path) -> None:
    """A `ForeignFileError` when ``path`` exists, is not empty and is not a SQLite
    file: someone else's file, never to be moved aside or written into."""
    try:
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise ForeignFileError(f"{path} is not a regular file; it is left untouched")
        if not path.exists():
            return
        with path.open("rb") as handle:
            head = handle.read(len(_SQLITE_HEADER))
    except OSError:
        return  # unreadable: connecting will say why
    if head and head != _SQLITE_HEADER:
        raise ForeignFileError(f"{path} is not a SQLite file; it is left untouched")


_COLUMNS = ["key", "value", "created"]


def _check_not_foreign(conn: sqlite3.Connection, path: Path) -> None:
    """A `ForeignFileError` unless the database is empty or holds only this cache's
    table with its columns (and no application id or user version a program set)."""
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    columns = [row[1] for row in conn.execute("PRAGMA table_info(results)")]
    marks = [conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("application_id", "user_version")]
    if (names and (names != {"results"} or columns != _COLUMNS)) or any(marks):
        raise ForeignFileError(
            f"{path} is another program's SQLite database (tables: "
            f"{', '.join(sorted(names)) or 'none'}); it is left untouched"
        )


class SQLiteCache:
    """A persistent cache in one SQLite file; entries older than ``ttl_s`` seconds are
    misses (and are purged on write).

    A damaged cache (a SQLite file that reads as "malformed") is moved aside under a
    unique name (``*.corrupt-<time>-<id>``), logged, and replaced by a fresh one. A
    file that is not SQLite, or another program's database, is someone else's: it is
    left untouched and the cache is skipped, with a warning. A
    cache that is busy (another process holds the write lock), read-only or otherwise
    unavailable is left alone: a read is a miss and a write is skipped after waiting
    at most ``busy_timeout_s`` seconds. A cache never fails a search.
    """

    def __init__(
        self, path: str | Path, ttl_s: float | None = None, *, busy_timeout_s: float = 0.5
    ) -> None:
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError("ttl_s must be > 0 seconds or None")
        if not busy_timeout_s >= 0:
            raise ValueError("busy_timeout_s must be >= 0 seconds")
        self.path = Path(path).expanduser()
        self.ttl_s = ttl_s
        self.busy_timeout_s = float(busy_timeout_s)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._warned = False
        with self._lock:
            self._try_open()

    def _open(self) -> sqlite3.Connection:
        """The connection, opened (and the table created) on first use. Raises
        `sqlite3.Error`; a damaged file is quarantined and opened afresh once."""
        if self._conn is not None:
            return self._conn
        for attempt in range(2):
            try:
                self._conn = self._connect()
                return self._conn
            except sqlite3.DatabaseError as exc:
                if attempt or not is_corruption(exc):
                    raise
                self._quarantine(exc)
        raise AssertionError("unreachable")  # pragma: no cover

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _check_sqlite_file(self.path)
        conn = sqlite3.connect(self.path, check_same_thread=False, timeout=self.busy_timeout_s)
        try:
            _check_not_foreign(conn, self.path)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError:
                pass  # busy or read-only: the default journal works too
            try:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS results "
                    "(key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)"
                )
            except sqlite3.OperationalError:
                if not self._has_table(conn):  # a read-only cache that has it is fine
                    raise
            conn.execute("SELECT count(*) FROM results").fetchone()
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _has_table(conn: sqlite3.Connection) -> bool:
        row = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'results'"
        ).fetchone()
        return row is not None

    def _try_open(self) -> sqlite3.Connection | None:
        try:
            return self._open()
        except sqlite3.Error as exc:
            self._unavailable(exc)
            return None

    def _unavailable(self, exc: BaseException) -> None:
        """Log (once per outage) that the cache is skipped for now."""
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        logger.log(
            level, "transform cache %s is unavailable (%s); continuing without it", self.path, exc
        )

    def _still_corrupt(self) -> bool:
        """Check with a fresh connection: another process may already have replaced the
        damaged file with a healthy one, which must not be moved aside."""
        try:
            probe = sqlite3.connect(self.path, timeout=self.busy_timeout_s)
        except sqlite3.Error:
            return False
        try:
            return probe.execute("PRAGMA quick_check").fetchall() != [("ok",)]
        except sqlite3.Error as exc:
            return is_corruption(exc)
        finally:
            probe.close()

    def _quarantine(self, exc: Exception) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None
        try:
            _check_sqlite_file(self.path)
        except ForeignFileError:
            return  # not a SQLite file (any more): someone else's, never moved
        if not self.path.exists() or not self._still_corrupt():
            return
        stamp = f"{int(time.time())}-{uuid.uuid4().hex[:8]}"
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        logger.warning(
            "transform cache %s is corrupt (%s); moved it to %s and started a new one",
            self.path,
            exc,
            aside.name,
        )
        for suffix in ("", "-wal", "-shm"):
            part = Path(str(self.path) + suffix)
            try:
                part.replace(Path(str(aside) + suffix))
            except FileNotFoundError:
                pass

    def _handle(self, exc: sqlite3.Error) -> None:
        if is_corruption(exc):
            self._quarantine(exc)
        else:
            self._unavailable(exc)

    def get(self, key: str) -> Any:
        with self._lock:
            try:
                row = (
                    self._open()
                    .execute("SELECT value, created FROM results WHERE key = ?", (key,))
                    .fetchone()
                )
            except sqlite3.Error as exc:
                self._handle(exc)
                return None
            self._warned = False
        if row is None:
            return None
        value, created = row
        if self.ttl_s is not None and time.time() - created > self.ttl_s:
            return None
        try:
            data = json.loads(value)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def set(self, key: str, value: dict[str, Any]) -> None:
        blob = json.dumps(value, ensure_ascii=False)
        with self._lock:
            for attempt in range(2):
                try:
                    conn = self._open()
                    with conn:
                        conn.execute(
                            "INSERT OR REPLACE INTO results (key, value, created) VALUES (?, ?, ?)",
                            (key, blob, time.time()),
                        )
                        if self.ttl_s is not None:
                            conn.execute(
                                "DELETE FROM results WHERE created < ?",
                                (time.time() - self.ttl_s,),
                            )
                    return
                except sqlite3.Error as exc:
                    if attempt or not is_corruption(exc):
                        self._unavailable(exc)
                        return
                    self._quarantine(exc)

    def __len__(self) -> int:
        with self._lock:
            try:
                return int(self._open().execute("SELECT count(*) FROM results").fetchone()[0])
            except sqlite3.Error:
                return 0

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
