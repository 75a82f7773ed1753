"""Instrumentation events around every transform, on LlamaIndex's dispatcher.

Attach a handler the usual way (``get_dispatcher().add_event_handler(h)``) and each
transform run emits a `QueryTransformStartEvent` and a `QueryTransformEndEvent`
carrying what was generated, so observability tools show what was actually searched.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.events import BaseEvent
from llama_index_instrumentation.event_handlers.null import NullEventHandler

dispatcher = get_dispatcher(__name__)


def listening() -> bool:
    """Whether any event handler other than LlamaIndex's null handler would see our
    events (the events are not built at all otherwise)."""
    current: Any = dispatcher
    while current is not None:
        if any(not isinstance(h, NullEventHandler) for h in current.event_handlers):
            return True
        current = current.parent if current.propagate else None
    return False


class QueryTransformStartEvent(BaseEvent):
    """A transform is about to rewrite ``query``."""

    query: str
    method: str

    @classmethod
    def class_name(cls) -> str:
        """The event's name in LlamaIndex's instrumentation."""
        return "QueryTransformStartEvent"


class QueryTransformEndEvent(BaseEvent):
    """A transform finished: its queries, passages, usage and whether it fell back."""

    query: str
    method: str
    queries: list[str]
    hypothetical: list[str]
    include_query: bool
    usage: dict[str, Any]
    fallback: bool
    error: str | None = None
    latency_s: float = 0.0

    @classmethod
    def class_name(cls) -> str:
        """The event's name in LlamaIndex's instrumentation."""
        return "QueryTransformEndEvent"
