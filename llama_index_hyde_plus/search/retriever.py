"""`TransformRetriever`: transform -> concurrent fan-out -> fuse -> rerank."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
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

from .._checks import check_int, is_int, is_number
from ..provenance import summary, tag_nodes
from ..transforms.base import Guards, QueryTransformer, TransformResult
from ..transforms.core import CoreTransform, as_transformer
from . import steps
from .fusion import FusionMode
from .loops import IN_PROCESS_STORES, Async, Blocking, searches_in_process
from .steps import RERANK_CANDIDATES, Question
from .vectors import DocVectors, Embedder, embed_model_of

__all__ = [
    "IN_PROCESS_STORES",
    "MAX_TOP_K",
    "RERANK_CANDIDATES",
    "Question",
    "SearchResult",
    "TransformRetriever",
    "candidate_depth",
    "detect_search_type",
    "searches_in_process",
    "wrapped_top_k",
]

logger = logging.getLogger(__name__)


SearchType = Literal["auto", "dense", "keyword", "hybrid"]
_KEYWORD_MODES = {"sparse", "text_search"}
_HYBRID_MODES = {"hybrid", "semantic_hybrid"}

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


def wrapped_top_k(retriever: BaseRetriever) -> int | None:
    """The wrapped retriever's own ``similarity_top_k`` (a positive int), else None."""
    value = getattr(retriever, "similarity_top_k", None)
    if is_int(value) and value >= 1:
        return value
    return None


@dataclass(frozen=True)
class SearchResult:
    """Nodes of one search, the transform that shaped it, and its wall time.

    ``failed_searches`` lists the sub-searches of a fan-out that raised (their error
    text); the nodes come from the others. ``failed_positions`` says which they were:
    their places, from 0, among the searches the transform planned (the question's
    own comes first when the transform plans it).
    """

    nodes: list[NodeWithScore]
    transform: TransformResult
    latency_s: float
    failed_searches: tuple[str, ...] = ()
    failed_positions: tuple[int, ...] = ()


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
        model_timeout: float | None = 30.0,
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
        self._blocking = Blocking(self)
        self._async = Async(self)
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
        return self.top_k if self.top_k is not None else wrapped_top_k(self.retriever)

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
        done is decided by `plan.plan`; the steps (`steps.search`) carry it out, the
        same generator on both paths. Whatever fails or overruns ``model_timeout``
        after the LLM (the gate, embedding the generated text, searching with it,
        fusing) falls back to the question's own search (`steps.fell_back`); a
        failure of the question's own search is raised.

        ``query`` may be a ``QueryBundle``, read as `Question.of` says (a precomputed
        ``embedding`` or ``custom_embedding_strs`` stand for the question's own).
        ``transformed`` is a rewrite of this very question already made (by
        ``transformer.transform_safe``, say in an earlier step of a Workflow): it is
        searched and the transform is not called again (`_check_transformed`)."""
        question = Question.of(query)
        _check_transformed(transformed, question, self.transformer)
        start = time.perf_counter()
        found = self._blocking.run(steps.search(self, question, transformed))
        return self._finish(found, start)

    async def asearch(
        self, query: str | QueryBundle, *, transformed: TransformResult | None = None
    ) -> SearchResult:
        """`search` on the async path: the same steps carried out by awaits and tasks;
        never calls a blocking LLM, embedding or retriever method in the event loop
        (those without native async run in worker threads)."""
        question = Question.of(query)
        _check_transformed(transformed, question, self.transformer)
        start = time.perf_counter()
        found = await self._async.run(steps.search(self, question, transformed))
        return self._finish(found, start)

    def explain_scores(self, found: SearchResult) -> str | None:
        """What the scores of ``found``, a search of this retriever, are, in one line
        within 80 columns, when they fuse several ranked lists: ``"fused = sum of
        weight/(60+rank) over 3 searches (question x100, rest x1)"`` (RRF's sums are
        ranks, not similarities: a question weight of 100 puts its top hit at
        100/61 = 1.64); None when they are one list's own (the store's similarity, a
        rerank's blend, a reranker's score)."""
        return steps.scoring(self, found.transform, found.failed_positions)

    def close(self) -> None:
        """Stop the worker threads of the sync fan-out (they restart if needed)."""
        self._blocking.close()

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

    def _finish(self, found: steps.Found, start: float) -> SearchResult:
        nodes, result, errors = found
        cut = self.cut
        if cut is not None:
            nodes = nodes[:cut]
        return SearchResult(
            nodes=nodes,
            transform=result,
            latency_s=time.perf_counter() - start,
            failed_searches=tuple(text for _, text in errors) if errors else (),
            failed_positions=tuple(i for i, _ in errors) if errors else (),
        )


def _carrying_transform(result: SearchResult) -> list[NodeWithScore]:
    """``result``'s nodes, the first a copy whose metadata carries the transform's
    summary (`provenance.tag_nodes`)."""
    info = summary(result.transform, result.failed_searches, result.latency_s)
    return tag_nodes(result.nodes, info)
