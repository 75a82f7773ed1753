"""`TransformRetriever`: transform -> concurrent fan-out -> fuse -> rerank."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Literal

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.callbacks import CallbackManager
from llama_index.core.indices.base import BaseIndex
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.prompts.mixin import PromptMixinType
from llama_index.core.schema import NodeWithScore, QueryBundle

from . import expansion
from .fusion import FusionMode, fuse, unique_nodes
from .provenance import summary, tag_nodes
from .transforms.base import (
    Guards,
    QueryTransformer,
    SearchSpec,
    TransformResult,
    check_int,
    validate_query,
)
from .transforms.hyde import HyDE
from .vectors import DocVectors, Embedder, embed_model_of

logger = logging.getLogger(__name__)

SearchType = Literal["auto", "dense", "keyword", "hybrid"]
_KEYWORD_MODES = {"sparse", "text_search"}
_HYBRID_MODES = {"hybrid", "semantic_hybrid"}

RERANK_CANDIDATES = 50
"""How many of the question's hits a reranking transform (``strategy="rerank"``)
reorders before the top ``similarity_top_k`` are kept, when the retriever is built from
an index (`TransformRetriever.from_index`, `HyDERAG`)."""


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
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
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

    ``top_k=None`` (the default) means the wrapped retriever's own top k: its
    ``similarity_top_k`` when it has one (a fan-out over a ``similarity_top_k=3``
    retriever returns at most 3 nodes, like the retriever alone), else no cut. An int
    is an explicit cut, read as is (it cannot return more than the fused lists hold).

    ``retrieve`` / ``aretrieve`` (what query engines call) return copies of the nodes
    whose metadata carries a summary of the transform under ``"hyde_plus"``, hidden
    from the answer prompt and embeddings; `transform_of` reads it back from a
    response. `search` returns the full `SearchResult` and leaves the nodes as found.

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
        embed_model: BaseEmbedding | Embedder | None = None,
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
        if embed_model is not None and not isinstance(embed_model, (BaseEmbedding, Embedder)):
            raise TypeError("embed_model must be a LlamaIndex BaseEmbedding")
        self.retriever = retriever
        self.transformer = transformer
        self.fusion = FusionMode(fusion) if fusion is not None else None
        self.top_k = top_k
        self.reranker = reranker
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
        self._warned_include_query = False
        self._warned_no_embedder = False
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        super().__init__(callback_manager=callback_manager, verbose=verbose)
        if isinstance(transformer, HyDE) and not transformer.include_query:
            self._warn_include_query()

    @classmethod
    def from_index(
        cls,
        index: BaseIndex[Any],
        transformer: QueryTransformer,
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
        if not isinstance(transformer, QueryTransformer):
            raise TypeError(
                f"transformer must be a QueryTransformer, not {type(transformer).__name__}"
            )
        check_int(similarity_top_k, "similarity_top_k", 1, None)
        if retriever_kwargs and "similarity_top_k" in retriever_kwargs:
            raise ValueError(
                "give similarity_top_k as from_index's own argument, not in retriever_kwargs"
            )
        depth = candidate_depth(transformer.guards, similarity_top_k)
        base = index.as_retriever(similarity_top_k=depth, **dict(retriever_kwargs or {}))
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
        return {"transformer": self.transformer}

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return _carrying_transform(self.search(query_bundle.query_str))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return _carrying_transform(await self.asearch(query_bundle.query_str))

    # -- public --------------------------------------------------------------------
    def search(self, query: str) -> SearchResult:
        """Transform ``query``, run its searches concurrently, fuse and rerank.

        With guards that need them (grounding, rerank, feedback), the question is
        searched first and its hits are reused for the question's own list."""
        validate_query(query)
        start = time.perf_counter()
        guards = self.transformer.guards
        hits = (
            self._search_bundle(self._question_bundle(query))
            if guards.needs_question_hits
            else None
        )
        result = self.transformer.transform_safe(query, context=_context(guards, hits))
        self._check_include_query(result)
        result = self._gate(result, guards)
        errors: list[str] = []
        if hits is not None and guards.strategy == "rerank":
            if _expanded(result) and self._have_embedder("rerank strategy") and self.embedder:
                generated = expansion.mean_unit(self.embedder.texts(result.hypothetical))
                vectors = self.doc_vectors.get(hits)
                nodes = _blend(hits, vectors, generated, guards.blend)
            else:
                nodes = _copy(hits)
        elif hits is not None and _feeds_back(result, guards) and self._have_embedder("feedback"):
            vectors = self.doc_vectors.get(hits[: guards.feedback_k])
            nodes = _copy(self._search_bundle(self._feedback_bundle(query, vectors, guards)))
        else:
            specs = self._specs(result)
            bundles = [self._bundle(spec, query) for spec in specs]
            lists, weights, errors = self._run_sync(_Fanout(specs, bundles, query, hits))
            nodes = self._combine(lists, weights)
        if self.reranker is not None and nodes:
            nodes = self.reranker.postprocess_nodes(nodes, query_bundle=QueryBundle(query))
        return self._finish(nodes, result, start, errors)

    async def asearch(self, query: str) -> SearchResult:
        """Async twin of `search`; never calls a blocking LLM, embedding or retriever
        method (those without native async run in worker threads)."""
        validate_query(query)
        start = time.perf_counter()
        guards = self.transformer.guards
        hits = None
        if guards.needs_question_hits:
            hits = await self._asearch_bundle(await self._aquestion_bundle(query))
        result = await self.transformer.atransform_safe(query, context=_context(guards, hits))
        self._check_include_query(result)
        result = await self._agate(result, guards)
        errors: list[str] = []
        if hits is not None and guards.strategy == "rerank":
            if _expanded(result) and self._have_embedder("rerank strategy") and self.embedder:
                generated = expansion.mean_unit(await self.embedder.atexts(result.hypothetical))
                vectors = await self.doc_vectors.aget(hits)
                nodes = _blend(hits, vectors, generated, guards.blend)
            else:
                nodes = _copy(hits)
        elif hits is not None and _feeds_back(result, guards) and self._have_embedder("feedback"):
            assert self.embedder is not None
            vectors = await self.doc_vectors.aget(hits[: guards.feedback_k])
            await self.embedder.aquery(query)  # cached for the bundle below
            bundle = self._feedback_bundle(query, vectors, guards)
            nodes = _copy(await self._asearch_bundle(bundle))
        else:
            specs = self._specs(result)
            bundles = [await self._abundle(spec, query) for spec in specs]
            lists, weights, errors = await self._run_async(_Fanout(specs, bundles, query, hits))
            nodes = self._combine(lists, weights)
        if self.reranker is not None and nodes:
            nodes = await self._arerank(nodes, query)
        return self._finish(nodes, result, start, errors)

    # -- the question's own search and the guards ------------------------------------
    def _dense(self) -> bool:
        return self.embedder is not None and self.search_type != "keyword"

    def _question_bundle(self, query: str) -> QueryBundle:
        if self._dense():
            assert self.embedder is not None
            return QueryBundle(query_str=query, embedding=self.embedder.query(query))
        return QueryBundle(query_str=query)

    async def _aquestion_bundle(self, query: str) -> QueryBundle:
        if self._dense():
            assert self.embedder is not None
            return QueryBundle(query_str=query, embedding=await self.embedder.aquery(query))
        return QueryBundle(query_str=query)

    def _search_bundle(self, bundle: QueryBundle) -> list[NodeWithScore]:
        return list(self.retriever.retrieve(bundle))

    async def _asearch_bundle(self, bundle: QueryBundle) -> list[NodeWithScore]:
        if _has_native(self.retriever, "_aretrieve", BaseRetriever):
            return list(await self.retriever.aretrieve(bundle))
        return list(await asyncio.to_thread(self.retriever.retrieve, bundle))

    def _gate(self, result: TransformResult, guards: Guards) -> TransformResult:
        if not _gated(result, guards) or not self._have_embedder("gate"):
            return result
        assert self.embedder is not None
        sim = expansion.cosine(
            self.embedder.query(result.query),
            expansion.mean_unit(self.embedder.texts(result.hypothetical)),
        )
        return _gate_verdict(result, guards, sim)

    async def _agate(self, result: TransformResult, guards: Guards) -> TransformResult:
        if not _gated(result, guards) or not self._have_embedder("gate"):
            return result
        assert self.embedder is not None
        sim = expansion.cosine(
            await self.embedder.aquery(result.query),
            expansion.mean_unit(await self.embedder.atexts(result.hypothetical)),
        )
        return _gate_verdict(result, guards, sim)

    def _feedback_bundle(
        self, query: str, doc_vectors: list[list[float]], guards: Guards
    ) -> QueryBundle:
        assert self.embedder is not None  # _feeds_back checked it
        vector = expansion.rocchio_vector(
            self.embedder.query(query), doc_vectors, guards.feedback_alpha, guards.feedback_beta
        )
        return QueryBundle(query_str=query, embedding=vector)

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
    def _specs(self, result: TransformResult) -> list[SearchSpec]:
        if result.skipped:
            return [SearchSpec(text=result.query, embedding_strs=(result.query,))]
        return result.searches()

    def _bundle(self, spec: SearchSpec, query: str) -> QueryBundle:
        if self._dense() and (spec.passages or spec.text == query):
            assert self.embedder is not None
            if spec.passages:
                vector = expansion.weighted_vector(
                    self.embedder.query(spec.query or query),
                    self.embedder.texts(spec.passages),
                    spec.query_weight,
                )
            else:
                vector = self.embedder.query(query)
            return QueryBundle(query_str=spec.text, embedding=vector)
        return QueryBundle(query_str=spec.text, custom_embedding_strs=list(spec.embedding_strs))

    async def _abundle(self, spec: SearchSpec, query: str) -> QueryBundle:
        if self._dense() and (spec.passages or spec.text == query):
            assert self.embedder is not None
            if spec.passages:
                vector = expansion.weighted_vector(
                    await self.embedder.aquery(spec.query or query),
                    await self.embedder.atexts(spec.passages),
                    spec.query_weight,
                )
            else:
                vector = await self.embedder.aquery(query)
            return QueryBundle(query_str=spec.text, embedding=vector)
        return QueryBundle(query_str=spec.text, custom_embedding_strs=list(spec.embedding_strs))

    def _run_sync(self, fan: _Fanout) -> tuple[list[list[NodeWithScore]], list[float], list[str]]:
        specs, bundles, todo = fan.specs, fan.bundles, fan.todo()
        outcomes: list[Any] = [fan.hits] * len(specs)
        if len(todo) == 1 and len(specs) == 1:
            try:
                outcomes[0] = self.retriever.retrieve(bundles[0])
            except Exception as exc:
                self._log_failure(specs[0], exc)
                raise
        elif todo:
            pool = self._thread_pool()
            futures = {
                i: pool.submit(contextvars.copy_context().run, self.retriever.retrieve, bundles[i])
                for i in todo
            }
            for i, future in futures.items():
                try:
                    outcomes[i] = future.result()
                except Exception as exc:
                    outcomes[i] = exc
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

    async def _retrieve_one(self, bundle: QueryBundle, gate: asyncio.Semaphore) -> Any:
        async with gate:
            return await self._asearch_bundle(bundle)

    async def _run_async(
        self, fan: _Fanout
    ) -> tuple[list[list[NodeWithScore]], list[float], list[str]]:
        gate = asyncio.Semaphore(self.max_concurrency)
        specs, todo = fan.specs, fan.todo()
        found = await asyncio.gather(
            *(self._retrieve_one(fan.bundles[i], gate) for i in todo), return_exceptions=True
        )
        for outcome in found:
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome
        outcomes: list[Any] = [fan.hits] * len(specs)
        for i, outcome in zip(todo, found):
            outcomes[i] = outcome
        return self._split(specs, outcomes)

    def _split(
        self, specs: list[SearchSpec], outcomes: list[Any]
    ) -> tuple[list[list[NodeWithScore]], list[float], list[str]]:
        lists: list[list[NodeWithScore]] = []
        weights: list[float] = []
        errors: list[str] = []
        first_error: Exception | None = None
        for spec, outcome in zip(specs, outcomes):
            if isinstance(outcome, Exception):
                self._log_failure(spec, outcome)
                errors.append(f"{type(outcome).__name__}: {outcome}")
                first_error = first_error or outcome
            else:
                lists.append(list(outcome))
                weights.append(spec.weight)
        if not lists and first_error is not None:
            raise first_error
        return lists, weights, errors

    def _log_failure(self, spec: SearchSpec, exc: Exception) -> None:
        logger.warning(
            "sub-search %r failed (%s: %s); using the other searches",
            spec.text[:80],
            type(exc).__name__,
            exc,
        )

    def _combine(
        self, lists: list[list[NodeWithScore]], weights: list[float]
    ) -> list[NodeWithScore]:
        if len(lists) == 1:
            return _copy(lists[0])
        mode = self.fusion or self.transformer.default_fusion
        if mode is FusionMode.INTERLEAVE and len(set(weights)) > 1:
            mode = FusionMode.RRF  # interleaving cannot weigh lists; RRF can
        return fuse(lists, mode, weights=weights)

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
        cut = self.cut
        if cut is not None:
            nodes = nodes[:cut]
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


