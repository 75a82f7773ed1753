"""`TransformRetriever`: transform -> concurrent fan-out -> fuse -> rerank."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import numbers
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.callbacks import CallbackManager
from llama_index.core.indices.base import BaseIndex
from llama_index.core.indices.query.query_transform.base import BaseQueryTransform
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.prompts.mixin import PromptMixinType
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.core.settings import Settings

from .._attrs import overrides
from .._checks import check_int, is_int, is_number
from ..calls import door
from ..calls.door import Deadline, await_within
from ..calls.reliability import describe, failure
from ..calls.timeouts import MODEL_TIMEOUT_S
from ..provenance import summary, tag_nodes
from ..transforms.base import (
    Guards,
    QueryTransformer,
    SearchSpec,
    TransformResult,
    revised,
    validate_query,
)
from ..transforms.core import CoreTransform, as_transformer, caller_bundle
from ..usage import Usage
from . import expansion, plan
from .fusion import FusionMode, fuse, scored, unique_nodes
from .vectors import DocVectors, Embedder, embed_model_of

logger = logging.getLogger(__name__)

Bundles = list[QueryBundle | None]
"""One query per search of a fan-out; None where the question's own hits are reused."""
Hits = list[NodeWithScore] | None
"""The question's own hits, when it was searched first."""
Found = tuple[list[list[NodeWithScore]], list[float], list[str]]
"""A fan-out's outcome: the ranked lists, their fusion weights, the failed searches."""

Vec = list[float]
Carried = tuple[list[NodeWithScore], list[str]]
"""A step's nodes and the failed sub-searches of a fan-out."""


@dataclass(frozen=True)
class Question:
    """What the caller asked: the text a transform rewrites, and what the question's
    own search uses.

    From a ``QueryBundle`` (`of`), as LlamaIndex's own retrievers read one: a
    precomputed ``embedding`` is the question's vector wherever it is needed (its own
    search, the HyDE mix, the gate, feedback), never embedded again;
    ``custom_embedding_strs`` replace the question's text as what is embedded for it
    (the mean of their query embeddings, as LlamaIndex aggregates them), while the
    text is still what the transform rewrites and keyword search matches. A bundle with
    no text but an embedding or embedding strings cannot be rewritten: ``text`` is
    empty and it is searched as given."""

    text: str
    embedding: Vec | None = None
    custom_strs: tuple[str, ...] = ()
    given: QueryBundle | None = None

    @classmethod
    def of(cls, query: str | QueryBundle) -> Question:
        """``query`` read as a question (a `TypeError` or `ValueError` for one that
        has neither text nor an embedding)."""
        if not isinstance(query, QueryBundle):
            return cls(validate_query(query))
        embedding = None if query.embedding is None else [float(x) for x in query.embedding]
        strs = tuple(query.custom_embedding_strs or ())
        text = query.query_str
        if isinstance(text, str) and not text.strip() and (embedding is not None or strs):
            return cls("", embedding, strs, given=query)
        return cls(validate_query(text), embedding, strs, given=query)

    @property
    def embedding_strs(self) -> tuple[str, ...]:
        """What is embedded for the question when no embedding was given."""
        return self.custom_strs or (self.text,)

    def bundle(self, embedding: Vec | None = None) -> QueryBundle:
        """The question's own search: its text, the caller's embedding (else
        ``embedding``), and the caller's embedding strings."""
        if not self.text and self.given is not None:
            return self.given  # cannot be rewritten: searched as given
        return QueryBundle(
            query_str=self.text,
            embedding=self.embedding if self.embedding is not None else embedding,
            custom_embedding_strs=list(self.custom_strs) or None,
        )

    def untransformed(self, method: str) -> TransformResult:
        """The result of a question no transform could run on (no text)."""
        return TransformResult(
            query=self.text,
            method=method,
            queries=(),
            skipped="the query has an embedding but no text to rewrite; searched as given",
        )


SearchType = Literal["auto", "dense", "keyword", "hybrid"]
_KEYWORD_MODES = {"sparse", "text_search"}
_HYBRID_MODES = {"hybrid", "semantic_hybrid"}

_RERANKER = "the reranker"
_SEARCH = "the retriever"

RERANK_CANDIDATES = 50
"""How many of the question's hits a reranking transform (``strategy="rerank"``)
reorders: the one depth every caller gets (`TransformRetriever.from_index`, `HyDERAG`,
``hyde-plus query``, ``eval``, ``tune``, ``serve``). Hits past it (``eval`` and ``serve``
fetch 100) follow in the order found, so a ranking does not depend on how deep the
wrapped retriever fetched."""


MAX_TOP_K = 10_000
"""The most hits a `TransformRetriever` returns (``top_k``) or fetches
(``similarity_top_k``): FAISS sizes its answer by the count asked, and at 2**31 the
process aborts (``std::bad_alloc``) instead of raising."""


def candidate_depth(guards: Guards, top_k: int) -> int:
    """How many hits the wrapped retriever must fetch for ``guards`` to do their work
    before the results are cut to ``top_k``: a reranking strategy reorders the
    question's own candidates (`RERANK_CANDIDATES` of them); grounding and feedback read
    the question's top ``context_k`` / ``feedback_k`` hits."""
    if guards.strategy == "rerank":
        return max(top_k, RERANK_CANDIDATES)
    return max(top_k, guards.context_k, guards.feedback_k)


def own_top_k(retriever: BaseRetriever) -> int | None:
    """The wrapped retriever's own ``similarity_top_k`` (a positive int), else None."""
    value = getattr(retriever, "similarity_top_k", None)
    if is_int(value) and value >= 1:
        return value
    return None


@dataclass(frozen=True)
class SearchResult:
    """Nodes of one search, the transform that shaped it, and its wall time.

    ``failed_searches`` lists the sub-searches of a fan-out that raised (their error
    text); the nodes come from the others.
    """

    nodes: list[NodeWithScore]
    transform: TransformResult
    latency_s: float
    failed_searches: tuple[str, ...] = ()


def detect_search_type(retriever: BaseRetriever) -> Literal["dense", "keyword", "hybrid"]:
    """Best guess at how ``retriever`` matches: a ``search_type`` attribute on the
    retriever says so outright; BM25 and sparse/text modes are keyword, hybrid
    vector-store modes are hybrid, a fusion retriever over both is hybrid."""
    declared = getattr(retriever, "search_type", None)
    if declared in ("dense", "keyword", "hybrid"):
        return declared  # type: ignore[no-any-return]
    name = type(retriever).__name__.lower()
    if "bm25" in name or "keyword" in name:
        return "keyword"
    mode = getattr(retriever, "_vector_store_query_mode", None)
    mode_value = str(getattr(mode, "value", mode or "")).lower()
    if mode_value in _HYBRID_MODES:
        return "hybrid"
    if mode_value in _KEYWORD_MODES:
        return "keyword"
    children = getattr(retriever, "_retrievers", None)
    if isinstance(children, (list, tuple)) and children:
        kinds = {detect_search_type(c) for c in children if isinstance(c, BaseRetriever)}
        if "hybrid" in kinds or ("keyword" in kinds and "dense" in kinds):
            return "hybrid"
        if kinds == {"keyword"}:
            return "keyword"
    return "dense"


