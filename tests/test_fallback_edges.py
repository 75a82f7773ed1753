"""Edge cases: whatever fails after the LLM falls back to the question's own search,
traces on the host's callback manager, replies with no content, what a QueryBundle
carries, non-finite scores, escaped prompt braces, placeholder queries, the embedding
model of a loaded index, the docs extra's logging, and the RCP servers' last line of
defence."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.callbacks import CallbackManager, LlamaDebugHandler
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from llama_index_hyde_plus import HyDE, MultiQuery, TransformRetriever, transform_of
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM, StaticRetriever
from llama_index_hyde_plus.transforms.feedback import Rocchio

from .conftest import DOCS, Q, ids, search

POISON = "A poison passage about revenue and renewals."


async def retrieve(
    retriever: TransformRetriever, bundle: QueryBundle, use_async: bool
) -> list[NodeWithScore]:
    return await retriever.aretrieve(bundle) if use_async else retriever.retrieve(bundle)


# -- 4: a failure after the LLM falls back to the question's own search --------------
class _Rejecting(DeterministicEmbedding):
    """Embeds a text holding one of ``poison`` badly: ``mode`` "raise" (an API's 400),
    "short" (a vector of another size), "empty", "nan" or "interrupt" (KeyboardInterrupt)."""

    poison: tuple[str, ...] = ("poison",)
    mode: str = "raise"

    def vector(self, text: str) -> list[float]:
        if any(p in text for p in self.poison):
            if self.mode == "raise":
                raise ValueError("400: this input is rejected")
            if self.mode == "short":
                return [0.5] * 8
            if self.mode == "empty":
                return []
            if self.mode == "nan":
                return [float("nan")] * self.dim
            if self.mode == "interrupt":
                raise KeyboardInterrupt
        return super().vector(text)


def _index() -> VectorStoreIndex:
    nodes = [TextNode(id_=k, text=v) for k, v in DOCS.items()]
    return VectorStoreIndex(nodes, embed_model=DeterministicEmbedding(dim=64))


REASON = {"raise": "rejected", "short": "dimensions", "empty": "empty"}


def _steps() -> dict[str, object]:
    """A transform per step of the plan, each of whose generated text is poisoned."""
    return {
        "replace": lambda: HyDE(ScriptedLLM([POISON]), query_weight=0.5),
        "gate": lambda: HyDE(ScriptedLLM([POISON]), query_weight=0.5, gate=0.05),
        "rerank": lambda: HyDE(ScriptedLLM([POISON]), query_weight=0.5, strategy="rerank"),
    }


@pytest.mark.parametrize("mode", ["raise", "short", "empty"])
@pytest.mark.parametrize("step", ["replace", "gate", "rerank"])
@pytest.mark.parametrize("use_async", [False, True])
async def test_a_generated_text_the_embedding_rejects_falls_back_to_the_question(
    mode: str, step: str, use_async: bool
) -> None:
    base = _index().as_retriever(similarity_top_k=4)
    plain = ids(base.retrieve(Q))
    transform = _steps()[step]()  # type: ignore[operator]
    retriever = TransformRetriever(base, transform, embed_model=_Rejecting(dim=64, mode=mode))
    result = await search(retriever, Q, use_async)
    assert ids(result.nodes) == plain
    assert result.transform.fallback, result.transform
    assert REASON[mode] in (result.transform.error or ""), result.transform.error
    assert "question alone" in (result.transform.error or "")


@pytest.mark.parametrize("mode", ["raise", "short", "empty"])
@pytest.mark.parametrize("use_async", [False, True])
async def test_a_document_vector_the_embedding_rejects_makes_rocchio_fall_back(
    mode: str, use_async: bool
) -> None:
    base = _index().as_retriever(similarity_top_k=4)
    plain = ids(base.retrieve(Q))
    bad = _Rejecting(dim=64, mode=mode, poison=(DOCS[plain[1]][:30],))
    retriever = TransformRetriever(base, Rocchio(k=3, beta=0.5), embed_model=bad)
    result = await search(retriever, Q, use_async)
    assert ids(result.nodes) == plain
    assert result.transform.fallback and REASON[mode] in (result.transform.error or "")


class _ShortQueries(StaticRetriever):
    """A keyword store that rejects long query text (a query-length limit)."""

    def _answer(self, bundle: QueryBundle) -> list[NodeWithScore]:
        if len(bundle.query_str) > 40:
            raise ValueError("query too long for this store")
        return super()._answer(bundle)


def _keyword_store() -> _ShortQueries:
    return _ShortQueries(DOCS, results={Q: ["renewals", "pricing"]}, default=["lunch"])


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_keyword_store_rejecting_the_long_hyde_text_serves_the_question(
    use_async: bool,
) -> None:
    store = _keyword_store()
    hyde = HyDE(ScriptedLLM(["Renewals slipped as three large accounts delayed signing."]))
    retriever = TransformRetriever(store, hyde, search_type="keyword")
    result = await search(retriever, Q, use_async)
    assert ids(result.nodes) == ["renewals", "pricing"]
    assert result.transform.fallback and "too long" in (result.transform.error or "")


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_fanout_whose_every_search_is_rejected_serves_the_question(
    use_async: bool,
) -> None:
    store = _keyword_store()
    long_ones = "\n".join(f"{i}. a long paraphrase number {i} of why revenue fell" for i in (1, 2))
    mq = MultiQuery(ScriptedLLM([long_ones]), n=2, include_query=False)
    retriever = TransformRetriever(store, mq, search_type="keyword")
    result = await search(retriever, Q, use_async)
    assert ids(result.nodes) == ["renewals", "pricing"]
    assert result.transform.fallback and "too long" in (result.transform.error or "")


@pytest.mark.parametrize("use_async", [False, True])
async def test_when_the_question_itself_cannot_be_searched_its_error_propagates(
    use_async: bool,
) -> None:
    store = StaticRetriever(DOCS, fail_on=[Q])
    retriever = TransformRetriever(store, HyDE(ScriptedLLM([RuntimeError("llm down")])))
    with pytest.raises(RuntimeError, match="search failed"):
        await search(retriever, Q, use_async)
    assert store.queries == [Q]  # the question was searched once, not again


@pytest.mark.parametrize("use_async", [False, True])
async def test_the_question_failing_after_the_expansion_failed_propagates(
    use_async: bool,
) -> None:
    class _Down(StaticRetriever):
        def _answer(self, bundle: QueryBundle) -> list[NodeWithScore]:
            raise ConnectionError("store down")

    retriever = TransformRetriever(_Down(DOCS), HyDE(ScriptedLLM([POISON])))
    with pytest.raises(ConnectionError, match="store down"):
        await search(retriever, Q, use_async)


@pytest.mark.parametrize("step", ["replace", "gate", "rerank"])
def test_an_interrupt_while_embedding_the_generated_text_is_never_swallowed(step: str) -> None:
    base = _index().as_retriever(similarity_top_k=4)
    transform = _steps()[step]()  # type: ignore[operator]
    bad = _Rejecting(dim=64, mode="interrupt")
    retriever = TransformRetriever(base, transform, embed_model=bad)
    with pytest.raises(KeyboardInterrupt):
        retriever.search(Q)


async def test_a_stray_cancelled_error_from_the_store_is_a_failure_not_our_cancellation() -> None:
    class _Cancelling(StaticRetriever):
        async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            if query_bundle.query_str != Q:
                raise asyncio.CancelledError  # raised by the store; our task was not cancelled
            return await super()._aretrieve(query_bundle)

    store = _Cancelling(DOCS, default=["pto"])
    retriever = TransformRetriever(store, HyDE(ScriptedLLM([POISON])), search_type="keyword")
    if sys.version_info < (3, 11):  # cannot tell whose cancellation it is: it propagates
        with pytest.raises(asyncio.CancelledError):
            await retriever.asearch(Q)
        return
    found = await retriever.asearch(Q)
    assert found.transform.fallback and "CancelledError" in (found.transform.error or "")
    assert [n.node.node_id for n in found.nodes] == ["pto"]


# -- 9: traces run on the host's callback manager --------------------------------------
def _kept_ids(manager: CallbackManager) -> int:
    return sum(len(v) for v in manager.trace_map.values())


def test_retrieve_through_multi_query_keeps_no_more_trace_ids_as_it_goes() -> None:
    manager = CallbackManager([LlamaDebugHandler(print_trace_on_end=False)])
    saved = Settings._callback_manager
    Settings.callback_manager = manager
    try:
        base = _index().as_retriever(similarity_top_k=3)
        base.retrieve(Q)
        plain = _kept_ids(manager)
        llm = ScriptedLLM(respond=lambda prompt: "1. why revenue fell\n2. causes of lower sales")
        retriever = TransformRetriever(base, MultiQuery(llm, n=2))
        retriever.retrieve(Q)
        once = _kept_ids(manager)
        for _ in range(50):
            retriever.retrieve(Q)
        assert _kept_ids(manager) <= once, (plain, once, _kept_ids(manager))
        assert retriever.callback_manager is manager
    finally:
        Settings._callback_manager = saved


# -- 13: what a QueryBundle carries ------------------------------------------------------
PTO = DOCS["pto"]


@pytest.mark.parametrize("use_async", [False, True])
async def test_an_embedding_only_bundle_is_searched_as_given(use_async: bool) -> None:
    embed = DeterministicEmbedding(dim=64)
    base = _index().as_retriever(similarity_top_k=3)
    bundle = QueryBundle(query_str="", embedding=embed.vector(PTO))
    llm = ScriptedLLM(["never asked"])
    retriever = TransformRetriever(base, HyDE(llm))
    nodes = await retrieve(retriever, bundle, use_async)
    assert ids(nodes) == ids(base.retrieve(bundle)) and ids(nodes)[0] == "pto"
    assert llm.prompts == []
    info = transform_of(nodes)
    assert info is not None and info["skipped"] and not info["fallback"]


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_bundle_without_text_or_embedding_is_still_refused(use_async: bool) -> None:
    retriever = TransformRetriever(_index().as_retriever(), HyDE(ScriptedLLM(["x"])))
    with pytest.raises(ValueError, match="non-empty"):
        await retrieve(retriever, QueryBundle(query_str="  "), use_async)


@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize("llm_works", [False, True])
async def test_a_precomputed_embedding_is_the_questions_vector(
    use_async: bool, llm_works: bool
) -> None:
    """The caller's vector points at the PTO document while the text is about revenue:
    the question's own search (after an LLM failure), and HyDE's mix at question weight
    1, both search with the caller's vector, which is never embedded again."""
    embed = DeterministicEmbedding(dim=64)
    base = _index().as_retriever(similarity_top_k=3)
    reply = "Revenue fell as renewals slipped." if llm_works else RuntimeError("down")
    hyde = HyDE(ScriptedLLM([reply]), query_weight=1.0)
    retriever = TransformRetriever(base, hyde, embed_model=embed)
    bundle = QueryBundle(query_str=Q, embedding=embed.vector(PTO))
    nodes = await retrieve(retriever, bundle, use_async)
    assert ids(nodes)[0] == "pto", ids(nodes)
    info = transform_of(nodes)
    assert info is not None and info["fallback"] is not llm_works
    assert embed.sync_calls + embed.async_calls <= (1 if llm_works else 0)  # the passage


@pytest.mark.parametrize("use_async", [False, True])
async def test_custom_embedding_strs_replace_what_is_embedded_for_the_question(
    use_async: bool,
) -> None:
    base = _index().as_retriever(similarity_top_k=3)
    llm = ScriptedLLM(["1. why revenue fell\n2. causes of lower sales"])
    retriever = TransformRetriever(base, MultiQuery(llm, n=2, original_weight=100.0))
    bundle = QueryBundle(query_str=Q, custom_embedding_strs=[PTO])
    nodes = await retrieve(retriever, bundle, use_async)
    assert ids(nodes)[0] == "pto", ids(nodes)
    assert llm.prompts and Q in llm.prompts[0]  # the text is still what is rewritten


# -- 12: replies with no content ---------------------------------------------------------
EMPTY_REPLIES = [
    "</s>",
    "<|im_end|>",
    "<|endoftext|>",
    " <|eot_id|> ",
    "<s> </s>",
    "[INST] [/INST]",
    "\u200b\u200c\u200d\ufeff\u2060",
    "<|im_start|>assistant\n<|im_end|>",
]


@pytest.mark.parametrize("reply", EMPTY_REPLIES)
@pytest.mark.parametrize("use_async", [False, True])
async def test_a_hyde_reply_with_no_content_is_a_fallback_and_not_cached(
    reply: str, use_async: bool
) -> None:
    from llama_index_hyde_plus.caching.cache import MemoryCache

    cache = MemoryCache()
    hyde = HyDE(ScriptedLLM([reply, "Renewals slipped."]), cache=cache)
    result = await hyde.atransform(Q) if use_async else hyde.transform(Q)
    assert result.fallback and result.hypothetical == (), result
    again = await hyde.atransform(Q) if use_async else hyde.transform(Q)
    assert again.hypothetical == ("Renewals slipped.",) and not again.cached


@pytest.mark.parametrize("reply", EMPTY_REPLIES)
@pytest.mark.parametrize("use_async", [False, True])
async def test_a_multi_query_reply_with_no_content_is_a_fallback(
    reply: str, use_async: bool
) -> None:
    mq = MultiQuery(ScriptedLLM([reply]), n=3)
    result = await mq.atransform(Q) if use_async else mq.transform(Q)
    assert result.fallback and result.search_queries == (Q,), result


@pytest.mark.parametrize("use_async", [False, True])
async def test_special_tokens_and_invisible_characters_are_cleaned_from_replies(
    use_async: bool,
) -> None:
    hyde = HyDE(
        ScriptedLLM(["<|im_start|>assistant\n\u200bRenewals slipped.<|im_end|>\n<|im_start|>user"])
    )
    result = await hyde.atransform(Q) if use_async else hyde.transform(Q)
    assert result.hypothetical == ("Renewals slipped.",)
    reply = (
        "<|im_start|>assistant\n1. why revenue fell\n2. \u2060\u200b\n"
        "3. lower\u00ad sales causes<|im_end|>\n<|im_start|>user\n1. another turn"
    )
    mq = MultiQuery(ScriptedLLM([reply]), n=3)
    result = await mq.atransform(Q) if use_async else mq.transform(Q)
    assert result.queries == ("why revenue fell", "lower sales causes"), result.queries


def test_cleaning_keeps_joiners_inside_words_and_emoji() -> None:
    from llama_index_hyde_plus.transforms.parsing import clean_reply

    persian = "می\u200cخواهم"
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"
    assert clean_reply(f"\u200d{persian} {family}\u200c ") == f"{persian} {family}"
    assert clean_reply("\ufeffa\u200bb\u2060c\u00ad") == "abc"
    assert clean_reply("<s>[INST] the answer [/INST]") == "the answer"
    assert clean_reply("Use <b>bold</b> and a <|im_end|> marker") == "Use <b>bold</b> and a"


# -- placeholder lines are not queries -----------------------------------------------------
@pytest.mark.parametrize(
    "reply",
    [
        "• [Insert Query 1] • [Insert Query 2]",
        "• [Insert Query 1]\n• [Insert Query 2]",
        "1. <query 1>\n2. <query 2>",
        "Query 1: ...\nQuery 2: ...",
        '["<sub-question 1>", "[your query here]"]',
        "1. {query}\n2. [Paraphrase 2]",
        "1. Query 1\n2. Question 2",
    ],
)
def test_a_reply_of_template_placeholders_is_no_query(reply: str) -> None:
    from llama_index_hyde_plus.transforms.parsing import parse_queries

    assert parse_queries(reply, 3) == [], parse_queries(reply, 3)
    result = MultiQuery(ScriptedLLM([reply]), n=3).transform(Q)
    assert result.fallback, result


@pytest.mark.parametrize(
    ("reply", "queries"),
    [
        (
            "1. [What is a query plan?]\n2. <b>index</b> tuning",
            ["[What is a query plan?]", "<b>index</b> tuning"],
        ),
        (
            "1. query 1 of the SQL log\n2. question 2 on the exam",
            ["query 1 of the SQL log", "question 2 on the exam"],
        ),
        (
            "1. [PDF] export settings\n2. <query 1> refund policy",
            ["[PDF] export settings", "refund policy"],
        ),
        ("1. query planner\n2. search query syntax", ["query planner", "search query syntax"]),
    ],
)
def test_real_queries_beside_placeholders_are_kept(reply: str, queries: list[str]) -> None:
    from llama_index_hyde_plus.transforms.parsing import parse_queries

    assert parse_queries(reply, 3) == queries


# -- a non-finite score from the wrapped retriever ranks lowest ---------------------------
def _scored(pairs: list[tuple[str, float]]) -> list[NodeWithScore]:
    return [NodeWithScore(node=TextNode(id_=i, text=i), score=s) for i, s in pairs]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("mode", ["relative_score", "dist_based_score", "max"])
def test_one_non_finite_score_does_not_spoil_the_fusion(bad: float, mode: str) -> None:
    import math

    from llama_index_hyde_plus.search.fusion import fuse

    first = _scored([("a", 3.0), ("x", bad), ("b", 2.0), ("c", 1.0)])
    second = _scored([("b", 0.9), ("a", 0.5)])
    fused = fuse([first, second], mode)
    assert all(math.isfinite(n.score or 0.0) for n in fused), [n.score for n in fused]
    without = fuse([[n for n in first if n.node.node_id != "x"], second], mode)
    assert [i for i in ids(fused) if i != "x"] == ids(without)
    assert ids(fused).index("x") >= 2, ids(fused)  # below every better-scored node


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_one_non_finite_score_does_not_spoil_the_blend(bad: float) -> None:
    import math

    from llama_index_hyde_plus.search.expansion import blend_scores

    scores = blend_scores([3.0, bad, 1.0], [0.2, 0.9, 0.1], 0.3)
    assert all(math.isfinite(s) for s in scores) and scores[0] > scores[2], scores


@pytest.mark.parametrize("use_async", [False, True])
async def test_rerank_over_a_nan_scored_hit_ranks_the_others_normally(use_async: bool) -> None:
    import math

    class _OneNaN(StaticRetriever):
        def _answer(self, bundle: QueryBundle) -> list[NodeWithScore]:
            found = super()._answer(bundle)
            found[1] = NodeWithScore(node=found[1].node, score=float("nan"))
            return found

    store = _OneNaN(DOCS, default=["renewals", "hiring", "pricing", "pto"])
    hyde = HyDE(ScriptedLLM(["Revenue fell because renewals slipped."]), strategy="rerank")
    retriever = TransformRetriever(store, hyde, embed_model=DeterministicEmbedding(dim=64))
    result = await search(retriever, Q, use_async)
    assert all(math.isfinite(n.score or 0.0) for n in result.nodes), [n.score for n in result.nodes]
    assert ids(result.nodes)[0] == "renewals"


# -- escaped braces render whatever the query holds ---------------------------------------
@pytest.mark.parametrize("query", ["\x00secret\x00 plans", "a {{name}} b", "{query} and {n}"])
def test_escaped_braces_render_independently_of_the_query(query: str) -> None:
    llm = ScriptedLLM(["1. one\n2. two"])
    MultiQuery(llm, n=2, prompt="Write {{n}} literally, then {n} queries for: {query}").transform(
        query
    )
    assert llm.prompts == [f"Write {{n}} literally, then 2 queries for: {query}"]


# -- load_index(embed_model=...) checks the model against the index's metadata ------------
class _Nameless(BaseEmbedding):
    """An embedding model with no name of its own (LlamaIndex's default "unknown")."""

    size: int = 64

    def _get_query_embedding(self, query: str) -> list[float]:
        return DeterministicEmbedding(dim=self.size).vector(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_query_embedding(text)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)


@pytest.fixture
def built(tmp_path: Path) -> Path:
    from llama_index.core import Document

    from llama_index_hyde_plus.stores.faiss import build_faiss_index

    out = tmp_path / "index"
    docs = [Document(text=t, id_=i) for i, t in DOCS.items()]
    build_faiss_index(docs, DeterministicEmbedding(dim=64), out, embed_spec="det", max_length=256)
    return out


def test_load_index_queries_with_the_given_model_when_it_matches(built: Path) -> None:
    from llama_index_hyde_plus import load_index

    model = DeterministicEmbedding(dim=64)
    index = load_index(built, embed_model=model)
    assert index._embed_model is model
    assert ids(index.as_retriever(similarity_top_k=1).retrieve("paid time off"))[0] == "pto"


@pytest.mark.parametrize(
    ("model", "says"),
    [
        (DeterministicEmbedding(dim=32), "32 dimensions"),
        (DeterministicEmbedding(dim=64, model_name="another-model"), "another-model"),
        (_Nameless(size=32), "32"),
    ],
)
def test_load_index_refuses_an_embed_model_that_does_not_match(
    built: Path, model: BaseEmbedding, says: str
) -> None:
    from llama_index_hyde_plus import load_index

    with pytest.raises(ValueError, match="embed_model") as raised:
        load_index(built, embed_model=model)
    assert says in str(raised.value)


def test_load_index_accepts_a_nameless_model_of_the_right_size_with_a_warning(
    built: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from llama_index_hyde_plus import load_index

    with caplog.at_level(logging.WARNING):
        index = load_index(built, embed_model=_Nameless())
    assert ids(index.as_retriever(similarity_top_k=1).retrieve("paid time off"))[0] == "pto"
    assert any("deterministic-bow" in r.getMessage() for r in caplog.records)


def test_load_index_takes_a_spec_or_a_model_not_both(built: Path) -> None:
    from llama_index_hyde_plus import load_index

    with pytest.raises(ValueError, match="not both"):
        load_index(built, "det", embed_model=DeterministicEmbedding(dim=64))


# -- reading with the docs extra leaves the root logger alone -----------------------------
@pytest.mark.slow  # a fresh interpreter
def test_reading_documents_with_the_docs_extra_leaves_the_root_logger_alone(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "prices.csv").write_text("item,price\nlaptop,1200\n")
    code = (
        "import logging, sys\n"
        "root = logging.getLogger()\n"
        "before = (root.level, list(root.handlers))\n"
        "import llama_index_hyde_plus\n"
        "from llama_index_hyde_plus.readers import read_documents\n"
        "docs = read_documents(__import__('pathlib').Path(sys.argv[1]))\n"
        "assert docs and 'laptop' in docs[0].text, docs\n"
        "print(before == (root.level, list(root.handlers)), root.level, root.handlers)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "docs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("True"), done.stdout


# -- the RCP servers' last line of defence ---------------------------------------------------
class _GeventTimeout(BaseException):
    """What gevent's ``Timeout`` is: not an ``Exception``."""


class _Raising(StaticRetriever):
    """Raises ``error`` (a BaseException) for the query "boom"."""

    error: BaseException = _GeventTimeout("timed out")

    def _answer(self, bundle: QueryBundle) -> list[NodeWithScore]:
        if bundle.query_str == "boom":
            raise self.error
        return super()._answer(bundle)


def _frame(id_: int, method: str, params: dict[str, object]) -> bytes:
    import json

    return json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}).encode()


def _rcp_server(error: BaseException, http: bool = False):  # type: ignore[no-untyped-def]
    from llama_index_hyde_plus.server.rcp import TransformService, build_server
    from llama_index_hyde_plus.testing import echo_llm

    store = _Raising(DOCS, default=["pto"])
    store.error = error
    return build_server(TransformService(echo_llm(), store), http=http)


def _init() -> bytes:
    import rcp

    return _frame(1, "initialize", {"protocolVersion": rcp.PROTOCOL_VERSION})


def test_the_stdio_server_answers_a_non_exception_error_and_keeps_serving() -> None:
    import io
    import json

    from llama_index_hyde_plus.server.rcp import serve_stdio

    frames = [_init(), _frame(2, "retrieve", {"query": "boom", "k": 1})]
    frames.append(_frame(3, "retrieve", {"query": "paid time off", "k": 1}))
    out = io.BytesIO()
    serve_stdio(
        _rcp_server(_GeventTimeout("t")), stdin=io.BytesIO(b"\n".join(frames) + b"\n"), stdout=out
    )
    replies = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["id"] for r in replies] == [1, 2, 3], replies
    assert (
        replies[1]["error"]["code"] == -32603 and "_GeventTimeout" in replies[1]["error"]["message"]
    )
    assert replies[2]["result"]["hits"][0]["id"] == "pto"


