from __future__ import annotations

import pytest

from llama_index_hyde_plus import HyDE, MultiQuery, StepBack
from llama_index_hyde_plus.reliability import CircuitBreaker
from llama_index_hyde_plus.testing import ScriptedLLM
from llama_index_hyde_plus.transforms.options import LLM_OPTION_NAMES


def test_every_llm_transform_takes_the_shared_options_by_name() -> None:
    shared = CircuitBreaker(name="provider")
    for cls in (HyDE, MultiQuery, StepBack):
        t = cls(ScriptedLLM(), temperature=0.3, timeout=2.0, breaker=shared)
        assert (t.temperature, t.timeout, t.breaker) == (0.3, 2.0, shared)


def test_an_unknown_option_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
        HyDE(ScriptedLLM(), temprature=0.3)  # type: ignore[call-arg]


def test_breaker_absent_gives_each_transform_its_own_and_none_turns_it_off() -> None:
    a, b = HyDE(ScriptedLLM()), HyDE(ScriptedLLM())
    assert isinstance(a.breaker, CircuitBreaker) and a.breaker is not b.breaker
    assert HyDE(ScriptedLLM(), breaker=None).breaker is None


def test_breaker_booleans_still_work_but_are_deprecated() -> None:
    with pytest.warns(DeprecationWarning, match="breaker=True/False is deprecated"):
        off = HyDE(ScriptedLLM(), breaker=False)  # type: ignore[typeddict-item]
    with pytest.warns(DeprecationWarning):
        on = HyDE(ScriptedLLM(), breaker=True)  # type: ignore[typeddict-item]
    assert off.breaker is None and isinstance(on.breaker, CircuitBreaker)


def test_breaker_of_another_type_is_refused() -> None:
    with pytest.raises(TypeError, match="breaker must be a CircuitBreaker or None"):
        HyDE(ScriptedLLM(), breaker="yes")  # type: ignore[typeddict-item]


def test_timeout_default_comes_from_the_class_and_none_means_unbounded() -> None:
    class Patient(HyDE):
        DEFAULT_TIMEOUT_S = 60.0

    assert HyDE(ScriptedLLM()).timeout == 10.0
    assert Patient(ScriptedLLM()).timeout == 60.0
    assert HyDE(ScriptedLLM(), timeout=None).timeout is None


def test_option_names_list_own_then_shared_options() -> None:
    names = MultiQuery.option_names()
    assert names[0] == "n" and "include_query" in names
    assert set(names) >= LLM_OPTION_NAMES
    assert "n" not in StepBack.option_names()
    assert "num_passages" in HyDE.option_names() and "n" not in HyDE.option_names()
