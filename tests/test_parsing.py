from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llama_index_hyde_plus.transforms.parsing import (
    dedupe,
    is_echo,
    parse_queries,
    parse_single,
    read_queries,
    trim_passage,
)
from llama_index_hyde_plus.transforms.prompts import (
    DECOMPOSE_PROMPT,
    MULTI_QUERY_PROMPT,
    STEP_BACK_PROMPT,
)


class TestTrimPassage:
    def test_text_within_limit_is_only_stripped(self) -> None:
        assert trim_passage("  Short text.  ", 100) == "Short text."

    def test_cuts_at_last_sentence_end_inside_limit(self) -> None:
        text = "First sentence here. Second one is longer! Third never fits in."
        assert trim_passage(text, 50) == "First sentence here. Second one is longer!"

    def test_keeps_closing_quote_after_sentence_end(self) -> None:
        text = 'He said "revenue fell." Then the board met and decided many things.'
        assert trim_passage(text, 40) == 'He said "revenue fell."'

    def test_ignores_period_inside_a_number(self) -> None:
        text = "Growth was 3.5 percent in the quarter and costs rose sharply"
        out = trim_passage(text, 30)
        assert out == "Growth was 3.5 percent in the"

    def test_falls_back_to_word_break_without_sentence_end(self) -> None:
        text = "no sentence ends anywhere in this rather long passage of words"
        out = trim_passage(text, 25)
        assert out == "no sentence ends anywhere"

    def test_hard_cut_when_no_boundary(self) -> None:
        assert trim_passage("x" * 50, 10) == "x" * 10

    def test_rejects_non_positive_limit(self) -> None:
        with pytest.raises(ValueError, match="max_characters"):
            trim_passage("text", 0)

    @given(st.text(), st.integers(min_value=1, max_value=300))
    def test_never_exceeds_limit(self, text: str, limit: int) -> None:
        assert len(trim_passage(text, limit)) <= limit

    @given(
        st.lists(st.sampled_from(["alpha", "beta.", "gamma!", "delta?", "x"]), min_size=1),
        st.integers(min_value=1, max_value=80),
    )
    def test_ends_on_a_boundary(self, words: list[str], limit: int) -> None:
        text = " ".join(words)
        out = trim_passage(text, limit)
        if len(text) <= limit:
            assert out == text
        elif out and len(out) < limit and " " in text[:limit]:
            # cut at a sentence end or a word break: the next char of the text is a space
            assert text[len(out)] == " " or out[-1] in ".!?"
            assert text.startswith(out)


MESSY = {
    "numbered": (
        "1. first query\n2. second query\n3. third query",
        ["first query", "second query", "third query"],
    ),
    "parens": ("1) alpha\n2) beta", ["alpha", "beta"]),
    "bullets": ("- alpha\n* beta\n• gamma", ["alpha", "beta", "gamma"]),
    "preamble": (
        "Here are 3 alternative queries:\n\n1. alpha one\n2. beta two\n3. gamma three\n\nI hope this helps!",
        ["alpha one", "beta two", "gamma three"],
    ),
    "quotes": (
        "1. \"alpha one\"\n2. \u201cbeta two\u201d\n3. 'gamma'",
        ["alpha one", "beta two", "gamma"],
    ),
    "json": ('["alpha", "beta", "gamma"]', ["alpha", "beta", "gamma"]),
    "json_fenced": ('```json\n["alpha", "beta"]\n```', ["alpha", "beta"]),
    "json_object": ('{"queries": ["alpha", "beta"]}', ["alpha", "beta"]),
    "plain_lines": ("alpha one\n\nbeta two\n", ["alpha one", "beta two"]),
    "labels": ("Query 1: alpha\nQuery 2: beta", ["alpha", "beta"]),
    "bold": ("1. **alpha** one\n2. beta", ["alpha one", "beta"]),
    "sure": ("Sure! Here you go\nalpha\nbeta", ["alpha", "beta"]),
    "double_numbering": ("1. 1. alpha one\n2. 2. beta two", ["alpha one", "beta two"]),
    "headings_and_bare_numbers": (
        "Question: alpha one\nQueries: 1.\nQuestion: beta two\nRevenue:",
        ["alpha one", "beta two"],
    ),
    "step_back_label": ("Step-back question: What drives revenue?", ["What drives revenue?"]),
}


@pytest.mark.parametrize("name", sorted(MESSY))
def test_parse_queries_handles_messy_output(name: str) -> None:
    text, expected = MESSY[name]
    assert parse_queries(text, 5) == expected