@pytest.mark.parametrize("fatal", [KeyboardInterrupt(), SystemExit(3)])
def test_the_stdio_server_lets_interrupts_and_exits_through(fatal: BaseException) -> None:
    import io

    from llama_index_hyde_plus.server.rcp import serve_stdio

    frames = _init() + b"\n" + _frame(2, "retrieve", {"query": "boom", "k": 1}) + b"\n"
    with pytest.raises(type(fatal)):
        serve_stdio(_rcp_server(fatal), stdin=io.BytesIO(frames), stdout=io.BytesIO())


def _http_post(url: str, body: bytes) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_http_server_answers_a_non_exception_error_in_json_rpc() -> None:
    import json

    from llama_index_hyde_plus.server.http import RcpHttpServer

    server = RcpHttpServer(_rcp_server(_GeventTimeout("t"), http=True)).start()
    try:
        assert _http_post(server.url, _init())[0] == 200
        status, body = _http_post(server.url, _frame(2, "retrieve", {"query": "boom", "k": 1}))
        assert status == 200, body
        reply = json.loads(body)
        assert reply["id"] == 2 and reply["error"]["code"] == -32603, reply
        status, body = _http_post(server.url, _frame(3, "retrieve", {"query": "pto", "k": 1}))
        assert status == 200 and json.loads(body)["result"]["hits"], body
    finally:
        server.stop()


