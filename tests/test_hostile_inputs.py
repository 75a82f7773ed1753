"""Hostile inputs to the Python API: a store, embedder or cache raising an error that is
not an ``Exception`` never crashes the search; two LLMs differing only in a function
field (their prompt format) never share cache entries; a generation with an empty reply
among N is not cached as complete; a cache entry of another question, or with nothing
in it, is never served as a hit."""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import pytest
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle

from llama_index_hyde_plus import HyDE, MemoryCache, MultiQuery, TransformRetriever
from llama_index_hyde_plus.caching.kv_cache import KVStoreCache
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM, StaticRetriever

from .conftest import DOCS

Q = "Why did revenue drop?"


class Timeout(BaseException):
    """gevent's Timeout is a BaseException, not an Exception."""


class RejectsGenerated(StaticRetriever):
    """Searches the question; raises ``error`` for any other query text."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(DOCS, default=["renewals", "pto"])
        self.error = error

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if query_bundle.query_str != Q:
            raise self.error
        return super()._retrieve(query_bundle)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if query_bundle.query_str != Q:
            raise self.error
        return await super()._aretrieve(query_bundle)


def _mq_reply(prompt: str) -> str:
    return "1. What drove the revenue decline?\n2. Why were renewals late?"


@pytest.mark.parametrize("error", [Timeout("store"), asyncio.CancelledError()])
@pytest.mark.parametrize("use_async", [False, True])
async def test_a_store_raising_a_non_exception_on_generated_text_serves_the_question(
    error: BaseException, use_async: bool
) -> None:
    retriever = TransformRetriever(
        RejectsGenerated(error),
        MultiQuery(ScriptedLLM(respond=_mq_reply), n=2),
        embed_model=DeterministicEmbedding(dim=64),
    )
    found = await retriever.asearch(Q) if use_async else retriever.search(Q)
    assert [n.node.node_id for n in found.nodes] == ["renewals", "pto"]
    assert len(found.failed_searches) == 2 and type(error).__name__ in found.failed_searches[0]


class RejectsQuestion(StaticRetriever):
    """Raises ``error`` when the question itself is searched."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(DOCS, default=["renewals", "pto"])
        self.error = error

    def _answer(self, bundle: QueryBundle) -> list[NodeWithScore]:
        if bundle.query_str == Q:
            raise self.error
        return super()._answer(bundle)


@pytest.mark.parametrize("error", [Timeout("store"), asyncio.CancelledError("stray")])
@pytest.mark.parametrize("use_async", [False, True])
async def test_a_non_exception_from_the_question_searched_first_is_raised_as_a_call_error(
    error: BaseException, use_async: bool
) -> None:
    """Grounded HyDE searches the question before the LLM writes: what that search
    raises is raised, as a plain retriever would, but a stray ``CancelledError`` from a
    store's client is a failure (`CallError`), never the task's own cancellation."""
    from llama_index_hyde_plus.calls.reliability import CallError

    retriever = TransformRetriever(
        RejectsQuestion(error),
        HyDE(ScriptedLLM(respond=lambda p: "Renewals slipped."), grounded=2),
        search_type="keyword",
    )
    if not use_async:
        with pytest.raises(CallError, match=type(error).__name__):
            retriever.search(Q)
        return
    task = asyncio.ensure_future(retriever.asearch(Q))
    with pytest.raises(CallError, match=type(error).__name__):
        await task
    assert not task.cancelled()


class TimeoutEmbedding(DeterministicEmbedding):
    """Embeds the question; raises gevent-style Timeout on generated passages."""

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        raise Timeout("embedder")

    def _get_text_embedding(self, text: str) -> list[float]:
        raise Timeout("embedder")

    async def _aget_text_embedding(self, text: str) -> list[float]:
        raise Timeout("embedder")

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        raise Timeout("embedder")


@pytest.mark.parametrize("use_async", [False, True])
async def test_an_embedder_raising_a_non_exception_on_the_passage_serves_the_question(
    use_async: bool,
) -> None:
    retriever = TransformRetriever(
        StaticRetriever(DOCS, default=["renewals", "pto"]),
        HyDE(ScriptedLLM(respond=lambda p: "Renewals slipped."), strategy="replace"),
        embed_model=TimeoutEmbedding(dim=64),
    )
    found = await retriever.asearch(Q) if use_async else retriever.search(Q)
    assert found.nodes and found.transform.fallback and "Timeout" in (found.transform.error or "")


