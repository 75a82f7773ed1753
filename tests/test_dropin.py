"""`TransformRetriever` as a drop-in for core's: core transforms, core's keywords and
prompt keys, a rewrite made in an earlier step (`transformed=`), a Workflow; a core
transform is given the caller's own bundle and its own embedding is searched."""

from __future__ import annotations

import asyncio
import runpy
import threading
from pathlib import Path
from typing import Any

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.indices.query.query_transform.base import (
    BaseQueryTransform,
    HyDEQueryTransform,
)
from llama_index.core.prompts import PromptTemplate
from llama_index.core.retrievers import TransformRetriever as CoreTransformRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.core.vector_stores.types import VectorStoreQuery

from llama_index_hyde_plus import HyDE, MultiQuery, TransformRetriever
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM, StaticRetriever
from llama_index_hyde_plus.transforms.core import CoreTransform

from .conftest import DOCS

Q = "Why did revenue drop?"
PASSAGE = "Enterprise renewals slipped as three large accounts delayed signing."


def _base() -> StaticRetriever:
    return StaticRetriever(DOCS, default=["renewals", "lunch", "pto"])


def test_a_core_hyde_transform_is_searched_as_core_searches_it() -> None:
    base = _base()
    llm = ScriptedLLM(respond=lambda prompt: PASSAGE)
    retriever = TransformRetriever(base, HyDEQueryTransform(llm=llm))
    found = retriever.search(Q)
    assert found.transform.method == "HyDEQueryTransform" and not found.transform.fallback
    assert found.transform.hypothetical == (PASSAGE,)
    assert found.transform.usage.calls == 1  # read from LlamaIndex's instrumentation
    (bundle,) = base.bundles  # one search: the passage and the question, averaged by core
    assert bundle.query_str == Q and bundle.embedding_strs == [PASSAGE, Q]
    assert [n.node.node_id for n in found.nodes] == ["renewals", "lunch", "pto"]


def test_core_keyword_names_work() -> None:
    base = _base()
    core = HyDEQueryTransform(llm=ScriptedLLM(respond=lambda prompt: PASSAGE))
    retriever = TransformRetriever(retriever=base, query_transform=core)
    assert retriever.retrieve(Q)[0].node.node_id == "renewals"
    with pytest.raises(TypeError, match="once"):
        TransformRetriever(base, HyDE(ScriptedLLM()), query_transform=core)
    with pytest.raises(TypeError, match="needs a transformer"):
        TransformRetriever(base)
    with pytest.raises(TypeError, match="transformer must be a QueryTransformer or"):
        TransformRetriever(base, "hyde")  # type: ignore[arg-type]


def test_core_transform_metadata_reaches_run() -> None:
    seen: list[dict[str, Any]] = []

    class Recording(BaseQueryTransform):
        def _run(self, query_bundle: QueryBundle, metadata: dict[str, Any]) -> QueryBundle:
            seen.append(metadata)
            return QueryBundle(query_str=f"{query_bundle.query_str} rewritten")

        def _get_prompts(self) -> dict[str, Any]:
            return {}

        def _update_prompts(self, prompts: Any) -> None:
            return None

    base = _base()
    TransformRetriever(base, Recording(), transform_metadata={"prev_reasoning": "r"}).search(Q)
    assert seen == [{"prev_reasoning": "r"}] and base.queries == [f"{Q} rewritten"]
    with pytest.raises(ValueError, match="transform_metadata"):
        TransformRetriever(base, HyDE(ScriptedLLM()), transform_metadata={"a": 1})


def test_core_prompt_module_key_updates_ours_and_core_transforms() -> None:
    new = PromptTemplate("Write a passage answering: {query}")
    ours = TransformRetriever(_base(), HyDE(ScriptedLLM()))
    assert "query_transform:hyde_prompt" in ours.get_prompts()
    ours.update_prompts({"query_transform:hyde_prompt": new})
    assert ours.transformer.get_prompts()["hyde_prompt"].get_template() == new.get_template()

    core_new = PromptTemplate("Passage for: {context_str}")
    core = HyDEQueryTransform(llm=ScriptedLLM())
    theirs = TransformRetriever(_base(), core)
    theirs.update_prompts({"query_transform:hyde_prompt": core_new})
    assert core.get_prompts()["hyde_prompt"].get_template() == core_new.get_template()


def test_a_failing_core_transform_falls_back_to_the_question() -> None:
    base = _base()
    core = HyDEQueryTransform(llm=ScriptedLLM([RuntimeError("provider down")]))
    found = TransformRetriever(base, core).search(Q)
    assert found.transform.fallback and "provider down" in (found.transform.error or "")
    assert base.queries == [Q] and found.nodes


async def test_a_core_transform_runs_off_the_event_loop() -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []

    def respond(prompt: str) -> str:
        threads.append(threading.get_ident())
        return PASSAGE

    retriever = TransformRetriever(_base(), HyDEQueryTransform(llm=ScriptedLLM(respond=respond)))
    nodes = await retriever.aretrieve(Q)
    assert nodes[0].node.node_id == "renewals" and threads and loop_thread not in threads