def _check_options(
    top_k: Any, max_concurrency: Any, search_type: Any, reranker: Any, model_timeout: Any
) -> None:
    """A `TypeError` / `ValueError` naming the first `TransformRetriever` option that is
    not valid."""
    if top_k is not None and (not is_int(top_k) or not 1 <= top_k <= MAX_TOP_K):
        raise ValueError(f"top_k must be an int from 1 to {MAX_TOP_K}, or None")
    if not is_int(max_concurrency) or max_concurrency < 1:
        raise ValueError("max_concurrency must be an int >= 1")
    if search_type not in ("auto", "dense", "keyword", "hybrid"):
        raise ValueError("search_type must be one of 'auto', 'dense', 'keyword', 'hybrid'")
    if reranker is not None and not isinstance(reranker, BaseNodePostprocessor):
        raise TypeError("reranker must be a LlamaIndex node postprocessor")
    if model_timeout is not None and (not is_number(model_timeout) or not 0 < model_timeout < 1e6):
        raise ValueError("model_timeout must be > 0 seconds (and finite), or None")


def _check_wiring(
    fusion: Any, manager: Any, verbose: Any, object_map: Any, embed_model: Any
) -> None:
    """`_check_options` for the `TransformRetriever` arguments that are objects or
    flags: ``fusion``, ``callback_manager``, ``verbose``, ``object_map``,
    ``embed_model`` (a `CallbackManager` stand-in would fail every ``retrieve``)."""
    if fusion is not None and (
        not isinstance(fusion, str) or fusion not in {mode.value for mode in FusionMode}
    ):
        modes = ", ".join(repr(mode.value) for mode in FusionMode)
        raise ValueError(f"fusion must be a FusionMode ({modes}) or None, not {fusion!r}")
    if manager is not None and not isinstance(manager, CallbackManager):
        raise TypeError(
            f"callback_manager must be a LlamaIndex CallbackManager or None, "
            f"not {type(manager).__name__}"
        )
    if not isinstance(verbose, bool):
        raise TypeError(f"verbose must be True or False, not {verbose!r}")
    if object_map is not None and not isinstance(object_map, dict):
        raise TypeError("object_map must be a dict of node ids to objects, or None")
    if embed_model is not None and not isinstance(embed_model, (BaseEmbedding, Embedder)):
        raise TypeError("embed_model must be a LlamaIndex BaseEmbedding")


def _one_transform(
    transformer: QueryTransformer | BaseQueryTransform | None,
    query_transform: BaseQueryTransform | None,
) -> QueryTransformer | BaseQueryTransform:
    """The transform given as ``transformer`` or as core's ``query_transform=``."""
    if transformer is not None and query_transform is not None:
        raise TypeError("give the transform once: as transformer or as query_transform")
    chosen = transformer if transformer is not None else query_transform
    if chosen is None:
        raise TypeError("TransformRetriever needs a transformer (or core's query_transform=)")
    return chosen


def _reused(transformed: TransformResult | None) -> TransformResult | None:
    """A rewrite made earlier, as this search reports it: its calls were reported by
    the step that made them, so zero ``usage`` here (theirs in ``generation_usage``)."""
    if transformed is None:
        return None
    spent = transformed.generation_usage or transformed.usage
    return revised(transformed, usage=Usage(), generation_usage=spent)


def _placed(outcomes: list[Any], at: list[int], found: list[Any]) -> list[Any]:
    """``outcomes`` with ``found[k]`` put at position ``at[k]``."""
    placed = list(outcomes)
    for i, outcome in zip(at, found):
        placed[i] = outcome
    return placed


def _joined(step: plan.Fanout, outcomes: list[Any], question: Any) -> None:
    """Put the question's own hits (or what its search raised), searched while the LLM
    wrote, in the place of every search of ``step`` that reuses them."""
    for i, reused in enumerate(step.reuse):
        if reused:
            outcomes[i] = question


@dataclass(frozen=True)
class _Fanout:
    """The searches of one fan-out step to run, for `_run_sync` and `_run_async`."""

    step: plan.Fanout
    bundles: Bundles
    deadline: Deadline | None
    """When the searches with the generated text must have answered (the question's
    own are not bounded)."""
    pending: Any
    """The question's own search started while the LLM wrote (a future or a task,
    joined with the others), or None."""
    todo: list[int]
    """The searches to run, by index in ``step.specs``."""
    own: frozenset[int]
    """Those of ``todo`` that search the question itself."""
    outcomes: list[Any]
    """What each search found (or raised); the question's hits in hand where nothing
    is to run."""
    lone: int | None
    """The one search to run when it is the only one (no question search pending): run
    in place, with no thread and no task. None otherwise."""

    @classmethod
    def of(
        cls,
        step: plan.Fanout,
        bundles: Bundles,
        hits: Hits,
        question: Question,
        deadline: Deadline | None,
        pending: Any,
    ) -> _Fanout:
        """The searches ``step`` runs (see the fields).

        Args:
            step: the fan-out.
            bundles: one query per spec of ``step`` (None where hits are reused).
            hits: the question's hits in hand, if any.
            question: the question.
            deadline: the bound of the searches with the generated text.
            pending: the question's search running since the LLM was called, or None.
        """
        todo = step.todo()
        own = frozenset(i for i in todo if plan.is_question(step.specs[i], question.text))
        lone = todo[0] if len(todo) == 1 and pending is None else None
        return cls(step, bundles, deadline, pending, todo, own, [hits] * len(step.specs), lone)

    def bundle(self, i: int) -> QueryBundle:
        """The query of search ``i`` (one in ``todo``: never reused hits)."""
        bundle = self.bundles[i]
        assert bundle is not None
        return bundle


def _check_transformed(
    transformed: TransformResult | None, question: Question, transformer: QueryTransformer
) -> None:
    """A `TypeError` / `ValueError` naming ``transformed`` unless it is None or a
    `TransformResult` of this very question that ``transformer`` could have made
    without the question's hits (a grounded transform is shown them: it must run
    inside the search)."""
    if transformed is None:
        return
    if not isinstance(transformed, TransformResult):
        raise TypeError(f"transformed must be a TransformResult, not {type(transformed).__name__}")
    if transformed.query != question.text:
        raise ValueError(
            f"transformed is a rewrite of {transformed.query[:60]!r}, not of the query "
            f"searched ({question.text[:60]!r})"
        )
    method = transformer.method or type(transformer).__name__
    if transformed.method != method:
        raise ValueError(
            f"transformed was made by {transformed.method!r}, not by this retriever's "
            f"transformer ({method!r})"
        )
    if transformer.guards.context_k:
        raise ValueError(
            "transformed cannot be given for a grounded transform (it is shown the "
            "question's own hits, which only the search fetches); call search(query)"
        )


#: The vector stores whose search runs in this process (no network, no disk wait): a
#: search of them with a given vector cannot hang on I/O. By exact class (a subclass
#: may do anything), or a store class that says so (``searches_in_process = True``, as
#: the FAISS store of `FaissStore` does).
IN_PROCESS_STORES = frozenset(
    {
        "llama_index.core.vector_stores.simple.SimpleVectorStore",
        "llama_index.vector_stores.faiss.base.FaissVectorStore",
    }
)
_IN_PROCESS_DOCSTORE = "llama_index.core.storage.docstore.simple_docstore.SimpleDocumentStore"


