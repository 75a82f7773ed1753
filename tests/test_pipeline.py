from __future__ import annotations

import pytest
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler

from llama_index_hyde_plus import HyDERAG, aquery_for_evaluation, query_for_evaluation
from llama_index_hyde_plus.testing import ScriptedLLM, StaticRetriever
from llama_index_hyde_plus.usage import PRICE_TABLE

from .conftest import DOCS
from .openai_stub import openai_stub

Q = "Why did revenue drop?"
PASSAGE = "Revenue dropped because enterprise renewals slipped last quarter."
SEED_KEYS = {
    "execution_time",
    "input_tokens",
    "output_tokens",
    "total_cost",
    "retrieval_method",
    "llm_hyde_model",
    "llm_answer_model",
    "hyde_provider",
    "answer_provider",
    "hyde_model_id",
    "answer_model_id",
    "hyde_cost",
    "answer_cost",
    "usage_source",
    "cost_source",
}


def tokens(text: str) -> int:
    return len(text.split())


def models() -> tuple[ScriptedLLM, ScriptedLLM]:
    hyde = ScriptedLLM([PASSAGE], model_name="gpt-4o-mini")
    answer = ScriptedLLM(["Three large accounts delayed their renewals."], model_name="gpt-4o")
    return hyde, answer


def test_query_for_evaluation_returns_every_key_with_correct_values(
    faiss_index: VectorStoreIndex,
) -> None:
    hyde, answer = models()
    out = query_for_evaluation(
        Q, index=faiss_index, custom_hyde_llm=hyde, custom_answer_llm=answer, top_k=3
    )
    assert set(out) == {"question", "answer", "contexts", "metadata"}
    assert out["question"] == Q
    assert out["answer"] == "Three large accounts delayed their renewals."
    assert len(out["contexts"]) == 3 and set(out["contexts"]) <= set(DOCS.values())
    meta = out["metadata"]
    assert set(meta) >= SEED_KEYS

    [hyde_prompt], [answer_prompt] = hyde.prompts, answer.prompts
    hyde_in, hyde_out = tokens(hyde_prompt), tokens(PASSAGE)
    ans_in, ans_out = tokens(answer_prompt), tokens(out["answer"])
    assert meta["input_tokens"] == hyde_in + ans_in
    assert meta["output_tokens"] == hyde_out + ans_out
    hyde_cost = PRICE_TABLE["gpt-4o-mini"].cost(hyde_in, hyde_out)
    answer_cost = PRICE_TABLE["gpt-4o"].cost(ans_in, ans_out)
    assert meta["hyde_cost"] == pytest.approx(hyde_cost)
    assert meta["answer_cost"] == pytest.approx(answer_cost)
    assert meta["total_cost"] == pytest.approx(hyde_cost + answer_cost)
    assert meta["retrieval_method"] == "hyde"
    assert (meta["llm_hyde_model"], meta["llm_answer_model"]) == ("gpt-4o-mini", "gpt-4o")
    assert (meta["hyde_model_id"], meta["answer_model_id"]) == ("gpt-4o-mini", "gpt-4o")
    assert meta["hyde_provider"] == meta["answer_provider"] == "ScriptedLLM"
    assert meta["usage_source"] == "provider" and meta["cost_source"] == "price-table"
    assert meta["execution_time"] >= meta["hyde_latency"] >= 0
    assert meta["hypothetical_document"] == PASSAGE and meta["hyde_fallback"] is False


def test_stages_use_their_own_models_temperatures_and_the_original_question(
    faiss_index: VectorStoreIndex,
) -> None:
    hyde, answer = models()
    # the paper's HyDE (passages only), so the passage alone decides the contexts
    HyDERAG(faiss_index, hyde_llm=hyde, answer_llm=answer, include_query=False).query(Q)
    assert hyde.call_kwargs == [{"temperature": 0.7, "max_tokens": 500}]
    assert answer.call_kwargs == [{"temperature": 0.0}]
    [answer_prompt] = answer.prompts
    assert f"Question: {Q}" in answer_prompt
    assert PASSAGE not in answer_prompt
    assert DOCS["renewals"] in answer_prompt


async def test_async_pipeline_matches_and_never_blocks(faiss_index: VectorStoreIndex) -> None:
    hyde = ScriptedLLM([PASSAGE], model_name="gpt-4o-mini", forbid_sync=True)
    answer = ScriptedLLM(["Renewals slipped."], model_name="gpt-4o", forbid_sync=True)
    out = await aquery_for_evaluation(
        Q, index=faiss_index, custom_hyde_llm=hyde, custom_answer_llm=answer
    )
    assert out["answer"] == "Renewals slipped." and len(out["contexts"]) == 5
    assert hyde.sync_calls == answer.sync_calls == 0
    assert out["metadata"]["hyde_fallback"] is False


