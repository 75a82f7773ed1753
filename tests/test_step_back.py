from __future__ import annotations

from llama_index_hyde_plus import StepBack
from llama_index_hyde_plus.testing import ScriptedLLM


def test_one_general_question_searched_with_the_original() -> None:
    llm = ScriptedLLM(["Step-back question: What drives software revenue?\nExtra line"])
    result = StepBack(llm).transform("Why did revenue drop in Q3?")
    assert result.queries == ("What drives software revenue?",)
    assert result.search_queries == ("Why did revenue drop in Q3?", "What drives software revenue?")
    assert set(StepBack(llm).get_prompts()) == {"step_back_prompt"}


def test_repeating_the_question_falls_back_and_says_why() -> None:
    result = StepBack(ScriptedLLM(["Why did revenue drop?"])).transform("Why did revenue drop?")
    assert result.fallback and result.search_queries == ("Why did revenue drop?",)
    assert result.queries == ()  # the question is never listed as the step-back question
    assert result.error == (
        "UnusableReplyError: no query could be parsed from the reply "
        "(left out of the reply: 1 repeating the question)"
    )


def test_error_falls_back() -> None:
    # a provider's own timeout is transient: the default 2 retries see it too
    result = StepBack(ScriptedLLM([TimeoutError("slow")] * 3)).transform("q")
    assert result.fallback and "TimeoutError" in (result.error or "")


LONG = (
    "Revenue in a software business depends on many things, including pricing, the "
    "number of customers and how often they renew their contracts, as well as the wider "
    "economy and competition from other vendors in the same market. Renewals matter most."
)


def test_a_long_paragraph_reply_yields_its_first_sentence() -> None:
    result = StepBack(ScriptedLLM([LONG])).transform("Why did revenue drop in Q3?")
    assert result.queries == (LONG.split(". ")[0] + ".",)


def test_the_question_line_after_a_paragraph_is_taken() -> None:
    reply = f"Sure! {LONG}\nWhat drives software revenue?\nI hope this helps."
    result = StepBack(ScriptedLLM([reply])).transform("Why did revenue drop in Q3?")
    assert result.queries == ("What drives software revenue?",)


async def test_an_echo_of_the_instruction_is_skipped_async() -> None:
    llm = ScriptedLLM(
        ["Reply with the step-back question only.\nWhat drives software revenue?"],
        forbid_sync=True,
    )
    result = await StepBack(llm).atransform("Why did revenue drop in Q3?")
    assert result.queries == ("What drives software revenue?",) and llm.sync_calls == 0
