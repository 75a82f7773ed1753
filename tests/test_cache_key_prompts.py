"""The cache key holds what is sent to the model: a formatter reading a 20,000-entry
table is keyed by what it renders without reading the table into every key (no stall
of the event loop per query); a formatter reading a file is keyed by what it renders,
so a changed file is a miss, never a stale hit; a bound built-in formatter and a
prompt's function mappings are keyed by what they render."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.llms import CompletionResponse
from llama_index.core.prompts import PromptTemplate

from llama_index_hyde_plus import HyDE, MemoryCache
from llama_index_hyde_plus.testing import ScriptedLLM

Q = "Why did revenue drop?"
TABLE = {f"style-{i}": f"Answer in style {i}." for i in range(20_000)}
"""A 20,000-entry global a formatter reads."""
STYLE_FILE = Path(os.environ.get("HYDE_PLUS_TEST_STYLE_FILE", "style.txt"))


class FormattingLLM(ScriptedLLM):
    """A scripted LLM that formats a prompt with ``completion_to_prompt`` as local
    models do (llama.cpp, Hugging Face): what the model receives is its output."""

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """The scripted reply to the formatted prompt."""
        sent = prompt if formatted else self.completion_to_prompt(prompt)
        return super().complete(sent, formatted=True, **kwargs)

    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        """`complete` on the async path."""
        sent = prompt if formatted else self.completion_to_prompt(prompt)
        return await super().acomplete(sent, formatted=True, **kwargs)


def _echo(prompt: str) -> str:
    return f"Passage for: {prompt[:24]} / {prompt[-40:]}"


def _table_formatter(prompt: str) -> str:
    return TABLE["style-7"] + "\n" + prompt


def _table_reader(prompt: str) -> str:
    return TABLE["style-7"] + " Renewals slipped."


def _file_formatter(prompt: str) -> str:
    return STYLE_FILE.read_text() + "\n" + prompt


def _file_mapping(**kwargs: Any) -> str:
    return STYLE_FILE.read_text() + ": " + str(kwargs["query"])


# -- no per-query stall for a formatter over a big table ---------------------------
async def _stall(run: Callable[[str], Any], queries: list[str]) -> tuple[float, float]:
    """(longest gap between two runs of a 1 ms ticker, total seconds) while ``run``
    serves ``queries`` one after another."""
    gaps: list[float] = []
    stop = asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.005)
    start = time.perf_counter()
    try:
        for query in queries:
            result = await run(query)
            assert result.cached
    finally:
        total = time.perf_counter() - start
        stop.set()
        await ticker
    return max(gaps), total


async def test_cached_queries_through_a_formatter_over_a_big_table_never_stall_the_loop() -> None:
    llm = FormattingLLM(respond=_echo, completion_to_prompt=_table_formatter)
    hyde = HyDE(llm, cache=MemoryCache(), breaker=None)
    queries = [f"{Q} ({i})" for i in range(50)]
    for query in queries:  # fill the cache
        assert not (await hyde.atransform(query)).cached
    longest, total = await _stall(hyde.atransform, queries)
    # the table read into every key would cost seconds for these 50 hits
    assert total < 0.5, f"50 hits took {total:.2f}s"
    assert longest < 0.25, f"the loop stalled {longest:.3f}s"


async def test_a_setting_over_a_big_table_is_keyed_off_the_event_loop() -> None:
    """A function setting keyed by what it reads (not by output: ``respond`` answers
    the prompt) is read on a worker thread once it proves slow to key."""
    hyde = HyDE(ScriptedLLM(respond=_table_reader), cache=MemoryCache(), breaker=None)
    queries = [f"{Q} ({i})" for i in range(5)]
    for query in queries:
        await hyde.atransform(query)
    longest, _ = await _stall(hyde.atransform, queries)
    assert longest < 0.15, f"the loop stalled {longest:.3f}s"


def test_a_big_table_the_formatter_reads_still_changes_what_is_sent() -> None:
    llm = FormattingLLM(respond=_echo, completion_to_prompt=_table_formatter)
    before = HyDE(llm).cache_key_for(Q)
    TABLE["style-7"] = "Answer tersely."
    try:
        assert HyDE(llm).cache_key_for(Q) != before
    finally:
        TABLE["style-7"] = "Answer in style 7."
    assert HyDE(llm).cache_key_for(Q) == before


# -- a formatter reading a file is keyed by what it renders ----------------------
@pytest.fixture
def style_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "style.txt"
    path.write_text("Answer in English")
    monkeypatch.setattr(sys.modules[__name__], "STYLE_FILE", path)
    return path


def _file_llm_hyde(how: str, cache: MemoryCache) -> HyDE:
    if how == "completion_to_prompt":
        return HyDE(FormattingLLM(respond=_echo, completion_to_prompt=_file_formatter), cache=cache)
    prompt = PromptTemplate("Write a passage. {query}", function_mappings={"query": _file_mapping})
    return HyDE(ScriptedLLM(respond=_echo), prompt=prompt, cache=cache)


@pytest.mark.parametrize("how", ["completion_to_prompt", "function_mapping"])
@pytest.mark.parametrize("use_async", [False, True])
async def test_a_formatter_reading_a_file_misses_once_the_file_changes(
    how: str, use_async: bool, style_file: Path
) -> None:
    cache = MemoryCache()
    hyde = _file_llm_hyde(how, cache)

    async def run() -> Any:
        return await hyde.atransform(Q) if use_async else hyde.transform(Q)

    first = await run()
    again = await run()
    assert not first.cached and again.cached  # same file: a hit
    style_file.write_text("Answer in French")
    french = await run()
    assert not french.cached  # not the English generation
    assert "French" in french.hypothetical[0] and "English" in first.hypothetical[0]
    assert (await run()).cached
    style_file.write_text("Answer in English")
    assert (await run()).hypothetical == first.hypothetical


# -- the same configuration in another process: the same key --------------------------
_KEYS_IN_A_SUBPROCESS = """
import sys
sys.path.insert(0, sys.argv[1])
import tests.test_cache_key_prompts as t
for hyde in t.configurations():
    print(hyde.cache_key_for(t.Q))