def test_failed_hyde_still_answers_from_the_original_query(
    faiss_index: VectorStoreIndex,
) -> None:
    hyde = ScriptedLLM([RuntimeError("provider down")])
    answer = ScriptedLLM(["I do not know."])
    result = HyDERAG(faiss_index, hyde_llm=hyde, answer_llm=answer, top_k=2).query(Q)
    assert result.answer == "I do not know." and len(result.nodes) == 2
    meta = result.metadata()
    assert meta["hyde_fallback"] is True and "provider down" in meta["hyde_error"]
    assert meta["cost_source"] == "hyde=none,answer=unknown"


def test_retriever_results_are_cut_to_top_k() -> None:
    base = StaticRetriever(DOCS, default=list(DOCS))
    hyde, answer = models()
    out = query_for_evaluation(
        Q, retriever=base, custom_hyde_llm=hyde, custom_answer_llm=answer, top_k=2
    )
    assert len(out["contexts"]) == 2


def test_token_counting_handler_sees_both_stages(
    faiss_index: VectorStoreIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    hyde, answer = models()  # built before the handler exists
    counter = TokenCountingHandler()
    monkeypatch.setattr(Settings, "_callback_manager", CallbackManager([counter]))
    result = HyDERAG(faiss_index, hyde_llm=hyde, answer_llm=answer).query(Q)
    assert len(counter.llm_token_counts) == 2
    assert counter.prompt_llm_token_count == result.usage.input_tokens
    assert counter.completion_llm_token_count == result.usage.output_tokens


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({}, "exactly one"), ({"top_k": 0}, "top_k")],
)
def test_bad_arguments(faiss_index: VectorStoreIndex, kwargs: dict, message: str) -> None:
    args = {"index": faiss_index, **kwargs} if "top_k" in kwargs else kwargs
    with pytest.raises(ValueError, match=message):
        query_for_evaluation(Q, **args)


def test_answer_prompt_needs_context_and_query(faiss_index: VectorStoreIndex) -> None:
    with pytest.raises(ValueError, match="answer_prompt"):
        HyDERAG(faiss_index, answer_prompt="Just {query}")


def test_model_names_use_the_real_openai_client(
    faiss_index: VectorStoreIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    with openai_stub(text="Renewals slipped.", prompt_tokens=50, completion_tokens=10) as (
        base,
        state,
    ):
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.setenv("OPENAI_API_BASE", base)
        out = query_for_evaluation(
            Q, index=faiss_index, hyde_model="gpt-4o-mini", answer_model="gpt-4o"
        )
    meta = out["metadata"]
    assert [r["body"]["model"] for r in state.requests] == ["gpt-4o-mini", "gpt-4o"]
    assert [r["body"]["temperature"] for r in state.requests] == [0.7, 0.0]
    assert (meta["input_tokens"], meta["output_tokens"]) == (100, 20)
    assert meta["hyde_provider"] == meta["answer_provider"] == "openai"
    assert meta["total_cost"] == pytest.approx(
        PRICE_TABLE["gpt-4o-mini"].cost(50, 10) + PRICE_TABLE["gpt-4o"].cost(50, 10)
    )
    assert meta["usage_source"] == "provider"


def test_answer_call_has_a_timeout_and_retries_transient_errors(
    faiss_index: VectorStoreIndex,
) -> None:
    from llama_index_hyde_plus.calls.reliability import LLMTimeoutError, RetryPolicy
    from llama_index_hyde_plus.testing import HANG

    class RateLimited(Exception):
        status_code = 429

    flaky = ScriptedLLM([RateLimited("slow down"), "Renewals slipped."])
    rag = HyDERAG(
        faiss_index,
        hyde_llm=ScriptedLLM([PASSAGE]),
        answer_llm=flaky,
        retry=RetryPolicy(max_retries=2, base_delay_s=0.01),
    )
    assert rag.query(Q).answer == "Renewals slipped."
    hung = HyDERAG(
        faiss_index,
        hyde_llm=ScriptedLLM([PASSAGE]),
        answer_llm=ScriptedLLM([HANG]),
        answer_timeout=0.2,
    )
    with pytest.raises(LLMTimeoutError):
        hung.query(Q)
