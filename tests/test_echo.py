from __future__ import annotations

import asyncio
import time

from llama_index_hyde_plus.echo import EchoLLM, echo_reply


def test_echo_reply_varies_the_question_it_finds() -> None:
    assert echo_reply("Write a passage.\nQuestion: why did revenue drop?\nPassage:").startswith(
        "1. why did revenue drop? explained\n2. background of why did revenue drop?"
    )
    assert "evidence about last line" in echo_reply("first line\nlast line")


def test_echo_llm_answers_sync_async_and_streaming_alike() -> None:
    llm = EchoLLM()
    prompt = "Query: laptops"
    text = llm.complete(prompt).text
    assert asyncio.run(llm.acomplete(prompt)).text == text
    assert [c.text for c in llm.stream_complete(prompt)] == [text]
    assert llm.is_local and llm.metadata.model_name == "echo"


async def test_echo_llm_waits_without_blocking_the_event_loop() -> None:
    llm = EchoLLM(delay=1.0)
    start = time.perf_counter()
    await asyncio.gather(*(llm.acomplete("Query: q") for _ in range(5)))
    assert time.perf_counter() - start < 4.0  # five waits overlapped, not 5 s in a row