def test_a_core_transform_wraps_explicitly_too() -> None:
    core = HyDEQueryTransform(llm=ScriptedLLM(respond=lambda prompt: PASSAGE))
    wrapped = CoreTransform(core)
    assert TransformRetriever(_base(), wrapped).transformer is wrapped
    with pytest.raises(TypeError, match="transform must be a LlamaIndex BaseQueryTransform"):
        CoreTransform(HyDE(ScriptedLLM()))  # type: ignore[arg-type]


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_rewrite_made_earlier_is_searched_without_a_second_call(use_async: bool) -> None:
    llm = ScriptedLLM(respond=lambda prompt: PASSAGE)
    retriever = TransformRetriever(
        _base(), HyDE(llm, strategy="replace"), embed_model=DeterministicEmbedding(dim=64)
    )
    made = retriever.transformer.transform_safe(Q)
    calls = llm.sync_calls + llm.async_calls
    if use_async:
        found = await retriever.asearch(Q, transformed=made)
    else:
        found = retriever.search(Q, transformed=made)
    assert found.transform.hypothetical == (PASSAGE,) and found.nodes
    assert llm.sync_calls + llm.async_calls == calls
    # the rewrite's calls were the earlier step's to report: none counted twice
    assert found.transform.usage.calls == 0 and found.transform.generation_usage == made.usage


def test_a_rewrite_of_another_question_or_a_grounded_transform_is_refused() -> None:
    llm = ScriptedLLM(respond=lambda prompt: "other")
    retriever = TransformRetriever(_base(), MultiQuery(llm, n=1))
    other = retriever.transformer.transform_safe("Who moved offices?")
    with pytest.raises(ValueError, match="transformed is a rewrite of"):
        retriever.search(Q, transformed=other)
    with pytest.raises(ValueError, match="made by 'hyde'"):
        retriever.search(Q, transformed=HyDE(llm).transform_safe(Q))
    with pytest.raises(TypeError, match="transformed must be a TransformResult"):
        retriever.search(Q, transformed="a passage")  # type: ignore[arg-type]
    grounded = TransformRetriever(
        _base(), HyDE(llm, grounded=2), embed_model=DeterministicEmbedding(dim=64)
    )
    with pytest.raises(ValueError, match="grounded"):
        grounded.search(Q, transformed=grounded.transformer.transform_safe(Q))


def test_the_workflow_example_streams_the_rewrite_then_answers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    path = Path(__file__).parent.parent / "examples" / "workflow_rag.py"
    module = runpy.run_path(str(path))
    asyncio.run(module["main"]())
    out = capsys.readouterr().out
    wrote = out.index("hyde wrote: Revenue fell as enterprise renewals slipped")
    assert wrote < out.index("Answer: Revenue dropped because enterprise renewals slipped")