async def test_our_own_cancellation_still_propagates_through_the_fallback() -> None:
    class Slow(StaticRetriever):
        async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            await asyncio.sleep(10)
            return []

    retriever = TransformRetriever(
        Slow(DOCS), MultiQuery(ScriptedLLM(respond=_mq_reply), n=2), max_concurrency=1
    )
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(retriever.asearch(Q), 0.2)


class TimeoutCache:
    def get(self, key: str) -> Any:
        raise Timeout("cache")

    def set(self, key: str, value: Any) -> None:
        raise Timeout("cache")


def test_a_cache_raising_a_non_exception_is_a_miss() -> None:
    llm = ScriptedLLM(respond=lambda p: "Renewals slipped.")
    result = HyDE(llm, cache=TimeoutCache()).transform(Q)  # type: ignore[arg-type]
    assert result.hypothetical == ("Renewals slipped.",) and not result.fallback


def _formatter(prefix: str) -> Any:
    def fmt(prompt: str) -> str:
        return f"{prefix}\n{prompt}"

    return fmt


def test_llms_differing_in_a_function_field_do_not_share_cache_entries() -> None:
    cache = MemoryCache()
    en = ScriptedLLM(["English passage"], completion_to_prompt=_formatter("Answer in English"))
    fr = ScriptedLLM(["Passage français"], completion_to_prompt=_formatter("Réponds en français"))
    assert HyDE(en, cache=cache).transform(Q).hypothetical == ("English passage",)
    second = HyDE(fr, cache=cache).transform(Q)
    assert not second.cached and second.hypothetical == ("Passage français",)
    same = ScriptedLLM([], completion_to_prompt=_formatter("Answer in English"))
    assert HyDE(same, cache=cache).transform(Q).cached  # the same format: the same key


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_generation_with_an_empty_reply_among_n_is_not_cached(use_async: bool) -> None:
    cache = MemoryCache()
    llm = ScriptedLLM(["Passage one.", "   ", "Passage three.", "P1.", "P2.", "P3."])
    hyde = HyDE(llm, num_passages=3, cache=cache, breaker=None)
    first = await hyde.atransform(Q) if use_async else hyde.transform(Q)
    assert len(first.hypothetical) == 2 and "1 of 3 replies had no content" in (first.error or "")
    again = await hyde.atransform(Q) if use_async else hyde.transform(Q)
    assert not again.cached and len(again.hypothetical) == 3


def test_a_cache_entry_of_another_question_or_with_nothing_in_it_is_a_miss() -> None:
    from llama_index.core.storage.kvstore import SimpleKVStore

    store = SimpleKVStore()
    cache = KVStoreCache(store)
    llm = ScriptedLLM(respond=lambda p: "Fresh passage.")
    hyde = HyDE(llm, num_passages=1, cache=cache)
    key = hyde.cache_key_for(Q)
    other = HyDE(ScriptedLLM(["Other passage."]), num_passages=1).transform("Who moved?")
    bad = [
        {**other.to_dict()},  # another question's entry under this key
        {**hyde.transform("Why did revenue drop?").to_dict(), "hypothetical": []},  # empty
        {**other.to_dict(), "query": Q, "method": "multi-query"},  # another method's
    ]
    for entry in bad:
        store.put(key, {"created": 1e12, "result": entry}, collection=cache.collection)
        result = hyde.transform(Q)
        assert not result.cached and result.hypothetical == ("Fresh passage.",)


def _en(prompt: str) -> str:
    return f"Answer in English.\n{prompt}"


def _fr(prompt: str) -> str:
    return f"Réponds en français.\n{prompt}"