def _is_exactly(obj: object, names: frozenset[str]) -> bool:
    """Whether ``obj``'s own class (not a base: a subclass may do I/O) is named in
    ``names`` (by module and qualified name: nothing is imported to ask), or says it
    only computes in this process (a class attribute ``searches_in_process = True``)."""
    kind = type(obj)
    if getattr(kind, "searches_in_process", False) is True:
        return True
    return f"{kind.__module__}.{kind.__qualname__}" in names


def searches_in_process(retriever: BaseRetriever, bundle: QueryBundle) -> bool:
    """Whether searching ``bundle`` with ``retriever`` only computes in this process,
    so it cannot hang on a network or a lock and needs no `model_timeout` bound: a
    retriever that says so (a true ``searches_in_process`` attribute), or LlamaIndex's
    own ``VectorIndexRetriever`` (not a subclass) over an in-memory or FAISS vector store
    and an in-memory docstore, with no recursive retrieval, given the vector (it embeds
    nothing). Such a search runs in the caller's thread: handing it to a worker would
    cost more than the search.

    Args:
        retriever: the wrapped retriever.
        bundle: what it is asked to search.
    """
    try:
        if getattr(retriever, "searches_in_process", False) is True:
            return True
    except Exception:  # a property that raises vouches for nothing
        return False
    if type(retriever).__name__ != "VectorIndexRetriever" or bundle.embedding is None:
        return False
    from llama_index.core.indices.vector_store.retrievers import VectorIndexRetriever

    if type(retriever) is not VectorIndexRetriever or retriever.object_map:
        return False
    return _is_exactly(retriever._vector_store, IN_PROCESS_STORES) and _is_exactly(
        retriever._docstore, frozenset({_IN_PROCESS_DOCSTORE})
    )


def _copy(nodes: Sequence[NodeWithScore]) -> list[NodeWithScore]:
    """Fresh NodeWithScore wrappers (deduplicated by node id), so that a reranker's
    scoring never touches the wrapped retriever's objects. A shallow ``model_copy``:
    half the cost of building one."""
    return [item.model_copy() for item in unique_nodes(nodes)]


def _rerank_output(out: object) -> list[NodeWithScore]:
    """A reranker's answer, checked: a list of ``NodeWithScore`` whose scores are None or
    finite real numbers (numpy's too). Anything else (None, a string, a list of texts, a
    NaN score) is a ``TypeError`` / ``ValueError``: a failed reranker, whose fused
    nodes are kept."""
    if not isinstance(out, list):
        raise TypeError(f"the reranker returned {type(out).__name__}, not a list of NodeWithScore")
    for item in out:
        if not isinstance(item, NodeWithScore):
            kind = type(item).__name__
            raise TypeError(f"the reranker returned a list holding {kind}, not NodeWithScore")
        score = item.score
        if score is not None and not (isinstance(score, numbers.Real) and math.isfinite(score)):
            raise ValueError(f"the reranker returned the score {score!r}, not a finite number")
    return out


