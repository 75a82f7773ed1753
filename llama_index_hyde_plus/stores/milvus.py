"""Hybrid (BM25 + dense) search on Milvus: Milvus Lite from a local file, or a cluster.

The same code serves both: a ``uri`` that is a file path runs Milvus Lite in-process
(``milvus-lite``, no server), a ``http(s)://`` URI (and ``token``) talks to a Milvus
cluster or Zilliz Cloud. The collection has a dense vector field and a sparse field
filled by Milvus's built-in BM25 function from the text, and hybrid queries are fused
by Milvus (RRF, k=60, or weighted). With `TransformRetriever`, the dense side gets the
HyDE embedding and the BM25 side the passage text (query plus passage with
``include_query=True``). Needs the ``milvus`` extra.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Literal, cast

from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle

from .._redact import redact_uri
from ..calls import door
from ..chunking import Chunking
from .base import BuildSettings, Store
from .ingestion import Previous, build_steps, check_recorded, ingest, recorded
from .milvus_builds import (
    check_name_is_ours,
    fill_and_switch,
    is_local_uri,
    recorded_builds,
    resolve,
)
from .nodes import (
    EmbeddingMismatchError,
    IndexInfo,
    ProgressFn,
    TotalFn,
    check_embedding_model,
    embedding_model_name,
)

Ranker = Literal["rrf", "weighted"]
DEFAULT_COLLECTION = "hyde_plus"

logger = logging.getLogger(__name__)


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")


def check_collection_name(collection: str) -> str:
    """``collection`` if Milvus accepts it as a collection or alias name (letters,
    digits and ``_``, not starting with a digit); else a `ValueError` naming it."""
    if not isinstance(collection, str) or not _NAME.match(collection):
        raise ValueError(
            f"--collection {collection!r} is not a Milvus name: use letters, digits and _, "
            "starting with a letter or _"
        )
    return collection


def check_uri(uri: str) -> str:
    """``uri`` if it can name a Milvus: an ``http(s)://``/``tcp://``/``unix:`` URL, or a
    Milvus Lite database ending in ``.db``; else a `ValueError`. A local path comes back
    absolute, with ``~`` expanded and links resolved (``m.db/``, ``./m.db``, ``~/m.db``
    and a link to it are one path), so one database has one record file beside it,
    never one inside its folder, whatever the spelling. An existing folder that holds
    files but no ``databases/`` is someone's, not a Milvus Lite database: refused, so
    no command (not even a query) lets Milvus Lite write into it."""
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError("--uri is needed for the Milvus store (a .db file path or a URL)")
    if not is_local_uri(uri) or uri.startswith("unix:"):
        return uri
    path = Path(uri).expanduser()
    if path.suffix != ".db":
        raise ValueError(
            f"--uri {uri}: a Milvus Lite file must end in .db (or give an http(s):// URL)"
        )
    if (path.exists() or path.is_symlink()) and not path.is_dir():
        # a Milvus Lite database is a folder (databases/, collections/, LOCK): this is
        # someone's file (an SQLite .db, say), which Milvus Lite would trip over
        raise ValueError(
            f"--uri {uri} is a file, not a Milvus Lite database (a folder; a file is "
            "someone's data, or a database of Milvus Lite 2.x, which this one cannot "
            "open); it is left alone: choose a new .db path"
        )
    if path.is_dir() and any(path.iterdir()) and not (path / "databases").is_dir():
        raise ValueError(
            f"--uri {uri} is a folder that is not a Milvus Lite database (no databases/ in "
            "it); it is left alone: choose a new .db path"
        )
    return str(path.resolve())


def is_database(uri: str) -> bool:
    """Whether the local ``uri`` (checked by `check_uri`) holds a Milvus Lite database
    (its ``databases/`` folder): a query never opens anything else, since Milvus Lite
    would create a database there."""
    return (Path(uri) / "databases").is_dir()


def milvus_store(
    uri: str,
    *,
    collection: str = DEFAULT_COLLECTION,
    dim: int | None = None,
    token: str = "",
    overwrite: bool = False,
    ranker: Ranker = "rrf",
    weights: tuple[float, float] = (1.0, 1.0),
) -> Any:
    """A ``MilvusVectorStore`` with a dense field, a BM25 sparse field and hybrid fusion,
    writing rows under derived keys (`milvus_rows.KeyedMilvusVectorStore`).

    ``ranker="rrf"`` fuses with reciprocal rank fusion (k=60); ``"weighted"`` with
    ``weights`` (sparse, dense) on normalised scores.
    """
    from llama_index.vector_stores.milvus.utils import BM25BuiltInFunction

    from .milvus_rows import KeyedMilvusVectorStore

    if ranker not in ("rrf", "weighted"):
        raise ValueError("ranker must be 'rrf' or 'weighted'")
    if is_local_uri(uri):
        Path(uri).expanduser().parent.mkdir(parents=True, exist_ok=True)
    params: dict[str, Any] = {"k": 60} if ranker == "rrf" else {"weights": list(weights)}
    return KeyedMilvusVectorStore(
        uri=str(Path(uri).expanduser()) if is_local_uri(uri) else uri,
        token=token,
        collection_name=collection,
        dim=dim,
        overwrite=overwrite,
        enable_sparse=True,
        sparse_embedding_function=BM25BuiltInFunction(),
        hybrid_ranker="RRFRanker" if ranker == "rrf" else "WeightedRanker",
        hybrid_ranker_params=params,
    )


def build_milvus_index(
    documents: Sequence[Document],
    embed_model: BaseEmbedding,
    uri: str,
    *,
    collection: str = DEFAULT_COLLECTION,
    token: str = "",
    embed_spec: str = "",
    max_length: int = 256,
    batch_size: int = 64,
    progress: ProgressFn | None = None,
    chunking: Chunking | None = None,
    total: TotalFn | None = None,
) -> VectorStoreIndex:
    """Embed ``documents`` into a new hybrid collection and switch ``collection`` (an
    alias) to it, dropping only the builds it replaced (`milvus_builds`: an interrupted
    build leaves the old collection serving). ``chunking``, ``total``: as in
    `build_faiss_index`. On Milvus Lite, a rebuild made with the same model and chunking
    embeds only new or changed documents and copies the vectors of the unchanged chunks
    from the collection it replaces (`ingestion`; its rows are read back for that,
    nothing else). A collection or alias called ``collection`` that hyde-plus did not
    make is refused before any embedding."""
    check_collection_name(collection)
    uri = check_uri(uri)
    if is_local_uri(uri):
        Path(uri).parent.mkdir(parents=True, exist_ok=True)  # as `--out` does for FAISS
    client = _client(uri, token)
    check_name_is_ours(client, uri, collection)
    steps, chunk_meta = build_steps(
        embed_model, chunking, max_length, batch_size=batch_size, progress=progress, total=total
    )
    identity = steps[1].identity
    done = ingest(documents, steps, previous_build(client, uri, collection, identity))
    nodes = done.nodes
    if not nodes:
        raise ValueError("no documents to index")
    dim = len(nodes[0].embedding or [])
    entry = {
        "documents": len(documents),
        "chunks": len(nodes),
        "chunking": chunk_meta,
        "dim": dim,
        "embed": embed_spec,
        "embed_model": embedding_model_name(embed_model),
        "max_length": max_length,
        "collection": collection,
        "fingerprint": identity,
        "embedded": done.embedded,
        "reused": done.reused,
        "unchanged": done.unchanged,
        INGESTION_KEY: done.docstore.to_dict(),
        CHUNKS_KEY: recorded(nodes),
    }

    def fill(physical: str) -> VectorStoreIndex:
        store = milvus_store(uri, collection=physical, dim=dim, token=token)
        storage = StorageContext.from_defaults(vector_store=store)
        return VectorStoreIndex(nodes, storage_context=storage, embed_model=embed_model)

    return cast(VectorStoreIndex, fill_and_switch(client, (uri, collection), entry, fill))


INGESTION_KEY = "ingestion"
"""Where a build's record entry keeps the pipeline's docstore (`ingestion`)."""
CHUNKS_KEY = "ingestion_chunks"
"""Where it keeps the chunks it wrote (`ingestion.recorded`): rows written since by
``serve --writable`` are not taken for the build's own."""
_ROW_FIELDS = ["id", "text", "embedding", "_node_content"]


