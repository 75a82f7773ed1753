from __future__ import annotations

from typing import ClassVar

import pytest

from llama_index_hyde_plus import HyDE, MultiQuery, Rocchio, StepBack
from llama_index_hyde_plus.testing import ScriptedLLM
from llama_index_hyde_plus.transforms._listing import QueryListTransform
from llama_index_hyde_plus.transforms.registry import (
    BUILTINS,
    METHODS,
    TRANSFORMS,
    check_options,
    make_transform,
    transform_class,
    uses_llm,
)


def test_names_come_from_the_classes() -> None:
    assert tuple(cls.method for cls in BUILTINS) == TRANSFORMS
    assert tuple(cls.method for cls in BUILTINS if cls.uses_llm) == METHODS
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


def test_classes_describe_their_count_and_options() -> None:
    assert MultiQuery.count_option() == "n" and StepBack.count_option() is None
    assert HyDE.count_option() == "num_passages" and Rocchio.count_option() is None
    assert {"k", "alpha", "beta"} == set(Rocchio.option_names())
    with pytest.raises(TypeError, match="unexpected keyword argument 'n'"):
        StepBack(ScriptedLLM(), n=2)


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
    assert Keywords.count_option() == "n" and "timeout" in Keywords.option_names()
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