def test_the_http_server_answers_a_body_that_is_not_utf8_with_a_parse_error() -> None:
    import json

    from llama_index_hyde_plus.server.http import RcpHttpServer

    server = RcpHttpServer(_rcp_server(_GeventTimeout("t"), http=True)).start()
    try:
        body = b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"nonce": "\xff\xfe"}}'
        status, raw = _http_post(server.url, body)
        reply = json.loads(raw)
        assert reply["error"]["code"] == -32700 and "UTF-8" in reply["error"]["message"], reply
        assert status == 200
    finally:
        server.stop()


def test_the_stdio_server_answers_a_line_that_is_not_utf8_with_a_parse_error() -> None:
    import io
    import json

    from llama_index_hyde_plus.server.rcp import serve_stdio

    bad = b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"nonce": "\xff"}}'
    out = io.BytesIO()
    serve_stdio(_rcp_server(_GeventTimeout("t")), stdin=io.BytesIO(bad + b"\n"), stdout=out)
    reply = json.loads(out.getvalue())
    assert reply["error"]["code"] == -32700 and "UTF-8" in reply["error"]["message"], reply


_TOKENS = ["</s>", "<s>", "<|im_end|>", "<|im_start|>", "<|eot_id|>", "[/INST]", "\u200b", "\ufeff"]