def previous_build(client: Any, uri: str, collection: str, identity: str) -> Previous | None:
    """The build ``collection`` serves as the pipeline's starting point, when the record
    lists it with the `fingerprint` ``identity`` and its docstore; else None (a server,
    which keeps no record, or another model: everything is embedded). Its rows are read
    back, in the order the build wrote them (its record's), to copy the vectors of
    unchanged chunks into the new build; rows written
    since the build (``serve --writable``) are checked against its record
    (`Previous.reusable`)."""
    from llama_index.core.storage.docstore import SimpleDocumentStore

    before = resolve(client, collection)
    entry = recorded_builds(uri, collection).get(before or "")
    if not isinstance(entry, dict) or entry.get("fingerprint") != identity:
        return None
    state, chunks = entry.get(INGESTION_KEY), entry.get(CHUNKS_KEY)
    if not isinstance(state, dict) or chunks is None or before is None:
        return None
    try:
        chunks = check_recorded(chunks)
        docstore = SimpleDocumentStore.from_dict(state)
        rows = stored_rows(client, before)
        position = {chunk: i for i, chunk in enumerate(chunks)}  # the record keeps the order
        rows.sort(key=lambda n: position.get(n.node_id, len(position)))
        return Previous(identity, docstore, rows, chunks)
    except Exception as exc:  # damaged: the build starts over, which repairs it
        logger.warning("embedding everything again: %s is unreadable (%s)", before, exc)
        return None


