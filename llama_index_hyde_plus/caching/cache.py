"""Transform-result caches: `MemoryCache` (LRU) and `SQLiteCache` (persistent, TTL).

Pass one as ``cache=`` to any built-in transform. Entries are keyed by a hash of the
method, the model and its generation settings, the prompt, the transform's generation
options and the query (see `cache_key` and `LLMTransform.cache_key_for`), and hold the
`TransformResult`. Only complete successes are stored (not a fallback, nor a result
some of whose calls failed), so an outage never poisons the cache; a cache may opt in
to keeping unusable replies too (`keeps_unusable_replies`, as an evaluation's does).
Both caches are safe to share between threads and event loops; `MemoryCache` is
bounded in entries and bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import sqlite3
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable
from functools import partial
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from ..calls.outage import Outage

logger = logging.getLogger(__name__)


@runtime_checkable
class TransformCache(Protocol):
    """What a transform needs from a cache: values by string key (`cache_key`).

    What is stored: a complete `TransformResult` (never a fallback, nor one with an
    ``error`` from a failed call). By default `set` receives its JSON-able
    ``to_dict()`` form and `get` must return an equal dict (or None for a miss); such a
    cache may do blocking I/O, so it is called on worker threads of its own, unless
    it says it only computes (`answers_in_process`). A cache whose class sets
    ``holds_objects = True`` (like `MemoryCache`) receives the immutable
    `TransformResult` itself, must return the very object, and must never block (it is
    called on the event loop). A cache whose class sets ``keeps_unusable_replies =
    True`` also keeps a generation whose replies could not be used
    (`keeps_unusable_replies`)."""

    def get(self, key: str) -> Any:
        """The value stored under ``key``, or None for a miss.

        Args:
            key: a `cache_key`.
        """
        ...

    def set(self, key: str, value: Any) -> None:
        """Store ``value`` under ``key``; must never raise for want of space or access.

        Args:
            key: a `cache_key`.
            value: the result's ``to_dict()`` form, or the `TransformResult` itself
                when the class sets ``holds_objects = True``.
        """
        ...


def holds_objects(cache: TransformCache) -> bool:
    """Whether ``cache`` keeps `TransformResult` objects in process (see
    `TransformCache`): no encoding, and no worker thread for its calls."""
    return getattr(cache, "holds_objects", False) is True


def keeps_unusable_replies(cache: TransformCache) -> bool:
    """Whether ``cache`` also keeps a generation the model answered but the transform
    could not use (an ``UnusableReplyError``: an empty or unparseable reply), serving it
    again as the same fallback or partial result. An evaluation's cache does, so that
    every configuration sharing a generation, in a run and in later runs, is scored on
    the same replies; other caches do not, so a model asked again may answer better.
    A timeout or a failed call is never kept."""
    return getattr(cache, "keeps_unusable_replies", False) is True


def answers_in_process(cache: TransformCache) -> bool:
    """Whether ``cache``'s calls only compute in this process (no disk, lock or network
    to wait on), so a transform makes them in the caller's thread, the event loop's
    included, instead of on the cache's worker threads: one that holds objects
    (`holds_objects`), or one that says so (a true ``answers_in_process``, as a
    `KVStoreCache` over LlamaIndex's in-memory ``SimpleKVStore`` does)."""
    return holds_objects(cache) or getattr(cache, "answers_in_process", False) is True


def cache_key(parts: dict[str, Any]) -> str:
    """A stable hash of ``parts`` (sorted JSON), used as the cache key. Plain data
    only: an object is a `TypeError`, never its repr (which may hold an address and
    differ in every process)."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def approx_size(value: object) -> int:
    """Roughly the bytes ``value`` keeps alive: ``sys.getsizeof`` of it and of all it
    reaches through tuples, lists, sets, dicts and dataclass fields (a result's
    strings, usage, searches, children), each object counted once however often it is
    shared."""
    seen: set[int] = set()
    total = 0
    todo = [value]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, (tuple, list, set, frozenset)):
            todo.extend(item)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            todo.extend(getattr(item, f.name) for f in dataclasses.fields(item))
    return total


def _check_size(value: object, name: str) -> int:
    # not _checks.is_int: this module imports nothing of ours (a test loads it alone)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1")
    return value


def _check_seconds(value: object, name: str, high: float | None) -> float:
    """``value`` as a float if it is a finite number of seconds (not a bool) from 0 to
    ``high`` (None: no bound); else a `TypeError` or `ValueError` naming ``name``."""
    # not _checks.check_number: this module imports nothing of ours (see _check_size)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or (high is not None and value > high):
        bound = "" if high is None else f" and at most {high:g}"
        raise ValueError(f"{name} must be a finite number of seconds >= 0{bound}, not {value!r}")
    return float(value)


MAX_BUSY_TIMEOUT_S = 3600.0
"""The longest ``busy_timeout_s`` of a `SQLiteCache`: a search may wait this long for
another process's write lock (an infinite wait would hang it)."""

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
_R = TypeVar("_R")

_ENTRY_OVERHEAD = 100
"""Bytes an entry costs beyond its key and value: the ordered dict's link and slot."""


class BoundedLRU(Generic[K, V]):
    """A thread-safe LRU holding at most ``max_entries`` entries and ``max_bytes``
    bytes, the least recently used evicted first. ``size_of(key, value)`` says what an
    entry weighs; one heavier than the whole budget is not kept at all."""

    def __init__(self, max_entries: int, max_bytes: int, size_of: Callable[[K, V], int]) -> None:
        self.max_entries = _check_size(max_entries, "max_entries")
        self.max_bytes = _check_size(max_bytes, "max_bytes")
        self._size_of = size_of
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """What the entries weigh now (by ``size_of``)."""
        return self._bytes

    def get(self, key: K) -> V | None:
        """The value kept under ``key`` (now the most recently used), or None.

        Args:
            key: the entry's key.
        """
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                return None
            self._data.move_to_end(key)
            return entry[0]

    def set(self, key: K, value: V) -> bool:
        """Keep ``value`` (replacing what ``key`` held), evicting the least recently
        used entries beyond the budget; False when it alone is over ``max_bytes``, and
        then ``key`` holds nothing.

        Args:
            key: the entry's key.
            value: what to keep.
        """
        size = self._size_of(key, value) + _ENTRY_OVERHEAD
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.max_bytes:
                return False
            self._data[key] = (value, size)
            self._bytes += size
            while len(self._data) > self.max_entries or self._bytes > self.max_bytes:
                self._bytes -= self._data.popitem(last=False)[1][1]
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._data.clear()
            self._bytes = 0


class LRUHolder(Generic[K, V]):
    """A cache kept in a `BoundedLRU` (``self._lru``): its budget, weight and size are
    the LRU's, said here once for every cache built on one."""

    _lru: BoundedLRU[K, V]

    @property
    def max_entries(self) -> int:
        """Most entries kept."""
        return self._lru.max_entries

    @property
    def max_bytes(self) -> int:
        """Most bytes the kept entries weigh in all (estimated)."""
        return self._lru.max_bytes

    @property
    def nbytes(self) -> int:
        """The estimated weight of what is kept now."""
        return self._lru.nbytes

    def __len__(self) -> int:
        return len(self._lru)

    def clear(self) -> None:
        """Drop every entry."""
        self._lru.clear()


DEFAULT_MAX_BYTES = 64 << 20
"""`MemoryCache`'s byte budget when none is given: 64 MiB."""


class MemoryCache(LRUHolder[str, Any]):
    """An in-process LRU of at most ``max_entries`` results weighing at most
    ``max_bytes`` (64 MiB by default) in all, the least recently used evicted first
    (thread- and async-safe). A result's weight is estimated from its strings and
    everything else it holds (`approx_size`); one heavier than the whole budget is not
    kept.

    Built-in transforms store their (immutable) `TransformResult` objects here rather
    than their dict form, so a hit costs no decoding; `get` returns what `set` got."""

    holds_objects = True

    def __init__(self, max_entries: int = 1024, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._lru = BoundedLRU(max_entries, max_bytes, _entry_size)

    def get(self, key: str) -> Any:
        """The result stored under ``key`` (now the most recently used), or None.

        Args:
            key: a `cache_key`.
        """
        return self._lru.get(key)

    def set(self, key: str, value: Any) -> None:
        """Store ``value``, dropping the least recently used entries beyond
        ``max_entries`` or ``max_bytes``; one heavier than ``max_bytes`` alone is not
        kept (and ``key`` then holds nothing).

        Args:
            key: a `cache_key`.
            value: the `TransformResult` (kept as is, not copied).
        """
        self._lru.set(key, value)


def _entry_size(key: str, value: object) -> int:
    return sys.getsizeof(key) + approx_size(value)


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


def _is_io_error(exc: BaseException) -> bool:
    """True for SQLite's I/O errors (``SQLITE_IOERR_*``: a read cut short by a file
    truncated under the connection, a failed read or write), which the open connection
    keeps meeting; not for a busy or locked file."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return int(code) & 0xFF == 10  # SQLITE_IOERR
    return "disk i/o error" in str(exc).lower()


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

APPLICATION_ID = 0x48595044
"""The application id (``PRAGMA application_id``, bytes 68-71 of the file's header:
``HYPD``) a `SQLiteCache` stamps its database with: its owner marker. The header is
read without SQLite, so a database whose schema is damaged still shows whose it is."""


def _stamped_as_ours(path: Path) -> bool:
    """Whether the file at ``path`` is a SQLite database whose header carries
    `APPLICATION_ID`: provably this cache's, so it may be moved aside when damaged."""
    try:
        if path.is_symlink() or not path.is_file():
            return False
        with path.open("rb") as handle:
            head = handle.read(100)
    except OSError:
        return False
    return head.startswith(_SQLITE_HEADER) and int.from_bytes(head[68:72], "big") == APPLICATION_ID


_UNAVAILABLE: tuple[type[Exception], ...] = (sqlite3.Error, OSError)
"""What an unavailable cache raises: SQLite's errors, and the file system's (a folder
that cannot be made: a file in the way, a read-only file system, no permission)."""


def _check_not_foreign(conn: sqlite3.Connection, path: Path) -> None:
    """A `ForeignFileError` unless the database is empty or holds only this cache's
    table with its columns (no other table, view, index or trigger), with no
    application id but `APPLICATION_ID` and no user version (another program's
    marks)."""
    rows = conn.execute("SELECT type, name FROM sqlite_master")
    schema = {(kind, name) for kind, name in rows if not name.startswith("sqlite_")}  # not SQLite's
    columns = [row[1] for row in conn.execute("PRAGMA table_info(results)")]
    app_id, version = (
        conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("application_id", "user_version")
    )
    marked = app_id not in (0, APPLICATION_ID) or version != 0
    if (schema and (schema != {("table", "results")} or columns != _COLUMNS)) or marked:
        held = ", ".join(f"{kind} {name}" for kind, name in sorted(schema)) or "no tables"
        raise ForeignFileError(
            f"{path} is another program's SQLite database ({held}); it is left untouched"
        )


def _unmarked_damage(path: Path, exc: BaseException) -> ForeignFileError:
    return ForeignFileError(
        f"{path} is damaged ({exc}) and its header does not mark it as this cache's "
        f"database (application id {APPLICATION_ID:#x}); it is left untouched"
    )


def _check_unmarked(path: Path, timeout: float) -> None:
    """A `ForeignFileError` unless the database at ``path``, which lacks the owner marker,
    is absent, empty, or (`_check_not_foreign`) holds only this cache's table (a cache
    written before the marker, stamped once it is opened); one with a ``-wal`` journal
    beside it is not (reading that journal recovers it). Read as an immutable file
    (no lock, no journal, no ``-wal`` or ``-shm`` opened), so another program's
    database is never written, checkpointed or recovered, nor its shared memory
    changed; one that cannot be read (damaged) is not provably this cache's, and is
    left untouched."""
    try:
        if not path.exists() or path.stat().st_size == 0:
            return
        wal = Path(f"{path}-wal")
        journaled = wal.exists() and wal.stat().st_size > 0
    except OSError:
        return  # unreadable: connecting will say why
    if journaled:  # what the -wal holds is read only by recovering it: a write
        raise ForeignFileError(
            f"{path} has no owner marker and a -wal journal in use or left by another "
            "program; it is left untouched"
        )
    uri = Path(os.path.abspath(path)).as_uri() + "?mode=ro&immutable=1"
    try:
        probe = sqlite3.connect(uri, uri=True, timeout=timeout)
    except sqlite3.Error:
        return  # not openable at all: connecting will say why
    try:
        _check_not_foreign(probe, path)
    except sqlite3.DatabaseError as exc:
        if not is_corruption(exc):
            raise
        raise _unmarked_damage(path, exc) from exc
    finally:
        probe.close()


class SQLiteCache:
    """A persistent cache in one SQLite file; entries older than ``ttl_s`` seconds are
    misses (and are purged on write).

    The database is stamped with `APPLICATION_ID` in its header, its owner marker. A
    damaged cache (a SQLite file that reads as "malformed") that carries the marker is
    moved aside under a unique name (``*.corrupt-<time>-<id>``), logged, and replaced by
    a fresh one, which the call that found the damage and every later one use at once
    (a damaged file dealt with is no outage); an instance whose file another process
    moved aside goes to the fresh one too. A file that is not SQLite, another
    program's database, or a damaged database without the marker is someone else's:
    it is left untouched (its ``-wal`` and ``-shm`` too) and the cache is skipped,
    with a warning. A cache that is busy (another process holds the write lock),
    read-only, whose folder cannot be created (a file in the way, a read-only file
    system, no permission) or otherwise unavailable is left alone, with one warning per
    outage: a read is a miss (``len`` is 0) and a write is skipped after waiting at
    most ``busy_timeout_s`` seconds. A cache never fails a search.

    Args:
        path: the SQLite file (``~`` expanded); it and its folder are created when
            missing.
        ttl_s: seconds an entry stays valid (a finite number above 0); None: for ever.
        busy_timeout_s: seconds a call waits for another process's write lock before
            the cache is skipped for that call (from 0 to `MAX_BUSY_TIMEOUT_S`).
    """

    def __init__(
        self, path: str | Path, ttl_s: float | None = None, *, busy_timeout_s: float = 0.5
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or a Path, not {type(path).__name__}")
        if ttl_s is not None:
            ttl_s = _check_seconds(ttl_s, "ttl_s", None)
            if ttl_s == 0:
                raise ValueError("ttl_s must be > 0 seconds, or None")
        busy_timeout_s = _check_seconds(busy_timeout_s, "busy_timeout_s", MAX_BUSY_TIMEOUT_S)
        self.path = Path(path).expanduser()
        self.ttl_s = ttl_s
        self.busy_timeout_s = float(busy_timeout_s)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._file: tuple[int, int] | None = None  # (device, inode) the connection has open
        self._warned = False
        # reads and writes fail apart (a read-only file, or another process's write
        # lock in WAL mode, still reads): each is left alone after it fails
        self._reads = Outage(self.busy_timeout_s)
        self._writes = Outage(self.busy_timeout_s)
        with self._lock:
            self._try_open()

    def _open(self) -> sqlite3.Connection:
        """The connection, opened (and the table created) on first use, and opened
        again once the path names another file than the one it has open (another
        process moved a damaged file aside and started a fresh one, or the file was
        removed): its calls would go to a file nobody else reads. Raises
        `sqlite3.Error` or `OSError`."""
        if self._conn is not None and _identity(self.path) != self._file:
            self._drop_connection()
        if self._conn is None:
            self._conn = self._connect()
            self._file = _identity(self.path)
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None

    def _using(self, op: Callable[[sqlite3.Connection], _R]) -> _R:
        """``op`` on the connection (`_open`). A damaged file that is dealt with
        (`_quarantine`: moved aside, or found already replaced) is no outage: ``op``
        runs again at once, on the file now at the path. Raises `sqlite3.Error` or
        `OSError` when the cache is unavailable, a damaged file it could not move aside
        (not provably its own, or the file system refused) included."""
        for attempt in (0, 1):
            try:
                return op(self._open())
            except sqlite3.DatabaseError as exc:
                if _is_io_error(exc):  # the next call opens it afresh: SQLite recovers
                    self._drop_connection()  # its journal, or finds the damage
                if attempt or not is_corruption(exc) or not self._quarantine(exc):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _check_sqlite_file(self.path)
        if not _stamped_as_ours(self.path):
            _check_unmarked(self.path, self.busy_timeout_s)
        conn = sqlite3.connect(self.path, check_same_thread=False, timeout=self.busy_timeout_s)
        try:
            _check_not_foreign(conn, self.path)
            try:  # before WAL, so the marker reaches the file's own header at once
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS results "
                    "(key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)"
                )
                if conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
                    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            except sqlite3.OperationalError:
                if not self._has_table(conn):  # a read-only cache that has it is fine
                    raise
            try:
                conn.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError:
                pass  # busy or read-only: the default journal works too
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
            return self._using(_itself)
        except _UNAVAILABLE as exc:
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

    def _quarantine(self, exc: Exception) -> bool:
        """Move a damaged cache aside (see `_move_aside`): True once the path is free
        of it. A file system that refuses, or a database that is not provably this
        cache's, leaves it where it is, logged as unavailable: False."""
        try:
            self._move_aside(exc)
        except (OSError, ForeignFileError) as err:
            self._unavailable(err)
            return False
        return True

    def _move_aside(self, exc: Exception) -> None:
        self._drop_connection()
        if not self.path.exists():
            return
        if not _stamped_as_ours(self.path):  # no owner marker: someone else's, never moved
            raise _unmarked_damage(self.path, exc)
        checked = _identity(self.path)
        if not self._still_corrupt() or _identity(self.path) != checked:
            return  # healthy, or replaced meanwhile (another process's fresh cache)
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

    def get(self, key: str) -> Any:
        """The stored dict, or None for a miss: absent, older than ``ttl_s``,
        unreadable, or the file busy, locked, read-only, not ours or damaged (a damaged
        file is moved aside, and a fresh one started).

        Args:
            key: a `cache_key`.
        """
        with self._lock:  # checked once it is ours: callers queued behind a busy wait skip
            if self._reads.skipping():
                return None
            try:
                row = self._using(partial(_read, key))
            except _UNAVAILABLE as exc:
                self._reads.failed()
                self._unavailable(exc)
                return None
            self._reads.answered()
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
        """Store ``value`` as JSON and drop entries older than ``ttl_s``. Skipped, with
        one warning per outage, when the file is busy past ``busy_timeout_s``,
        read-only or not ours; a damaged file is moved aside and the write made to a
        fresh one.

        Args:
            key: a `cache_key`.
            value: the result's JSON-able ``to_dict()`` form.
        """
        blob = json.dumps(value, ensure_ascii=False)
        with self._lock:
            if self._writes.skipping():
                return
            try:
                self._using(partial(_write, key, blob, self.ttl_s))
            except _UNAVAILABLE as exc:
                self._writes.failed()
                self._unavailable(exc)
                return
            self._writes.answered()

    def __len__(self) -> int:
        with self._lock:
            try:
                return self._using(_count)
            except _UNAVAILABLE as exc:
                self._unavailable(exc)
                return 0

    def close(self) -> None:
        """Close the connection; a later call opens it again."""
        with self._lock:
            self._drop_connection()


def _identity(path: Path) -> tuple[int, int] | None:
    """The (device, inode) of the file at ``path``; None when there is none."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _itself(conn: sqlite3.Connection) -> sqlite3.Connection:
    return conn


def _read(key: str, conn: sqlite3.Connection) -> tuple[str, float] | None:
    """The value and creation time stored under ``key``, or None."""
    row = conn.execute("SELECT value, created FROM results WHERE key = ?", (key,)).fetchone()
    return None if row is None else (row[0], row[1])


def _write(key: str, blob: str, ttl_s: float | None, conn: sqlite3.Connection) -> None:
    """Store ``blob`` under ``key`` and drop the entries older than ``ttl_s``, in one
    transaction."""
    with conn:
        conn.execute(
            "INSERT OR REPLACE INTO results (key, value, created) VALUES (?, ?, ?)",
            (key, blob, time.time()),
        )
        if ttl_s is not None:
            conn.execute("DELETE FROM results WHERE created < ?", (time.time() - ttl_s,))


def _count(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM results").fetchone()[0])