def test_parse_queries_caps_at_n() -> None:
    assert parse_queries("1. a1\n2. b2\n3. c3\n4. d4", 2) == ["a1", "b2"]


def test_parse_queries_dedupes_case_and_space_insensitively_first_wins() -> None:
    assert parse_queries("1. Alpha  Beta\n2. alpha beta\n3. Gamma", 5) == ["Alpha  Beta", "Gamma"]


def test_parse_queries_excludes_given_items() -> None:
    assert parse_queries("1. the question\n2. other", 5, exclude=("The Question",)) == ["other"]


def test_parse_queries_empty_reply_is_empty_list() -> None:
    assert parse_queries("   \n\n", 3) == []


def test_parse_queries_rejects_bad_n() -> None:
    with pytest.raises(ValueError, match="n must be"):
        parse_queries("a", 0)


def test_dedupe_keeps_order() -> None:
    assert dedupe(["b", "a", "B", "c", "a"]) == ["b", "a", "c"]


@given(st.text(), st.integers(min_value=1, max_value=10))
def test_parse_queries_never_raises_never_exceeds_n_no_duplicates(text: str, n: int) -> None:
    out = parse_queries(text, n)
    assert len(out) <= n
    keys = [" ".join(x.casefold().split()) for x in out]
    assert len(keys) == len(set(keys))
    assert all(x.strip() for x in out)


class TestQueryLength:
    def test_each_query_is_trimmed_at_a_word_break(self) -> None:
        reply = "1. " + "revenue " * 5000 + "\n2. short query"
        first, second = parse_queries(reply, 2, max_characters=60)
        assert len(first) <= 60 and first.endswith("revenue") and second == "short query"

    @pytest.mark.slow  # a 10 MB reply
    def test_default_limit_is_500_characters(self) -> None:
        [query] = parse_queries("word " * 2_000_000, 1)  # a 10 MB reply
        assert 0 < len(query) <= 500

    def test_rejects_non_positive_limit(self) -> None:
        with pytest.raises(ValueError, match="max_characters"):
            parse_queries("q", 1, max_characters=0)


@pytest.mark.slow  # a 340 kB reply, twice
@pytest.mark.parametrize("name", ["MultiQuery", "StepBack", "Decompose", "Rewrite"])
def test_list_transforms_cap_each_generated_query(name: str) -> None:
    import llama_index_hyde_plus as hp
    from llama_index_hyde_plus.testing import ScriptedLLM

    cls = getattr(hp, name)
    huge = "1. " + "why did revenue drop " * 10_000 + "\n2. " + "what changed " * 10_000
    result = cls(ScriptedLLM([huge])).transform("Why did revenue drop?")
    assert not result.fallback and result.queries
    assert all(len(q) <= 500 for q in result.queries)
    short = cls(ScriptedLLM([huge]), max_characters=40).transform("Why did revenue drop?")
    assert all(len(q) <= 40 for q in short.queries)
    with pytest.raises(ValueError, match="max_characters"):
        cls(ScriptedLLM(), max_characters=0)


MULTI_INSTRUCTION = MULTI_QUERY_PROMPT.format(n=3, query="")