class _HungCore(BaseQueryTransform):
    """A core transform whose LLM never answers (until released)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def _run(self, query_bundle: QueryBundle, metadata: dict[str, Any]) -> QueryBundle:
        self.release.wait(30)
        return query_bundle

    def _get_prompts(self) -> dict[str, Any]:
        return {}

    def _update_prompts(self, prompts: Any) -> None:
        return None


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_hung_core_transform_times_out_and_holds_none_of_the_loops_threads(
    use_async: bool,
) -> None:
    core = _HungCore()
    try:
        retriever = TransformRetriever(_base(), CoreTransform(core, timeout=0.2))
        if use_async:
            found = await asyncio.gather(*(retriever.asearch(Q) for _ in range(12)))
            # the loop's default executor is free for the app's own blocking work
            assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 2) == "free"
        else:
            found = [retriever.search(Q)]
        assert all(
            f.transform.fallback and "did not answer within 0.2s" in (f.transform.error or "")
            for f in found
        )
        assert all(f.nodes for f in found)
    finally:
        core.release.set()


def test_a_core_transform_raising_a_non_exception_falls_back() -> None:
    class Timeout(BaseException):
        pass

    class Raising(_HungCore):
        def _run(self, query_bundle: QueryBundle, metadata: dict[str, Any]) -> QueryBundle:
            raise Timeout("gevent")

    found = TransformRetriever(_base(), Raising()).search(Q)
    assert found.transform.fallback and "Timeout" in (found.transform.error or "") and found.nodes


def test_a_core_transform_handed_to_a_core_engine_returns_its_own_bundle() -> None:
    seen: list[dict[str, Any]] = []

    class Rewrites(_HungCore):
        def _run(self, query_bundle: QueryBundle, metadata: dict[str, Any]) -> QueryBundle:
            seen.append(metadata)
            return QueryBundle(query_str="Foo bar\n" + query_bundle.query_str)

    wrapped = CoreTransform(Rewrites(), metadata={"a": 1})
    bundle = wrapped.run(QueryBundle("What is?"), {"index_summary": "s"})
    assert bundle.query_str == "Foo bar\nWhat is?" and seen == [{"a": 1, "index_summary": "s"}]


def test_a_core_transforms_query_text_is_searched_as_it_returns_it() -> None:
    base = _base()

    class Keeps(_HungCore):
        def _run(self, query_bundle: QueryBundle, metadata: dict[str, Any]) -> QueryBundle:
            return QueryBundle(query_str=query_bundle.query_str + "\n")

    TransformRetriever(base, Keeps()).search(Q)
    assert base.queries == [Q + "\n"]


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_dense_retriever_gets_the_question_as_query_str_and_the_passage_to_embed(
    use_async: bool,
) -> None:
    base = _base()  # no embedding model: it embeds the strings it is given, as core's do
    retriever = TransformRetriever(base, HyDE(ScriptedLLM(respond=lambda p: PASSAGE)))
    found = await retriever.asearch(Q) if use_async else retriever.search(Q)
    assert found.transform.hypothetical == (PASSAGE,) and not found.transform.fallback
    (bundle,) = base.bundles
    assert bundle.query_str == Q and PASSAGE in bundle.embedding_strs


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_vector_index_retriever_gets_the_question_as_query_str(
    faiss_index: VectorStoreIndex, spy_queries: list[VectorStoreQuery], use_async: bool
) -> None:
    hyde = HyDE(ScriptedLLM(respond=lambda p: PASSAGE), include_query=False)
    retriever = TransformRetriever(faiss_index.as_retriever(similarity_top_k=2), hyde)
    found = await retriever.asearch(Q) if use_async else retriever.search(Q)
    assert not found.transform.fallback
    (query,) = spy_queries
    assert query.query_str == Q and query.query_embedding is not None


@pytest.mark.parametrize("search_type", ["keyword", "hybrid"])
def test_keyword_and_hybrid_retrievers_get_the_generated_text_as_query_str(
    search_type: str,
) -> None:
    base = _base()
    hyde = HyDE(ScriptedLLM(respond=lambda p: PASSAGE), include_query=True)
    TransformRetriever(base, hyde, search_type=search_type).search(Q)  # type: ignore[arg-type]
    (bundle,) = base.bundles
    assert PASSAGE in bundle.query_str


# -- a wrapped core transform sees the caller's bundle, and its vector is searched ---
class _CoreBase(BaseQueryTransform):
    def _get_prompts(self) -> dict[str, Any]:
        return {}

    def _update_prompts(self, prompts: Any) -> None:
        pass


class _EmbeddingTransform(_CoreBase):
    """A core transform that answers with a vector of its own."""

    def _run(self, query_bundle: QueryBundle, metadata: dict[str, Any]) -> QueryBundle:
        return QueryBundle(query_str=query_bundle.query_str, embedding=[1.0] + [0.0] * 7)


class _SpyTransform(_CoreBase):
    """A core transform that records what it was given and returns it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[Any, ...]] = []

    def _run(self, query_bundle: QueryBundle, metadata: dict[str, Any]) -> QueryBundle:
        bundle = query_bundle
        self.seen.append((bundle.query_str, bundle.custom_embedding_strs, bundle.embedding))
        return query_bundle


class _Recording(StaticRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self.bundles.append(query_bundle)
        return super()._retrieve(query_bundle)


def _recording() -> _Recording:
    retriever = _Recording({"a": "x"}, default=["a"])
    retriever.bundles = []
    return retriever


async def _retrieve(retriever: Any, query: Any, use_async: bool) -> Any:
    return await retriever.aretrieve(query) if use_async else retriever.retrieve(query)


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_core_transforms_own_embedding_is_searched_as_core_searches_it(
    use_async: bool,
) -> None:
    searched: dict[str, set[tuple[float, ...]]] = {}
    for name, make in (
        ("core", lambda r: CoreTransformRetriever(r, _EmbeddingTransform())),
        (
            "ours",
            lambda r: TransformRetriever(
                r,
                query_transform=_EmbeddingTransform(),
                embed_model=DeterministicEmbedding(),
                search_type="dense",
            ),
        ),
    ):
        inner = _recording()
        await _retrieve(make(inner), "q", use_async)
        searched[name] = {tuple(b.embedding or ()) for b in inner.bundles}
    assert searched["ours"] == searched["core"] == {(1.0,) + (0.0,) * 7}


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_core_transform_is_given_the_callers_own_bundle(use_async: bool) -> None:
    given = QueryBundle("q", custom_embedding_strs=["special text"], embedding=[0.5, 0.5])
    seen: dict[str, Any] = {}
    for name, make in (
        ("core", lambda r, t: CoreTransformRetriever(r, t)),
        ("ours", lambda r, t: TransformRetriever(r, query_transform=t)),
    ):
        spy = _SpyTransform()
        inner = _recording()
        await _retrieve(make(inner, spy), given, use_async)
        seen[name] = (spy.seen, {tuple(b.embedding or ()) for b in inner.bundles})
    assert seen["ours"] == seen["core"]
    assert seen["ours"][0] == [("q", ["special text"], [0.5, 0.5])]
