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
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

logger = logging.getLogger("llama_index_hyde_plus")


@runtime_checkable
class TransformCache(Protocol):
    """What a transform needs from a cache: JSON-able dicts by string key."""

    def get(self, key: str) -> dict[str, Any] | None: ...

    def set(self, key: str, value: dict[str, Any]) -> None: ...


def cache_key(parts: dict[str, Any]) -> str:
    """A stable hash of ``parts`` (sorted JSON), used as the cache key."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class MemoryCache:
    """An in-process LRU of at most ``max_entries`` results (thread- and async-safe)."""

    def __init__(self, max_entries: int = 1024) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError("max_entries must be an int >= 1")
        self.max_entries = max_entries
        self._data: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def set(self, key: str, value: dict[str, Any]) -> None:
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


class SQLiteCache:
    """A persistent cache in one SQLite file; entries older than ``ttl_s`` seconds are
    misses (and are purged on write). A corrupted file is moved aside (``*.corrupt-*``),
    logged, and replaced by a fresh one: a cache failure never fails a search."""

    def __init__(self, path: str | Path, ttl_s: float | None = None) -> None:
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError("ttl_s must be > 0 seconds or None")
        self.path = Path(path).expanduser()
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        with self._lock:
            self._open()

    def _open(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(2):
            try:
                conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS results "
                    "(key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)"
                )
                conn.execute("SELECT count(*) FROM results").fetchone()
                self._conn = conn
                return conn
            except sqlite3.DatabaseError as exc:
                if attempt:
                    raise
                self._quarantine(exc)
        raise AssertionError("unreachable")  # pragma: no cover

    def _quarantine(self, exc: Exception) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        logger.warning(
            "transform cache %s is unreadable (%s); moved it to %s and started a new one",
            self.path,
            exc,
            aside.name,
        )
        for suffix in ("", "-wal", "-shm"):
            part = Path(str(self.path) + suffix)
            if part.exists():
                part.replace(Path(str(aside) + suffix))

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            try:
                row = (
                    self._open()
                    .execute("SELECT value, created FROM results WHERE key = ?", (key,))
                    .fetchone()
                )
            except sqlite3.DatabaseError as exc:
                self._quarantine(exc)
                return None
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
                except sqlite3.DatabaseError as exc:
                    if attempt:
                        logger.warning("could not write to transform cache %s: %s", self.path, exc)
                        return
                    self._quarantine(exc)

    def __len__(self) -> int:
        with self._lock:
            try:
                return int(self._open().execute("SELECT count(*) FROM results").fetchone()[0])
            except sqlite3.DatabaseError:
                return 0

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
