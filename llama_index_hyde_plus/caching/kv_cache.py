"""`KVStoreCache`: a transform cache on LlamaIndex's own key-value store interface.

Any ``BaseKVStore`` serves (``RedisKVStore`` from ``llama-index-storage-kvstore-redis``,
``SimpleKVStore``, the MongoDB, Postgres, Firestore... stores): every process that opens
the same store shares one cache, and a store that outlives the process (Redis) keeps it
across restarts. So several ``hyde-plus serve`` replicas behind a load balancer pay once
for a rewrite, not once per replica.

It keeps the guarantees of the other caches: a store that fails (down, timing out,
refusing a write) is a miss or a skipped write with one warning per outage, never a
failed search; entries older than ``ttl_s`` are misses; only complete successes reach
it (the transform decides what is stored).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from typing import Any

from llama_index.core.storage.kvstore.simple_kvstore import SimpleKVStore
from llama_index.core.storage.kvstore.types import BaseKVStore

from .._extras import install_hint
from ..calls.outage import Outage
from ..calls.reliability import describe, failure
from ..calls.timeouts import CACHE_TIMEOUT_S

logger = logging.getLogger(__name__)

DEFAULT_COLLECTION = "hyde_plus_transforms"
"""The collection (a Redis hash) entries are kept in, apart from a docstore's own."""

REDIS_TIMEOUT_S = CACHE_TIMEOUT_S
"""Seconds a Redis opened by `KVStoreCache.from_uri` may take to connect or answer: the
cache's own bound (`timeouts.CACHE_TIMEOUT_S`)."""

CLOCK_SKEW_S = 60.0
"""How far ahead of this process's clock another writer's may run: an entry written
further in the future than that never expires by its age, so it counts as expired."""

_SCHEMES = ("redis://", "rediss://", "unix://")


