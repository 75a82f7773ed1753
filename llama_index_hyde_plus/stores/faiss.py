"""`FaissStore`: a FAISS index folder on disk (dense search), built by `indexing`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding

from .base import BuildSettings, Store

if TYPE_CHECKING:
    from ..indexing import IndexInfo


class FaissStore(Store):
    """The index folder ``path`` (``hyde_plus.json`` plus LlamaIndex storage files)."""

    kind: ClassVar[str] = "faiss"
    modes: ClassVar[tuple[str, ...]] = ("dense",)
    search: ClassVar[str] = "dense"

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path).expanduser()

    @property
    def location(self) -> str:
        return str(self.path)

    def check_target(self, docs: Path | None = None) -> None:
        from ..index_folder import check_index_target

        check_index_target(self.path, docs)

    def _build(
        self, documents: Sequence[Document], embed_model: BaseEmbedding, settings: BuildSettings
    ) -> IndexInfo:
        from ..indexing import build_faiss_index

        return build_faiss_index(documents, embed_model, self.path, **settings.as_kwargs())

    def meta(self) -> dict[str, Any] | None:
        from ..index_folder import META_FILE, read_meta

        return read_meta(self.path) if (self.path / META_FILE).is_file() else None

    def embedding_model(self, embed: str | None = None) -> BaseEmbedding:
        from ..index_folder import read_meta

        read_meta(self.path)  # a missing or damaged index is named before any model loads
        return super().embedding_model(embed)

    def load(self, embed_model: BaseEmbedding) -> VectorStoreIndex:
        from ..indexing import load_faiss_index

        return load_faiss_index(self.path, embed_model)

    def retriever(self, index: VectorStoreIndex, top_k: int) -> BaseRetriever:
        return index.as_retriever(similarity_top_k=top_k)
