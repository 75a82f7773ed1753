"""Settings that change what the model generates are in the cache key, even when named
like a secret (``stop_token``, ``eos_token``); secrets (API keys, access tokens, client
secrets, passwords) never are."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import Field

from llama_index_hyde_plus import HyDE, MemoryCache
from llama_index_hyde_plus.testing import ScriptedLLM

from .conftest import Q


class _TokenLLM(ScriptedLLM):
    stop_token: str = Field(default="\n")
    eos_token: str = Field(default="</s>")
    hf_token: str = Field(default="hf_x")
    access_token: str = Field(default="a")
    client_secret: str = Field(default="s")
    openai_api_key: str = Field(default="k")
    password: str = Field(default="p")
    additional_kwargs: dict[str, Any] = Field(default_factory=dict)


def _token_key(**fields: Any) -> str:
    llm = _TokenLLM(respond=lambda p: "x", **fields)
    return HyDE(llm=llm, cache=MemoryCache()).cache_key_for(Q)


@pytest.mark.parametrize(
    ("field", "first", "second"),
    [
        ("stop_token", "\n", "."),
        ("eos_token", "</s>", "<|end|>"),
        ("additional_kwargs", {"stop_token_ids": [1]}, {"stop_token_ids": [2]}),
        ("additional_kwargs", {"eos_token": "</s>"}, {"eos_token": "<|end|>"}),
        ("additional_kwargs", {"bos_token_id": 1}, {"bos_token_id": 2}),
        ("additional_kwargs", {"max_new_tokens": 1}, {"max_new_tokens": 2}),
    ],
)
def test_token_generation_settings_are_in_the_key(field: str, first: Any, second: Any) -> None:
    assert _token_key(**{field: first}) != _token_key(**{field: second})


@pytest.mark.parametrize(
    ("field", "first", "second"),
    [
        ("hf_token", "hf_a", "hf_b"),
        ("access_token", "a", "b"),
        ("client_secret", "a", "b"),
        ("openai_api_key", "a", "b"),
        ("password", "a", "b"),
    ],
)
def test_secrets_are_never_in_the_key(field: str, first: Any, second: Any) -> None:
    assert _token_key(**{field: first}) == _token_key(**{field: second})