class KVStoreCache:
    """Transform results in a LlamaIndex ``BaseKVStore`` (thread-safe; shared between
    processes through the store).

    Each entry is the result's JSON form with the time it was written; a read of an
    entry older than ``ttl_s`` seconds is a miss (and deletes it); on Redis 7.4+ each
    entry also expires in Redis itself (``HEXPIRE``), elsewhere expired entries stay
    until read. What is read and written is a copy: changing a hit changes no later
    one. Calls are blocking (a transform makes them on worker threads of the cache's
    own, each bounded by ``timeouts.CACHE_TIMEOUT_S``), except over the in-memory
    ``SimpleKVStore``, which only computes (`answers_in_process`).

    Args:
        kvstore: the store, e.g. ``RedisKVStore(redis_uri="redis://localhost:6379")``.
        collection: the collection entries live in (a Redis hash of that name).
        ttl_s: seconds an entry stays valid; None: until the store drops it.
    """

    def __init__(
        self,
        kvstore: BaseKVStore,
        *,
        collection: str = DEFAULT_COLLECTION,
        ttl_s: float | None = None,
    ) -> None:
        if not isinstance(kvstore, BaseKVStore):
            raise TypeError(
                f"kvstore must be a LlamaIndex BaseKVStore, not {type(kvstore).__name__}"
            )
        if not isinstance(collection, str) or not collection:
            raise ValueError("collection must be a non-empty string")
        if ttl_s is not None and (
            isinstance(ttl_s, bool)
            or not isinstance(ttl_s, (int, float))
            or not math.isfinite(ttl_s)
            or ttl_s <= 0
        ):
            raise ValueError("ttl_s must be a number of seconds > 0, or None")
        self.kvstore = kvstore
        self.collection = collection
        self.ttl_s = None if ttl_s is None else float(ttl_s)
        self._outage = Outage()
        self._no_field_expiry = False  # the Redis has no HEXPIRE (older than 7.4)

    @classmethod
    def from_uri(
        cls,
        uri: str,
        *,
        collection: str = DEFAULT_COLLECTION,
        ttl_s: float | None = None,
        timeout_s: float = REDIS_TIMEOUT_S,
    ) -> KVStoreCache:
        """A cache on the Redis server at ``uri`` (``redis://host:port/db``,
        ``rediss://`` for TLS, ``unix:///path.sock``), whose connect and reply times
        are bounded by ``timeout_s``. Nothing is sent until the first lookup: a server
        that is down is a miss then, not an error now. Needs the ``redis`` extra
        (``llama-index-storage-kvstore-redis``)."""
        if not isinstance(uri, str) or not uri.startswith(_SCHEMES):
            raise ValueError(
                f"uri must be a Redis URL (redis://host:port, rediss://..., unix://...), "
                f"not {uri!r}"
            )
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
            raise TypeError("timeout_s must be a number of seconds")
        if not 0 < timeout_s < 1e6:
            raise ValueError("timeout_s must be > 0 seconds (and finite)")
        try:
            from llama_index.storage.kvstore.redis import RedisKVStore
        except ImportError as exc:
            raise ImportError(
                f"a Redis cache needs the redis extra: {install_hint('redis')}"
            ) from exc
        store = RedisKVStore(
            redis_uri=uri, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        return cls(store, collection=collection, ttl_s=ttl_s)

    @property
    def answers_in_process(self) -> bool:
        """True over LlamaIndex's in-memory ``SimpleKVStore`` itself (not a subclass,
        which may do I/O): a read is a dict lookup and a copy, made in the caller's
        thread (`cache.answers_in_process`); a hand-off to a worker thread would cost
        more than the read. Any other store is called on the cache's worker threads."""
        return type(self.kvstore) is SimpleKVStore

    def _failed(self, what: str, exc: BaseException) -> None:
        """Log the first failure of an outage as a warning, the rest at debug level; the
        store is then left alone for a while (`Outage`: a hung Redis costs one
        bounded wait every few seconds, not two on every search)."""
        first = self._outage.failed()
        logger.log(
            logging.WARNING if first else logging.DEBUG,
            "transform cache %s failed (%s); continuing without it",
            what,
            describe(exc),
        )

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored result's dict form, or None (a miss, an expired entry, a
        malformed one, or a store that failed)."""
        if self._outage.skipping():
            return None
        try:
            entry = self.kvstore.get(key, collection=self.collection)
        except BaseException as exc:
            self._failed("read", failure(exc))
            return None
        self._outage.answered()
        if not isinstance(entry, dict):
            return None
        value, created = entry.get("result"), entry.get("created")
        if not isinstance(value, dict) or isinstance(created, bool):
            return None
        if not isinstance(created, (int, float)):
            return None
        age = time.time() - created
        if self.ttl_s is not None and not -CLOCK_SKEW_S <= age <= self.ttl_s:  # or from the future
            self._forget(key)
            return None
        return copy.deepcopy(value)  # an in-process store hands out its own dict

    def _forget(self, key: str) -> None:
        try:
            self.kvstore.delete(key, collection=self.collection)
        except BaseException as exc:
            self._failed("delete", failure(exc))

    def set(self, key: str, value: dict[str, Any]) -> None:
        """Store ``value`` (a result's dict form) under ``key``; a failing store is
        skipped with a warning."""
        if self._outage.skipping():
            return
        entry = {"created": time.time(), "result": copy.deepcopy(value)}
        try:
            self.kvstore.put(key, entry, collection=self.collection)
        except BaseException as exc:
            self._failed("write", failure(exc))
            return
        self._outage.answered()
        self._expire(key)

    def _expire(self, key: str) -> None:
        """Let a Redis that can (7.4+: ``HEXPIRE``) drop the entry itself once ``ttl_s``
        ran out, so entries nobody reads again do not pile up. An older Redis, or any
        other store, keeps them until they are read (a read of an expired entry
        deletes it) or the collection is cleared."""
        client = getattr(self.kvstore, "_redis_client", None)
        if (
            self.ttl_s is None
            or self._no_field_expiry
            or not callable(getattr(client, "hexpire", None))
        ):
            return
        try:
            client.hexpire(self.collection, math.ceil(self.ttl_s), key)  # type: ignore[union-attr]
        except BaseException as exc:
            if type(exc).__name__ != "ResponseError":  # an unknown command: Redis < 7.4
                self._failed("expiry", failure(exc))
                return
            self._no_field_expiry = True
            logger.debug("this Redis has no HEXPIRE (7.4+); expired entries go when read")

    def describe(self) -> str:
        """Where the entries are, without credentials: ``redis HOST:PORT/DB`` for a
        Redis store, else the store's class name."""
        client = getattr(self.kvstore, "_redis_client", None)
        kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
        if isinstance(kwargs, dict) and "host" in kwargs:
            return f"redis {kwargs['host']}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
        if isinstance(kwargs, dict) and "path" in kwargs:
            return f"redis {kwargs['path']}"
        return type(self.kvstore).__name__

    def __repr__(self) -> str:
        return (
            f"KVStoreCache({type(self.kvstore).__name__}, collection={self.collection!r}, "
            f"ttl_s={self.ttl_s!r})"
        )
