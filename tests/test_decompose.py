from __future__ import annotations

from llama_index_hyde_plus import Decompose, FusionMode
from llama_index_hyde_plus.testing import ScriptedLLM

REPLY = """Sub-questions:
1. What was revenue in Q3?
2. Which accounts delayed renewal?
3. What did the board decide?
4. An extra one"""


def test_sub_questions_are_parsed_up_to_n_without_the_whole_question() -> None:
    result = Decompose(ScriptedLLM([REPLY]), n=3, include_query=False).transform(
        "Explain Q3 revenue and the board"
    )
    assert result.queries == (
        "What was revenue in Q3?",
        "Which accounts delayed renewal?",
        "What did the board decide?",
    )
    assert result.search_queries == result.queries
    assert Decompose.default_fusion is FusionMode.INTERLEAVE


def test_by_default_the_whole_question_is_searched_first_with_its_fusion_weight() -> None:
    decompose = Decompose(ScriptedLLM([REPLY]), n=3)
    result = decompose.transform("Explain Q3 revenue and the board")
    assert result.search_queries[0] == "Explain Q3 revenue and the board"
    specs = result.searches()
    shipped = Decompose.SHIPPED_ORIGINAL_WEIGHT[decompose.generator]
    assert specs[0].weight == decompose.original_weight == shipped
    assert all(spec.weight == 1.0 for spec in specs[1:])


def test_include_query_adds_the_whole_question() -> None:
    result = Decompose(ScriptedLLM([REPLY]), n=1, include_query=True).transform("whole")
    assert result.search_queries == ("whole", "What was revenue in Q3?")


def test_json_reply_is_understood() -> None:
    result = Decompose(ScriptedLLM(['["a part", "b part"]'])).transform("q")
    assert result.queries == ("a part", "b part")


def test_an_echo_of_the_prompt_is_not_a_sub_question() -> None:
    reply = (
        "1. Break the question into simpler sub-questions that together answer it\n"
        "2. What was revenue in Q3?\n"
        "3. Which accounts delayed renewal?"
    )
    result = Decompose(ScriptedLLM([reply]), n=3).transform("Explain Q3 revenue and renewals")
    assert result.queries == ("What was revenue in Q3?", "Which accounts delayed renewal?")