class _Formatter:
    """A formatter object whose prefix is state the cache key must read (called, or
    through its bound method `fmt`)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __call__(self, prompt: str) -> str:
        return f"{self.prefix}\n{prompt}"

    fmt = __call__


def _fmt(prompt: str, system: str = "") -> str:
    return f"{system}\n{prompt}"


@pytest.mark.parametrize(
    "pair",
    [
        (lambda p: _en(p), lambda p: _fr(p)),  # other names called
        (lambda p: p.upper(), lambda p: p.lower()),  # other attributes
        (lambda p: (lambda: "EN")() + p, lambda p: (lambda: "FR")() + p),  # nested code
        (functools.partial(_fmt, system="EN"), functools.partial(_fmt, system="FR")),
        (_Formatter("EN"), _Formatter("FR")),  # callable objects
    ],
    ids=["names", "attributes", "nested", "partials", "objects"],
)
def test_callables_that_compute_differently_get_different_keys(pair: tuple[Any, Any]) -> None:
    one, other = pair
    a = HyDE(ScriptedLLM(completion_to_prompt=one))
    b = HyDE(ScriptedLLM(completion_to_prompt=other))
    assert a.cache_key_for(Q) != b.cache_key_for(Q)
    assert a.cache_key_for(Q) == HyDE(ScriptedLLM(completion_to_prompt=one)).cache_key_for(Q)


def test_a_formatter_over_state_with_no_plain_form_is_keyed_by_what_it_renders() -> None:
    """A prompt formatter is keyed by what it renders, never by an identity (an
    address reused once its object is freed), so it is cached once per rendering and
    never serves the other language."""
    field = "completion_to_prompt"
    import gc

    class Opaque:
        def __init__(self, prefix: str) -> None:
            self.style = [prefix, threading.Lock()]  # a part with no plain form

        def fmt(self, prompt: str) -> str:
            return f"{self.style[0]}:{prompt}"

    cache = MemoryCache()
    wrong = 0
    gc.freeze()  # each collection below frees this loop's objects without the suite's heap
    try:
        for i in range(40):  # objects freed and their addresses reused
            lang = ["EN", "FR"][i % 2]
            llm = ScriptedLLM([f"answered in {lang}"], **{field: Opaque(lang).fmt})
            result = HyDE(llm, cache=cache).transform(Q)
            wrong += result.hypothetical != (f"answered in {lang}",)
            del llm
            gc.collect()
    finally:
        gc.unfreeze()
    # never cached under a reusable identity; once per rendering
    assert wrong == 0 and len(cache) == 2


def test_a_bound_method_keys_by_its_objects_state() -> None:
    en = HyDE(ScriptedLLM(completion_to_prompt=_Formatter("EN").fmt)).cache_key_for(Q)
    fr = HyDE(ScriptedLLM(completion_to_prompt=_Formatter("FR").fmt)).cache_key_for(Q)
    assert en != fr and en == HyDE(
        ScriptedLLM(completion_to_prompt=_Formatter("EN").fmt)
    ).cache_key_for(Q)


class _HangingReranker(BaseNodePostprocessor):
    release: Any = None

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        self.release.wait(30)
        return list(reversed(nodes))


def _behind_a_hung_reranker(**options: Any) -> tuple[_HangingReranker, TransformRetriever]:
    """A two-query fan-out over `DOCS` whose reranker hangs until its ``release`` is
    set; ``options`` go to the `TransformRetriever` (``model_timeout``...)."""
    reranker = _HangingReranker(release=threading.Event())
    retriever = TransformRetriever(
        StaticRetriever(DOCS, default=["renewals", "pto"]),
        MultiQuery(ScriptedLLM(respond=_mq_reply), n=2),
        reranker=reranker,
        **options,
    )
    return reranker, retriever


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_hung_reranker_keeps_the_fused_order_after_its_timeout(use_async: bool) -> None:
    reranker, retriever = _behind_a_hung_reranker(model_timeout=0.2)
    try:
        found = (
            await asyncio.wait_for(retriever.asearch(Q), 10) if use_async else retriever.search(Q)
        )
        assert [n.node.node_id for n in found.nodes] == ["renewals", "pto"]  # as fused
    finally:
        reranker.release.set()
    with pytest.raises(ValueError, match="model_timeout"):
        TransformRetriever(StaticRetriever(DOCS), MultiQuery(ScriptedLLM()), model_timeout=0)


def test_every_model_of_one_server_shares_its_worker_threads() -> None:
    from llama_index_hyde_plus.calls.workers import LLMPools

    pools = LLMPools()
    llms = [ScriptedLLM(model_name=f"ft:base:tenant-{i}") for i in range(3)]
    for llm in llms:
        object.__setattr__(llm, "api_base", "http://one-server:8000/v1")
    assert len({id(pools.for_llm(llm)) for llm in llms}) == 1
    assert pools.for_llm(ScriptedLLM(model_name="local-a")) is not pools.for_llm(llms[0])


def test_what_a_callable_computes_with_is_read_in_full() -> None:
    """Parts inside containers, tuple or secret-named keys, private and extra pydantic
    attributes are in the key, so EN and FR never share one entry."""
    from pydantic import BaseModel, PrivateAttr

    class Private(BaseModel):
        _pre: str = PrivateAttr(default="")

        def fmt(self, prompt: str) -> str:
            return f"{self._pre}:{prompt}"

    def boxed(lang: str) -> Any:
        box = [_Formatter(lang)]
        return lambda p: box[0].fmt(p)

    def keyed(lang: str) -> Any:
        table = {("k",): lang, "token": lang}
        return lambda p: f"{table[('k',)]}{table['token']}{p}"

    def private(lang: str) -> Any:
        model = Private()
        model._pre = lang
        return model.fmt

    for make in (boxed, keyed, private):
        en = HyDE(ScriptedLLM(completion_to_prompt=make("EN"))).cache_key_for(Q)
        fr = HyDE(ScriptedLLM(completion_to_prompt=make("FR"))).cache_key_for(Q)
        assert en != fr, make.__name__


@pytest.mark.parametrize("use_async", [False, True])
async def test_hung_reranker_calls_hold_neither_the_fan_out_nor_the_loops_threads(
    use_async: bool,
) -> None:
    reranker, retriever = _behind_a_hung_reranker(model_timeout=0.1, max_concurrency=1)
    try:
        for _ in range(8):  # each leaves a hung reranker call behind
            found = (
                await asyncio.wait_for(retriever.asearch(Q), 10)
                if use_async
                else retriever.search(Q)
            )
            assert [n.node.node_id for n in found.nodes] == ["renewals", "pto"]
        if use_async:  # the app's own blocking work still has the loop's threads
            assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 2) == "free"
    finally:
        reranker.release.set()


def test_keyword_only_defaults_and_class_data_are_in_the_key() -> None:
    """EN and FR never share entries through these two."""

    def kwd(lang: str) -> Any:
        def f(p: str, *, _f: _Formatter = _Formatter(lang)) -> str:  # noqa: B008 - the case under test
            return _f.fmt(p)

        return f

    def cls(lang: str) -> Any:
        class Made:
            pre = lang

            def __call__(self, p: str) -> str:
                return f"{self.pre}:{p}"

        return Made()

    for make in (kwd, cls):
        en = HyDE(ScriptedLLM(completion_to_prompt=make("EN"))).cache_key_for(Q)
        fr = HyDE(ScriptedLLM(completion_to_prompt=make("FR"))).cache_key_for(Q)
        assert en != fr, make.__name__


TEMPLATES = {"style": "EN"}


def test_the_module_data_a_formatter_reads_is_in_the_key() -> None:
    """A lambda reading a module-level table gets a new key when the table changes,
    never the old format's generations."""
    fmt = lambda p: f"{TEMPLATES['style']}:{p}"  # noqa: E731
    before = HyDE(ScriptedLLM(completion_to_prompt=fmt)).cache_key_for(Q)
    TEMPLATES["style"] = "FR"
    try:
        assert HyDE(ScriptedLLM(completion_to_prompt=fmt)).cache_key_for(Q) != before
    finally:
        TEMPLATES["style"] = "EN"


def test_a_formatter_whose_state_cannot_be_read_is_keyed_by_what_it_renders() -> None:
    """A formatter is keyed by what it renders, which needs none of its state."""
    field = "completion_to_prompt"

    class Sly:
        def __init__(self, prefix: str) -> None:
            self.prefix = prefix

        def __getattribute__(self, name: str) -> Any:
            if name == "__dict__":
                raise RuntimeError("no peeking")
            return object.__getattribute__(self, name)

        def __call__(self, prompt: str) -> str:
            return f"{self.prefix}:{prompt}"

    cache = MemoryCache()
    for lang in ("EN", "FR", "EN", "FR"):
        llm = ScriptedLLM([f"answered in {lang}"], **{field: Sly(lang)})
        assert HyDE(llm, cache=cache).transform(Q).hypothetical == (f"answered in {lang}",)
    assert len(cache) == 2