class TransformRetriever(BaseRetriever):
    """Wrap any LlamaIndex retriever so every query is transformed first.

    Every search a transform asks for (one for HyDE, several for multi-query,
    step-back, decompose) runs concurrently, up to ``max_concurrency`` at a time (on
    the async path as tasks, on the sync path in worker threads, which also works
    inside a running event loop such as Jupyter's). The lists are fused with ``fusion``
    (default: the transform's own preference, RRF, or interleave for `Decompose`),
    deduplicated by node id, optionally reranked against the ORIGINAL question, and cut
    to ``top_k``. A failing sub-search is logged and the others still count.

    ``top_k=None`` (the default) means the wrapped retriever's own top k: its
    ``similarity_top_k`` when it has one (a fan-out over a ``similarity_top_k=3``
    retriever returns at most 3 nodes, like the retriever alone), else no cut. An int
    (1 to `MAX_TOP_K`) is an explicit cut, read as is (it cannot return more than the
    fused lists hold).

    ``retrieve`` / ``aretrieve`` (what query engines call) return the nodes with the
    first one a copy whose metadata carries a summary of the transform under
    ``"hyde_plus"``, hidden from the answer prompt and embeddings; `transform_of` reads
    it back from a response. `search` returns the full `SearchResult` and leaves the nodes as found.

    ``search_type`` says how the wrapped retriever matches ("auto" guesses): dense
    retrievers get the averaged embedding of the HyDE passages (and query), keyword and
    hybrid ones get the passage text as ``query_str``.

    Traces go to ``callback_manager``, else ``Settings.callback_manager`` (as with
    LlamaIndex's own retrievers), so the wrapped retriever's events end with them.
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        transformer: QueryTransformer | BaseQueryTransform | None = None,
        *,
        query_transform: BaseQueryTransform | None = None,
        transform_metadata: dict[str, Any] | None = None,
        object_map: dict[str, Any] | None = None,
        fusion: FusionMode | str | None = None,
        top_k: int | None = None,
        reranker: BaseNodePostprocessor | None = None,
        max_concurrency: int = 8,
        search_type: SearchType = "auto",
        embed_model: BaseEmbedding | Embedder | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
        model_timeout: float | None = MODEL_TIMEOUT_S,
    ) -> None:
        if not isinstance(retriever, BaseRetriever):
            raise TypeError(
                f"retriever must be a LlamaIndex BaseRetriever, not {type(retriever).__name__}"
            )
        transformer = as_transformer(
            _one_transform(transformer, query_transform), transform_metadata
        )
        _check_options(top_k, max_concurrency, search_type, reranker, model_timeout)
        _check_wiring(fusion, callback_manager, verbose, object_map, embed_model)
        self.retriever = retriever
        self.transformer = transformer
        self.fusion = FusionMode(fusion) if fusion is not None else None
        self.top_k = top_k
        self.reranker = reranker
        self.model_timeout = model_timeout
        """Seconds the models called after the LLM may take (None: no bound): the
        embedding calls of one search (the gate's, the generated text's, the documents'
        and a remote store's vectors) share one deadline, after which the search falls
        back to the question's own; the reranker has as long again for its own call,
        after which the fused order is kept."""
        self.max_concurrency = max_concurrency
        self.search_type = detect_search_type(retriever) if search_type == "auto" else search_type
        if isinstance(embed_model, Embedder):
            self.embedder: Embedder | None = embed_model
        else:
            model = embed_model or embed_model_of(retriever)
            self.embedder = Embedder(model) if model is not None else None
        """Embeds the question and generated text for weighted vectors, the gate and
        reranking: ``embed_model``, else the wrapped retriever's own model."""
        self.doc_vectors = DocVectors(retriever, self.embedder)
        self._warned_no_embedder = False
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        # the host's manager, as LlamaIndex's own retrievers take it: a private one
        # would never end the wrapped retriever's traces, whose ids then pile up
        host = callback_manager or Settings.callback_manager
        super().__init__(callback_manager=host, object_map=object_map, verbose=verbose)
        advice = transformer.search_advice(self.search_type)
        if advice:
            logger.warning("%s", advice)

    @classmethod
    def from_index(
        cls,
        index: BaseIndex[Any],
        transformer: QueryTransformer | BaseQueryTransform,
        *,
        similarity_top_k: int = 5,
        retriever_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> TransformRetriever:
        """A `TransformRetriever` over ``index.as_retriever(...)`` returning at most
        ``similarity_top_k`` nodes.

        The base retriever fetches deeper when the transform's guards need more
        candidates (`candidate_depth`: 50 for ``strategy="rerank"``) and the results
        are cut to ``similarity_top_k`` (``top_k`` in ``kwargs`` overrides the cut).
        The index's embedding model is passed as ``embed_model`` unless ``kwargs``
        names one, so weighted HyDE vectors, the gate, rerank and Rocchio work.
        ``retriever_kwargs`` go to ``as_retriever`` (filters, a query mode...); other
        ``kwargs`` to the constructor.
        """
        if not isinstance(index, BaseIndex):
            raise TypeError(f"index must be a LlamaIndex index, not {type(index).__name__}")
        transformer = as_transformer(transformer, kwargs.pop("transform_metadata", None))
        check_int(similarity_top_k, "similarity_top_k", 1, MAX_TOP_K)
        if retriever_kwargs is not None and not (
            isinstance(retriever_kwargs, Mapping)
            and all(isinstance(k, str) for k in retriever_kwargs)
        ):
            raise TypeError("retriever_kwargs must be a mapping of as_retriever's option names")
        if retriever_kwargs and "similarity_top_k" in retriever_kwargs:
            raise ValueError(
                "give similarity_top_k as from_index's own argument, not in retriever_kwargs"
            )
        depth = candidate_depth(transformer.guards, similarity_top_k)
        try:
            base = index.as_retriever(similarity_top_k=depth, **dict(retriever_kwargs or {}))
        except (TypeError, ValueError) as exc:  # the index refused one of them
            kind = TypeError if isinstance(exc, TypeError) else ValueError
            raise kind(f"retriever_kwargs: {exc}") from exc
        kwargs.setdefault("top_k", similarity_top_k)
        if kwargs.get("embed_model") is None:
            kwargs["embed_model"] = embed_model_of(index)
        return cls(base, transformer, **kwargs)

    @property
    def cut(self) -> int | None:
        """How many nodes a search returns at most: ``top_k`` when set, else the
        wrapped retriever's own ``similarity_top_k`` (read at each search, since it can
        be changed); None means no cut."""
        return self.top_k if self.top_k is not None else own_top_k(self.retriever)

    # -- LlamaIndex plumbing -------------------------------------------------------
    def _get_prompt_modules(self) -> PromptMixinType:
        # "query_transform" is core TransformRetriever's key: its users' update_prompts
        # calls keep working (for a wrapped core transform it names the core one)
        inner = self.transformer.core if isinstance(self.transformer, CoreTransform) else None
        return {"transformer": self.transformer, "query_transform": inner or self.transformer}

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return _carrying_transform(self.search(query_bundle))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return _carrying_transform(await self.asearch(query_bundle))

    # -- public --------------------------------------------------------------------
    def search(
        self, query: str | QueryBundle, *, transformed: TransformResult | None = None
    ) -> SearchResult:
        """Transform ``query``, run its searches concurrently, fuse and rerank.

        With guards that need them (grounding, rerank, feedback), the question is
        searched first and its hits are reused for the question's own list. What is
        done is decided by `plan.plan`; this method only carries it out. Whatever fails
        or overruns ``model_timeout`` after the LLM (the gate, embedding the generated
        text, searching with it, fusing) falls back to the question's own search
        (`_fell_back`); a failure of the question's own search is raised.

        ``query`` may be a ``QueryBundle``, read as `Question.of` says (a precomputed
        ``embedding`` or ``custom_embedding_strs`` stand for the question's own).
        ``transformed`` is a rewrite of this very question already made (by
        ``transformer.transform_safe``, say in an earlier step of a Workflow): it is
        searched and the transform is not called again (`_check_transformed`)."""
        question = Question.of(query)
        _check_transformed(transformed, question, self.transformer)
        start = time.perf_counter()
        if not question.text:
            return self._as_given(question, start)
        guards = self.transformer.guards
        hits = None
        if plan.question_first(guards):
            hits = self._search_bundle(self._question_bundle(question))
        searching = None  # the question's own search, while the LLM writes
        if plan.overlaps(guards, self.transformer.searches_question):
            run = contextvars.copy_context().run
            searching = self._thread_pool().submit(run, self._question_hits, question)
        context = plan.context_for(guards, hits)
        with caller_bundle(question.given):
            result = _reused(transformed) or self.transformer.transform_safe(
                question.text, context=context
            )
        found = searching.result() if searching and guards.needs_question_hits else None
        hits, pending = self._after_overlap(hits, searching, found, guards)
        step: plan.Step | None = None
        deadline = Deadline.start(self.model_timeout)  # for the models after the LLM
        try:
            expanded = result
            if plan.wants_gate(result, guards) and self._have_embedder("gate"):
                similarity = self._similarity(question, result, deadline)
                top = self._top_similarity(question, hits, guards, deadline)
                expanded = plan.gate_verdict(result, guards, similarity, top)
            step = self._planned(expanded, guards, hits)
            nodes, errors = self._carry_out(step, question, hits, pending, deadline)
            result = expanded
        except BaseException as exc:
            error = failure(exc)  # interrupts go on up
            if plan.question_alone(step, question.text):
                raise
            result = _fell_back(result, error)
            step = self._planned(result, guards, hits)
            nodes, errors = self._carry_out(step, question, hits, pending, deadline)
        nodes = self._reranked_or_kept(nodes, question)
        return self._finish(nodes, result, start, errors)

    async def asearch(
        self, query: str | QueryBundle, *, transformed: TransformResult | None = None
    ) -> SearchResult:
        """Async twin of `search` (the same plan, the same steps, the same fallback);
        never calls a blocking LLM, embedding or retriever method (those without native
        async run in worker threads)."""
        question = Question.of(query)
        _check_transformed(transformed, question, self.transformer)
        start = time.perf_counter()
        if not question.text:
            return await self._aas_given(question, start)
        guards = self.transformer.guards
        hits = None
        if plan.question_first(guards):
            hits = await self._asearch_bundle(await self._aquestion_bundle(question))
        searching = None  # the question's own search, while the LLM writes
        if plan.overlaps(guards, self.transformer.searches_question):
            searching = asyncio.ensure_future(self._aquestion_hits(question))
        context = plan.context_for(guards, hits)
        try:
            beside = searching if guards.needs_question_hits else None
            result = _reused(transformed) or await self._atransform_beside(
                question, context, beside
            )
        except BaseException:
            if searching is not None:
                searching.cancel()
            raise
        found = await searching if searching and guards.needs_question_hits else None
        hits, pending = self._after_overlap(hits, searching, found, guards)
        step: plan.Step | None = None
        deadline = Deadline.start(self.model_timeout)  # for the models after the LLM
        try:
            expanded = result
            if plan.wants_gate(result, guards) and self._have_embedder("gate"):
                similarity = await self._asimilarity(question, result, deadline)
                top = await self._atop_similarity(question, hits, guards, deadline)
                expanded = plan.gate_verdict(result, guards, similarity, top)
            step = self._planned(expanded, guards, hits)
            nodes, errors = await self._acarry_out(step, question, hits, pending, deadline)
            result = expanded
        except BaseException as exc:
            # the question's own search still running is what the fallback returns: it
            # is cancelled only when this search ends here (cancelled, interrupted, or
            # the question's own search failed)
            error = _failure_or_cancel(exc, pending)
            if plan.question_alone(step, question.text):
                _cancel(pending)
                raise
            result = _fell_back(result, error)
            step = self._planned(result, guards, hits)
            nodes, errors = await self._acarry_out(step, question, hits, pending, deadline)
        nodes = await self._areranked_or_kept(nodes, question)
        return self._finish(nodes, result, start, errors)

    async def _atransform_beside(
        self, question: Question, context: list[str] | None, searching: Any
    ) -> TransformResult:
        """The transform of ``question``; with the question's own search ``searching``
        beside it (a guard that needs its hits: rerank, feedback), a failure of that
        search is raised at once and the LLM call is cancelled (a plain retriever raises
        at once: the search does not wait on the LLM for up to its timeout only to
        raise the same error). A fan-out passes None: it goes on without the
        question's list, as before."""
        with caller_bundle(question.given):
            call = self.transformer.atransform_safe(question.text, context=context)
            if searching is None:
                return await call
            transforming = asyncio.ensure_future(call)
        try:
            await asyncio.wait({searching, transforming}, return_when=asyncio.FIRST_COMPLETED)
            if searching.done() and isinstance(searching.result(), BaseException):
                transforming.cancel()
                await asyncio.wait({transforming})  # ended: no task left behind
                raise searching.result()
            return await transforming
        finally:
            if not transforming.done():
                transforming.cancel()

    def _as_given(self, question: Question, start: float) -> SearchResult:
        """A question with no text (an embedding-only bundle), searched as given."""
        found = unique_nodes(self._search_bundle(question.bundle()))
        nodes = self._reranked_or_kept(found, question)
        return self._finish(nodes, question.untransformed(self._method()), start, [])

    async def _aas_given(self, question: Question, start: float) -> SearchResult:
        found = unique_nodes(await self._asearch_bundle(question.bundle()))
        nodes = await self._areranked_or_kept(found, question)
        return self._finish(nodes, question.untransformed(self._method()), start, [])

    def _carry_out(
        self,
        step: plan.Step,
        question: Question,
        hits: Hits,
        pending: Any = None,
        deadline: Deadline | None = None,
    ) -> Carried:
        """The nodes of ``step`` and the failed sub-searches of a fan-out (raises what
        fails; the caller falls back); the models it calls answer by ``deadline``."""
        if isinstance(step, plan.Rerank):
            assert hits is not None and self.embedder is not None
            generated = self.embedder.texts(step.passages, deadline)
            head = self.doc_vectors.get(hits[:RERANK_CANDIDATES], deadline)
            return _reranked(hits, head, generated, step), []
        if isinstance(step, plan.Feedback):
            assert hits is not None
            vectors = self.doc_vectors.get(hits[: step.k], deadline)
            bundle = _feedback(question.text, self._own(question, deadline), vectors, step)
            return unique_nodes(self._search_generated(bundle, deadline)), []
        if isinstance(step, plan.Fanout):
            bundles = self._bundles(step, question, self._vectors(step, question, deadline))
            fan = _Fanout.of(step, bundles, hits, question, deadline, pending)
            lists, weights, errors = self._run_sync(fan)
            return self._combine(lists, weights), errors
        return unique_nodes(hits or []), []

    async def _acarry_out(
        self,
        step: plan.Step,
        question: Question,
        hits: Hits,
        pending: Any = None,
        deadline: Deadline | None = None,
    ) -> Carried:
        if isinstance(step, plan.Rerank):
            assert hits is not None and self.embedder is not None
            generated = await self.embedder.atexts(step.passages, deadline)
            head = await self.doc_vectors.aget(hits[:RERANK_CANDIDATES], deadline)
            return _reranked(hits, head, generated, step), []
        if isinstance(step, plan.Feedback):
            assert hits is not None
            vectors = await self.doc_vectors.aget(hits[: step.k], deadline)
            own = await self._aown(question, deadline)
            bundle = _feedback(question.text, own, vectors, step)
            return unique_nodes(await self._asearch_generated(bundle, deadline)), []
        if isinstance(step, plan.Fanout):
            dense = await self._avectors(step, question, deadline)
            bundles = self._bundles(step, question, dense)
            fan = _Fanout.of(step, bundles, hits, question, deadline, pending)
            lists, weights, errors = await self._run_async(fan)
            return self._combine(lists, weights), errors
        return unique_nodes(hits or []), []

    def _method(self) -> str:
        return self.transformer.method or type(self.transformer).__name__

    def _planned(
        self, result: TransformResult, guards: Guards, hits: list[NodeWithScore] | None
    ) -> plan.Step:
        """`plan.plan` for ``result``, warning once about a guard dropped for want of an
        embedding model."""
        decided = plan.plan(result, guards, hits, have_embedder=self.embedder is not None)
        if decided.missing_embedder:
            self._have_embedder(decided.missing_embedder)
        return decided.step

    # -- the question's own search and the guards ------------------------------------
    def _dense(self) -> bool:
        return self.embedder is not None and self.search_type != "keyword"

    def _own(self, question: Question, deadline: Deadline | None = None) -> Vec:
        """The question's vector: the caller's embedding, else the mean of the query
        embeddings of its embedding strings (as LlamaIndex's retrievers aggregate them),
        the embedder answering by ``deadline``."""
        if question.embedding is not None:
            return question.embedding
        assert self.embedder is not None
        strs = question.embedding_strs
        return _mean([self.embedder.query(text, deadline) for text in strs])

    async def _aown(self, question: Question, deadline: Deadline | None = None) -> Vec:
        if question.embedding is not None:
            return question.embedding
        assert self.embedder is not None
        strs = question.embedding_strs
        return _mean([await self.embedder.aquery(text, deadline) for text in strs])

    def _question_bundle(self, question: Question) -> QueryBundle:
        if question.embedding is None and self._dense():
            return question.bundle(_searchable(self._own(question)))
        return question.bundle()

    async def _aquestion_bundle(self, question: Question) -> QueryBundle:
        if question.embedding is None and self._dense():
            return question.bundle(_searchable(await self._aown(question)))
        return question.bundle()

    def _question_hits(self, question: Question) -> list[NodeWithScore] | BaseException:
        """The question's own hits, or what its search raised (returned, so that the
        caller decides once the transform is done: `_overlapped`)."""
        try:
            return self._search_bundle(self._question_bundle(question))
        except BaseException as exc:
            return failure(exc)

    async def _aquestion_hits(self, question: Question) -> list[NodeWithScore] | BaseException:
        try:
            return await self._asearch_bundle(await self._aquestion_bundle(question))
        except BaseException as exc:
            return failure(exc, in_task=True)

    def _after_overlap(
        self, hits: Hits, searching: Any, found: Any, guards: Guards
    ) -> tuple[Hits, Any]:
        """``(hits, pending)`` once the transform is done, ``searching`` being the
        question's own search started while the LLM wrote (or None): a guard that needs
        its hits takes what it ``found`` (`_overlapped`); a fan-out goes on with the
        search still running, ``pending``, joined with its other searches."""
        if searching is None:
            return hits, None
        if guards.needs_question_hits:
            return self._overlapped(found, guards), None
        return [], searching

    def _overlapped(
        self, found: list[NodeWithScore] | BaseException, guards: Guards
    ) -> list[NodeWithScore] | None:
        """The question's hits searched while the LLM wrote. If that search failed: a
        guard that needs them raises it (the question's own search failed, as a plain
        retriever's would); a fan-out goes on without them (its own search of the
        question then reports the failure beside the other lists)."""
        if not isinstance(found, BaseException):
            return found
        if guards.needs_question_hits:
            raise found
        return None

    def _search_bundle(self, bundle: QueryBundle) -> list[NodeWithScore]:
        return list(self.retriever.retrieve(bundle))

    async def _asearch_bundle(self, bundle: QueryBundle) -> list[NodeWithScore]:
        """A search on the async path: a native async retriever awaited, a blocking
        one unbounded on its own threads (`door`, ``kind="search"``)."""
        if overrides(self.retriever, "_aretrieve", BaseRetriever):
            return list(await self.retriever.aretrieve(bundle))
        call = partial(self.retriever.retrieve, bundle)
        return list(await door.arun(call, on=self.retriever, kind="search", what=_SEARCH))

    def _similarity(
        self, question: Question, result: TransformResult, deadline: Deadline | None
    ) -> float:
        """Cosine of the question's vector and the generated text's mean (the gate);
        `plan.UnusableVector` when a vector cannot be compared."""
        assert self.embedder is not None
        generated = self.embedder.texts(result.hypothetical, deadline)
        return _similarity(self._own(question, deadline), generated)

    async def _asimilarity(
        self, question: Question, result: TransformResult, deadline: Deadline | None
    ) -> float:
        assert self.embedder is not None
        generated = await self.embedder.atexts(result.hypothetical, deadline)
        return _similarity(await self._aown(question, deadline), generated)

    def _top_similarity(
        self,
        question: Question,
        hits: list[NodeWithScore] | None,
        guards: Guards,
        deadline: Deadline | None,
    ) -> float | None:
        """Cosine of the question's vector and its own top hit's stored vector (the
        relative gate's reference); None with no relative gate or no hit."""
        if guards.gate_relative is None or not hits:
            return None
        top = self.doc_vectors.get(hits[:1], deadline)
        return _similarity(self._own(question, deadline), top)

    async def _atop_similarity(
        self,
        question: Question,
        hits: list[NodeWithScore] | None,
        guards: Guards,
        deadline: Deadline | None,
    ) -> float | None:
        if guards.gate_relative is None or not hits:
            return None
        top = await self.doc_vectors.aget(hits[:1], deadline)
        return _similarity(await self._aown(question, deadline), top)

    def _have_embedder(self, what: str) -> bool:
        if self.embedder is not None:
            return True
        if not self._warned_no_embedder:
            self._warned_no_embedder = True
            logger.warning(
                "the %s needs an embedding model and the wrapped retriever has none; "
                "pass TransformRetriever(..., embed_model=...). Searching without it.",
                what,
            )
        return False

    # -- searches ------------------------------------------------------------------
    def _wants_vector(self, spec: SearchSpec, query: str) -> bool:
        """Whether ``spec`` is searched with a vector we embed (weighted passages, or
        the question itself) rather than the retriever's own embedding of its strings
        (a core transform's ``custom_embedding_strs``, a paraphrase)."""
        return self._dense() and bool(spec.passages or plan.is_question(spec, query))

    def _to_embed(self, step: plan.Fanout, query: str) -> list[SearchSpec | None]:
        """The searches of ``step`` that need a vector we embed (None: none, or reused);
        the sync and async paths differ only in how they embed them."""
        return [
            None if reused or not self._wants_vector(spec, query) else spec
            for spec, reused in zip(step.specs, step.reuse)
        ]

    def _vectors(
        self, step: plan.Fanout, question: Question, deadline: Deadline | None = None
    ) -> list[_Dense | None]:
        """The embeddings each search of ``step`` needs (None: none, reused, or the
        plain question's when the embedder failed: see `_embed`)."""
        todo = self._to_embed(step, question.text)
        return [None if s is None else self._embed(s, question, deadline) for s in todo]

    async def _avectors(
        self, step: plan.Fanout, question: Question, deadline: Deadline | None = None
    ) -> list[_Dense | None]:
        todo = self._to_embed(step, question.text)
        return [None if s is None else await self._aembed(s, question, deadline) for s in todo]

    def _embed(
        self, spec: SearchSpec, question: Question, deadline: Deadline | None
    ) -> _Dense | None:
        """The question's query vector and the passages' document vectors for ``spec``
        (a sub-question of a chain is embedded as a query of its own), the embedder
        answering by ``deadline``. None for the plain question when the embedder fails
        or overruns: the wrapped retriever embeds it itself, as it would alone (so the
        fallback after a hung embedder does not wait on it again)."""
        assert self.embedder is not None
        if plan.is_question(spec, question.text):
            try:
                return self._own(question, deadline), []
            except BaseException as exc:
                _unembedded(failure(exc))
                return None
        asked = spec.query or question.text
        if asked == question.text:
            own = self._own(question, deadline)
        else:
            own = self.embedder.query(asked, deadline)
        return own, self.embedder.texts(spec.passages, deadline) if spec.passages else []

    async def _aembed(
        self, spec: SearchSpec, question: Question, deadline: Deadline | None
    ) -> _Dense | None:
        assert self.embedder is not None
        if plan.is_question(spec, question.text):
            try:
                return await self._aown(question, deadline), []
            except BaseException as exc:
                _unembedded(failure(exc, in_task=True))
                return None
        asked = spec.query or question.text
        if asked == question.text:
            own = await self._aown(question, deadline)
        else:
            own = await self.embedder.aquery(asked, deadline)
        passages = await self.embedder.atexts(spec.passages, deadline) if spec.passages else []
        return own, passages

    def _bundles(
        self, step: plan.Fanout, question: Question, vectors: list[_Dense | None]
    ) -> list[QueryBundle | None]:
        """One bundle per search of ``step`` (None for a reused one); the question's
        own search carries what the caller gave for it (`Question.bundle`). Raises
        `plan.UnusableVector` when a generated vector cannot be searched with."""
        bundles: list[QueryBundle | None] = []
        for spec, reused, dense in zip(step.specs, step.reuse, vectors):
            own = plan.is_question(spec, question.text)
            if reused:
                bundles.append(None)
            elif own:  # our vector of the question only if it can be searched with
                bundles.append(question.bundle(_searchable(dense[0]) if dense else None))
            elif spec.embedding is not None:  # a core transform's own vector, as given
                vector = list(spec.embedding)
                plan.check_vectors([vector], "transformed")
                bundles.append(QueryBundle(query_str=spec.text, embedding=vector))
            elif dense is None:
                strs = list(spec.embedding_strs)
                text = self._query_str(spec)
                bundles.append(QueryBundle(query_str=text, custom_embedding_strs=strs))
            else:
                bundles.append(_dense_bundle(self._query_str(spec), spec, dense))
        return bundles

    def _query_str(self, spec: SearchSpec) -> str:
        """The ``query_str`` of the search ``spec``: its text (the passages, the
        question repeated to its weight) for a keyword or hybrid retriever, which
        matches it; for a dense one the question it asks (``spec.query`` beside
        passages), as core's HyDE sends it, the generated text going only to the
        embedding (``custom_embedding_strs`` or our vector)."""
        if self.search_type in ("keyword", "hybrid"):
            return spec.text
        return spec.query if spec.passages and spec.query else spec.text

    def _run_sync(self, fan: _Fanout) -> Found:
        """The searches of ``fan`` at once. Those of the generated text run on the
        retriever's own worker threads (`door`), ``max_concurrency`` at a time,
        until ``fan.deadline`` (one that overruns fails, as one that raises does); the
        question's own search is not bounded (the user's own: a plain retriever would
        wait on it too) and runs on the fan-out's threads; a lone search runs here."""
        outcomes = fan.outcomes
        if fan.lone is not None:
            try:
                outcomes[fan.lone] = self._search_one(fan, fan.lone)
            except Exception as exc:
                outcomes[fan.lone] = exc
            return self._split(fan.step.specs, outcomes)
        if fan.todo:
            run = self.retriever.retrieve
            ctx = contextvars.copy_context
            pool = self._thread_pool()
            futures = {i: pool.submit(ctx().run, run, fan.bundle(i)) for i in fan.own}
            generated = [i for i in fan.todo if i not in fan.own]
            calls = [partial(run, fan.bundle(i)) for i in generated]
            at_once = self.max_concurrency - len(fan.own) - (fan.pending is not None)
            found = door.run_all(
                calls,
                on=self.retriever,
                kind="store",
                deadline=fan.deadline,
                what=_SEARCH,
                at_once=at_once,
            )
            outcomes = _placed(outcomes, generated, found)
            for i, future in futures.items():
                try:
                    outcomes[i] = future.result()
                except BaseException as exc:
                    outcomes[i] = failure(exc)
        if fan.pending is not None:
            _joined(fan.step, outcomes, fan.pending.result())
        return self._split(fan.step.specs, outcomes)

    def _search_one(self, fan: _Fanout, i: int) -> Any:
        """Search ``i`` of ``fan`` in this thread: the question's own unbounded, one
        with the generated text until the deadline (`_search_generated`)."""
        if i in fan.own:
            return self.retriever.retrieve(fan.bundle(i))
        return self._search_generated(fan.bundle(i), fan.deadline)

    def _search_generated(self, bundle: QueryBundle, deadline: Deadline | None) -> Any:
        """A search with the generated text (or vectors), bounded by ``deadline`` on
        the retriever's threads (`ModelTimeoutError` once it passes; None: in this thread), or
        in this thread when the search only computes (`searches_in_process`)."""
        if deadline is not None and searches_in_process(self.retriever, bundle):
            deadline = None
        call = partial(self._search_bundle, bundle)
        return door.run(call, on=self.retriever, kind="store", deadline=deadline, what=_SEARCH)

    async def _asearch_generated(self, bundle: QueryBundle, deadline: Deadline | None) -> Any:
        """`_search_generated` on the async path: a native async retriever cancelled at
        ``deadline`` (awaited in this task when `searches_in_process`), a blocking one
        on the retriever's threads (never the loop's executor)."""
        if overrides(self.retriever, "_aretrieve", BaseRetriever):
            if deadline is not None and searches_in_process(self.retriever, bundle):
                deadline = None  # awaited in this task: no task of its own to bound
            return await await_within(self._asearch_bundle(bundle), deadline, _SEARCH)
        call = partial(self._search_bundle, bundle)
        return await door.arun(
            call, on=self.retriever, kind="store", deadline=deadline, what=_SEARCH
        )

    def _thread_pool(self) -> ThreadPoolExecutor:
        """Worker threads for the sync fan-out, created once and reused (idle threads
        cost nothing; creating them per search did). At most ``max_concurrency``."""
        if self._pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        max_workers=self.max_concurrency, thread_name_prefix="hyde-plus"
                    )
        return self._pool

    def close(self) -> None:
        """Stop the worker threads of the sync fan-out (they restart if needed)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    async def _asearch_one(
        self, bundle: QueryBundle, own: bool, deadline: Deadline | None, gate: Any = None
    ) -> Any:
        """One search of a fan-out (past ``gate`` when there is one): the question's own
        unbounded, one with the generated text until ``deadline``."""
        if gate is not None:
            async with gate:
                return await self._asearch_one(bundle, own, deadline)
        if own:
            return await self._asearch_bundle(bundle)
        return await self._asearch_generated(bundle, deadline)

    async def _run_async(self, fan: _Fanout) -> Found:
        outcomes = fan.outcomes
        if fan.lone is not None:  # one search: no task, no semaphore
            i = fan.lone
            try:
                outcomes[i] = await self._asearch_one(fan.bundle(i), i in fan.own, fan.deadline)
            except BaseException as exc:
                outcomes[i] = failure(exc, in_task=True)
            return self._split(fan.step.specs, outcomes)
        running = 0 if fan.pending is None else 1  # the question's search holds one place
        gate = None
        if len(fan.todo) + running > self.max_concurrency:
            gate = asyncio.Semaphore(max(1, self.max_concurrency - running))
        searches: list[Any] = [
            self._asearch_one(fan.bundle(i), i in fan.own, fan.deadline, gate) for i in fan.todo
        ]
        if fan.pending is not None:  # the question's own search, started while the LLM wrote
            searches.append(fan.pending)
        found = await asyncio.gather(*searches, return_exceptions=True)
        found = [  # our own cancellation raised out of gather; these are the searches'
            failure(o, in_task=True) if isinstance(o, BaseException) else o for o in found
        ]
        if fan.pending is not None:
            _joined(fan.step, outcomes, found.pop())
        for i, outcome in zip(fan.todo, found):
            outcomes[i] = outcome
        return self._split(fan.step.specs, outcomes)

    def _split(self, specs: Sequence[SearchSpec], outcomes: list[Any]) -> Found:
        lists: list[list[NodeWithScore]] = []
        weights: list[float] = []
        errors: list[str] = []
        first_error: Exception | None = None
        for spec, outcome in zip(specs, outcomes):
            if isinstance(outcome, Exception):
                self._log_failure(spec, outcome)
                errors.append(describe(outcome))
                first_error = first_error or outcome
            else:
                lists.append(list(outcome))
                weights.append(spec.weight)
        if not lists and first_error is not None:
            raise first_error
        return lists, weights, errors

    def _log_failure(self, spec: SearchSpec, exc: Exception) -> None:
        logger.warning(
            "sub-search %r failed (%s); using the other searches",
            spec.text[:80],
            describe(exc),
        )

    def _combine(
        self, lists: list[list[NodeWithScore]], weights: list[float]
    ) -> list[NodeWithScore]:
        if len(lists) == 1:  # copied only for a reranker (`_reranked_or_kept`)
            return unique_nodes(lists[0])
        mode = self.fusion or self.transformer.default_fusion
        if mode is FusionMode.INTERLEAVE and len(set(weights)) > 1:
            mode = FusionMode.RRF  # interleaving cannot weigh lists; RRF can
        return fuse(lists, mode, weights=weights, k=self.transformer.rrf_k)

    def _reranked_or_kept(
        self, nodes: list[NodeWithScore], question: Question
    ) -> list[NodeWithScore]:
        """``nodes`` through the ``reranker``; as they are, with a warning, when it fails
        (a reranker is one more component that never breaks search). A reranker gets
        fresh wrappers (`_copy`): its scores never touch the wrapped retriever's
        objects; without one the nodes are handed on as that retriever made them, as a
        plain retriever would (a copy was a fifth of a cache hit's cost)."""
        if self.reranker is None or not nodes:
            return nodes
        deadline = Deadline.start(self.model_timeout)  # its own: whatever came before
        given = _copy(nodes)  # what it scores; one that overran goes on with these alone
        try:
            call = self._rerank_call(given, question)
            out = door.run(call, on=self.reranker, deadline=deadline, what=_RERANKER)
            return _rerank_output(out)
        except BaseException as exc:
            self._rerank_failed(failure(exc))
            return nodes

    def _rerank_call(
        self, nodes: list[NodeWithScore], question: Question
    ) -> Callable[[], list[NodeWithScore]]:
        reranker, bundle = self.reranker, question.bundle()
        assert reranker is not None
        return lambda: reranker.postprocess_nodes(nodes, query_bundle=bundle)

    async def _areranked_or_kept(
        self, nodes: list[NodeWithScore], question: Question
    ) -> list[NodeWithScore]:
        if self.reranker is None or not nodes:
            return nodes
        deadline = Deadline.start(self.model_timeout)
        given = _copy(nodes)  # see _reranked_or_kept
        try:
            if overrides(self.reranker, "_apostprocess_nodes", BaseNodePostprocessor):
                coro = self.reranker.apostprocess_nodes(given, query_bundle=question.bundle())
                return _rerank_output(await await_within(coro, deadline, _RERANKER))
            call = self._rerank_call(given, question)
            out = await door.arun(call, on=self.reranker, deadline=deadline, what=_RERANKER)
            return _rerank_output(out)
        except BaseException as exc:
            self._rerank_failed(failure(exc, in_task=True))
            return nodes

    def _rerank_failed(self, exc: Exception) -> None:
        logger.warning("the reranker failed (%s); returning the nodes as fused", describe(exc))

    def _finish(
        self,
        nodes: list[NodeWithScore],
        result: TransformResult,
        start: float,
        errors: list[str],
    ) -> SearchResult:
        cut = self.cut
        if cut is not None:
            nodes = nodes[:cut]
        return SearchResult(
            nodes=nodes,
            transform=result,
            latency_s=time.perf_counter() - start,
            failed_searches=tuple(errors),
        )


def _carrying_transform(result: SearchResult) -> list[NodeWithScore]:
    """``result``'s nodes, the first a copy whose metadata carries the transform's
    summary (`provenance.tag_nodes`)."""
    info = summary(result.transform, result.failed_searches, result.latency_s)
    return tag_nodes(result.nodes, info)


_Dense = tuple[list[float], list[list[float]]]
"""A search's own question vector and its passages' vectors."""


def _mean(vectors: Sequence[Vec]) -> Vec:
    """The element-wise mean of ``vectors`` (one vector: itself)."""
    if len(vectors) == 1:
        return vectors[0]
    return [sum(column) / len(vectors) for column in zip(*vectors)]


def _searchable(vector: Vec) -> Vec | None:
    """``vector``, or None when it cannot be searched with (empty, NaN, infinite or all
    zeros): the wrapped retriever then embeds the question itself."""
    try:
        plan.check_vectors([vector], "question")
    except plan.UnusableVector:
        return None
    return vector


def _unembedded(exc: Exception) -> None:
    """No vector of ours for the question's own search (the embedder failed with
    ``exc``): the wrapped retriever embeds the question itself."""
    logger.warning(
        "embedding the question failed (%s); the retriever embeds it itself",
        describe(exc),
    )


def _cancel(task: Any) -> None:
    """Cancel ``task`` (the question's own search, or None) if it is still running."""
    if task is not None and not task.done():
        task.cancel()


def _failure_or_cancel(exc: BaseException, pending: Any) -> Exception:
    """`failure` of ``exc`` on the async path; when ``exc`` must propagate (our own
    cancellation, an interrupt), ``pending`` is cancelled first so no task is left
    behind."""
    try:
        return failure(exc, in_task=True)
    except BaseException:
        _cancel(pending)
        raise


def _fell_back(result: TransformResult, exc: Exception) -> TransformResult:
    """The one place where a failure after the LLM (embedding the generated text,
    searching with it, fusing) becomes the question's own search: ``result`` as a
    fallback saying why (`plan.degraded`). Only failures come here (`reliability.failure`):
    cancellation and interrupts propagate."""
    reason = str(exc) if isinstance(exc, plan.UnusableVector) else describe(exc)
    logger.warning(
        "searching with the %s output failed (%s); searching with the question alone",
        result.method,
        reason,
    )
    return plan.degraded(result, reason)


def _similarity(own: Vec, generated: list[Vec]) -> float:
    """The cosine of the question's vector ``own`` and the mean of the ``generated``
    text's vectors (`plan.UnusableVector` when one cannot be used)."""
    plan.check_vectors([own, *generated], "question or passage", len(own))
    return expansion.cosine(own, expansion.mean_unit(generated))


def _dense_bundle(query_str: str, spec: SearchSpec, dense: _Dense) -> QueryBundle:
    """The bundle of a search with our own vector: the weighted mix of the question and
    the passages, or the query's own vector when there are none. `plan.UnusableVector`
    when a vector is empty, of another size than the question's, NaN or infinite."""
    own, passages = dense
    if not passages:  # a sub-question of a chain, embedded as a query of its own
        return QueryBundle(query_str=query_str, embedding=_searchable(own))
    plan.check_vectors([own, *passages], "question or passage", len(own))
    vector = expansion.weighted_vector(own, passages, spec.query_weight)
    plan.check_vectors([vector], "weighted search")
    return QueryBundle(query_str=query_str, embedding=vector)


def _feedback(query: str, own: Vec, doc_vectors: list[Vec], step: plan.Feedback) -> QueryBundle:
    """The Rocchio search's bundle (`plan.UnusableVector` when a vector cannot be used:
    the caller keeps the question's own hits)."""
    plan.check_vectors([own, *doc_vectors], "question or document", len(own))
    vector = expansion.rocchio_vector(own, doc_vectors, step.alpha, step.beta)
    plan.check_vectors([vector], "feedback")
    return QueryBundle(query_str=query, embedding=vector)


def _reranked(
    hits: list[NodeWithScore],
    doc_vectors: list[Vec],
    generated: list[Vec],
    step: plan.Rerank,
) -> list[NodeWithScore]:
    """The first `RERANK_CANDIDATES` of ``hits`` (``doc_vectors`` are theirs) reordered
    by the blend (see `_blend`), then the rest in the order found, scored below them;
    `plan.UnusableVector` when a passage or document vector cannot be used (the caller
    keeps ``hits`` as found)."""
    plan.check_vectors([*doc_vectors, *generated], "document or passage")
    head = _blend(hits[:RERANK_CANDIDATES], doc_vectors, expansion.mean_unit(generated), step.blend)
    seen = {item.node.node_id for item in head}
    rest = unique_nodes([x for x in hits[RERANK_CANDIDATES:] if x.node.node_id not in seen])
    floor = min((float(item.score or 0.0) for item in head), default=0.0)
    return [*head, *(scored(item.node, floor - 1e-6 * (i + 1)) for i, item in enumerate(rest))]


def _blend(
    hits: list[NodeWithScore],
    doc_vectors: list[list[float]],
    generated: Any,
    blend: float,
) -> list[NodeWithScore]:
    """``hits`` reordered by the blend of their own score and their similarity to the
    generated text (see `expansion.blend_scores`); the same nodes, new wrappers."""
    unique = unique_nodes(hits)
    if len(unique) != len(hits):
        keep = {id(item) for item in unique}
        doc_vectors = [v for item, v in zip(hits, doc_vectors) if id(item) in keep]
    sims = [expansion.cosine(v, generated) for v in doc_vectors]
    scores = expansion.blend_scores([float(h.score or 0.0) for h in unique], sims, blend)
    order = expansion.best_first(scores)
    return [scored(unique[i].node, scores[i]) for i in order]
