from __future__ import annotations

import logging

import pytest

from llama_index_hyde_plus import MultiQuery, TransformResult
from llama_index_hyde_plus.testing import ScriptedLLM
from llama_index_hyde_plus.transforms.parsing import QueryCount

REPLY = (
    "Here are 3 queries:\n1. revenue decline causes\n2. why sales fell\n3. why did revenue drop?"
)


def test_paraphrases_are_parsed_and_the_question_is_searched_first() -> None:
    llm = ScriptedLLM([REPLY])
    result = MultiQuery(llm, n=3).transform("Why did revenue drop?")
    # the model's copy of the question is dropped: it is searched already
    assert result.queries == ("revenue decline causes", "why sales fell")
    assert result.search_queries[0] == "Why did revenue drop?"
    assert "3" in llm.prompts[0] and "Why did revenue drop?" in llm.prompts[0]


def test_without_include_query_only_paraphrases_are_searched() -> None:
    result = MultiQuery(ScriptedLLM([REPLY]), n=2, include_query=False).transform("q")
    assert result.search_queries == ("revenue decline causes", "why sales fell")


def test_never_more_than_n() -> None:
    result = MultiQuery(ScriptedLLM(["1. a1\n2. b2\n3. c3\n4. d4"]), n=2).transform("q")
    assert result.queries == ("a1", "b2")


def test_prompt_may_use_n_and_is_swappable() -> None:
    llm = ScriptedLLM(["a1"])
    mq = MultiQuery(llm, n=4, prompt="Give {n} variants of {query}")
    mq.transform("q")
    assert llm.prompts == ["Give 4 variants of q"]
    assert set(mq.get_prompts()) == {"multi_query_prompt"}


def test_unparseable_reply_falls_back() -> None:
    result = MultiQuery(ScriptedLLM(["\n\n"])).transform("q")
    assert result.fallback and result.search_queries == ("q",)


def test_a_reply_that_only_repeats_the_question_falls_back_and_says_why() -> None:
    q = "Why did revenue drop?"
    llm = ScriptedLLM([f"1. {q}\n2. {q.lower()}\n3.  {q.upper()}"])
    result = MultiQuery(llm, n=3).transform(q)
    assert result.fallback and result.search_queries == (q,)
    assert result.queries == ()  # the question is never listed as a generated query
    assert result.error == (
        "UnusableReplyError: no query could be parsed from the reply "
        "(left out of the reply: 3 repeating the question)"
    )
    assert result.parsed == QueryCount(asked=3, kept=0, dropped=(("duplicate_of_question", 3),))


def test_a_short_reply_says_how_many_queries_were_kept_and_why_the_rest_were_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="llama_index_hyde_plus")
    reply = (
        "Here are 3 queries:\n1. Why did revenue drop?\n2. revenue decline causes\n"
        "3. Revenue decline causes\n4. [Insert query 3]"
    )
    result = MultiQuery(ScriptedLLM([reply]), n=3).transform("Why did revenue drop?")
    assert not result.fallback and result.error is None
    assert result.queries == ("revenue decline causes",)
    assert result.to_dict()["parsed"] == {
        "asked": 3,
        "kept": 1,
        "dropped": {"duplicate_of_question": 1, "duplicate_of_another": 1, "not_a_query": 2},
        "trimmed": 0,
    }
    said = (
        "kept 1 of the 3 queries asked for; left out of the reply: 1 repeating the question, "
        "1 repeating another query, 2 holding no query"
    )
    assert result.parsed is not None and result.parsed.summary() == said
    assert f"multi-query {said}" in caplog.text  # what -v shows
    assert TransformResult.from_dict(result.to_dict()).parsed == result.parsed  # cached


def test_a_full_reply_counts_what_it_left_out_past_n_and_what_it_cut() -> None:
    reply = "1. " + "long " * 200 + "\n2. b2\n3. c3"
    result = MultiQuery(ScriptedLLM([reply]), n=2, max_characters=50).transform("q")
    assert result.parsed == QueryCount(asked=2, kept=2, dropped=(("beyond_n", 1),), trimmed=1)
    assert not result.parsed.short


@pytest.mark.parametrize("n", [0, 11])
def test_n_out_of_range_is_value_error(n: int) -> None:
    with pytest.raises(ValueError, match="n must be"):
        MultiQuery(ScriptedLLM(), n=n)


