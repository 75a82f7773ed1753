from __future__ import annotations

from llama_index_hyde_plus import Rewrite
from llama_index_hyde_plus.testing import ScriptedLLM


def test_one_rewritten_query_replaces_the_original() -> None:
    llm = ScriptedLLM(['Rewritten query: "paid time off policy for employees"'])
    result = Rewrite(llm, include_query=False).transform("pto polcy??")
    assert result.queries == ("paid time off policy for employees",)
    assert result.search_queries == ("paid time off policy for employees",)
    assert "pto polcy??" in llm.prompts[0]
    assert set(Rewrite(llm).get_prompts()) == {"rewrite_prompt"}


def test_by_default_the_original_is_searched_too_and_weighted() -> None:
    llm = ScriptedLLM(['"paid time off policy for employees"'])
    result = Rewrite(llm, original_weight=3).transform("pto polcy??")
    assert result.search_queries == ("pto polcy??", "paid time off policy for employees")
    assert [s.weight for s in result.searches()] == [3.0, 1.0]


async def test_async_twin_gives_the_same_result() -> None:
    llm = ScriptedLLM(["paid time off policy"], forbid_sync=True)
    result = await Rewrite(llm).atransform("pto policy")
    assert result.queries == ("paid time off policy",) and llm.sync_calls == 0


def test_the_first_short_line_is_the_rewrite_not_a_trailing_question() -> None:
    reply = "paid time off policy for employees\nWould you like another version?"
    result = Rewrite(ScriptedLLM([reply])).transform("pto polcy??")
    assert result.queries == ("paid time off policy for employees",)


def test_a_paragraph_reply_is_cut_to_its_first_sentence_and_max_characters() -> None:
    reply = (
        "Employee paid time off policy and annual leave entitlement rules. This query "
        "expands the abbreviation PTO, fixes the spelling of policy, and removes the "
        "question marks, so that a search engine can match documents about leave."
    )
    result = Rewrite(ScriptedLLM([reply]), max_characters=40).transform("pto polcy??")
    assert len(result.queries) == 1 and len(result.queries[0]) <= 40
    full = Rewrite(ScriptedLLM([reply])).transform("pto polcy??")
    assert full.queries == ("Employee paid time off policy and annual leave entitlement rules.",)