def stored_rows(client: Any, physical: str) -> list[BaseNode]:
    """Every row of the collection ``physical`` as a node with its dense vector (in the
    order of their keys). A collection that is not loaded (a new process finds it
    released) is loaded for the read and released again after it."""
    loading = not is_loaded(client, physical)
    if loading:
        client.load_collection(physical)
    try:
        return _read_rows(client, physical)
    finally:
        if loading:
            client.release_collection(physical)


def _read_rows(client: Any, physical: str) -> list[BaseNode]:
    """The rows of the loaded collection ``physical``, as `stored_rows` says."""
    from llama_index.core.vector_stores.utils import metadata_dict_to_node

    nodes: list[BaseNode] = []
    # Milvus Lite answers the iterator's timestamp request "not implemented" (logged by
    # grpc and pymilvus) and the iterator goes on with the client's own
    with _held_back(["pymilvus.orm.iterator", "grpc._server"], below=logging.CRITICAL):
        rows = client.query_iterator(physical, batch_size=1000, output_fields=_ROW_FIELDS)
        try:
            while batch := rows.next():
                for row in batch:
                    node = metadata_dict_to_node(row, text=row.get("text"))
                    node.embedding = [float(x) for x in row["embedding"]]
                    nodes.append(node)
        finally:
            rows.close()
    return nodes


#: The loggers of pymilvus and Milvus Lite that log each failed call with a traceback
#: before the error is raised (and reported by us in one line).
_TRACING_LOGGERS = ("pymilvus.decorators", "milvus_lite.adapter.grpc.servicer")


def _untraced() -> AbstractContextManager[None]:
    """Hold back the tracebacks `_TRACING_LOGGERS` log for a failed call while in the
    block."""
    return _held_back(_TRACING_LOGGERS, below=logging.CRITICAL + 1)


@contextmanager
def _held_back(names: Sequence[str], *, below: int) -> Iterator[None]:
    """Drop the records under level ``below`` that the loggers ``names`` log while in
    the block: a filter of its own per use (no logger's level is changed), so
    overlapping uses in threads are safe."""

    def hold(record: logging.LogRecord) -> bool:
        return record.levelno >= below

    targets = [logging.getLogger(name) for name in names]
    for target in targets:
        target.addFilter(hold)
    try:
        yield
    finally:
        for target in targets:
            target.removeFilter(hold)


#: Milvus Lite's message for an index file cut short (a full disk leaves one empty).
_SHORT_FILE = "No data left in file"


def unreadable_reason(uri: str, exc: BaseException) -> str:
    """Milvus's message in ``exc`` (a ``MilvusException``'s own, without its code),
    and, when Milvus Lite found a file cut short, the empty ``*.idx`` files under the
    database at ``uri``: index files a full disk left empty, which Milvus Lite rebuilds
    on load once they are removed (hyde-plus never deletes them itself)."""
    message = str(getattr(exc, "message", "") or exc)
    if _SHORT_FILE not in message or not is_local_uri(uri):
        return message
    folder = Path(uri).expanduser()
    empty = sorted(p for p in folder.rglob("*.idx") if p.is_file() and p.stat().st_size == 0)
    if not empty:
        return message
    shown = ", ".join(str(p) for p in empty[:5]) + (
        f" and {len(empty) - 5} more" if len(empty) > 5 else ""
    )
    return (
        f"{message}; these index files are empty: {shown}. They are index files a full "
        "disk left empty; Milvus Lite rebuilds them from the data on load if you remove "
        "them (only those files)"
    )


