from __future__ import annotations

import logging

import pytest
from llama_index.core import Settings
from llama_index.core.prompts import PromptTemplate

from llama_index_hyde_plus import HyDE
from llama_index_hyde_plus.testing import HANG, ScriptedLLM
from llama_index_hyde_plus.transforms.prompts import HYDE_PAPER_PROMPTS

Q = "Why did revenue drop?"
PASSAGE = "Revenue dropped because enterprise renewals slipped."


def test_generates_a_passage_from_the_default_prompt() -> None:
    llm = ScriptedLLM([PASSAGE])
    result = HyDE(llm).transform(Q)
    assert result.hypothetical == (PASSAGE,)
    assert result.queries == () and result.search_queries == (Q,)  # passages, no queries
    assert result.method == "hyde"
    assert not result.fallback
    assert Q in llm.prompts[0]
    assert result.usage.calls == 1 and result.usage.usage_source == "provider"


def test_custom_prompt_replaces_default_instruction() -> None:
    llm = ScriptedLLM([PASSAGE])
    HyDE(llm, prompt="Finance excerpt answering: {query}").transform(Q)
    assert llm.prompts == [f"Finance excerpt answering: {Q}"]


def test_paper_prompts_are_valid_templates() -> None:
    for prompt in HYDE_PAPER_PROMPTS.values():
        HyDE(ScriptedLLM(), prompt=prompt)


@pytest.mark.parametrize("prompt", ["No placeholder", "{question} {query}"])
def test_prompt_without_query_placeholder_or_with_unknown_field_is_value_error(
    prompt: str,
) -> None:
    with pytest.raises(ValueError, match="prompt"):
        HyDE(ScriptedLLM(), prompt=prompt)


def test_update_prompts_swaps_the_prompt_and_validates_it() -> None:
    llm = ScriptedLLM([PASSAGE])
    hyde = HyDE(llm)
    assert set(hyde.get_prompts()) == {"hyde_prompt"}
    hyde.update_prompts({"hyde_prompt": PromptTemplate("Doc for {query}")})
    hyde.transform(Q)
    assert llm.prompts == [f"Doc for {Q}"]
    with pytest.raises(ValueError):
        hyde.update_prompts({"hyde_prompt": PromptTemplate("no field")})


def test_passage_is_trimmed_to_max_characters_at_sentence_end() -> None:
    reply = "Renewals slipped. Three accounts delayed signing. More detail follows here."
    result = HyDE(ScriptedLLM([reply]), max_characters=50).transform(Q)
    assert result.hypothetical == ("Renewals slipped. Three accounts delayed signing.",)


def test_echoed_passage_label_is_removed() -> None:
    result = HyDE(ScriptedLLM(["Passage: " + PASSAGE])).transform(Q)
    assert result.hypothetical == (PASSAGE,)


def test_num_passages_makes_that_many_calls_and_keeps_each_passage() -> None:
    llm = ScriptedLLM(["one passage.", "two passage.", "three passage."])
    result = HyDE(llm, num_passages=3, temperature=0.7).transform(Q)
    # the calls run at once: which call gets which scripted reply is theirs to race
    assert sorted(result.hypothetical) == ["one passage.", "three passage.", "two passage."]
    assert result.usage.calls == 3
    assert [kw.get("temperature") for kw in llm.call_kwargs] == [0.7, 0.7, 0.7]


def test_include_query_joins_embedding_strs_and_keyword_text() -> None:
    result = HyDE(ScriptedLLM(["p1.", "p2."]), num_passages=2, include_query=True).transform(Q)
    first, second = result.hypothetical  # the calls run at once, in either order
    assert {first, second} == {"p1.", "p2."}
    assert result.embedding_strs == (first, second, Q)
    [search] = result.searches()
    assert search.text == f"{Q}\n\n{first}\n\n{second}"


def test_without_include_query_keyword_text_is_only_the_passage() -> None:
    [search] = HyDE(ScriptedLLM([PASSAGE]), include_query=False).transform(Q).searches()
    assert search.text == PASSAGE
    assert search.embedding_strs == (PASSAGE,)


def test_no_temperature_kwarg_unless_set() -> None:
    llm = ScriptedLLM([PASSAGE])
    HyDE(llm).transform(Q)
    assert "temperature" not in llm.call_kwargs[0]


def test_uses_settings_llm_when_none_given(monkeypatch: pytest.MonkeyPatch) -> None:
    llm = ScriptedLLM([PASSAGE])
    monkeypatch.setattr(Settings, "_llm", llm)
    assert HyDE().transform(Q).hypothetical == (PASSAGE,)