def test_lines_echoing_the_prompt_are_not_taken_for_queries() -> None:
    reply = (
        "1. Reply with one query per line, numbered 2 to 4\n"
        "2. Sure! Here are three queries\n"
        "3. revenue decline causes\n"
        "4. Write 3 different search queries that ask for the same information\n"
        "5. why sales fell"
    )
    result = MultiQuery(ScriptedLLM([reply]), n=3).transform("Why did revenue drop?")
    assert result.queries == ("revenue decline causes", "why sales fell")


def test_a_swapped_prompt_is_what_echoes_are_compared_with() -> None:
    prompt = "Paraphrase for a librarian, in formal catalogue register: {query}"
    reply = "1. formal catalogue register librarian paraphrase\n2. revenue decline causes"
    result = MultiQuery(ScriptedLLM([reply]), n=2, prompt=prompt).transform("Why did revenue drop?")
    assert result.queries == ("revenue decline causes",)


def test_a_reply_of_only_echoes_falls_back() -> None:
    reply = "Sure!\nReply with one query per line, numbered 1 to 3"
    result = MultiQuery(ScriptedLLM([reply]), n=3).transform("Why did revenue drop?")
    assert result.fallback and result.search_queries == ("Why did revenue drop?",)


@pytest.mark.parametrize(
    ("model_name", "generator", "weight"),
    [("SmolLM2-135M-Instruct-Q4_1", "small", 100.0), ("gpt-4o-mini", "capable", 5.0)],
)
def test_the_shipped_question_weight_depends_on_the_generator(
    model_name: str, generator: str, weight: float
) -> None:
    llm = ScriptedLLM(["1. revenue decline causes\n2. why sales fell"], model_name=model_name)
    mq = MultiQuery(llm)
    assert mq.generator == generator and mq.original_weight == weight
    result = mq.transform("Why did revenue drop?")
    assert result.defaults == generator and result.searches()[0].weight == weight
    chosen = MultiQuery(ScriptedLLM(["1. a\n2. b"], model_name=model_name), original_weight=3.0)
    assert chosen.transform("Why did revenue drop?").defaults is None


@pytest.mark.parametrize(
    "copy",
    [
        "Why did revenue drop",
        "Why did revenue drop ?",
        "Why did revenue drop?.",
        "why  did REVENUE drop？",
        "Ｗｈｙ ｄｉｄ ｒｅｖｅｎｕｅ ｄｒｏｐ？",
    ],
)
def test_a_near_copy_of_the_question_is_a_repeat_of_it(copy: str) -> None:
    reply = f"1. {copy}\n2. {copy}\n3. {copy}"
    result = MultiQuery(ScriptedLLM([reply]), n=3).transform("Why did revenue drop?")
    assert result.fallback and result.queries == ()
    assert result.parsed == QueryCount(asked=3, kept=0, dropped=(("duplicate_of_question", 3),))


def test_control_characters_and_lone_surrogates_never_reach_a_query() -> None:
    reply = "1. a\x01b\x1b[31mc\n2. \x7fdel query\n3. bad \ud800 query\r4. next\u20285. line"
    result = MultiQuery(ScriptedLLM([reply]), n=5).transform("q")
    assert result.queries == ("ab[31mc", "del query", "bad  query", "next", "line")
    assert all(ch.isprintable() for query in result.queries for ch in query)


@pytest.mark.parametrize(
    "reply", [REPLY, "1. why sales fell", "1. Why did revenue drop?", "", "1.\n2.\n3."]
)
def test_every_result_a_list_transform_writes_is_one_its_cache_reads_back(reply: str) -> None:
    from llama_index_hyde_plus import Decompose
    from llama_index_hyde_plus.transforms.base import check_record

    for transform in (MultiQuery(ScriptedLLM([reply]), n=3), Decompose(ScriptedLLM([reply]))):
        check_record(transform.transform("Why did revenue drop?").to_dict())


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"kept": 4}, "parsed"),
        ({"trimmed": 3}, "parsed"),
        ({"dropped": {"\x1b[31m" + "A" * 5000: 1}}, "parsed"),
        ({"dropped": {"not_a_query": 10**400}}, "parsed"),
        ({"kept": 1}, "kept"),
    ],
)
def test_a_cached_count_that_cannot_be_true_is_refused(
    change: dict[str, object], field: str
) -> None:
    from llama_index_hyde_plus.transforms.base import check_record

    record = MultiQuery(ScriptedLLM([REPLY]), n=3).transform("Why did revenue drop?").to_dict()
    record["parsed"] = {**record["parsed"], **change}
    if field == "kept":
        record["parsed"]["kept"] = 1  # two queries are listed
    with pytest.raises(ValueError, match=field):
        check_record(record)
