"""The `Store` interface: what every store builds, records, loads and searches."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding

from .._checks import is_int

if TYPE_CHECKING:
    from typing_extensions import Required, Unpack

    from ..chunking import Chunking
    from .nodes import IndexInfo, ProgressFn, TotalFn


@dataclass(frozen=True)
class BuildSettings:
    """How a build embeds: what to record of the model, batching, progress, and how
    documents are split (``chunking``; None: one node per document)."""

    embed_spec: str
    max_length: int
    batch_size: int = 64
    progress: ProgressFn | None = None
    chunking: Chunking | None = None
    total: TotalFn | None = None

    def as_kwargs(self) -> dict[str, Any]:
        """The settings as keyword arguments of `build_faiss_index` and friends."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class BuildOptions(TypedDict, total=False):
    """The keyword options of `Store.build` (the fields of `BuildSettings`):
    ``embed_spec`` and ``max_length`` are required."""

    embed_spec: Required[str]
    max_length: Required[int]
    batch_size: int
    progress: ProgressFn | None
    chunking: Chunking | None
    total: TotalFn | None


class Store(ABC):
    """A place to build an index in and search it from.

    ``kind`` names the implementation (``--store``); ``modes`` are the search modes it
    has (the RCP ``retrieve.modes``: ``dense``, ``hybrid``). `build` embeds documents
    and replaces the index atomically; `meta` is how it was embedded (None if there is
    no index); `load` opens it as a LlamaIndex ``VectorStoreIndex`` checked against
    ``embed_model``; `open` does the whole job for a caller: the recorded embedding
    model, the index and a retriever of ``top_k``.
    """

    kind: ClassVar[str]
    modes: ClassVar[tuple[str, ...]]
    search: ClassVar[str]
    """The search it runs, in words (``dense``, ``BM25 + dense``)."""
    title: ClassVar[str]
    """Its name in messages (``FAISS``, ``Milvus``)."""
    address: ClassVar[str]
    """``"folder"`` (``--out`` / ``--index``) or ``"uri"`` (``--uri``): how it is found."""
    address_help: ClassVar[str] = ""
    """What the address is, in words, for a message that asks for it."""
    vector_store_class: ClassVar[str]
    """The name of the LlamaIndex vector store class its indexes use (a subclass
    counts too): how `vector_store_kind` tells which store a retriever searches."""

    @classmethod
    @abstractmethod
    def at(cls, *, path: Path | None, uri: str | None, collection: str | None, token: str) -> Store:
        """The store at ``path`` (a folder) or ``uri`` (a URI, ``collection``, ``token``),
        whichever this kind uses (`make_store`)."""

    @classmethod
    def recognises(cls, path: Path) -> bool:
        """Whether the folder ``path`` holds an index of this store (`kind_at`)."""
        return False

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the index is, for messages."""

    @abstractmethod
    def check_target(self, docs: Path | None = None) -> None:
        """A `ValueError` before any work when a build here would overwrite what is
        not an index (or the documents themselves)."""

    def build(
        self,
        documents: Sequence[Document],
        embed_model: BaseEmbedding,
        **options: Unpack[BuildOptions],
    ) -> IndexInfo:
        """Embed ``documents`` (recording ``embed_spec`` and ``max_length``, so queries
        embed alike) and switch the index to them in one step. With ``chunking`` each
        document is split into chunks (`hyde-plus index`); without, each is one node
        keeping its id (evaluation scores by document id). ``total`` is told the number
        of texts to embed before ``progress`` counts them (`BuildOptions`). The target
        is checked first (`check_target`): nothing is embedded for a refused one."""
        self.check_target()
        return self._build(documents, embed_model, BuildSettings(**options))

    @abstractmethod
    def _build(
        self, documents: Sequence[Document], embed_model: BaseEmbedding, settings: BuildSettings
    ) -> IndexInfo:
        """`build`, with its options in one value."""

    @abstractmethod
    def meta(self) -> dict[str, Any] | None:
        """How the index was embedded (``embed``, ``max_length``, ``dim``...)."""

    @abstractmethod
    def load(self, embed_model: BaseEmbedding) -> VectorStoreIndex:
        """The index, checked against ``embed_model``."""

    @abstractmethod
    def retriever(self, index: VectorStoreIndex, top_k: int) -> BaseRetriever:
        """A retriever of ``index`` in this store's richest mode."""

    def mode_retriever(self, index: VectorStoreIndex, top_k: int, mode: str) -> BaseRetriever:
        """A retriever of ``index`` searching in ``mode`` (one of `modes`)."""
        if mode not in self.modes:
            raise ValueError(f"{self.title} searches {', '.join(self.modes)}, not {mode!r}")
        return self.retriever(index, top_k)

    def writer(self, index: VectorStoreIndex, embed_model: BaseEmbedding) -> Any:
        """What writes documents into ``index`` (RCP ``index/add`` / ``index/delete``,
        see `index_writes`); a `ValueError` saying why for a store that stays
        read-only."""
        raise ValueError(f"a {self.title} index is read-only: it cannot be served --writable")

    def embedding_model(self, embed: str | None = None) -> BaseEmbedding:
        """``embed`` (a model spec), else the one recorded at indexing, at the recorded
        ``max_length`` (an evaluation records ``spec@max_length``)."""
        from ..models import resolve_embedding

        meta = self.meta() or {}
        recorded, _, length = str(meta.get("embed") or "auto").partition("@")
        max_length = meta.get("max_length") or (int(length) if length.isdecimal() else 256)
        if not is_int(max_length) or max_length < 1:
            raise ValueError(
                f"the index at {self.location} records max_length {max_length!r:.40}, not a "
                "whole number of tokens: it is damaged; rebuild it with `hyde-plus index`"
            )
        return resolve_embedding(embed or recorded, max_length=max_length)

    def open(self, top_k: int, *, embed: str | None = None) -> BaseRetriever:
        """A retriever of ``top_k`` over this index, embedding queries as it was built."""
        return self.retriever(self.load(self.embedding_model(embed)), top_k)

    def describe(self) -> str:
        """One line for banners and logs: ``faiss (dense) at my-index``."""
        return f"{self.kind} ({', '.join(self.modes)}) at {self.location}"