"""


def configurations() -> list[HyDE]:
    """One transform per kind of key part: a formatter over a big table, a function
    mapping over a file, a formatter over a file."""
    mapped = PromptTemplate("Write a passage. {query}", function_mappings={"query": _file_mapping})
    return [
        HyDE(FormattingLLM(respond=_echo, completion_to_prompt=_table_formatter)),
        HyDE(ScriptedLLM(respond=_echo), prompt=mapped),
        HyDE(FormattingLLM(respond=_echo, completion_to_prompt=_file_formatter)),
    ]


@pytest.mark.slow
def test_replicas_with_another_working_folder_share_keys(
    style_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYDE_PLUS_TEST_STYLE_FILE", str(style_file))
    monkeypatch.setenv("HYDE_PLUS_LANG", "EN")
    root = str(Path(__file__).resolve().parents[1])
    replica = tmp_path / "replica"
    replica.mkdir()
    env = {**os.environ, "PWD": str(replica), "HOSTNAME": "replica-2", "HYDE_PLUS_OTHER": "2"}
    out = subprocess.run(
        [sys.executable, "-c", _KEYS_IN_A_SUBPROCESS, root],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=replica,
        env=env,
    ).stdout.split()
    assert out == [hyde.cache_key_for(Q) for hyde in configurations()]


def test_revised_is_dataclasses_replace_for_every_field() -> None:
    """`revised`, the hit path's copy, is exact only while `TransformResult` has no
    ``__post_init__`` and every field is in ``__init__``; it matches ``replace``."""
    import dataclasses

    from llama_index_hyde_plus.transforms.base import TransformResult, revised
    from llama_index_hyde_plus.usage import Usage

    assert not hasattr(TransformResult, "__post_init__")
    assert all(f.init for f in dataclasses.fields(TransformResult))
    result = HyDE(ScriptedLLM(respond=_echo)).transform(Q)
    changes = {"usage": Usage(cached=True), "cached": True, "latency_s": 0.5}
    assert revised(result, **changes) == dataclasses.replace(result, **changes)
    assert revised(result) == result and revised(result) is not result
    with pytest.raises(TypeError):
        revised(result, nonsense=1)


def test_a_setting_changed_on_the_same_llm_changes_the_key_of_the_same_transform() -> None:
    """The settings are read for every key: a field set again, or a dict setting
    changed in place, is a new key on the same transform, and the old value's again."""
    from tests.test_cache_guarantees import SettingsLLM

    llm = SettingsLLM(additional_kwargs={"top_p": 0.5})
    hyde = HyDE(llm)
    first = hyde.cache_key_for(Q)
    assert hyde.cache_key_for(Q) == first
    llm.temperature = 0.7
    hot = hyde.cache_key_for(Q)
    llm.max_tokens = 64
    capped = hyde.cache_key_for(Q)
    llm.additional_kwargs["top_p"] = 0.9  # in place
    nucleus = hyde.cache_key_for(Q)
    assert len({first, hot, capped, nucleus}) == 4
    llm.temperature, llm.max_tokens, llm.additional_kwargs["top_p"] = 0.0, None, 0.5
    assert hyde.cache_key_for(Q) == first