def _carrying_transform(result: SearchResult) -> list[NodeWithScore]:
    """``result``'s nodes as copies whose metadata carries the transform's summary."""
    info = summary(result.transform, result.failed_searches, result.latency_s)
    return tag_nodes(result.nodes, info)


def _context(guards: Guards, hits: list[NodeWithScore] | None) -> list[str] | None:
    """The question's top passages for a grounded transform."""
    if not guards.context_k or not hits:
        return None
    return [item.node.get_content() for item in hits[: guards.context_k]]


def _expanded(result: TransformResult) -> bool:
    return bool(result.hypothetical) and not result.fallback and not result.skipped


def _gated(result: TransformResult, guards: Guards) -> bool:
    return guards.gate is not None and _expanded(result)


def _gate_verdict(result: TransformResult, guards: Guards, similarity: float) -> TransformResult:
    assert guards.gate is not None
    if similarity >= guards.gate:
        return result
    reason = (
        f"generated text disagrees with the question (cosine {similarity:.3f} < gate "
        f"{guards.gate:g}); searched with the question alone"
    )
    logger.debug("%s: %s", result.method, reason)
    return replace(result, skipped=reason)


def _feeds_back(result: TransformResult, guards: Guards) -> bool:
    return guards.feedback_k > 0 and guards.feedback_beta > 0 and not result.fallback


@dataclass(frozen=True)
class _Fanout:
    """The searches of one query: each spec with its bundle, and the question's own
    hits when they were fetched first (a plain-question spec reuses them)."""

    specs: list[SearchSpec]
    bundles: list[QueryBundle]
    query: str
    hits: list[NodeWithScore] | None

    def todo(self) -> list[int]:
        """Indexes of the specs that still need a search."""
        return [i for i, spec in enumerate(self.specs) if not self._reusable(spec)]

    def _reusable(self, spec: SearchSpec) -> bool:
        """Whether ``spec`` is the plain question, already searched."""
        return self.hits is not None and not spec.passages and spec.text == self.query


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
    return [NodeWithScore(node=unique[i].node, score=scores[i]) for i in order]
