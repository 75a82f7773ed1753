"""The cache key follows what a formatter renders: each guard here changes what the
formatter computes with in place, on the same transform, between two keys; a fresh
transform's key is the reference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from llama_index_hyde_plus import HyDE
from llama_index_hyde_plus.testing import ScriptedLLM

Q = "Why did revenue drop?"
STYLE = "EN"
TABLE = ("EN",)


def _styled(prompt: str) -> str:
    return f"{STYLE}:{prompt}"


def _tabled(prompt: str) -> str:
    return f"{TABLE[0]}:{prompt}"


def _keys_follow(fmt: Callable[[str], str], change: Callable[[], Any]) -> None:
    """``change`` alters what ``fmt`` computes with: the same transform's key changes,
    and equals a fresh transform's."""
    hyde = HyDE(ScriptedLLM(completion_to_prompt=fmt))
    before = hyde.cache_key_for(Q)
    assert hyde.cache_key_for(Q) == before  # served again while nothing changed
    change()
    after = hyde.cache_key_for(Q)
    assert after != before
    assert after == HyDE(ScriptedLLM(completion_to_prompt=fmt)).cache_key_for(Q)


def test_a_list_a_closure_holds_changed_in_place_changes_the_key() -> None:
    words = ["EN"]
    _keys_follow(lambda p: f"{words[0]}:{p}", lambda: words.__setitem__(0, "FR"))


def test_a_closure_variable_rebound_changes_the_key() -> None:
    def factory() -> tuple[Callable[[str], str], Callable[[], None]]:
        style = "EN"

        def fmt(prompt: str) -> str:
            return f"{style}:{prompt}"

        def switch() -> None:
            nonlocal style
            style = "FR"

        return fmt, switch

    fmt, switch = factory()
    _keys_follow(fmt, switch)


def test_a_default_rebound_changes_the_key() -> None:
    def fmt(prompt: str, style: str = "EN", *, mark: str = "!") -> str:
        return f"{style}{mark}:{prompt}"

    def rebind() -> None:
        fmt.__defaults__ = ("FR",)

    _keys_follow(fmt, rebind)
    fmt.__defaults__ = ("EN",)
    _keys_follow(fmt, lambda: fmt.__kwdefaults__.__setitem__("mark", "?"))  # type: ignore[union-attr]


def test_module_data_rebound_changes_the_key() -> None:
    def rebind(name: str, value: Any) -> Callable[[], None]:
        return lambda: globals().__setitem__(name, value)

    try:
        _keys_follow(_styled, rebind("STYLE", "FR"))
        _keys_follow(_tabled, rebind("TABLE", ("FR",)))
    finally:
        globals().update(STYLE="EN", TABLE=("EN",))


def test_new_code_changes_the_key() -> None:
    def fmt(prompt: str) -> str:
        return f"EN:{prompt}"

    def other(prompt: str) -> str:
        return f"FR:{prompt}"

    def swap() -> None:
        fmt.__code__ = other.__code__

    _keys_follow(fmt, swap)


def test_a_setting_of_the_llm_set_again_changes_the_key() -> None:
    llm = ScriptedLLM(respond=lambda p: "A")
    hyde = HyDE(llm)
    before = hyde.cache_key_for(Q)
    llm.system_prompt = "Answer in French."
    assert hyde.cache_key_for(Q) != before


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_hit_after_the_state_changed_is_a_miss(use_async: bool) -> None:
    from llama_index_hyde_plus import MemoryCache

    words = ["EN"]
    llm = ScriptedLLM(["first", "second"], completion_to_prompt=lambda p: f"{words[0]}:{p}")
    hyde = HyDE(llm, cache=MemoryCache(), breaker=None)
    run = hyde.atransform if use_async else None
    first = await run(Q) if run else hyde.transform(Q)
    again = await run(Q) if run else hyde.transform(Q)
    assert again.cached and again.hypothetical == first.hypothetical
    words[0] = "FR"
    third = await run(Q) if run else hyde.transform(Q)
    assert not third.cached and third.hypothetical == ("second",)
