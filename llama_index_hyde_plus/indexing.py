"""Build, persist and load a FAISS index on disk (the embedded default store).

An index folder holds LlamaIndex's storage files, the FAISS index, and
``hyde_plus.json`` recording how it was embedded, so a query embeds the same way.
``hyde_plus.json`` also names the data folder inside the index (``data-<id>``): a
build writes a new data folder and switches the metadata file to it with one atomic
rename, so an interrupted build never leaves a half-written index and never loses the
previous one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llama_index.core import Document, StorageContext, VectorStoreIndex, load_index_from_storage
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import BaseNode, MetadataMode, TextNode

from ._files import STAGING_MARKER, is_marked_staging, make_folder_beside
from .chunking import Chunking, Tokenizer, split_documents, tokenizer_for

logger = logging.getLogger(__name__)

META_FILE = "hyde_plus.json"
CURRENT_LINK = "current"
"""The link inside an index folder to its data folder in use: a stable path that plain
LlamaIndex opens (``StorageContext.from_defaults(persist_dir=...)``); a build switches
it atomically (a new link renamed over it)."""
ProgressFn = Callable[[int], None]
TotalFn = Callable[[int], None]
"""Told the number of texts to embed (chunks or documents) before any progress."""


@dataclass(frozen=True)
class IndexInfo:
    """What a build wrote: where (an index folder, or a Milvus URI and collection),
    how many documents (and ``chunks``, the nodes they were split into: as many as the
    documents without chunking), the vector size, the embedding and how long it took."""

    location: str
    documents: int
    dim: int
    embed: str
    max_length: int
    seconds: float
    chunks: int = 0

    def __post_init__(self) -> None:
        if not self.chunks:
            object.__setattr__(self, "chunks", self.documents)

    @property
    def path(self) -> Path:
        """``location`` as a path (a FAISS index folder)."""
        return Path(self.location)

    @property
    def docs_per_second(self) -> float:
        return self.documents / self.seconds if self.seconds else 0.0


def check_index_target(out: Path, docs: Path | None = None) -> Path:
    """``out`` resolved, if an index may be written there; else a `ValueError` saying why.

    The target must be absent, an empty folder, or a hyde-plus index (it holds
    ``hyde_plus.json``): anything else could be someone's files, and a build replaces
    the folder. It may not be the documents folder ``docs`` or a folder above it.
    """
    target = out.expanduser().resolve()
    if target.exists() and not target.is_dir():
        raise ValueError(
            f"--out {out} is a file, not a folder; give a new or empty folder for the index"
        )
    if docs is not None:
        source = docs.expanduser().resolve()
        if target == source or target in source.parents:
            raise ValueError(
                f"--out {out} is the documents folder or contains it; "
                "write the index to a separate folder"
            )
    if target.is_dir() and not (target / META_FILE).is_file() and any(target.iterdir()):
        raise ValueError(
            f"--out {out} is a folder that is neither empty nor a hyde-plus index "
            f"(no {META_FILE}); refusing to replace it: choose a new or empty folder"
        )
    return target


def _batches(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def nodes_from_documents(
    documents: Sequence[Document],
    chunking: Chunking | None = None,
    tokenizer: Tokenizer | None = None,
) -> list[TextNode]:
    """The nodes to embed: one per document keeping its id without ``chunking`` (as
    BEIR scoring by document id needs), else the chunks of `split_documents` (counted
    with ``tokenizer``). Metadata (source, title...) is kept but not embedded or shown
    to the LLM (the title is already in the text). Two documents with one id, or a
    chunk id that is also a document's, are a `ValueError`: one would replace the other."""
    seen: set[str] = set()
    for d in documents:
        if d.doc_id in seen:
            raise ValueError(f"duplicate document id {d.doc_id!r}; give every document its own")
        seen.add(d.doc_id)
    if chunking is not None:
        nodes = split_documents(documents, chunking, tokenizer)
        ids = [n.node_id for n in nodes]
        if len(set(ids)) != len(ids):
            clash = next(i for i in ids if ids.count(i) > 1)
            raise ValueError(
                f"chunk id {clash!r} is also another document's id; rename that document"
            )
        return nodes
    return [
        TextNode(
            id_=d.doc_id,
            text=d.text,
            metadata=dict(d.metadata),
            excluded_embed_metadata_keys=list(d.metadata),
            excluded_llm_metadata_keys=list(d.metadata),
            embedding=d.embedding,
        )
        for d in documents
    ]