@given(
    st.lists(st.sampled_from([*_TOKENS, "a", " ", "\n", "<", "|", ">", "im_", "end"]), max_size=12)
)
def test_cleaning_a_reply_twice_changes_nothing_and_leaves_no_token(parts: list[str]) -> None:
    from llama_index_hyde_plus.transforms.parsing import clean_reply

    once = clean_reply("".join(parts))
    assert clean_reply(once) == once
    assert not any(token in once for token in _TOKENS), once


@pytest.mark.parametrize("mode", ["empty", "nan"])
@pytest.mark.parametrize("use_async", [False, True])
async def test_an_unusable_vector_of_the_question_leaves_its_embedding_to_the_retriever(
    mode: str, use_async: bool
) -> None:
    """Our embedding model fails the question itself (the wrapped retriever's own does
    not): the question's lists are searched with the retriever's embedding, as a plain
    retriever would, instead of with an empty or wrong-size vector."""
    base = _index().as_retriever(similarity_top_k=4)
    plain = ids(base.retrieve(Q))
    bad = _Rejecting(dim=64, mode=mode, poison=("revenue drop",))
    llm = ScriptedLLM(["1. renewals slipping\n2. large accounts delayed"])
    mq = MultiQuery(llm, n=2, original_weight=100.0)
    result = await search(TransformRetriever(base, mq, embed_model=bad), Q, use_async)
    assert ids(result.nodes)[0] == plain[0] and not result.failed_searches, result
