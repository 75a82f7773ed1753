from __future__ import annotations

from types import SimpleNamespace

import pytest

from llama_index_hyde_plus import HyDE, MultiQuery, StepBack
from llama_index_hyde_plus.calls.reliability import CircuitBreaker
from llama_index_hyde_plus.calls.timeouts import (
    LOCAL_START_S,
    LOCAL_TOKENS_PER_S,
    REMOTE_TIMEOUT_S,
    timeout_for,
)
from llama_index_hyde_plus.evaluation.runner import TransformSpec, build_transform
from llama_index_hyde_plus.server.rcp import TransformService
from llama_index_hyde_plus.testing import ScriptedLLM
from llama_index_hyde_plus.transforms.factory import build
from llama_index_hyde_plus.transforms.options import LLM_OPTION_NAMES
from llama_index_hyde_plus.transforms.registry import entry_for


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


@pytest.mark.parametrize("bad", ["yes", True, False])
def test_breaker_of_another_type_is_refused(bad: object) -> None:
    with pytest.raises(TypeError, match="breaker must be a CircuitBreaker or None"):
        HyDE(ScriptedLLM(), breaker=bad)  # type: ignore[typeddict-item]


def test_timeout_default_is_the_one_policy_by_model_kind_and_none_means_unbounded() -> None:
    remote = ScriptedLLM()
    assert HyDE(remote).timeout == REMOTE_TIMEOUT_S == timeout_for(remote)
    local = SimpleNamespace(is_local=True, max_tokens=256, n_parallel=4)
    assert timeout_for(local) == LOCAL_START_S + 256 * 4 / LOCAL_TOKENS_PER_S
    assert timeout_for(local, max_tokens=100) == LOCAL_START_S + 100 * 4 / LOCAL_TOKENS_PER_S
    measured = SimpleNamespace(is_local=True, max_tokens=256, n_parallel=1, tokens_per_s=128.0)
    assert timeout_for(measured) == LOCAL_START_S + 2.0
    assert HyDE(remote, timeout=None).timeout is None
    assert HyDE(remote, timeout=5).timeout == 5


def test_every_caller_builds_transforms_with_the_same_timeout() -> None:
    """Library, eval/tune (runner), the RCP server and the CLI's factory agree (they
    were 10 s, 600 s, 10 s and 120 s)."""
    llm = ScriptedLLM()
    library = HyDE(llm).timeout
    runner = build_transform(TransformSpec("hyde", "hyde"), llm, None, None).timeout
    served = TransformService(llm).transformer("hyde", 1)
    built = build("hyde", llm, {})
    assert library == runner == served.timeout == built.timeout == timeout_for(llm)  # type: ignore[attr-defined]


def test_option_names_list_own_then_shared_options() -> None:
    names = entry_for("multi-query").option_names()
    assert names[0] == "n" and "include_query" in names
    assert set(names) >= LLM_OPTION_NAMES
    assert "n" not in entry_for("step-back").option_names()
    hyde = entry_for("hyde").option_names()
    assert "num_passages" in hyde and "n" not in hyde
