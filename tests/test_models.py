from __future__ import annotations

import pytest

from llama_index_hyde_plus.echo import EchoLLM
from llama_index_hyde_plus.models import describe_llm, llm_threads, resolve_llm


def test_scripted_is_the_echo_model_with_its_delay_in_milliseconds() -> None:
    llm = resolve_llm("scripted:25")
    assert isinstance(llm, EchoLLM) and llm.delay == pytest.approx(0.025)
    assert describe_llm(llm) == "echo"
    assert isinstance(resolve_llm("Scripted"), EchoLLM)


@pytest.mark.parametrize("spec", ["scripted:fast", "scripted:-5", "scripted:nan"])
def test_a_bad_scripted_delay_is_a_value_error(spec: str) -> None:
    with pytest.raises(ValueError, match="scripted delay"):
        resolve_llm(spec)


def test_an_unknown_model_choice_is_named() -> None:
    with pytest.raises(ValueError, match="unknown model choice 'claude'"):
        resolve_llm("claude")


def test_openai_without_a_key_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ValueError, match="needs an API key"):
        resolve_llm("openai:gpt-4o-mini")


def test_openai_gets_temperature_and_max_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    llm = resolve_llm("openai:gpt-4o", temperature=0.2, max_tokens=77)
    assert (llm.model, llm.temperature, llm.max_tokens) == ("gpt-4o", 0.2, 77)  # type: ignore[attr-defined]


def test_llm_threads_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HYDE_PLUS_LLM_THREADS", raising=False)
    assert llm_threads() is None
    monkeypatch.setenv("HYDE_PLUS_LLM_THREADS", "1")
    assert llm_threads() == 1
    monkeypatch.setenv("HYDE_PLUS_LLM_THREADS", "two")
    with pytest.raises(ValueError, match="HYDE_PLUS_LLM_THREADS"):
        llm_threads()


@pytest.mark.local
def test_local_gets_seed_tokens_and_parallel_capped_at_eight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HYDE_PLUS_LLM_THREADS", "1")
    llm = resolve_llm("local", temperature=0.1, max_tokens=33, seed=7, parallel=50)
    assert (llm.temperature, llm.max_tokens, llm.seed) == (0.1, 33, 7)  # type: ignore[attr-defined]
    assert llm.n_parallel == 8 and llm.threads == 1  # type: ignore[attr-defined]
