from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent

from llama_index_hyde_plus import HyDE, MultiQuery
from llama_index_hyde_plus.events import QueryTransformEndEvent, QueryTransformStartEvent
from llama_index_hyde_plus.testing import ScriptedLLM


class Collect(BaseEventHandler):
    events: list[BaseEvent] = []

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, (QueryTransformStartEvent, QueryTransformEndEvent)):
            self.events.append(event)


@pytest.fixture
def collected() -> Iterator[list[BaseEvent]]:
    handler = Collect(events=[])
    root = get_dispatcher()
    root.add_event_handler(handler)
    try:
        yield handler.events
    finally:
        root.event_handlers.remove(handler)


def test_start_and_end_events_carry_the_generated_passage_and_usage(
    collected: list[BaseEvent],
) -> None:
    HyDE(ScriptedLLM(["A passage."])).transform_safe("Why?")
    start, end = collected
    assert isinstance(start, QueryTransformStartEvent)
    assert (start.query, start.method) == ("Why?", "hyde")
    assert isinstance(end, QueryTransformEndEvent)
    assert end.hypothetical == ["A passage."] and end.fallback is False
    assert end.usage["calls"] == 1 and end.usage["input_tokens"] > 0


async def test_async_events_report_queries_and_fallback(collected: list[BaseEvent]) -> None:
    await MultiQuery(ScriptedLLM(["1. a1\n2. b2"]), n=2).atransform_safe("q")
    await MultiQuery(ScriptedLLM([RuntimeError("down")])).atransform_safe("q")
    ends = [e for e in collected if isinstance(e, QueryTransformEndEvent)]
    assert ends[0].queries == ["a1", "b2"] and not ends[0].fallback
    assert ends[1].fallback and "down" in (ends[1].error or "")