@contextmanager
def readable(uri: str, collection: str, doing: str = "cannot read") -> Iterator[None]:
    """Turn an error of Milvus itself (``MilvusException``: a collection it cannot load
    or search, or, ``doing="could not write"``, build) into a `ValueError` naming the
    URI, the collection and Milvus's message, so a command reports it in one line."""
    from pymilvus.exceptions import MilvusException

    try:
        with _untraced():
            yield
    except MilvusException as exc:
        raise ValueError(
            f"Milvus {doing} collection {collection!r} at {redact_uri(uri)}: "
            f"{unreadable_reason(uri, exc)}"
        ) from exc


def _client(uri: str, token: str) -> Any:
    """A client of ``uri``; a `ValueError` naming the URI when it cannot be opened (an
    unreachable server, a file that is not a Milvus Lite database)."""
    from pymilvus import MilvusClient

    local = is_local_uri(uri)
    try:
        return MilvusClient(uri=str(Path(uri).expanduser()) if local else uri, token=token)
    except Exception as exc:
        what = "is not a Milvus Lite database or is in use" if local else "does not answer"
        raise ValueError(
            f"cannot open Milvus at {redact_uri(uri)}: it {what} ({type(exc).__name__})"
        ) from exc


def read_milvus_meta(
    uri: str, collection: str = DEFAULT_COLLECTION, *, token: str = ""
) -> dict[str, Any] | None:
    """How a local collection was embedded (None for a cluster or an unknown file)."""
    uri = check_uri(uri)
    entries = recorded_builds(uri, collection)
    if not entries or not is_database(uri):
        return None
    physical = resolve(_client(uri, token), collection)
    entry = entries.get(physical) if physical else None
    if not isinstance(entry, dict):
        return None
    return {k: v for k, v in entry.items() if k not in (INGESTION_KEY, CHUNKS_KEY)}


def load_milvus_index(
    uri: str,
    embed_model: BaseEmbedding,
    *,
    collection: str = DEFAULT_COLLECTION,
    token: str = "",
    ranker: Ranker = "rrf",
) -> VectorStoreIndex:
    """Open an existing hybrid collection (loading it into memory if this process has
    not), checking that ``embed_model`` is the one it was built with."""
    uri = check_uri(uri)
    if is_local_uri(uri) and not is_database(uri):
        raise ValueError(
            f"no Milvus Lite database at {uri}; build one with "
            "`hyde-plus index DIR --store milvus --uri PATH`"
        )
    client = _client(uri, token)
    physical = resolve(client, collection)
    if physical is None:
        raise ValueError(
            f"no collection {collection!r} at {redact_uri(uri)}; build it with `hyde-plus "
            f"index DIR --store milvus --uri {redact_uri(uri)} --collection {collection}`"
        )
    where = f"Milvus collection {collection!r} at {redact_uri(uri)}"
    meta = read_milvus_meta(uri, collection, token=token) or {}
    dim = _dense_dim(client, physical)
    if dim is not None:
        meta.setdefault("dim", dim)
    check_embedding_model(where, meta, embed_model)
    if not is_loaded(client, physical):
        client.load_collection(physical)  # a new process finds it released
    store = milvus_store(uri, collection=physical, dim=dim, token=token, ranker=ranker)
    return VectorStoreIndex.from_vector_store(store, embed_model=embed_model)


def is_loaded(client: Any, physical: str) -> bool:
    """Whether the collection ``physical`` is loaded (searchable) on the server."""
    from pymilvus.client.types import LoadState

    return bool(client.get_load_state(physical).get("state") == LoadState.Loaded)


def _dense_dim(client: Any, physical: str) -> int | None:
    try:
        fields = client.describe_collection(physical).get("fields", [])
    except Exception:
        return None
    for f in fields:
        params = f.get("params") or {}
        if "dim" in params:
            return int(params["dim"])
    return None


#: LlamaIndex's query mode and our search type for each RCP mode a Milvus store has.
#: ``sparse`` (BM25 alone) is searched here (`MilvusHybridRetriever._bm25`), not by
#: LlamaIndex, whose sparse search asks for ``drop_ratio_search=0.2``: Milvus Lite
#: refuses any ratio but 0.
_MODES = {
    "hybrid": ("hybrid", "hybrid"),
    "dense": ("default", "dense"),
    "sparse": ("default", "keyword"),
}