def prepare_nodes(
    documents: Sequence[Document],
    embed_model: BaseEmbedding,
    chunking: Chunking | None,
    max_length: int,
) -> tuple[list[TextNode], dict[str, Any] | None]:
    """``(nodes, chunking settings to record)`` for a build: chunks counted in the
    tokens of ``embed_model`` when ``chunking`` is given (checked against
    ``max_length`` first), else one node per document and None."""
    if chunking is None:
        return nodes_from_documents(documents), None
    chunking.check(max_length)
    name, tokenizer = tokenizer_for(embed_model)
    return nodes_from_documents(documents, chunking, tokenizer), chunking.as_meta(name)


def check_batch_size(batch_size: int) -> None:
    """A `ValueError` naming ``--batch-size`` unless it is a whole number of at least 1."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"--batch-size must be a whole number of at least 1, not {batch_size!r}")


def embed_nodes(
    nodes: Sequence[BaseNode],
    embed_model: BaseEmbedding,
    *,
    batch_size: int = 64,
    progress: ProgressFn | None = None,
) -> None:
    """Set ``node.embedding`` on every node that has none, in batches, reporting
    progress (a node that already carries a vector, such as a document built from an
    index's stored vectors, is counted but not embedded again).

    The nodes are embedded shortest text first, so texts of similar length share a
    batch and little of each batch is padding; ``nodes`` itself keeps its order."""
    check_batch_size(batch_size)
    if progress is not None and any(n.embedding is not None for n in nodes):
        progress(sum(1 for n in nodes if n.embedding is not None))
    texts = [n.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes]
    todo = [i for i, n in enumerate(nodes) if n.embedding is None]
    order = sorted(todo, key=lambda i: len(texts[i]))
    for batch in _batches(order, batch_size):
        vectors = embed_model.get_text_embedding_batch([texts[i] for i in batch])
        for i, vector in zip(batch, vectors, strict=True):
            nodes[i].embedding = vector
        if progress is not None:
            progress(len(batch))


def build_faiss_index(
    documents: Sequence[Document],
    embed_model: BaseEmbedding,
    out: Path,
    *,
    embed_spec: str,
    max_length: int,
    batch_size: int = 64,
    progress: ProgressFn | None = None,
    chunking: Chunking | None = None,
    total: TotalFn | None = None,
) -> IndexInfo:
    """Embed ``documents`` (one node each, or chunks with ``chunking``) into a FAISS
    inner-product index at ``out``."""
    import faiss
    from llama_index.vector_stores.faiss import FaissVectorStore

    out = check_index_target(out)
    start = time.perf_counter()
    nodes, chunk_meta = prepare_nodes(documents, embed_model, chunking, max_length)
    if total is not None:
        total(len(nodes))
    embed_nodes(nodes, embed_model, batch_size=batch_size, progress=progress)
    dim = len(nodes[0].embedding or [])
    store = FaissVectorStore(faiss_index=faiss.IndexFlatIP(dim))
    storage = StorageContext.from_defaults(vector_store=store)
    index = VectorStoreIndex(nodes, storage_context=storage, embed_model=embed_model)
    seconds = time.perf_counter() - start

    info = IndexInfo(str(out), len(documents), dim, embed_spec, max_length, seconds, len(nodes))
    meta = {
        "format": 2,
        "documents": info.documents,
        "chunks": info.chunks,
        "chunking": chunk_meta,
        "dim": dim,
        "embed": embed_spec,
        "embed_model": embedding_model_name(embed_model),
        "max_length": max_length,
        "build_seconds": round(seconds, 3),
    }
    _write_index(out, index.storage_context, meta)
    return info


def embedding_model_name(embed_model: BaseEmbedding) -> str:
    """The name recorded beside an index (and checked when it is queried)."""
    return str(getattr(embed_model, "model_name", None) or type(embed_model).__name__)


def pause_for_tests(stage: str) -> None:
    """Test hook: with ``HYDE_PLUS_TEST_PAUSE_BEFORE_SWITCH=FILE`` set, create FILE
    (holding ``stage``) and wait while it exists, so a test can kill the build at
    the moment an interruption would hurt most (new data written, not switched in)."""
    flag = os.environ.get("HYDE_PLUS_TEST_PAUSE_BEFORE_SWITCH")
    if not flag:
        return
    path = Path(flag)
    path.write_text(stage)
    while path.exists():
        time.sleep(0.05)


def _write_index(out: Path, storage: StorageContext, meta: dict[str, Any]) -> None:
    """Write the storage files into a fresh data folder and switch ``hyde_plus.json`` to
    it in one atomic rename; the previous index stays whole and usable until then.

    ``out/hyde_plus.json`` names its data folder (``out/data-<id>``). A new target is
    built in a hidden folder beside it and renamed into place; an existing index gets
    the new data folder inside it, then its metadata file is replaced atomically, then
    the old data is removed. Leftovers of interrupted builds are removed on the way.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale_builds(out)
    try:
        _write_data(out, storage, meta)
    except FileNotFoundError as exc:  # another build's cleanup took our staging folder
        raise ValueError(
            f"another build of {out} ran at the same time and removed this one's files; "
            "the index is whole (the other build's); build one at a time"
        ) from exc


def _write_data(out: Path, storage: StorageContext, meta: dict[str, Any]) -> None:
    data = f"data-{uuid.uuid4().hex[:12]}"
    meta = {**meta, "data": data}
    if out.is_dir() and (out / META_FILE).is_file():
        storage.persist(persist_dir=str(out / data))
        pending = out / f".{META_FILE}.{uuid.uuid4().hex[:8]}.tmp"
        pending.write_text(json.dumps(meta, indent=2))
        pause_for_tests("faiss")
        os.replace(pending, out / META_FILE)  # the switch
        point_current(out, data)
        _clean_index_folder(out, keep=data)
        return
    tmp = make_folder_beside(out.parent, _staging_prefix(out), marked=True)
    try:
        storage.persist(persist_dir=str(tmp / data))
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        point_current(tmp, data)
        pause_for_tests("faiss")
        os.rename(tmp, out)  # out is absent or an empty folder: both are replaced atomically
        (out / STAGING_MARKER).unlink(missing_ok=True)
    finally:
        if is_marked_staging(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def point_current(out: Path, data: str) -> None:
    """Point ``out/current`` at ``out/data`` in one step: a new relative link is made
    beside it and renamed over it, so a reader sees the old data folder or the new one,
    never a missing link. A ``current`` that is not a link (the user's) is left alone."""
    link = out / CURRENT_LINK
    if link.exists() and not link.is_symlink():
        logger.warning("%s is not a link; the stable path was not updated", link)
        return
    pending = out / f".{CURRENT_LINK}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        pending.symlink_to(data, target_is_directory=True)
        os.replace(pending, link)
    except OSError as exc:  # a file system without links: the metadata still names it
        pending.unlink(missing_ok=True)
        logger.warning("could not link %s to %s (%s)", link, data, exc)


def _current_target(out: Path) -> str | None:
    """The data folder name ``out/current`` links to, if it is such a link."""
    link = out / CURRENT_LINK
    return os.readlink(link) if link.is_symlink() else None


def _is_link_draft(entry: Path) -> bool:
    """A link an interrupted `point_current` left (``.current.<id>.tmp``)."""
    name = entry.name
    return name.startswith(f".{CURRENT_LINK}.") and name.endswith(".tmp") and entry.is_symlink()


#: What a format-1 index kept at its top level, removed once a new build replaces it.
_LEGACY_FILES = (
    "docstore.json",
    "index_store.json",
    "graph_store.json",
    "default__vector_store.json",
    "image__vector_store.json",
)


_DATA_NAME = re.compile(r"data-[0-9a-f]{12}")
#: What a data folder holds: LlamaIndex's storage files (and nothing else).
_DATA_FILES = frozenset(_LEGACY_FILES)


def _staging_prefix(out: Path) -> str:
    return f".{out.name}.build-"


def _is_data_folder(entry: Path) -> bool:
    """Whether ``entry`` is a data folder a build wrote: a real folder named
    ``data-<12 hex>`` holding only LlamaIndex storage files (its name alone is not
    enough for it to be deleted)."""
    if not _DATA_NAME.fullmatch(entry.name) or entry.is_symlink() or not entry.is_dir():
        return False
    try:
        return all(f.name in _DATA_FILES and f.is_file() for f in entry.iterdir())
    except OSError:
        return False


def _is_draft(entry: Path) -> bool:
    """A metadata draft a build left (``.hyde_plus.json.<id>.tmp``, a plain file)."""
    name = entry.name
    return (
        name.startswith(f".{META_FILE}.")
        and name.endswith(".tmp")
        and entry.is_file()
        and not entry.is_symlink()
    )


def _clean_index_folder(out: Path, keep: str) -> None:
    for entry in out.iterdir():
        name = entry.name
        if name in (keep, META_FILE):
            continue
        if _is_data_folder(entry):
            shutil.rmtree(entry, ignore_errors=True)
        elif (
            _is_draft(entry)
            or _is_link_draft(entry)
            or (
                name in (*_LEGACY_FILES, STAGING_MARKER)
                and entry.is_file()
                and not entry.is_symlink()
            )
        ):
            entry.unlink(missing_ok=True)


def _clean_stale_builds(out: Path) -> None:
    """Remove what interrupted builds of ``out`` left: the staging folders beside it
    (named ``.<out>.build-*`` and holding this tool's marker file: nothing else is
    touched), and data folders or metadata drafts inside it that its metadata does not
    name."""
    if out.parent.is_dir():
        prefix = _staging_prefix(out)
        for entry in out.parent.iterdir():
            if entry.name.startswith(prefix) and is_marked_staging(entry):
                shutil.rmtree(entry, ignore_errors=True)
    if out.is_dir() and (out / META_FILE).is_file():
        try:
            current = str(read_meta(out).get("data") or "")
        except ValueError:
            return  # a corrupt metadata file: leave everything for the user to see
        linked = _current_target(out)  # in use too, if a build died before relinking
        for entry in out.iterdir():
            if _is_link_draft(entry):
                entry.unlink(missing_ok=True)
            elif entry.name not in (current, linked) and (
                _is_data_folder(entry) or _is_draft(entry)
            ):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)


def read_meta(path: Path) -> dict[str, Any]:
    """The metadata of the index at ``path`` (a `ValueError` naming the file if it is
    missing or unreadable)."""
    meta_path = path / META_FILE
    if not path.exists():
        raise ValueError(
            f"index {path} does not exist; build one with `hyde-plus index DIR --out {path}`"
        )
    if not meta_path.is_file():
        hint = " (a Milvus Lite database? open it with --uri)" if path.suffix == ".db" else ""
        raise ValueError(
            f"{path} is not a hyde-plus index (no {META_FILE}){hint}; build one with "
            "`hyde-plus index DIR --out PATH`"
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(
            f"{meta_path} is corrupt ({exc}); rebuild the index with "
            f"`hyde-plus index DIR --out {path}`"
        ) from exc
    if not isinstance(meta, dict):
        raise ValueError(
            f"{meta_path} is corrupt (not a JSON object); rebuild the index with "
            f"`hyde-plus index DIR --out {path}`"
        )
    return dict(meta)


class EmbeddingMismatchError(ValueError):
    """The query embedding does not match the one the index was built with."""


def _dimension_error(where: str, index_dim: int, query_dim: int) -> EmbeddingMismatchError:
    return EmbeddingMismatchError(
        f"{where} holds {index_dim}-d vectors but the query embedding has {query_dim} "
        "dimensions; query with the embedding model the index was built with, or rebuild it"
    )


def check_embedding_model(where: str, meta: dict[str, Any], embed_model: BaseEmbedding) -> None:
    """Raise `EmbeddingMismatchError` when ``meta`` records another embedding model."""
    recorded = meta.get("embed_model")
    in_use = embedding_model_name(embed_model)
    if recorded and str(recorded) != in_use:
        raise EmbeddingMismatchError(
            f"{where} was embedded with {recorded!r} but the query uses {in_use!r}; "
            "use the same embedding model (or rebuild the index with this one)"
        )
    dim = getattr(embed_model, "dim", None)
    if isinstance(dim, int) and isinstance(meta.get("dim"), int) and dim != meta["dim"]:
        raise _dimension_error(where, int(meta["dim"]), dim)


def _checked_faiss_store(faiss_index: Any, where: str) -> Any:
    """A `FaissVectorStore` whose queries check the embedding dimension first (FAISS
    itself aborts with a bare assertion)."""
    from llama_index.core.vector_stores.types import VectorStoreQuery, VectorStoreQueryResult
    from llama_index.vector_stores.faiss import FaissVectorStore

    class CheckedFaissVectorStore(FaissVectorStore):
        def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
            got = len(query.query_embedding or [])
            if got != faiss_index.d:
                raise _dimension_error(where, int(faiss_index.d), got)
            return super().query(query, **kwargs)

    return CheckedFaissVectorStore(faiss_index=faiss_index)  # type: ignore[call-arg]


def _rebuild_hint(path: Path) -> str:
    return f"rebuild it with `hyde-plus index DIR --out {path}`"


def data_folder(path: Path, meta: dict[str, Any]) -> Path:
    """The data folder ``meta`` names inside the index at ``path`` (``path`` itself for
    a format-1 index, which names none). Only a plain child name is followed: ``..``,
    a path with a separator, an absolute path, or a link leading out of the index is a
    `ValueError` (the index is damaged or was tampered with)."""
    name: object = meta.get("data")
    if name is None:
        return path
    plain = (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\\x00")
        and Path(name).name == name
    )
    if plain and isinstance(name, str):
        data = path / name
        if not data.is_symlink() or data.resolve().parent == path.resolve():
            return data
    raise ValueError(
        f"{path / META_FILE}: 'data' must name a folder inside the index, not {name!r:.80}; "
        f"{_rebuild_hint(path)}"
    )


def load_faiss_index(path: Path, embed_model: BaseEmbedding) -> VectorStoreIndex:
    """Load an index written by `build_faiss_index`.

    A `ValueError` names what is wrong (a missing or truncated file, a corrupt
    metadata file, another embedding model than the one it was built with)."""
    import faiss

    path = path.expanduser()
    meta = read_meta(path)
    check_embedding_model(f"the index at {path}", meta, embed_model)
    data = data_folder(path, meta)
    vectors = data / "default__vector_store.json"
    for required in ("docstore.json", "index_store.json", vectors.name):
        if not (data / required).is_file():
            raise ValueError(f"the index at {path} has no {data / required}; {_rebuild_hint(path)}")
    try:
        faiss_index = faiss.read_index(str(vectors))
    except RuntimeError as exc:
        raise ValueError(
            f"the vector store {vectors} is unreadable (truncated or corrupt); "
            f"{_rebuild_hint(path)}"
        ) from exc
    store = _checked_faiss_store(faiss_index, f"the index at {path}")
    try:
        storage = StorageContext.from_defaults(vector_store=store, persist_dir=str(data))
        index = load_index_from_storage(storage, embed_model=embed_model)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"the index files in {data} are unreadable ({exc}); {_rebuild_hint(path)}"
        ) from exc
    assert isinstance(index, VectorStoreIndex)
    if faiss_index.ntotal != len(index.index_struct.nodes_dict):
        raise ValueError(
            f"the vector store {vectors} holds {faiss_index.ntotal} vectors but the index "
            f"lists {len(index.index_struct.nodes_dict)} documents; {_rebuild_hint(path)}"
        )
    _check_docstore(index, data / "docstore.json", path)
    return index


def _check_docstore(index: VectorStoreIndex, docstore: Path, path: Path) -> None:
    """A `ValueError` when the document store lacks a node the index lists (a
    ``docstore.json`` emptied to ``{}`` or ``[]`` loads, then fails every search)."""
    ids = list(index.index_struct.nodes_dict.values())
    try:
        missing = sum(not index.docstore.document_exists(node_id) for node_id in ids)
    except Exception as exc:  # a docstore.json of the wrong shape fails inside LlamaIndex
        raise ValueError(
            f"the document store {docstore} is unreadable ({type(exc).__name__}); "
            f"{_rebuild_hint(path)}"
        ) from exc
    if missing:
        raise ValueError(
            f"the document store {docstore} lacks {missing} of the {len(ids)} documents the "
            f"index lists; {_rebuild_hint(path)}"
        )


def load_index(path: Path | str, embed: str | None = None) -> VectorStoreIndex:
    """The FAISS index folder ``path`` (as `hyde-plus index` writes it) as a LlamaIndex
    ``VectorStoreIndex``, with the embedding model recorded at indexing (or ``embed``,
    a model spec such as ``openai:text-embedding-3-small``), so queries embed alike."""
    from .stores import FaissStore

    store = FaissStore(path)
    return store.load(store.embedding_model(embed))
