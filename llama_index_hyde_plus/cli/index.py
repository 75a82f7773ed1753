"""``hyde-plus index``: embed a folder of documents into a store."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from . import _console as ui
from . import _early as early
from ._console import progress_bar, reported, setup_logging, task
from ._names import DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_SIZE
from ._options import Collection, Embed, MilvusToken, StoreKind, Uri, Verbose

if TYPE_CHECKING:
    from llama_index.core import Document

    from ..chunking import Chunking
    from ..readers import Skipped
    from ..stores import Store
    from ..stores.nodes import IndexInfo


def build_store(
    store: Store,
    documents: Sequence[Document],
    *,
    embed: str,
    max_length: int,
    batch_size: int,
    chunking: Chunking | None = None,
) -> IndexInfo:
    """Load the embedding model named ``embed`` and build ``store`` with a progress bar
    (of chunks once the documents are split, with ``chunking``; none when no chunk needs
    embedding). The target is checked before the model loads or any bar shows
    (`Store.check_target`)."""
    from ..models import concrete_embedding_spec, resolve_embedding

    if chunking is not None:
        chunking.check(max_length)  # before the model loads
    store.check_target()
    spec = concrete_embedding_spec(embed)
    with ui.err.status("Loading the embedding model..."):
        embed_model = resolve_embedding(spec, max_length=max_length)
    what = "chunks" if chunking is not None else "docs"
    with progress_bar() as progress:
        advance = task(progress, f"Embedding {what}", len(documents), f"{what}/s")
        task_id = progress.task_ids[-1]

        def counted(n: int) -> None:
            progress.update(task_id, total=n, visible=n > 0)  # nothing to embed: no bar

        return store.build(
            documents,
            embed_model,
            embed_spec=spec,
            max_length=max_length,
            batch_size=batch_size,
            progress=advance,
            chunking=chunking,
            total=counted,
        )


SKIPPED_SHOWN = 20
"""Skipped files listed one per line; the rest are counted."""


def print_skipped(skipped: Sequence[Skipped]) -> None:
    """What was not indexed and why, on stderr (never silently)."""
    if not skipped:
        return
    ui.err.print(f"[yellow]Skipped {len(skipped)} file(s):[/]")
    for item in skipped[:SKIPPED_SHOWN]:
        ui.err.print(f"  {ui.named(item.path)}: {ui.literal(item.reason)}", soft_wrap=True)
    if len(skipped) > SKIPPED_SHOWN:
        ui.err.print(f"  ... and {len(skipped) - SKIPPED_SHOWN} more")


def _target(
    store: str | None, out: Path | None, uri: str | None, collection: str, token: str
) -> Store:
    from ..stores import make_store, store_kind

    kind = store_kind(store, uri, path=out, path_flag="--out")
    return make_store(kind, path=out, uri=uri, collection=collection, token=token)


def index(
    docs: Annotated[
        Path,
        typer.Argument(
            metavar="DIR",
            help="Folder of documents: .txt .md .rst .jsonl, with [docs] .pdf .docx .html .csv.",
        ),
    ],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Folder to write a FAISS index to.")
    ] = None,
    store: StoreKind = None,
    uri: Uri = None,
    collection: Collection = "hyde_plus",
    milvus_token: MilvusToken = None,
    embed: Embed = "auto",
    max_length: Annotated[int, typer.Option(help="Max tokens per text (local model).")] = 256,
    batch_size: Annotated[int, typer.Option(help="Texts per embedding batch.")] = 64,
    chunk_size: Annotated[
        int, typer.Option(help="Most tokens per chunk (at most --max-length).")
    ] = DEFAULT_CHUNK_SIZE,
    chunk_overlap: Annotated[
        int, typer.Option(help="Tokens shared by consecutive chunks.")
    ] = DEFAULT_CHUNK_OVERLAP,
    verbose: Verbose = False,
) -> None:
    """Split a folder of documents into chunks and embed them into FAISS on disk or a
    hybrid Milvus collection."""
    setup_logging(verbose)
    with early.refused():
        early.documents_folder(docs)

    from ..chunking import Chunking
    from ..readers import read_folder
    from ..stores.nodes import check_batch_size

    chunking = Chunking(chunk_size, chunk_overlap)
    with reported():
        chunking.check(max_length)
        check_batch_size(batch_size)
        target = _target(store, out, uri, collection, milvus_token or "")
        target.check_target(docs)
        contents = read_folder(docs)
        print_skipped(contents.skipped)
        info = build_store(
            target,
            contents.documents,
            embed=embed,
            max_length=max_length,
            batch_size=batch_size,
            chunking=chunking,
        )
    ui.console.print(built_line(info, target.search))


def built_line(info: IndexInfo, search: str) -> str:
    """What a build did, in one line: the index is up to date (nothing changed), or
    what it indexed, how and what it embedded (`embedded_line`)."""
    where = f"[bold]{ui.named(str(info.location))}[/]"
    if info.unchanged:
        return (
            f"[green]The index in {where} is up to date:[/] {info.documents} documents, "
            f"{info.chunks} chunks, nothing re-embedded ({info.seconds:.1f}s)"
        )
    return (
        f"[green]Indexed {info.documents} documents as {info.chunks} chunks[/] into {where} "
        f"({search}, {info.dim}-d, {info.seconds:.1f}s): {embedded_line(info)}"
    )


def embedded_line(info: IndexInfo) -> str:
    """What a build embedded: ``embedded 12 of 5,183 chunks (5,171 unchanged)`` (and how
    many its cache held, after a build that failed), with the rate of those embedded."""
    cached = info.chunks - info.embedded - info.reused  # a failed build's, run again
    from_cache = f", {cached:,} from the cache" if cached > 0 else ""
    line = (
        f"embedded {info.embedded:,} of {info.chunks:,} chunks "
        f"({info.reused:,} unchanged{from_cache})"
    )
    if info.embedded and info.seconds:
        line += f", {info.embedded / info.seconds:.1f} chunks/s"
    return line