class MilvusHybridRetriever(BaseRetriever):
    """Milvus hybrid search (BM25 + dense, fused by Milvus) as a LlamaIndex retriever;
    with ``mode="dense"`` the dense vectors alone, with ``mode="sparse"`` BM25 alone.

    Its async path runs the synchronous client in a worker thread: pymilvus's async
    client binds to the first event loop that uses it and fails in any later one (each
    ``asyncio.run``, each notebook cell), so it is not used.
    """

    search_type = "hybrid"

    def __init__(self, index: VectorStoreIndex, top_k: int = 10, mode: str = "hybrid") -> None:
        super().__init__()
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}, not {mode!r}")
        query_mode, self.search_type = _MODES[mode]
        self.mode = mode
        self._inner = index.as_retriever(vector_store_query_mode=query_mode, similarity_top_k=top_k)

        self._embed_model = index._embed_model
        self._vector_store = index.vector_store
        """Where `DocVectors` reads stored vectors (feedback, the stand-in's copies)."""
        self._dim = getattr(index.vector_store, "dim", None)
        name = str(getattr(index.vector_store, "collection_name", ""))
        self._where = f"Milvus collection {name!r}"
        self.where = (str(getattr(index.vector_store, "uri", "") or ""), name)
        """The URI and collection named when Milvus fails a search (`readable`)."""
        self.similarity_top_k = top_k
        """How many hits a search returns (what `TransformRetriever` cuts a fan-out to)."""

    def _checked(self, query_bundle: QueryBundle) -> QueryBundle:
        """Embed the query here (as the inner retriever would) to check its dimension:
        Milvus itself answers a wrong one with an opaque RPC error."""
        if query_bundle.embedding is None and query_bundle.embedding_strs:
            query_bundle.embedding = self._embed_model.get_agg_embedding_from_queries(
                query_bundle.embedding_strs
            )
        got = len(query_bundle.embedding or [])
        if self._dim and got and got != self._dim:
            raise EmbeddingMismatchError(
                f"{self._where} holds {self._dim}-d vectors but the query embedding has "
                f"{got} dimensions; query with the embedding model it was built with"
            )
        return query_bundle

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        """The hits, searched while no write of this process is between its upsert and
        its delete (`milvus_rows.RowsLock`): a document is seen whole, old or new. The
        query is embedded before, outside the lock."""
        lock = getattr(self._vector_store, "rows_lock", None)
        with readable(*self.where):
            if self.mode != "sparse":
                query_bundle = self._checked(query_bundle)
            with lock.shared() if lock is not None else nullcontext():
                if self.mode == "sparse":
                    return self._bm25(query_bundle.query_str)
                return self._inner.retrieve(query_bundle)

    def _bm25(self, query: str) -> list[NodeWithScore]:
        """BM25 alone: Milvus's full-text search of the sparse field its BM25 function
        fills from the text. The score is the BM25 score (Milvus Lite reports it
        negated as a distance, a cluster as is: BM25 is never negative, so its
        magnitude is the score either way), best first."""
        store: Any = self._vector_store
        found = store.client.search(
            collection_name=store.collection_name,
            data=[query],
            anns_field=store.sparse_embedding_field,
            limit=self.similarity_top_k,
            output_fields=["*"],
            search_params={"params": {"drop_ratio_search": 0.0}},
        )
        nodes, scores, _ = store._parse_from_milvus_results(found)
        hits = [
            NodeWithScore(node=n, score=abs(float(s))) for n, s in zip(nodes, scores, strict=True)
        ]
        return sorted(hits, key=lambda h: -(h.score or 0.0))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        """`_retrieve` on this retriever's own worker threads (never the event loop's
        default executor, which the app's own jobs may fill); cancelling abandons it."""
        call = partial(self._retrieve, query_bundle)
        return await door.arun(call, on=self, kind="store", what="Milvus")


def hybrid_retriever(index: VectorStoreIndex, top_k: int = 10) -> MilvusHybridRetriever:
    """A retriever that runs Milvus hybrid search (BM25 + dense, fused by Milvus)."""
    return MilvusHybridRetriever(index, top_k)