def _key(respond: Callable[[str], str], **fields: Any) -> str:
    transform = HyDE(llm=ScriptedLLM(respond=respond, **fields), cache=MemoryCache())
    return transform.cache_key_for(Q)


# -- a prompt formatter is keyed by what it renders ---------------------------------
def test_bound_builtin_prompt_functions_of_the_llm_are_keyed_by_what_they_render() -> None:
    def key(**fields: Any) -> str:
        return _key(lambda p: "x", **fields)

    assert key(completion_to_prompt="EN {}".format) != key(completion_to_prompt="FR {}".format)
    assert key(messages_to_prompt="EN {}".format) != key(messages_to_prompt="FR {}".format)
    assert key(completion_to_prompt="EN {}".format) == key(completion_to_prompt="EN {}".format)


# -- a prompt's function mappings are in the key ------------------------------------
def _mapped(language: str) -> PromptTemplate:
    def render(**kwargs: Any) -> str:
        return f"in {language}: {kwargs['query']}"

    return PromptTemplate("Q: {query}", function_mappings={"query": render})


@pytest.mark.parametrize("use_async", [False, True])
async def test_prompts_with_other_function_mappings_never_share_a_generation(
    use_async: bool,
) -> None:
    cache = MemoryCache()
    results = []
    for language in ("English", "French"):
        llm = ScriptedLLM(respond=lambda p: "reply to " + p)
        transform = HyDE(llm=llm, prompt=_mapped(language), cache=cache)
        result = await transform.atransform(Q) if use_async else transform.transform(Q)
        results.append((result, llm))
    assert not results[1][0].cached and len(results[1][1].prompts) == 1
    assert "French" in results[1][0].hypothetical[0]


def test_a_plain_prompt_keeps_its_key_and_equal_mappings_share_one() -> None:
    plain = HyDE(llm=ScriptedLLM(respond=lambda p: "x"), cache=MemoryCache())
    same = HyDE(
        llm=ScriptedLLM(respond=lambda p: "x"), prompt=plain.prompt.get_template(), cache=None
    )
    assert plain.cache_key_for(Q) == same.cache_key_for(Q)
    one = HyDE(llm=ScriptedLLM(respond=lambda p: "x"), prompt=_mapped("English"))
    two = HyDE(llm=ScriptedLLM(respond=lambda p: "x"), prompt=_mapped("English"))
    assert one.cache_key_for(Q) == two.cache_key_for(Q) != plain.cache_key_for(Q)


# -- the prompt is rendered once per call: what is keyed is what is sent --
@pytest.mark.parametrize("use_async", [False, True])
def test_a_rotating_mapping_never_stores_one_renderings_passage_under_anothers_key(
    use_async: bool,
) -> None:
    import asyncio
    import itertools

    from llama_index.core.prompts import PromptTemplate

    from llama_index_hyde_plus import HyDE, MemoryCache
    from llama_index_hyde_plus.testing import ScriptedLLM

    examples = itertools.cycle(["EXAMPLE-A", "EXAMPLE-B"])
    renders: list[str] = []

    def example(**kwargs: Any) -> str:
        renders.append(next(examples))  # a few-shot example rotated per rendering
        return f"{renders[-1]}\nQuestion: {kwargs['query']}"

    prompt = PromptTemplate("{query}\nPassage:", function_mappings={"query": example})
    llm = ScriptedLLM(respond=lambda p: "passage " + ("A" if "EXAMPLE-A" in p else "B"))
    hyde = HyDE(llm, prompt=prompt, cache=MemoryCache())
    q = "Why did revenue drop?"
    results = [
        asyncio.run(hyde.atransform(q)) if use_async else hyde.transform(q) for _ in range(4)
    ]
    assert len(renders) == 4  # once per call, not once for the key and again to send
    assert [r.hypothetical[0] for r in results] == ["passage A", "passage B"] * 2
    assert [r.cached for r in results] == [False, False, True, True]
