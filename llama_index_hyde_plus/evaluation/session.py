"""`EvalSession`: one dataset's index, embedder and transform cache, shared by every
transform a run scores; `score` runs one transform over every question."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from llama_index.core import VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import LLM

from ..caching.cache import SQLiteCache, TransformCache
from ..search.retriever import TransformRetriever
from ..search.vectors import Embedder
from ..stores import Store
from ..transforms.base import TransformResult
from ..transforms.condense import chat_history
from ..transforms.factory import build
from ..transforms.registry import uses_llm
from ..transforms.reuse import unusable
from ..usage import Usage, sum_usage
from .beir import BeirDataset
from .index_cache import Advance, ProgressFactory, cached_index, check_holds, eval_store
from .metrics import MEASURES, evaluate, percentile
from .pacing import Pacer
from .results import EvalResult, TransformReport
from .specs import TransformSpec

if TYPE_CHECKING:
    from typing_extensions import Required, Unpack

logger = logging.getLogger(__name__)


def needs_llm(name: str) -> bool:
    """Whether the transform called ``name`` calls an LLM (its class says)."""
    return uses_llm(name)


def build_transform(
    spec: TransformSpec, llm: LLM | None, cache: TransformCache | None, hyde_prompt: str | None
) -> Any:
    """The transform of ``spec`` (through `transforms.factory.build`: the timeout is
    the one policy, by the model's kind)."""
    return build(spec.name, llm, spec.options, cache=cache, task=hyde_prompt)


@dataclass
class _QueryRecord:
    """What one query's search did, for the report."""

    qid: str
    latency_s: float
    cached: bool
    fallback: bool
    skipped: bool
    usage: Usage
    timed_out: bool
    unusable: bool
    error: str | None
    queries: list[str]
    hypothetical: list[str]


OUT_OF_TIME = ("LLMTimeoutError", "QueuedTooLongError", "ModelBusyError")
"""The errors of a generation that ran out of time: the LLM's own, waiting for a worker
thread, or waiting for a slot of the local model ("model busy")."""


def ran_out_of_time(result: TransformResult) -> bool:
    """Whether ``result`` fell back because its generation ran out of time."""
    return result.fallback and (result.error or "").startswith(OUT_OF_TIME)


def was_unusable(result: TransformResult) -> bool:
    """Whether ``result`` fell back because the model's reply held nothing usable (an
    ``UnusableReplyError``: no query could be parsed from it, an empty passage; the
    rule `reuse.unusable` keeps such generations by)."""
    return result.fallback and unusable(result)


async def _run_one(
    retriever: TransformRetriever,
    queries: Mapping[str, str],
    concurrency: int,
    advance: Advance | None,
    chats: Mapping[str, Sequence[Mapping[str, str]]] | None = None,
) -> tuple[dict[str, dict[str, float]], list[_QueryRecord]]:
    pacer = Pacer.for_transform(retriever.transformer, concurrency)
    run: dict[str, dict[str, float]] = {}
    records: list[_QueryRecord] = []

    async def one(qid: str, text: str) -> None:
        chat: AbstractContextManager[None] = (
            chat_history(chats[qid]) if chats is not None else nullcontext()
        )
        async with pacer as ticket:  # the query's deadlines start once it is let in
            start = time.perf_counter()
            with chat:  # this task's own conversation (a context variable)
                result = await retriever.asearch(text)
            latency = time.perf_counter() - start
            t = result.transform
            timed_out = ran_out_of_time(t)
            if not (t.cached or t.skipped):
                written = (t.generation_usage or t.usage).output_tokens
                pacer.record(ticket, latency, timed_out, written)
        run[qid] = {n.node.node_id: float(n.score or 0.0) for n in result.nodes}
        records.append(
            _QueryRecord(
                qid=qid,
                latency_s=latency,
                cached=t.cached or any(c.cached for c in t.children),
                fallback=t.fallback,
                skipped=bool(t.skipped),
                usage=t.generation_usage or t.usage,
                timed_out=timed_out,
                unusable=was_unusable(t),
                error=(t.error or "unknown error") if t.fallback else None,
                queries=list(t.search_queries),
                hypothetical=list(t.hypothetical),
            )
        )
        if advance:
            note = pacer.note()
            advance(1, fell_back=int(t.fallback), **({"note": note} if note else {}))

    await asyncio.gather(*(one(qid, text) for qid, text in queries.items()))
    for change in pacer.changes:
        logger.info("queries in flight: %s", change)
    return run, records


class EvalCache(SQLiteCache):
    """The evaluation's transform cache: a `SQLiteCache` that also keeps generations
    whose replies could not be used (`keeps_unusable_replies`), so every configuration
    sharing a generation is scored on the same replies, in a run and when it is run
    again. A generation that timed out or whose call failed is asked again."""

    keeps_unusable_replies = True


class SessionOptions(TypedDict, total=False):
    """The options of an `EvalSession`, which `run_eval` and `run_tune` pass on:
    ``embed_model``, ``embed_label`` (recorded with the index) and ``cache_root`` are
    required; the others default as in `SESSION_DEFAULTS`. ``index_store`` is the
    user's own index of the documents, searched instead of one built; ``index``, the
    index already loaded from it (by a caller that checked it), is not loaded again."""

    embed_model: Required[BaseEmbedding]
    embed_label: Required[str]
    cache_root: Required[Path]
    max_length: int
    top_k: int
    concurrency: int
    use_cache: bool
    store: str
    milvus_uri: str | None
    milvus_token: str
    progress: ProgressFactory | None
    vectors: Mapping[str, Sequence[float]] | None
    index_store: Store | None
    index: VectorStoreIndex | None


SESSION_DEFAULTS: dict[str, Any] = {
    "max_length": 256,
    "top_k": 100,
    "concurrency": 4,
    "use_cache": True,
    "store": "faiss",
    "milvus_uri": None,
    "milvus_token": "",
    "progress": None,
    "vectors": None,
    "index_store": None,
    "index": None,
}
"""The `SessionOptions` an `EvalSession` fills in when they are not given."""


class EvalSession:
    """One dataset, its index (built once, cached on disk), one embedder shared by
    every run (so a sweep embeds each question and passage once) and the SQLite cache
    of transform outputs (so a sweep generates once per query). `score` runs one
    transform over every query and returns its report."""

    def __init__(self, ds: BeirDataset, **options: Unpack[SessionOptions]) -> None:
        """``options``: `SessionOptions` (the models, the cache root, the store and the
        depth); the optional ones default as in `SESSION_DEFAULTS`."""
        o: dict[str, Any] = {**SESSION_DEFAULTS, **options}
        if o["concurrency"] < 1:
            raise ValueError("concurrency must be >= 1")
        self.ds = ds
        self.top_k, self.concurrency, self.progress = o["top_k"], o["concurrency"], o["progress"]
        store, uri = o["store"], o["milvus_uri"]  # checked by `store_for`, before indexing
        embed_model, label, root = o["embed_model"], o["embed_label"], o["cache_root"]
        if o["index_store"] is not None:  # the user's own index of these documents
            self.store = o["index_store"]
            start = time.perf_counter()
            given = o["index"]  # already loaded from it by the caller, or loaded here
            self.index = self.store.load(embed_model) if given is None else given
            texts = {doc_id: text for doc_id, (_, text) in ds.corpus.items()}
            check_holds(self.index, texts, self.store.location)
            self.index_seconds, self.index_cached = time.perf_counter() - start, True
        else:
            self.store = eval_store(ds, label, root, store, uri, o["milvus_token"])
            self.index, self.index_seconds, self.index_cached = cached_index(
                ds,
                self.store,
                embed_model,
                label,
                max_length=o["max_length"],
                progress=self.progress,
                vectors=o["vectors"],
            )
        self._options = o
        embed_model.get_query_embedding("warm up")  # load the model outside the timings
        self.embedder = Embedder(embed_model, max_entries=200_000, max_bytes=1 << 30)
        self.cache = EvalCache(root / "eval" / "transforms.sqlite") if o["use_cache"] else None
        self._retriever: Any = None

    def derived(self, ds: BeirDataset, vectors: Mapping[str, Sequence[float]]) -> EvalSession:
        """A session over ``ds`` (a subset of this one's corpus) in its own store,
        built from ``vectors`` (this index's stored ones: nothing is embedded again),
        sharing this session's embedder; stand-in answers are not cached. Never the
        user's ``index_store``: it holds the whole corpus, the documents left out too."""
        options = {**self._options, "vectors": vectors, "use_cache": False}
        options.update(index_store=None, index=None)
        session = EvalSession(ds, **options)
        session.embedder = self.embedder
        return session

    def base_retriever(self) -> Any:
        """The store's own retriever (one per session: its vectors are reused)."""
        if self._retriever is None:
            self._retriever = self.store.retriever(self.index, self.top_k)
        return self._retriever

    def score(
        self,
        label: str,
        transformer: Any,
        *,
        options: dict[str, Any] | None = None,
        queries: Mapping[str, str] | None = None,
        chats: Mapping[str, Sequence[Mapping[str, str]]] | None = None,
    ) -> TransformReport:
        """Run ``transformer`` over every query and score it (no comparison yet).
        ``queries`` replaces the texts searched (same ids, same judgements); ``chats``
        gives each query the conversation before it (`chat_history`), for `Condense`."""
        retriever = TransformRetriever(
            self.base_retriever(), transformer, top_k=self.top_k, embed_model=self.embedder
        )
        texts = self.ds.queries if queries is None else queries
        advance = self.progress(label, len(texts)) if self.progress else None
        run, records = asyncio.run(_run_one(retriever, texts, self.concurrency, advance, chats))
        retriever.close()
        scores = evaluate(self.ds.qrels, run, MEASURES)
        fresh = [r.latency_s for r in records if not r.cached]
        examples = [
            {
                "qid": r.qid,
                "queries": r.queries,
                "hypothetical": r.hypothetical,
                "fallback": r.fallback,
                "fallback_reason": r.error,
            }
            for r in sorted(records, key=lambda r: str(r.qid))[:3]
        ]
        return TransformReport(
            label=label,
            scores=scores.mean,
            per_query_ndcg=scores.per_query["nDCG@10"],
            latency_p50_s=percentile(fresh, 50),
            latency_p95_s=percentile(fresh, 95),
            latency_n=len(fresh),
            usage=sum_usage([r.usage for r in records]),
            fallbacks=sum(1 for r in records if r.fallback),
            cached=sum(1 for r in records if r.cached),
            queries=len(records),
            examples=examples,
            skipped=sum(1 for r in records if r.skipped),
            timeouts=sum(1 for r in records if r.timed_out),
            unusable=sum(1 for r in records if r.unusable),
            fallback_reasons={r.qid: r.error for r in records if r.error is not None},
            options=dict(options or {}),
            rankings={qid: tuple(docs) for qid, docs in run.items()},
        )

    def result(
        self,
        name: str,
        reports: list[TransformReport],
        phases: dict[str, float],
        started: float,
        config: dict[str, Any],
    ) -> EvalResult:
        """The run's `EvalResult`: ``reports`` on this session's dataset (named
        ``name``), timed from ``started`` (a `time.perf_counter` reading)."""
        result = EvalResult(
            dataset=name,
            queries=len(self.ds.queries),
            documents=len(self.ds.corpus),
            unit=self.ds.unit,
            config=config,
            reports=reports,
            index_seconds=self.index_seconds,
            index_cached=self.index_cached,
            phases=phases,
        )
        result.wall_seconds = time.perf_counter() - started
        return result

    def close(self) -> None:
        """Close the SQLite cache of transform outputs the session opened, if any."""
        if self.cache is not None:
            self.cache.close()


def fresh_llm(llm: LLM | Callable[[], LLM] | None) -> LLM | None:
    """``llm`` itself, or a new one when it is a zero-argument factory."""
    return llm() if callable(llm) and not isinstance(llm, LLM) else llm
