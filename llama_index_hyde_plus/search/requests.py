"""What a search step asks for: the I/O it needs, as data; and what it reads of the
retriever it searches for (`Searcher`).

A step (`steps`, `vectors`) is a generator that yields one of these and is sent the
answer, or has what the call raised thrown in at the ``yield``; `loops` carries them
out, blocking or async. Nothing here calls anything.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle

from ..calls.door import Deadline
from ..transforms.base import QueryTransformer, SearchSpec
from .fusion import FusionMode

T = TypeVar("T")
Steps = Generator[Any, Any, T]
"""A search step: yields requests, is sent their answers, returns ``T``."""


class EmbedSteps(Protocol):
    """What the steps ask of `vectors.Embedder`: its embeddings, as steps."""

    def embed_query(self, text: str, deadline: Deadline | None = None) -> Steps[list[float]]: ...
    def embed_texts(
        self, texts: Sequence[str], deadline: Deadline | None = None
    ) -> Steps[list[list[float]]]: ...


class ReadSteps(Protocol):
    """What the steps ask of `vectors.DocVectors`: the stored vectors of hits, as a step."""

    def read(
        self, nodes: Sequence[NodeWithScore], deadline: Deadline | None = None
    ) -> Steps[list[list[float]]]: ...


class Searcher(Protocol):
    """What the steps and the loops read of a `TransformRetriever`."""

    @property
    def retriever(self) -> BaseRetriever: ...
    @property
    def transformer(self) -> QueryTransformer: ...
    @property
    def fusion(self) -> FusionMode | None: ...
    @property
    def reranker(self) -> BaseNodePostprocessor | None: ...
    @property
    def model_timeout(self) -> float | None: ...
    @property
    def max_concurrency(self) -> int: ...
    @property
    def search_type(self) -> str: ...
    @property
    def embedder(self) -> EmbedSteps | None: ...
    @property
    def doc_vectors(self) -> ReadSteps: ...

    def _have_embedder(self, what: str) -> bool: ...


@dataclass(slots=True)
class Embed:
    """The embedding ``model``'s vectors of ``texts``: ``kind`` "query" (one text,
    embedded as a question), "texts" (a batch of documents) or "text" (one document);
    answered by ``deadline``."""

    model: Any
    kind: Literal["query", "texts", "text"]
    texts: Any
    deadline: Deadline | None


@dataclass(slots=True)
class ReadStore:
    """``read()``, the stored vectors of some documents from the vector ``store`` of
    ``kind`` (faiss, milvus or None), answered by ``deadline``."""

    read: Callable[[], dict[str, list[float]]]
    kind: str | None
    store: Any
    deadline: Deadline | None


@dataclass(slots=True)
class SearchQuestion:
    """The question's own search: not bounded (a plain retriever would wait on it too)."""

    bundle: QueryBundle


@dataclass(slots=True)
class SearchGenerated:
    """A search with the generated text (or vectors), answered by ``deadline``."""

    bundle: QueryBundle
    deadline: Deadline | None


@dataclass(slots=True)
class Transform:
    """The transform of the question ``text`` (``given``: the caller's bundle) shown
    ``context``; ``beside`` is the question's search started while it writes when a
    guard needs its hits (a failure of it ends the wait), else None."""

    text: str
    given: QueryBundle | None
    context: list[str] | None
    beside: Any


@dataclass(slots=True)
class Start:
    """Run ``steps`` beside this one; answered with a handle for `Join` / `Cancel`."""

    steps: Steps[Any]


@dataclass(slots=True)
class Join:
    """What the steps run by `Start` returned (``handle``)."""

    handle: Any


@dataclass(slots=True)
class Cancel:
    """Stop the steps run by `Start` if they are still running."""

    handle: Any


@dataclass(slots=True)
class Rerank:
    """The reranker's answer for ``nodes`` and the question ``bundle`` by ``deadline``."""

    nodes: list[NodeWithScore]
    bundle: QueryBundle
    deadline: Deadline | None


@dataclass(slots=True)
class Failed:
    """``exc`` as a failure to handle (`reliability.failure`: answered with the
    ``Exception``), or thrown back when it must propagate (an interrupt, the running
    task's cancellation), ``cancel`` (a `Start` handle or None) cancelled first."""

    exc: BaseException
    cancel: Any = None


@dataclass(slots=True)
class SearchAll:
    """The searches of one fan-out at once; answered with what each found or raised,
    by index in ``specs``."""

    specs: Sequence[SearchSpec]
    bundles: list[QueryBundle | None]
    """One query per search (None where the question's own hits are reused)."""
    deadline: Deadline | None
    """When the searches with the generated text must have answered (the question's
    own are not bounded)."""
    pending: Any
    """The question's own search started while the LLM wrote (a `Start` handle,
    joined with the others), or None."""
    todo: list[int]
    """The searches to run, by index in ``specs``."""
    of_question: frozenset[int]
    """Those of ``todo`` that search the question itself."""
    outcomes: list[Any]
    """What each search found (or raised); the question's hits in hand where nothing
    is to run."""
    in_place: int | None
    """The one search to run when it is the only one (no question search pending): run
    in place, with no thread and no task. None otherwise."""

    def bundle(self, i: int) -> QueryBundle:
        """The query of search ``i`` (one in ``todo``: never reused hits)."""
        bundle = self.bundles[i]
        assert bundle is not None
        return bundle

    def joined(self, question: Any) -> None:
        """Put the question's own hits (or what its search raised), searched while the
        LLM wrote, in the place of every search that reuses them."""
        for i, bundle in enumerate(self.bundles):
            if bundle is None:
                self.outcomes[i] = question


REQUESTS = (
    Embed,
    ReadStore,
    SearchQuestion,
    SearchGenerated,
    SearchAll,
    Transform,
    Start,
    Join,
    Cancel,
    Rerank,
    Failed,
)
"""Every request a step can make: each loop answers all of them."""