@pytest.mark.parametrize(
    "reply",
    [RuntimeError("provider down"), ConnectionResetError("reset"), "", "   \n"],
    ids=["exception", "connection-reset", "empty", "blank"],
)
def test_failure_falls_back_to_the_original_query_with_one_warning(
    reply: object, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    result = HyDE(ScriptedLLM([reply])).transform(Q)  # type: ignore[list-item]
    assert result.fallback is True
    assert result.error
    assert result.queries == () and result.hypothetical == ()
    assert result.search_queries == (Q,)
    assert result.searches()[0].text == Q
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "original query" in warnings[0].getMessage()


def test_empty_reply_still_reports_the_tokens_spent() -> None:
    result = HyDE(ScriptedLLM([""])).transform(Q)
    assert result.fallback and result.usage.calls == 1 and result.usage.input_tokens > 0


def test_sync_timeout_falls_back() -> None:
    result = HyDE(ScriptedLLM([HANG]), timeout=0.2).transform(Q)
    assert result.fallback and "LLMTimeoutError" in (result.error or "")


async def test_async_timeout_falls_back() -> None:
    result = await HyDE(ScriptedLLM([HANG]), timeout=0.2).atransform(Q)
    assert result.fallback and "LLMTimeoutError" in (result.error or "")


async def test_atransform_never_calls_a_blocking_llm_method() -> None:
    llm = ScriptedLLM(["a.", "b."], forbid_sync=True)
    result = await HyDE(llm, num_passages=2).atransform(Q)
    assert not result.fallback, result.error
    assert llm.sync_calls == 0 and llm.async_calls == 2


async def test_partial_failure_of_several_passages_keeps_the_good_ones() -> None:
    llm = ScriptedLLM(["good passage.", RuntimeError("boom")])
    result = await HyDE(llm, num_passages=2).atransform(Q)
    assert result.hypothetical == ("good passage.",)
    assert not result.fallback and "boom" in (result.error or "")


def test_missing_settings_llm_falls_back_instead_of_raising(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken() -> None:
        raise ValueError("No API key found for OpenAI.")

    monkeypatch.setattr(type(Settings), "llm", property(lambda self: broken()))
    result = HyDE().transform(Q)
    assert result.fallback and "API key" in (result.error or "")


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"max_characters": 0}, "max_characters"),
        ({"num_passages": 0}, "num_passages"),
        ({"num_passages": 17}, "num_passages"),
        ({"temperature": 3.0}, "temperature"),
        ({"timeout": 0}, "timeout"),
    ],
)
def test_bad_parameters_are_value_errors_naming_the_parameter(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        HyDE(ScriptedLLM(), **kwargs)


@pytest.mark.parametrize("query", ["", "   ", "\u200b", " \ufeff\u200d\u2060 ", "\u202e\u00ad"])
def test_empty_query_is_value_error(query: str) -> None:
    llm = ScriptedLLM()
    with pytest.raises(ValueError, match="query must be a non-empty string"):
        HyDE(llm).transform(query)
    assert llm.prompts == []


@pytest.mark.parametrize("query", ["a\u200b", "\u200bwhy?", "\u05d0", "\u3042"])
def test_a_question_with_a_visible_character_is_searched(query: str) -> None:
    assert HyDE(ScriptedLLM(["A passage."])).transform(query).query == query


def test_non_llm_is_type_error() -> None:
    with pytest.raises(TypeError, match="llm"):
        HyDE("gpt-4o")  # type: ignore[arg-type]


def test_max_tokens_is_no_larger_than_what_max_characters_keeps() -> None:
    llm = ScriptedLLM(["A passage."])
    hyde = HyDE(llm, max_characters=400)
    hyde.transform("Why did revenue drop?")
    assert hyde.max_tokens == 100
    assert llm.call_kwargs[0]["max_tokens"] == 100


def test_a_model_with_a_lower_cap_of_its_own_keeps_it() -> None:
    class Capped(ScriptedLLM):
        max_tokens: int = 50

    llm = Capped(["A passage."])
    HyDE(llm, max_characters=2000).transform("Why did revenue drop?")
    assert "max_tokens" not in llm.call_kwargs[0]


def test_blend_without_the_rerank_strategy_is_refused_not_ignored() -> None:
    with pytest.raises(ValueError, match="blend only applies with strategy='rerank'"):
        HyDE(ScriptedLLM(), blend=0.5)
    assert HyDE(ScriptedLLM(), strategy="rerank", blend=0.5).guards.blend == 0.5
