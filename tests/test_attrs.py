"""`optional_attr` reads what ``getattr(obj, name, default)`` reads, on every kind of
object an LLM can be, without a failed pydantic lookup for the plain ones."""

from __future__ import annotations

from typing import Any

import pytest
import wrapt
from llama_index.core.base.llms.types import CompletionResponse, LLMMetadata
from llama_index.core.llms import MockLLM
from llama_index.core.llms.custom import CustomLLM
from pydantic import ConfigDict

from llama_index_hyde_plus._attrs import _only_in_dict, optional_attr, overrides
from llama_index_hyde_plus.testing import ScriptedLLM

NAMES = ("api_base", "model", "model_name", "max_tokens", "timeout", "loaded", "is_local")


class _ByProperty(ScriptedLLM):
    @property
    def timeout(self) -> float:
        return 7.0


class _Extras(ScriptedLLM):
    model_config = ConfigDict(extra="allow")


class _Intercepts(ScriptedLLM):
    def __getattribute__(self, name: str) -> Any:
        if name == "loaded":
            return "intercepted"
        return super().__getattribute__(name)


class _Proxy:
    def __getattr__(self, name: str) -> str:
        if name == "api_base":
            return "http://proxied"
        raise AttributeError(name)


def _objects() -> list[object]:
    set_later = ScriptedLLM()
    object.__setattr__(set_later, "api_base", "http://set-on-the-instance")
    return [
        ScriptedLLM(),
        MockLLM(max_tokens=5),
        set_later,
        _ByProperty(),
        _Extras(api_base="http://extra"),
        _Intercepts(),
        _Proxy(),
        object(),
        *_openai(),
    ]


def _openai() -> list[object]:
    """LlamaIndex's OpenAI LLM (an extra of this package), when installed."""
    try:
        from llama_index.llms.openai import OpenAI
    except ImportError:
        return []
    return [OpenAI(api_key="sk-none", timeout=5.0, max_retries=0)]


@pytest.mark.parametrize("obj", _objects(), ids=lambda o: type(o).__name__)
def test_every_name_reads_as_getattr_reads_it(obj: object) -> None:
    for name in NAMES:
        assert optional_attr(obj, name, "absent") == getattr(obj, name, "absent"), name


def test_only_a_plain_pydantic_model_is_read_from_its_dict() -> None:
    assert _only_in_dict(ScriptedLLM, "api_base")  # the shortcut is taken
    assert not _only_in_dict(_ByProperty, "timeout")  # a property computes
    assert not _only_in_dict(_Extras, "api_base")  # extra fields live elsewhere
    assert not _only_in_dict(_Intercepts, "loaded")
    assert not _only_in_dict(_Proxy, "api_base")
    assert not _only_in_dict(ScriptedLLM, "_lock")  # a private attribute


def test_a_property_that_raises_still_raises() -> None:
    class Raises(ScriptedLLM):
        @property
        def timeout(self) -> float:
            raise RuntimeError("no timeout here")

    with pytest.raises(RuntimeError, match="no timeout"):
        optional_attr(Raises(), "timeout")


class _HandsOn:
    """A wrapper whose class shows no LLM method: it hands every attribute on."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_overrides_answers_for_the_object_behind_a_proxy_or_a_forwarding_wrapper() -> None:
    native, blocking = ScriptedLLM(), _BlockingOnly()
    for wrap in (lambda o: o, wrapt.ObjectProxy, _HandsOn):
        assert overrides(wrap(native), "acomplete", CustomLLM)
        assert not overrides(wrap(blocking), "acomplete", CustomLLM)


def test_overrides_reads_a_coroutine_function_set_on_an_object_without_the_method() -> None:
    class Bare:
        pass

    obj = Bare()
    assert not overrides(obj, "acomplete", CustomLLM)
    obj.acomplete = _acomplete  # type: ignore[attr-defined]
    assert overrides(obj, "acomplete", CustomLLM)


async def _acomplete(prompt: str) -> str:
    return prompt


class _BlockingOnly(CustomLLM):
    """A CustomLLM with only the blocking methods: its acomplete is CustomLLM's."""

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata()

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=prompt)

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        yield CompletionResponse(text=prompt)
