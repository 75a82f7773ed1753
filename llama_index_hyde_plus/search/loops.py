"""The two loops that carry out what the search steps (`steps`) ask for.

`Blocking` answers each request with a blocking call in this thread, or on worker
threads when it must be bounded by a deadline or run beside another; `Async` answers
the same requests with awaits and tasks, never blocking the event loop (a blocking
retriever, embedder or reranker runs on its own worker threads). Both send the answer
back into the step, or throw in what the call raised, so a step's ``try`` / ``except``
sees the same exceptions on both paths. Every blocking or async call of the search
is made here, and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from types import TracebackType
from typing import Any, Generic

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle

from .._attrs import defining_class, overrides
from ..calls import door
from ..calls.door import await_within
from ..calls.reliability import failure
from ..transforms.core import caller_bundle
from . import requests as ask
from .requests import Searcher, Steps, T

_RERANKER = "the reranker"
_SEARCH = "the retriever"
_EMBEDDER = "the embedding model"
_STORE = "the vector store"
#: The async text-embedding methods; a model that has either of its own embeds
#: generated text natively on the async path.
_TEXT_ASYNC = ("_aget_text_embeddings", "_aget_text_embedding")
_SYNC_EMBED = {
    "query": "get_query_embedding",
    "texts": "get_text_embedding_batch",
    "text": "get_text_embedding",
}
_ASYNC_EMBED = {
    "query": "aget_query_embedding",
    "texts": "aget_text_embedding_batch",
    "text": "aget_text_embedding",
}


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


def search_deadline(
    retriever: BaseRetriever, bundle: QueryBundle, deadline: door.Deadline | None
) -> door.Deadline | None:
    """When a search with the generated text must have answered: ``deadline``, or None
    for one that only computes in this process (`searches_in_process`). Such a search
    cannot hang, so it is never failed by a deadline spent before it started (on a hung
    embedder, say): both loops ask this, for every search of the generated text."""
    if deadline is not None and searches_in_process(retriever, bundle):
        return None
    return deadline


def _rerank_call(reranker: Any, op: ask.Rerank) -> Callable[[], Any]:
    return lambda: reranker.postprocess_nodes(op.nodes, query_bundle=op.bundle)


def _retrieved(retriever: BaseRetriever, bundle: QueryBundle) -> list[NodeWithScore]:
    return list(retriever.retrieve(bundle))


def _native_embed(model: Any, kind: str) -> bool:
    """Whether ``model`` has its own async method for embeddings of ``kind``, other
    than one that only runs its blocking method on its worker threads (defined by a
    class that says so, ``async_on_workers = True``, as `LocalEmbedding`): that one
    the loop runs itself, under the deadline, which the async method cannot take. A
    subclass's own async method is native."""
    from llama_index.core.base.embeddings.base import BaseEmbedding

    for name in ("_aget_query_embedding",) if kind == "query" else _TEXT_ASYNC:
        if overrides(model, name, BaseEmbedding):
            owner = defining_class(model, name)
            if owner is None or vars(owner).get("async_on_workers") is not True:
                return True
    return False


class _Drive(Generic[T]):
    """What the two loops share, none of it I/O: the requests of ``todo`` in turn, each
    once the answer to the one before is sent back in (set as `answer`), or what its
    call raised is thrown in (the call is made under ``with drive:``, which keeps what
    it raises for that); once ``todo`` returns, what it returned (`value`)."""

    __slots__ = ("_thrown", "_todo", "answer", "value")

    def __init__(self, todo: Steps[T]) -> None:
        self._todo = todo
        self._thrown: BaseException | None = None
        self.answer: Any = None
        self.value: T

    def __iter__(self) -> Iterator[Any]:
        todo = self._todo
        while True:
            try:
                op = todo.send(self.answer) if self._thrown is None else todo.throw(self._thrown)
            except StopIteration as stop:
                self.value = stop.value
                return
            self.answer = self._thrown = None
            yield op

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        """Keep what the call raised (an interrupt or a cancellation too) to throw in."""
        self._thrown = exc
        return True


