from __future__ import annotations

from typing import Any, ClassVar

import pytest

from llama_index_hyde_plus import HyDE, MultiQuery, Rocchio, StepBack
from llama_index_hyde_plus.testing import ScriptedLLM
from llama_index_hyde_plus.transforms._listing import QueryListTransform
from llama_index_hyde_plus.transforms.registry import (
    BUILTINS,
    FANOUT_GRID,
    METHODS,
    TRANSFORMS,
    Entry,
    check_options,
    entry_for,
    make_transform,
    transform_class,
    uses_llm,
)


def test_names_come_from_the_classes() -> None:
    assert tuple(entry.cls.method for entry in BUILTINS) == TRANSFORMS
    assert tuple(entry.cls.method for entry in BUILTINS if entry.cls.uses_llm) == METHODS
    # the built-in LLM transforms, first and in order (a new one joins at the end)
    assert METHODS[:5] == ("hyde", "multi-query", "step-back", "decompose", "rewrite")
    assert not uses_llm("none") and not uses_llm("rocchio") and uses_llm("hyde")


def test_forgiving_spellings_resolve_and_unknown_names_list_the_choices() -> None:
    assert transform_class("Multi_Query") is MultiQuery
    assert transform_class("stepback") is StepBack
    with pytest.raises(ValueError, match="choose one of: none, hyde"):
        transform_class("hype")


def test_make_transform_passes_n_only_to_the_classes_that_take_it() -> None:
    llm = ScriptedLLM()
    assert make_transform("multi-query", llm, n=5).n == 5  # type: ignore[attr-defined]
    assert make_transform("step-back", llm, n=5).n == 1  # type: ignore[attr-defined]
    assert make_transform("hyde", llm, n=5).num_passages == 1  # type: ignore[attr-defined]
    assert isinstance(make_transform("rocchio", llm, n=5), Rocchio)


def test_entries_describe_their_count_and_options() -> None:
    assert entry_for("multi-query").count == "n" and entry_for("step-back").count is None
    assert entry_for("hyde").count == "num_passages" and entry_for("rocchio").count is None
    assert {"k", "alpha", "beta"} == set(entry_for("rocchio").option_names())
    assert entry_for("none").option_names() == ()
    with pytest.raises(TypeError, match="unexpected keyword argument 'n'"):
        StepBack(ScriptedLLM(), n=2)


@pytest.mark.parametrize("entry", BUILTINS, ids=TRANSFORMS)
def test_an_entrys_count_is_the_option_its_class_takes(entry: Entry) -> None:
    # the count a caller passes uniformly reaches the class, or is refused by it
    llm = ScriptedLLM() if entry.uses_llm else None
    for option in ("n", "num_passages"):
        kwargs: dict[str, Any] = {option: 2}
        if entry.uses_llm:
            kwargs["llm"] = llm
        if option == entry.count:
            assert getattr(entry.cls(**kwargs), option) == 2
        else:
            with pytest.raises(TypeError, match="argument"):
                entry.cls(**kwargs)


def test_the_tuner_and_the_cli_read_the_entry_not_the_class() -> None:
    hyde = entry_for("hyde")
    assert hyde.prompt_for_task("scifact") != hyde.prompt_for_task("fiqa")
    assert hyde.prompt_for_task("Answer {query}") == "Answer {query}"
    assert entry_for("multi-query").prompt_for_task("scifact") is None
    assert hyde.complexity({"grounded": 3, "gate": 0.4, "strategy": "rerank"}) == 7
    assert entry_for("rocchio").complexity({"k": 10, "beta": 0.8}) == 0
    assert entry_for("none").grid == ({},)
    for name in ("count_option", "option_names", "tune_grid", "complexity", "prompt_for_task"):
        assert not hasattr(HyDE, name), name


def test_a_grid_cannot_be_changed_by_a_caller() -> None:
    with pytest.raises(TypeError):
        entry_for("hyde").grid[0]["include_query"] = True  # type: ignore[index]
    with pytest.raises(AttributeError):
        entry_for("hyde").count = "n"  # type: ignore[misc]
    assert FANOUT_GRID[0] == {"include_query": False}


def test_check_options_names_an_unknown_option_and_refuses_runtime_objects() -> None:
    with pytest.raises(ValueError, match=r"hyde has no option 'weight'; its options: max_char"):
        check_options("hyde", {"weight": 0.5})
    with pytest.raises(ValueError, match="step-back has no option 'n'"):
        check_options("step-back", {"n": 2})  # a grid of n would sweep identical configs
    with pytest.raises(ValueError, match="none has no option 'n'; its options: none"):
        check_options("none", {"n": 4})
    with pytest.raises(ValueError, match="rocchio has no option 'temperature'; its options: k,"):
        check_options("rocchio", {"temperature": 0.3})
    with pytest.raises(ValueError, match="'cache' of hyde cannot come from a config"):
        check_options("hyde", {"cache": None})
    check_options("multi-query", {"n": 4, "original_weight": 3.0})


def test_a_new_list_transform_is_one_short_class() -> None:
    class Keywords(QueryListTransform):
        method: ClassVar[str] = "keywords"
        default_prompt: ClassVar[str] = "Give {n} keyword queries for: {query}"
        DEFAULT_N: ClassVar[int | None] = 2

    t = Keywords(ScriptedLLM(["1. revenue drop\n2. renewals slipped"]))
    result = t.transform("Why did revenue drop?")
    assert result.queries == ("revenue drop", "renewals slipped") and result.method == "keywords"
    entry = Entry(Keywords, count="n", grid=FANOUT_GRID)  # its registry line
    assert entry.method == "keywords" and entry.option_names()[0] == "n"
    assert "timeout" in entry.option_names()
    assert list(t.get_prompts()) == ["keywords_prompt"]  # named for its method


def test_a_prompt_is_named_for_its_method_unless_a_class_names_it() -> None:
    from llama_index_hyde_plus import HyDE, MultiQuery, StepBack

    assert (MultiQuery.prompt_key, StepBack.prompt_key) == (
        "multi_query_prompt",
        "step_back_prompt",
    )

    class MyHyDE(HyDE):  # a built-in's subclass keeps the name its users update
        method: ClassVar[str] = "my-hyde"

    class Named(QueryListTransform):
        method: ClassVar[str] = "sub-queries"
        prompt_key: ClassVar[str] = "subs"
        default_prompt: ClassVar[str] = "Give {n} queries for: {query}"

    assert (MyHyDE.prompt_key, Named.prompt_key) == ("hyde_prompt", "subs")


@pytest.mark.parametrize("entry", BUILTINS, ids=TRANSFORMS)
def test_every_configuration_an_entry_sweeps_builds_its_transform(entry: Entry) -> None:
    from llama_index_hyde_plus.evaluation.tune import check_grid

    assert check_grid(entry.method, entry.grid) == [dict(c) for c in entry.grid]
    assert all(entry.complexity(c) >= 0 for c in entry.grid)
