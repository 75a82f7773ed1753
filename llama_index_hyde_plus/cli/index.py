"""``hyde-plus index``: embed a folder of documents into a store."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from llama_index.core import Document

from ..indexing import IndexInfo
from ..stores import FaissStore, MilvusStore, Store
from ._console import console, err, progress_bar, reported, task
from ._options import Collection, Embed, StoreKind, Token, Uri


def build_store(
    store: Store,
    documents: Sequence[Document],
    *,
    embed: str,
    max_length: int,
    batch_size: int,
) -> IndexInfo:
    """Load the embedding model named ``embed`` and build ``store`` with a progress bar."""
    from ..models import concrete_embedding_spec, resolve_embedding

    spec = concrete_embedding_spec(embed)
    with err.status("Loading the embedding model..."):
        embed_model = resolve_embedding(spec, max_length=max_length)
    with progress_bar() as progress:
        advance = task(progress, "Embedding documents", len(documents), "docs/s")
        return store.build(
            documents,
            embed_model,
            embed_spec=spec,
            max_length=max_length,
            batch_size=batch_size,
            progress=advance,
        )


def _target(
    store: str | None, out: Path | None, uri: str | None, collection: str, token: str
) -> Store:
    store = store or ("milvus" if uri and out is None else "faiss")
    if store == "faiss" and uri is not None:
        raise ValueError("--uri is for the Milvus store (--store milvus); for FAISS give --out")
    if store == "milvus" and out is not None:
        raise ValueError("--out is for the FAISS store; Milvus takes --uri")
    if store == "faiss":
        if out is None:
            raise ValueError("--out is needed for the FAISS store")
        return FaissStore(out)
    if store != "milvus":
        raise ValueError("--store must be faiss or milvus")
    if not uri:
        raise ValueError("--uri is needed for the Milvus store (a file path or a URL)")
    return MilvusStore(uri, collection=collection, token=token)


def index(
    docs: Annotated[Path, typer.Argument(help="Folder of .txt, .md or .jsonl documents.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Folder to write a FAISS index to.")
    ] = None,
    store: StoreKind = None,
    uri: Uri = None,
    collection: Collection = "hyde_plus",
    token: Token = None,
    embed: Embed = "auto",
    max_length: Annotated[int, typer.Option(help="Max tokens per text (local model).")] = 256,
    batch_size: Annotated[int, typer.Option(help="Texts per embedding batch.")] = 64,
) -> None:
    """Embed a folder of documents into FAISS on disk or a hybrid Milvus collection."""
    from ..indexing import read_documents

    with reported():
        target = _target(store, out, uri, collection, token or "")
        target.check_target(docs)
        documents = read_documents(docs)
        info = build_store(
            target, documents, embed=embed, max_length=max_length, batch_size=batch_size
        )
    console.print(
        f"[green]Indexed {info.documents} documents[/] into [bold]{info.location}[/] "
        f"({target.search}, {info.dim}-d, {info.seconds:.1f}s, "
        f"{info.docs_per_second:.1f} docs/s)",
        soft_wrap=True,
    )
