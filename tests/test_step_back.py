from __future__ import annotations

from llama_index_hyde_plus import StepBack
from llama_index_hyde_plus.testing import ScriptedLLM


def test_one_general_question_searched_with_the_original() -> None:
    llm = ScriptedLLM(["Step-back question: What drives software revenue?\nExtra line"])
    result = StepBack(llm).transform("Why did revenue drop in Q3?")
    assert result.queries == ("What drives software revenue?",)
    assert result.search_queries == ("Why did revenue drop in Q3?", "What drives software revenue?")
    assert set(StepBack(llm).get_prompts()) == {"step_back_prompt"}


def test_repeating_the_question_is_not_a_failure() -> None:
    result = StepBack(ScriptedLLM(["Why did revenue drop?"])).transform("Why did revenue drop?")
    assert not result.fallback and result.search_queries == ("Why did revenue drop?",)


def test_error_falls_back() -> None:
    result = StepBack(ScriptedLLM([TimeoutError("slow")])).transform("q")
    assert result.fallback and "TimeoutError" in (result.error or "")
