"""The eval index cache: one index per corpus content and embedding, in a FAISS folder
under the cache root or a Milvus collection, reused by every later run."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from llama_index.core import VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding

from ..stores import FaissStore, Store, store_for
from ..stores.choice import store_classes
from .beir import BeirDataset


class Advance(Protocol):
    """``advance(n, fell_back=0, note="")``: ``n`` more items done, ``fell_back`` of them
    fell back to plain search (a progress bar shows the running count); ``note`` is
    shown beside it (``"2 in flight"`` once the pace was narrowed)."""

    def __call__(self, n: int, fell_back: int = 0, note: str = "") -> None: ...


ProgressFactory = Callable[[str, int], Advance]
"""``start(description, total)`` returns an `Advance`; the CLI draws progress bars."""

logger = logging.getLogger(__name__)


def _corpus_key(ds: BeirDataset, embed_label: str) -> str:
    """What a cached index depends on: the corpus content, what of it is embedded
    (titles or not: `BeirDataset.titled`) and the embedding."""
    embedded = "" if ds.titled else "|text alone"
    return hashlib.sha256(f"{ds.corpus_sha256}|{embed_label}{embedded}".encode()).hexdigest()


def index_cache_dir(ds: BeirDataset, embed_label: str, root: Path) -> Path:
    """Where the FAISS index of ``ds`` under ``embed_label`` lives in the cache."""
    return root / "indexes" / corpus_index_name(ds, embed_label)


def corpus_index_name(ds: BeirDataset, embed_label: str) -> str:
    """The name of the index of ``ds`` under ``embed_label`` in any store: the
    dataset's name (its first `NAME_CHARS` characters: a file name has 255 at most)
    and a key of its content and embedding."""
    return re.sub(r"\W", "_", ds.name)[:NAME_CHARS] + "-" + _corpus_key(ds, embed_label)[:20]


NAME_CHARS = 64
"""The most characters of a data set's name in the name of its index."""


def eval_store(
    ds: BeirDataset,
    embed_label: str,
    root: Path,
    kind: str = "faiss",
    uri: str | None = None,
    token: str = "",
) -> Store:
    """The store the index of ``ds`` is cached in: a FAISS folder under ``root``, or a
    collection at the Milvus ``uri``."""
    if store_classes().get(kind, FaissStore).address == "folder":  # as `index_cache_dir`
        name = corpus_index_name(ds, embed_label)
    else:
        name = re.sub(r"\W", "_", f"{ds.name}_{_corpus_key(ds, embed_label)[:12]}")
    return store_for(kind, name, root=root, uri=uri, token=token)


def cached_index(
    ds: BeirDataset,
    store: Store,
    embed_model: BaseEmbedding,
    embed_label: str,
    *,
    max_length: int = 256,
    batch_size: int = 32,
    progress: ProgressFactory | None = None,
    vectors: Mapping[str, Sequence[float]] | None = None,
) -> tuple[VectorStoreIndex, float, bool]:
    """``(index, build seconds, reused)``: the index of ``ds`` in ``store``, reused
    when it was built from the same corpus and embedding, else built (from
    ``vectors``, each document's stored vector, when given: no embedding). A cached
    index that cannot be read (a damaged file) is built again, with a warning: it is
    a cache, not the user's index."""
    meta = store.meta()
    if meta is not None and meta.get("embed") == embed_label:
        try:
            return store.load(embed_model), 0.0, True
        except ValueError as exc:
            logger.warning(
                "the cached index %s cannot be read (%s); building it again", store.location, exc
            )
    docs = ds.documents()
    what = "Embedding corpus"
    if vectors is not None:  # an index's own vectors, reused: nothing is embedded again
        what = "Indexing stored vectors"
        for doc in docs:
            doc.embedding = list(vectors[doc.doc_id])
    advance = progress(f"{what} ({store.kind})", len(docs)) if progress else None
    info = store.build(
        docs,
        embed_model,
        embed_spec=embed_label,
        max_length=max_length,
        batch_size=batch_size,
        progress=advance,
    )
    return store.load(embed_model), info.seconds, False


def check_holds(index: VectorStoreIndex, texts: Mapping[str, str], where: str) -> None:
    """A `ValueError` unless ``index`` holds exactly the chunks of ``texts`` (id ->
    text): each by id with the same text, and no other (an index reused for ``--docs``
    must be of exactly those chunks, none of a document since removed)."""
    differ = []
    for doc_id, text in texts.items():
        node = index.docstore.get_node(doc_id, raise_error=False)
        if node is None or node.get_content() != text:
            differ.append(doc_id)
    extra = sorted(set(index.index_struct.nodes_dict.values()) - set(texts))
    if differ or extra:
        said = []
        if differ:
            said.append(f"{len(differ)} of {len(texts)} missing or changed, e.g. {differ[0]!r}")
        if extra:
            said.append(f"{len(extra)} no longer in the documents, e.g. {extra[0]!r}")
        raise ValueError(
            f"--index {where} does not hold the same chunks as the documents "
            f"({'; '.join(said)}); rebuild it with `hyde-plus index` on them, or leave "
            "out --index"
        )