class TestEchoes:
    @pytest.mark.parametrize(
        "line",
        [
            "Reply with one query per line, numbered 2 to 4",
            "Here are 3 queries",
            "Here are three alternative search queries for you",
            "Sure!",
            "Sure! Here they are",
            "Okay, let me think",
            "Each worded differently (synonyms, other phrasings, more specific terms).",
        ],
    )
    def test_instruction_echoes_and_chatter_are_not_queries(self, line: str) -> None:
        reply = f"1. {line}\n2. revenue decline causes\n3. why sales fell"
        got = parse_queries(
            reply, 5, instruction=MULTI_INSTRUCTION, question="Why did revenue drop?"
        )
        assert got == ["revenue decline causes", "why sales fell"]

    def test_known_phrasings_are_caught_without_the_prompt(self) -> None:
        reply = "Reply with one query per line\n- revenue decline causes\n- numbered 1 to 3"
        assert parse_queries(reply, 5) == ["revenue decline causes"]

    @pytest.mark.parametrize(
        ("question", "query"),
        [
            ("How do search engines rank documents?", "different search queries for documents"),
            (
                "Where can I get detailed information?",
                "find documents with more specific information",
            ),
            ("How do I fix a slow SQL query?", "write a SQL query to find duplicate rows"),
            ("What does OK mean?", "OK Google not responding"),
            ("How do I answer emails faster?", "reply with templates to common emails"),
            ("Why did revenue drop?", "here is why revenue dropped"),
        ],
    )
    def test_legitimate_queries_that_share_the_prompts_words_are_kept(
        self, question: str, query: str
    ) -> None:
        reply = f"1. {query}\n2. another angle"
        got = parse_queries(reply, 5, instruction=MULTI_INSTRUCTION, question=question)
        assert got == [query, "another angle"]

    def test_an_echo_needs_three_words(self) -> None:
        assert not is_echo("specific terms", MULTI_INSTRUCTION)
        assert is_echo("specific terms, other phrasings", MULTI_INSTRUCTION)

    def test_decompose_prompt_echo_is_dropped(self) -> None:
        instruction = DECOMPOSE_PROMPT.format(n=3, query="")
        reply = (
            "1. Break it into simpler sub-questions that can each be answered\n"
            "2. What was revenue in Q3?"
        )
        got = parse_queries(reply, 3, instruction=instruction, question="Explain Q3 revenue")
        assert got == ["What was revenue in Q3?"]

    def test_a_reply_of_only_echoes_parses_to_nothing(self) -> None:
        reply = "Sure!\nHere are 3 queries\nReply with one query per line, numbered 1 to 3"
        assert parse_queries(reply, 3, instruction=MULTI_INSTRUCTION, question="q") == []


LONG = (
    "Revenue depends on many factors such as pricing, the number of customers, how often "
    "they renew, the state of the economy, competition from other vendors and the quality "
    "of the product, and a drop in any of them can reduce it. Other factors matter too."
)


class TestParseSingle:
    def test_first_question_line_wins_over_a_paragraph_before_it(self) -> None:
        reply = f"{LONG}\nWhat drives software revenue?\nAnother line?"
        assert parse_single(reply) == ["What drives software revenue?"]

    def test_first_short_line_wins(self) -> None:
        reply = "paid time off policy for employees\nIs this what you wanted?"
        assert parse_single(reply) == ["paid time off policy for employees"]

    def test_one_long_paragraph_yields_its_first_sentence(self) -> None:
        first = LONG.split(". ")[0] + "."
        assert len(LONG.split()) > 30 and parse_single(LONG) == [first]

    def test_a_long_paragraph_with_a_question_yields_the_question(self) -> None:
        reply = LONG + " So what factors determine software revenue? That is the question."
        assert parse_single(reply) == ["So what factors determine software revenue?"]

    def test_the_chosen_sentence_is_still_trimmed(self) -> None:
        [query] = parse_single("word " * 200, max_characters=40)
        assert 0 < len(query) <= 40

    def test_labels_quotes_echoes_and_excluded_items_are_skipped(self) -> None:
        instruction = STEP_BACK_PROMPT.format(query="")
        reply = (
            "Sure!\nReply with the step-back question only.\nWhy did revenue drop?\n"
            'Step-back question: "What drives revenue?"'
        )
        got = parse_single(
            reply,
            exclude=("Why did revenue drop?",),
            instruction=instruction,
            question="Why did revenue drop?",
        )
        assert got == ["What drives revenue?"]

    def test_nothing_usable_is_an_empty_list(self) -> None:
        assert parse_single("") == [] and parse_single("Sure!\n```\n```") == []

    @given(st.text())
    def test_never_raises_and_returns_at_most_one(self, text: str) -> None:
        out = parse_single(text)
        assert len(out) <= 1 and all(x.strip() for x in out)


def test_read_queries_counts_each_item_left_out_under_its_reason() -> None:
    reply = (
        "```\nSure!\n1. Why did revenue drop?\n2. revenue decline causes\n"
        "3. Reply with one query per line, numbered 1 to 3\n4. revenue decline causes\n"
        "5. why sales fell\n6. lost renewals\n```"
    )
    read = read_queries(reply, 2, exclude=("why did revenue drop?",))
    assert read.queries == ("revenue decline causes", "why sales fell")
    assert dict(read.count.dropped) == {
        "duplicate_of_question": 1,
        "duplicate_of_another": 1,
        "echo_of_prompt": 1,
        "not_a_query": 1,  # "Sure!" beside the numbered lines; the fences are not counted
        "beyond_n": 1,
    }
    assert read.count.asked == 2 and read.count.kept == 2 and not read.count.short
    assert list(read.queries) == parse_queries(reply, 2, exclude=("why did revenue drop?",))
