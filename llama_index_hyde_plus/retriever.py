"""`TransformRetriever`: transform -> concurrent fan-out -> fuse -> rerank."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.prompts.mixin import PromptMixinType
from llama_index.core.schema import NodeWithScore, QueryBundle

from .fusion import FusionMode, fuse, unique_nodes
from .transforms.base import QueryTransformer, SearchSpec, TransformResult, validate_query

logger = logging.getLogger("llama_index_hyde_plus")

SearchType = Literal["auto", "dense", "keyword", "hybrid"]
_KEYWORD_MODES = {"sparse", "text_search"}
_HYBRID_MODES = {"hybrid", "semantic_hybrid"}


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


def _has_native(obj: Any, name: str, base: type) -> bool:
    return getattr(type(obj), name, None) is not getattr(base, name, None)


def _copy(nodes: Sequence[NodeWithScore]) -> list[NodeWithScore]:
    """Fresh NodeWithScore wrappers (deduplicated by node id), so that scoring
    downstream never touches the wrapped retriever's objects."""
    return [NodeWithScore(node=item.node, score=item.score) for item in unique_nodes(nodes)]


class TransformRetriever(BaseRetriever):
    """Wrap any LlamaIndex retriever so every query is transformed first.

    Every search a transform asks for (one for HyDE, several for multi-query,
    step-back, decompose) runs concurrently, up to ``max_concurrency`` at a time (on
    the async path as tasks, on the sync path in worker threads, which also works
    inside a running event loop such as Jupyter's). The lists are fused with ``fusion``
    (default: the transform's own preference, RRF, or interleave for `Decompose`),
    deduplicated by node id, optionally reranked against the ORIGINAL question, and cut
    to ``top_k``. A failing sub-search is logged and the others still count.

    ``search_type`` says how the wrapped retriever matches ("auto" guesses): dense
    retrievers get the averaged embedding of the HyDE passages (and query), keyword and
    hybrid ones get the passage text as ``query_str``.
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        transformer: QueryTransformer,
        *,
        fusion: FusionMode | str | None = None,
        top_k: int | None = None,
        reranker: BaseNodePostprocessor | None = None,
        max_concurrency: int = 8,
        search_type: SearchType = "auto",
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        if not isinstance(retriever, BaseRetriever):
            raise TypeError(
                f"retriever must be a LlamaIndex BaseRetriever, not {type(retriever).__name__}"
            )
        if not isinstance(transformer, QueryTransformer):
            raise TypeError(
                f"transformer must be a QueryTransformer, not {type(transformer).__name__}"
            )
        if top_k is not None and (isinstance(top_k, bool) or top_k < 1):
            raise ValueError("top_k must be >= 1 or None")
        if isinstance(max_concurrency, bool) or max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        if search_type not in ("auto", "dense", "keyword", "hybrid"):
            raise ValueError("search_type must be one of 'auto', 'dense', 'keyword', 'hybrid'")
        if reranker is not None and not isinstance(reranker, BaseNodePostprocessor):
            raise TypeError("reranker must be a LlamaIndex node postprocessor")
        self.retriever = retriever
        self.transformer = transformer
        self.fusion = FusionMode(fusion) if fusion is not None else None
        self.top_k = top_k
        self.reranker = reranker
        self.max_concurrency = max_concurrency
        self.search_type = detect_search_type(retriever) if search_type == "auto" else search_type
        self._warned_include_query = False
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        super().__init__(callback_manager=callback_manager, verbose=verbose)
        if getattr(transformer, "method", "") == "hyde" and not transformer.include_query:
            self._warn_include_query()

    # -- LlamaIndex plumbing -------------------------------------------------------
    def _get_prompt_modules(self) -> PromptMixinType:
        return {"transformer": self.transformer}

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self.search(query_bundle.query_str).nodes

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return (await self.asearch(query_bundle.query_str)).nodes

    # -- public --------------------------------------------------------------------
    def search(self, query: str) -> SearchResult:
        """Transform ``query``, run its searches concurrently, fuse and rerank."""
        validate_query(query)
        start = time.perf_counter()
        result = self.transformer.transform_safe(query)
        self._check_include_query(result)
        specs = result.searches()
        lists, errors = self._run_sync(specs)
        nodes = self._combine(lists, result)
        if self.reranker is not None and nodes:
            nodes = self.reranker.postprocess_nodes(nodes, query_bundle=QueryBundle(query))
        return self._finish(nodes, result, start, errors)

    async def asearch(self, query: str) -> SearchResult:
        """Async twin of `search`; never calls a blocking LLM or retriever method."""
        validate_query(query)
        start = time.perf_counter()
        result = await self.transformer.atransform_safe(query)
        self._check_include_query(result)
        specs = result.searches()
        lists, errors = await self._run_async(specs)
        nodes = self._combine(lists, result)
        if self.reranker is not None and nodes:
            nodes = await self._arerank(nodes, query)
        return self._finish(nodes, result, start, errors)

    # -- internals -----------------------------------------------------------------
    def _bundle(self, spec: SearchSpec) -> QueryBundle:
        return QueryBundle(query_str=spec.text, custom_embedding_strs=list(spec.embedding_strs))

    def _run_sync(self, specs: list[SearchSpec]) -> tuple[list[list[NodeWithScore]], list[str]]:
        if len(specs) == 1:
            try:
                return [self.retriever.retrieve(self._bundle(specs[0]))], []
            except Exception as exc:
                self._log_failure(specs[0], exc)
                raise
        pool = self._thread_pool()
        futures = [
            pool.submit(contextvars.copy_context().run, self.retriever.retrieve, self._bundle(spec))
            for spec in specs
        ]
        outcomes: list[Any] = []
        for future in futures:
            try:
                outcomes.append(future.result())
            except Exception as exc:
                outcomes.append(exc)
        return self._split(specs, outcomes)

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

    async def _retrieve_one(self, spec: SearchSpec, gate: asyncio.Semaphore) -> Any:
        async with gate:
            bundle = self._bundle(spec)
            if _has_native(self.retriever, "_aretrieve", BaseRetriever):
                return await self.retriever.aretrieve(bundle)
            return await asyncio.to_thread(self.retriever.retrieve, bundle)

    async def _run_async(
        self, specs: list[SearchSpec]
    ) -> tuple[list[list[NodeWithScore]], list[str]]:
        gate = asyncio.Semaphore(self.max_concurrency)
        outcomes = await asyncio.gather(
            *(self._retrieve_one(spec, gate) for spec in specs), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome
        return self._split(specs, list(outcomes))

    def _split(
        self, specs: list[SearchSpec], outcomes: list[Any]
    ) -> tuple[list[list[NodeWithScore]], list[str]]:
        lists: list[list[NodeWithScore]] = []
        errors: list[str] = []
        first_error: Exception | None = None
        for spec, outcome in zip(specs, outcomes):
            if isinstance(outcome, Exception):
                self._log_failure(spec, outcome)
                errors.append(f"{type(outcome).__name__}: {outcome}")
                first_error = first_error or outcome
            else:
                lists.append(list(outcome))
        if not lists and first_error is not None:
            raise first_error
        return lists, errors

    def _log_failure(self, spec: SearchSpec, exc: Exception) -> None:
        logger.warning(
            "sub-search %r failed (%s: %s); using the other searches",
            spec.text[:80],
            type(exc).__name__,
            exc,
        )

    def _combine(
        self, lists: list[list[NodeWithScore]], result: TransformResult
    ) -> list[NodeWithScore]:
        if len(lists) == 1:
            return _copy(lists[0])
        mode = self.fusion or self.transformer.default_fusion
        return fuse(lists, mode)

    async def _arerank(self, nodes: list[NodeWithScore], query: str) -> list[NodeWithScore]:
        assert self.reranker is not None
        bundle = QueryBundle(query)
        if _has_native(self.reranker, "_apostprocess_nodes", BaseNodePostprocessor):
            return await self.reranker.apostprocess_nodes(nodes, query_bundle=bundle)
        return await asyncio.to_thread(self.reranker.postprocess_nodes, nodes, query_bundle=bundle)

    def _finish(
        self,
        nodes: list[NodeWithScore],
        result: TransformResult,
        start: float,
        errors: list[str],
    ) -> SearchResult:
        if self.top_k is not None:
            nodes = nodes[: self.top_k]
        return SearchResult(
            nodes=nodes,
            transform=result,
            latency_s=time.perf_counter() - start,
            failed_searches=tuple(errors),
        )

    def _check_include_query(self, result: TransformResult) -> None:
        if result.hypothetical and not result.include_query:
            self._warn_include_query()

    def _warn_include_query(self) -> None:
        if self._warned_include_query or self.search_type not in ("keyword", "hybrid"):
            return
        self._warned_include_query = True
        logger.warning(
            "HyDE has include_query=False but the retriever uses %s search: keyword "
            "matching will see only the generated passage, not the user's words. "
            "Use HyDE(include_query=True) for keyword and hybrid search.",
            self.search_type,
        )