class Blocking:
    """The sync loop: blocking calls, the fan-out on worker threads."""

    def __init__(self, r: Searcher | None = None) -> None:
        # a loop for models alone (r None) is asked of models only
        self.r: Searcher = r  # type: ignore[assignment]
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def run(self, todo: Steps[T]) -> T:
        """Carry out ``todo`` to its end; what it returns (or raises)."""
        drive = _Drive(todo)
        for op in drive:
            with drive:
                drive.answer = _BLOCKING[type(op)](self, op)
        return drive.value

    def thread_pool(self) -> ThreadPoolExecutor:
        """Worker threads for the fan-out and the question's search beside the LLM,
        created once and reused (idle threads cost nothing; creating them per search
        did). At most ``max_concurrency``."""
        if self._pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        max_workers=self.r.max_concurrency, thread_name_prefix="hyde-plus"
                    )
        return self._pool

    def close(self) -> None:
        """Stop the worker threads (they restart if needed)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    def _embed(self, op: ask.Embed) -> Any:
        call = partial(getattr(op.model, _SYNC_EMBED[op.kind]), op.texts)
        return door.run(call, on=op.model, deadline=op.deadline, what=_EMBEDDER)

    def _read_store(self, op: ask.ReadStore) -> Any:
        """A remote store (Milvus: it may hang) on its worker threads until the
        deadline; FAISS, which only computes, in this thread."""
        if op.kind == "milvus":
            return door.run(op.read, on=op.store, kind="store", deadline=op.deadline, what=_STORE)
        return op.read()

    def _search_question(self, op: ask.SearchQuestion) -> list[NodeWithScore]:
        return _retrieved(self.r.retriever, op.bundle)

    def _search_generated(self, op: ask.SearchGenerated) -> Any:
        """Bounded by the deadline on the retriever's own threads (`door`;
        `ModelTimeoutError` once it passes), or in this thread when the search only
        computes."""
        deadline = search_deadline(self.r.retriever, op.bundle, op.deadline)
        call = partial(_retrieved, self.r.retriever, op.bundle)
        return door.run(call, on=self.r.retriever, kind="store", deadline=deadline, what=_SEARCH)

    def _transform(self, op: ask.Transform) -> Any:
        with caller_bundle(op.given):
            return self.r.transformer.transform_safe(op.text, context=op.context)

    def _start(self, op: ask.Start) -> Future[Any]:
        run = contextvars.copy_context().run
        return self.thread_pool().submit(run, self.run, op.steps)

    def _join(self, op: ask.Join) -> Any:
        return op.handle.result()

    def _cancel(self, op: ask.Cancel) -> None:
        op.handle.cancel()  # a search already running goes on in its thread

    def _rerank(self, op: ask.Rerank) -> Any:
        reranker = self.r.reranker
        call = _rerank_call(reranker, op)
        return door.run(call, on=reranker, deadline=op.deadline, what=_RERANKER)

    def _failed(self, op: ask.Failed) -> Exception:
        return failure(op.exc)

    def _search_all(self, op: ask.SearchAll) -> list[Any]:
        """The searches of ``op`` at once. Those of the generated text run on the
        retriever's own worker threads (`door`, ``kind="store"``), ``max_concurrency``
        at a time, until ``op.deadline`` (one that overruns fails, as one that raises
        does), but for those that only compute (`searches_in_process`), run here first;
        the question's own search is not bounded (the user's own: a plain retriever
        would wait on it too) and runs on the fan-out's threads; a lone search runs
        here."""
        outcomes = op.outcomes
        if op.in_place is not None:
            self._search_here(op, op.in_place)
            return outcomes
        if op.todo:
            retriever = self.r.retriever
            ctx = contextvars.copy_context
            pool = self.thread_pool()
            futures = {
                i: pool.submit(ctx().run, retriever.retrieve, op.bundle(i)) for i in op.of_question
            }
            generated = [i for i in op.todo if i not in op.of_question]
            here = [i for i in generated if searches_in_process(retriever, op.bundle(i))]
            for i in here:
                self._search_here(op, i)
            bounded = [i for i in generated if i not in here]
            found = door.run_all(
                [partial(retriever.retrieve, op.bundle(i)) for i in bounded],
                on=retriever,
                kind="store",
                deadline=op.deadline,
                what=_SEARCH,
                at_once=self.r.max_concurrency - len(op.of_question) - (op.pending is not None),
            )
            for i, outcome in zip(bounded, found):
                outcomes[i] = outcome
            for i, future in futures.items():
                try:
                    outcomes[i] = future.result()
                except BaseException as exc:
                    outcomes[i] = failure(exc)
        if op.pending is not None:
            op.joined(op.pending.result())
        return outcomes

    def _search_here(self, op: ask.SearchAll, i: int) -> None:
        """Search ``i`` of ``op`` in this thread: what it found, or the failure it raised
        (`failure`: an interrupt or an exit propagates)."""
        try:
            op.outcomes[i] = self._search_one(op, i)
        except BaseException as exc:
            op.outcomes[i] = failure(exc)

    def _search_one(self, op: ask.SearchAll, i: int) -> Any:
        if i in op.of_question:
            return self.r.retriever.retrieve(op.bundle(i))
        return self._search_generated(ask.SearchGenerated(op.bundle(i), op.deadline))


def _cancel(task: Any) -> None:
    """Cancel ``task`` (the question's own search, or None) if it is still running."""
    if task is not None and not task.done():
        task.cancel()


class Async:
    """The async loop: awaits, tasks and ``gather``; blocking calls on worker threads."""

    def __init__(self, r: Searcher | None = None) -> None:
        # a loop for models alone (r None) is asked of models only
        self.r: Searcher = r  # type: ignore[assignment]

    async def run(self, todo: Steps[T]) -> T:
        """Carry out ``todo`` to its end; what it returns (or raises)."""
        drive = _Drive(todo)
        for op in drive:
            with drive:
                drive.answer = await _ASYNC[type(op)](self, op)
        return drive.value

    async def _embed(self, op: ask.Embed) -> Any:
        """The model's own async method when it has one (under asyncio's timeout),
        else its blocking one on its own worker threads (never the event loop's
        default executor)."""
        if _native_embed(op.model, op.kind):
            coro = getattr(op.model, _ASYNC_EMBED[op.kind])(op.texts)
            return await await_within(coro, op.deadline, _EMBEDDER)
        call = partial(getattr(op.model, _SYNC_EMBED[op.kind]), op.texts)
        return await door.arun(call, on=op.model, deadline=op.deadline, what=_EMBEDDER)

    async def _read_store(self, op: ask.ReadStore) -> Any:
        """A store read on the store's worker threads (FAISS too: never on the loop)."""
        if op.kind in ("faiss", "milvus"):
            return await door.arun(
                op.read, on=op.store, kind="store", deadline=op.deadline, what=_STORE
            )
        return op.read()

    async def _search_question(self, op: ask.SearchQuestion) -> list[NodeWithScore]:
        """A native async retriever awaited, a blocking one unbounded on the
        retriever's threads for unbounded searches (`door`, ``kind="search"``; never
        the event loop's default executor)."""
        retriever = self.r.retriever
        if overrides(retriever, "_aretrieve", BaseRetriever):
            return list(await retriever.aretrieve(op.bundle))
        call = partial(_retrieved, retriever, op.bundle)
        return await door.arun(call, on=self.r.retriever, kind="search", what=_SEARCH)

    async def _search_generated(self, op: ask.SearchGenerated) -> Any:
        """A native async retriever cancelled at the deadline (awaited in this task
        when `searches_in_process`), a blocking one on the retriever's own threads (`door`)."""
        retriever = self.r.retriever
        deadline = search_deadline(retriever, op.bundle, op.deadline)
        if overrides(retriever, "_aretrieve", BaseRetriever):
            search = self._search_question(ask.SearchQuestion(op.bundle))
            return await await_within(search, deadline, _SEARCH)
        call = partial(_retrieved, retriever, op.bundle)
        return await door.arun(
            call, on=self.r.retriever, kind="store", deadline=deadline, what=_SEARCH
        )

    async def _transform(self, op: ask.Transform) -> Any:
        """The transform; with the question's own search ``op.beside`` (a guard that
        needs its hits), a failure of that search is raised at once and the LLM call
        is cancelled (a plain retriever raises at once: the search does not wait on
        the LLM for up to its timeout only to raise the same error)."""
        searching = op.beside
        with caller_bundle(op.given):
            call = self.r.transformer.atransform_safe(op.text, context=op.context)
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

    async def _start(self, op: ask.Start) -> asyncio.Future[Any]:
        return asyncio.ensure_future(self.run(op.steps))

    async def _join(self, op: ask.Join) -> Any:
        return await op.handle

    async def _cancel(self, op: ask.Cancel) -> None:
        _cancel(op.handle)

    async def _rerank(self, op: ask.Rerank) -> Any:
        reranker = self.r.reranker
        assert reranker is not None
        if overrides(reranker, "_apostprocess_nodes", BaseNodePostprocessor):
            coro = reranker.apostprocess_nodes(op.nodes, query_bundle=op.bundle)
            return await await_within(coro, op.deadline, _RERANKER)
        call = _rerank_call(reranker, op)
        return await door.arun(call, on=reranker, deadline=op.deadline, what=_RERANKER)

    async def _failed(self, op: ask.Failed) -> Exception:
        try:
            return failure(op.exc, in_task=True)
        except BaseException:
            _cancel(op.cancel)
            raise

    async def _search_all(self, op: ask.SearchAll) -> list[Any]:
        """The searches of ``op`` as tasks, ``max_concurrency`` at a time (the
        question's search started while the LLM wrote holds one place); a lone one
        awaited in this task."""
        outcomes = op.outcomes
        if op.in_place is not None:  # one search: no task, no semaphore
            i = op.in_place
            try:
                outcomes[i] = await self._search_one(op, i)
            except BaseException as exc:
                outcomes[i] = failure(exc, in_task=True)
            return outcomes
        running = 0 if op.pending is None else 1
        gate = None
        if len(op.todo) + running > self.r.max_concurrency:
            gate = asyncio.Semaphore(max(1, self.r.max_concurrency - running))
        searches: list[Any] = [self._search_one(op, i, gate) for i in op.todo]
        if op.pending is not None:  # the question's own search, started while the LLM wrote
            searches.append(op.pending)
        found = await asyncio.gather(*searches, return_exceptions=True)
        found = [  # our own cancellation raised out of gather; these are the searches'
            failure(o, in_task=True) if isinstance(o, BaseException) else o for o in found
        ]
        if op.pending is not None:
            op.joined(found.pop())
        for i, outcome in zip(op.todo, found):
            outcomes[i] = outcome
        return outcomes

    async def _search_one(self, op: ask.SearchAll, i: int, gate: Any = None) -> Any:
        """Search ``i`` of ``op`` (past ``gate`` when there is one): the question's own
        unbounded, one with the generated text until the deadline."""
        if gate is not None:
            async with gate:
                return await self._search_one(op, i)
        if i in op.of_question:
            return await self._search_question(ask.SearchQuestion(op.bundle(i)))
        return await self._search_generated(ask.SearchGenerated(op.bundle(i), op.deadline))


def _handlers(loop: type) -> dict[type, Callable[[Any, Any], Any]]:
    """``loop``'s method for each request: `Embed` by ``_embed``, `SearchAll` by
    ``_search_all``..."""
    name = re.compile(r"(?<!^)(?=[A-Z])")
    return {
        kind: getattr(loop, "_" + name.sub("_", kind.__name__).lower()) for kind in ask.REQUESTS
    }


_BLOCKING = _handlers(Blocking)
_ASYNC = _handlers(Async)
BLOCKING = Blocking()
"""The loop for steps that only call models (`vectors.Embedder.query`, ...)."""
ASYNC = Async()
"""`BLOCKING` on the async path."""
