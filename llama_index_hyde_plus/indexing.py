"""Build, persist and load a FAISS index on disk (the embedded default store).

An index folder holds LlamaIndex's storage files, the FAISS index, and
``hyde_plus.json`` recording how it was embedded, so a query embeds the same way.
A build writes into a temporary folder beside the target and renames it into place
at the end: an interrupted build never leaves a half-written index.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llama_index.core import Document, StorageContext, VectorStoreIndex, load_index_from_storage
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import BaseNode, TextNode

META_FILE = "hyde_plus.json"
ProgressFn = Callable[[int], None]


@dataclass(frozen=True)
class IndexInfo:
    path: Path
    documents: int
    dim: int
    embed: str
    max_length: int
    seconds: float

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


def read_documents(folder: Path) -> list[Document]:
    """Documents from ``folder``: ``.txt``/``.md`` files (one document each) and
    ``.jsonl`` files (one per line, ``text`` plus optional ``title`` and ``_id``/``id``)."""
    if not folder.is_dir():
        raise ValueError(f"DIR must be a folder: {folder}")
    docs: list[Document] = []
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        rel = str(path.relative_to(folder))
        if path.suffix.lower() in (".txt", ".md"):
            text = path.read_text(encoding="utf-8", errors="replace").strip()
            if text:
                docs.append(Document(text=text, id_=rel, metadata={"source": rel}))
        elif path.suffix.lower() == ".jsonl":
            for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    text = str(row["text"]).strip()
                except (ValueError, KeyError, TypeError) as exc:
                    raise ValueError(f"{rel}:{lineno}: expected JSON with a 'text' field") from exc
                doc_id = str(row.get("_id") or row.get("id") or f"{rel}:{lineno}")
                title = str(row.get("title") or "").strip()
                body = f"{title}\n{text}" if title else text
                meta = {"source": rel, "title": title} if title else {"source": rel}
                docs.append(Document(text=body, id_=doc_id, metadata=meta))
    if not docs:
        raise ValueError(f"no .txt, .md or .jsonl documents found in {folder}")
    return docs


def _batches(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def nodes_from_documents(documents: Sequence[Document]) -> list[TextNode]:
    """One node per document, keeping its id; metadata (source, title) is kept but not
    embedded or shown to the LLM (the title is already in the text)."""
    return [
        TextNode(
            id_=d.doc_id,
            text=d.text,
            metadata=dict(d.metadata),
            excluded_embed_metadata_keys=list(d.metadata),
            excluded_llm_metadata_keys=list(d.metadata),
        )
        for d in documents
    ]


def embed_nodes(
    nodes: Sequence[BaseNode],
    embed_model: BaseEmbedding,
    *,
    batch_size: int = 64,
    progress: ProgressFn | None = None,
) -> None:
    """Set ``node.embedding`` on every node, in batches, reporting progress."""
    for batch in _batches(nodes, batch_size):
        texts = [n.get_content(metadata_mode="embed") for n in batch]
        for node, vector in zip(batch, embed_model.get_text_embedding_batch(texts)):
            node.embedding = vector
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
) -> IndexInfo:
    """Embed ``documents`` (one node each) into a FAISS inner-product index at ``out``."""
    import faiss
    from llama_index.vector_stores.faiss import FaissVectorStore

    out = check_index_target(out)
    start = time.perf_counter()
    nodes = nodes_from_documents(documents)
    embed_nodes(nodes, embed_model, batch_size=batch_size, progress=progress)
    dim = len(nodes[0].embedding or [])
    store = FaissVectorStore(faiss_index=faiss.IndexFlatIP(dim))
    storage = StorageContext.from_defaults(vector_store=store)
    index = VectorStoreIndex(nodes, storage_context=storage, embed_model=embed_model)
    seconds = time.perf_counter() - start

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        index.storage_context.persist(persist_dir=str(tmp))
        info = IndexInfo(out, len(nodes), dim, embed_spec, max_length, seconds)
        meta = {
            "format": 1,
            "documents": info.documents,
            "dim": dim,
            "embed": embed_spec,
            "embed_model": getattr(embed_model, "model_name", type(embed_model).__name__),
            "max_length": max_length,
            "build_seconds": round(seconds, 3),
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return info


def read_meta(path: Path) -> dict[str, Any]:
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise ValueError(
            f"{path} is not a hyde-plus index (no {META_FILE}); build one with "
            "`hyde-plus index DIR --out PATH`"
        )
    return dict(json.loads(meta_path.read_text()))


def load_faiss_index(path: Path, embed_model: BaseEmbedding) -> VectorStoreIndex:
    """Load an index written by `build_faiss_index`."""
    from llama_index.vector_stores.faiss import FaissVectorStore

    path = path.expanduser()
    read_meta(path)
    store = FaissVectorStore.from_persist_dir(str(path))
    storage = StorageContext.from_defaults(vector_store=store, persist_dir=str(path))
    index = load_index_from_storage(storage, embed_model=embed_model)
    assert isinstance(index, VectorStoreIndex)
    return index