class MilvusStore(Store):
    """Collection (an alias) ``collection`` at ``uri``: a Milvus Lite file path or a
    cluster URL with ``token``. Needs the ``milvus`` extra."""

    kind: ClassVar[str] = "milvus"
    modes: ClassVar[tuple[str, ...]] = ("hybrid", "dense", "sparse")
    search: ClassVar[str] = "BM25 + dense"
    title: ClassVar[str] = "Milvus"
    address: ClassVar[str] = "uri"
    address_help: ClassVar[str] = "a Milvus Lite file path or a URL"
    vector_store_class: ClassVar[str] = "MilvusVectorStore"

    def __init__(self, uri: str, *, collection: str = DEFAULT_COLLECTION, token: str = "") -> None:
        from ..models import require_extra

        require_extra("milvus", ("pymilvus", "llama_index.vector_stores.milvus"), "--store milvus")
        check_collection_name(collection)
        self.uri, self.collection, self.token = check_uri(uri), collection, token

    @classmethod
    def at(
        cls, *, path: Path | None, uri: str | None, collection: str | None, token: str
    ) -> MilvusStore:
        assert uri is not None, "a Milvus store is a URI"
        return cls(uri, collection=collection or DEFAULT_COLLECTION, token=token)

    @property
    def location(self) -> str:
        return f"collection {self.collection!r} at {redact_uri(self.uri)}"

    def check_target(self, docs: Path | None = None) -> None:
        """The `Store.check_target` checks, and that ``collection`` is not a name the
        user's own collection or alias has (asked of the database when it exists, so the
        refusal comes before the embedding model loads)."""
        if not is_local_uri(self.uri):
            check_name_is_ours(_client(self.uri, self.token), self.uri, self.collection)
            return
        self._check_local(docs)
        if is_database(self.uri):
            check_name_is_ours(_client(self.uri, self.token), self.uri, self.collection)

    def _check_local(self, docs: Path | None) -> None:
        target = Path(self.uri)  # absolute, links resolved, checked (`check_uri`)
        source = docs.expanduser().resolve() if docs is not None else None
        if source is not None and (target == source or source in target.parents):
            raise ValueError(f"--uri {self.uri} is inside the documents folder {docs}")
        recorded_builds(self.uri, self.collection)  # a `ValueError` for a user's or damaged file

    def _build(
        self, documents: Sequence[Document], embed_model: BaseEmbedding, settings: BuildSettings
    ) -> IndexInfo:
        start = time.perf_counter()
        with readable(self.uri, self.collection, "could not write"):  # a full disk, say
            index = build_milvus_index(
                documents,
                embed_model,
                self.uri,
                collection=self.collection,
                token=self.token,
                **settings.as_kwargs(),
            )
        meta = self.meta() or {}
        chunks = int(meta.get("chunks") or len(index.index_struct.nodes_dict) or len(documents))
        dim = int(meta.get("dim") or len(embed_model.get_query_embedding("dimension probe")))
        seconds = time.perf_counter() - start
        return IndexInfo(
            self.location,
            len(documents),
            dim,
            settings.embed_spec,
            settings.max_length,
            seconds,
            chunks,
            int(meta.get("embedded", chunks)),
            int(meta.get("reused", 0)),
            meta.get("unchanged") is True,
        )

    def meta(self) -> dict[str, Any] | None:
        return read_milvus_meta(self.uri, self.collection, token=self.token)

    def load(self, embed_model: BaseEmbedding) -> VectorStoreIndex:
        with readable(self.uri, self.collection):
            return load_milvus_index(
                self.uri, embed_model, collection=self.collection, token=self.token
            )

    def retriever(self, index: VectorStoreIndex, top_k: int) -> BaseRetriever:
        return self.mode_retriever(index, top_k, "hybrid")

    def mode_retriever(self, index: VectorStoreIndex, top_k: int, mode: str) -> BaseRetriever:
        retriever = MilvusHybridRetriever(index, top_k, mode)
        retriever.where = (self.uri, self.collection)
        return retriever

    def writer(self, index: VectorStoreIndex, embed_model: BaseEmbedding) -> Any:
        """A `MilvusWriter` of the collection ``index`` was loaded from: documents
        embedded with ``embed_model`` and chunked as the build recorded."""
        from ..server.index_writes import MilvusWriter, chunking_from_meta

        return MilvusWriter(index, embed_model, chunking_from_meta(self.meta()))
