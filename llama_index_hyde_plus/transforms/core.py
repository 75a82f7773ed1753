"""`CoreTransform`: any LlamaIndex core ``BaseQueryTransform`` as a `QueryTransformer`.

So a `TransformRetriever` wraps a user's own core transform, or core's
``HyDEQueryTransform`` / ``DecomposeQueryTransform``, with this package's fallback,
usage accounting and events: the core transform's ``run`` is called with the question,
and the ``QueryBundle`` it returns is searched as core's own ``TransformRetriever``
would search it (its ``query_str`` as the text, its ``embedding`` as given, else its
``embedding_strs`` averaged into the vector). Under a ``TransformRetriever`` it is
given the caller's own bundle (`caller_bundle`), as core gives it. An exception from
it becomes a fallback to the question's own search. On the async path it runs in a
worker thread (core transforms are blocking).

Usage: the LLM calls the core transform makes are read from LlamaIndex's
instrumentation events (``LLMCompletionEndEvent`` / ``LLMChatEndEvent``) raised while it
runs, in this context only, and priced like this package's own calls.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

from llama_index.core.indices.query.query_transform.base import BaseQueryTransform
from llama_index.core.prompts.mixin import PromptMixinType
from llama_index.core.schema import QueryBundle

from .._checks import is_number
from ..calls import door
from ..calls.door import Deadline, ModelTimeoutError
from ..calls.llm import model_name
from ..calls.reliability import LLMTimeoutError
from ..calls.timeouts import is_local, timeout_for
from ..usage import Usage, sum_usage, usage_for_call
from .base import QueryTransformer, SearchSpec, TransformResult

_POLICY: Any = object()
"""``timeout`` left out: the one timeout policy for the core transform's LLM."""
_CALLS: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "hyde_plus_core_calls", default=None
)
_CALLER_BUNDLE: contextvars.ContextVar[QueryBundle | None] = contextvars.ContextVar(
    "hyde_plus_core_caller_bundle", default=None
)
"""The bundle the caller of a search gave (`caller_bundle`), for a core transform."""
_listening = threading.Lock()
_handler: Any = None


@contextlib.contextmanager
def caller_bundle(bundle: QueryBundle | None) -> Iterator[None]:
    """Within it, a `CoreTransform` of the question ``bundle.query_str`` is given
    ``bundle`` itself (its ``custom_embedding_strs``, ``embedding``), as core's
    ``TransformRetriever`` gives its transform the caller's bundle; ``TransformRetriever``
    sets it around its transform call (in this context only: the worker thread a core
    transform runs on copies it)."""
    token = _CALLER_BUNDLE.set(bundle)
    try:
        yield
    finally:
        _CALLER_BUNDLE.reset(token)


def _listen() -> None:
    """Add, once per process, the instrumentation handler that hands LLM end events
    to the `CoreTransform` running in the current context (and ignores the rest)."""
    global _handler  # one handler per process, as LlamaIndex's own are
    with _listening:
        if _handler is not None:
            return
        from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
        from llama_index.core.instrumentation.event_handlers import BaseEventHandler
        from llama_index.core.instrumentation.events import BaseEvent
        from llama_index.core.instrumentation.events.llm import (
            LLMChatEndEvent,
            LLMCompletionEndEvent,
        )

        class _Collect(BaseEventHandler):
            @classmethod
            def class_name(cls) -> str:
                return "HydePlusCoreTransformUsage"

            def handle(self, event: BaseEvent, **kwargs: Any) -> None:
                calls = _CALLS.get()
                if calls is not None and isinstance(
                    event, (LLMCompletionEndEvent, LLMChatEndEvent)
                ):
                    calls.append(event)

        _handler = _Collect()
        get_dispatcher().add_event_handler(_handler)


def _usage_of(events: list[Any], llm: Any) -> Usage:
    """The usage of the LLM calls in ``events``: a chat call that wraps a completion
    (a ``CustomLLM`` answering ``chat`` through ``complete``) counts once."""
    completions: list[tuple[str, str, Any, Any]] = []
    chats: list[tuple[str, str, Any, Any]] = []
    for event in events:
        response = event.response
        if response is None:
            continue
        if hasattr(event, "prompt"):
            text = response.text or ""
            completions.append((event.prompt, text, response.raw, response.additional_kwargs))
        else:
            prompt = "\n".join(str(m.content or "") for m in event.messages)
            text = str(response.message.content or "")
            chats.append((prompt, text, response.raw, response.additional_kwargs))
    answered = {text for _, text, _, _ in completions}
    calls = completions + [c for c in chats if c[1] not in answered]
    name = model_name(llm) if llm is not None else None
    local = is_local(llm) if llm is not None else False
    return sum_usage(
        [
            usage_for_call(
                prompt=prompt,
                completion=text,
                raw=raw,
                additional_kwargs=extra,
                model=name,
                local=local,
            )
            for prompt, text, raw, extra in calls
        ]
    )


class CoreTransform(QueryTransformer):
    """A LlamaIndex core ``BaseQueryTransform`` run as this package's transform.

    `TransformRetriever` wraps any core transform in one automatically; build one
    yourself to compose it (``CoreTransform(core).then(...)`` is refused like any
    transform that is not a `QueryTransformer` chain stage would be, since a core
    transform returns one bundle).

    Args:
        transform: the core transform (``HyDEQueryTransform(llm=...)``, your own
            subclass...). Its prompts stay reachable through ``get_prompts`` /
            ``update_prompts`` under the module key ``query_transform``.
        metadata: passed to every ``run`` (core's ``transform_metadata``), e.g. the
            ``prev_reasoning`` a ``StepDecomposeQueryTransform`` reads.
    """

    include_query = True

    def __init__(
        self,
        transform: BaseQueryTransform,
        *,
        metadata: dict[str, Any] | None = None,
        timeout: Any = _POLICY,
    ) -> None:
        if not isinstance(transform, BaseQueryTransform) or isinstance(transform, QueryTransformer):
            raise TypeError(
                "transform must be a LlamaIndex BaseQueryTransform that is not already a "
                f"QueryTransformer, not {type(transform).__name__}"
            )
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError(f"metadata must be a dict or None, not {type(metadata).__name__}")
        given = timeout is not _POLICY and timeout is not None
        if given and (not is_number(timeout) or not 0 < timeout < 1e6):
            raise ValueError("timeout must be > 0 seconds (and finite), or None")
        super().__init__()
        self.core = transform
        self.metadata = metadata
        self._timeout = timeout

    @property
    def method(self) -> str:  # type: ignore[override]
        return type(self.core).__name__

    @property
    def timeout(self) -> float | None:
        """Seconds one run of the core transform may take: ``timeout`` when given (None:
        no bound), else the one policy for its LLM (`timeouts.timeout_for`)."""
        if self._timeout is not _POLICY:
            return self._timeout  # type: ignore[no-any-return]
        return timeout_for(getattr(self.core, "_llm", None))

    def _get_prompt_modules(self) -> PromptMixinType:
        return {"query_transform": self.core}

    def _run(self, query_bundle: QueryBundle, metadata: dict[str, Any]) -> QueryBundle:
        """As a core transform itself (handed to a core engine): the core transform's
        bundle as it returns it, with the run's metadata over the constructor's."""
        return self.core.run(query_bundle, {**(self.metadata or {}), **metadata})

    def _run_core(self, query: str) -> tuple[QueryBundle, list[Any]]:
        """The core transform's ``run`` (blocking) and the LLM events it raised."""
        _listen()
        calls: list[Any] = []
        token = _CALLS.set(calls)
        given = _CALLER_BUNDLE.get()
        if given is None or given.query_str != query:
            given = QueryBundle(query_str=query, custom_embedding_strs=[query])
        try:
            bundle = self.core.run(given, self.metadata)
        finally:
            _CALLS.reset(token)
        return bundle, calls

    def _bounded(self) -> dict[str, Any]:
        """How `door.run` makes the run: on its LLM's worker threads (a hung provider
        holds only its own), within ``timeout``."""
        provider = getattr(self.core, "_llm", None) or self.core
        deadline = Deadline.start(self.timeout)
        return {"on": provider, "deadline": deadline, "what": self.method}

    def transform(self, query: str) -> TransformResult:
        """Run the core transform on ``query`` (within ``timeout``, on its LLM's worker
        threads); the bundle it returns as one search."""
        try:
            found = door.run(partial(self._run_core, query), **self._bounded())
        except ModelTimeoutError as exc:
            raise LLMTimeoutError(str(exc)) from None
        return self._result(query, *found)

    async def atransform(self, query: str) -> TransformResult:
        """Async twin of `transform`: the run in a worker thread, never on the event loop
        or its default executor; cancelling the await abandons it."""
        try:
            found = await door.arun(partial(self._run_core, query), **self._bounded())
        except ModelTimeoutError as exc:
            raise LLMTimeoutError(str(exc)) from None
        return self._result(query, *found)

    def _result(self, query: str, bundle: Any, calls: list[Any]) -> TransformResult:
        if not isinstance(bundle, QueryBundle):
            raise TypeError(
                f"{type(self.core).__name__}.run() must return a QueryBundle, "
                f"not {type(bundle).__name__}"
            )
        text = bundle.query_str if bundle.query_str.strip() else query  # as core passes it
        strs = tuple(s for s in bundle.embedding_strs if isinstance(s, str) and s.strip())
        strs = strs or (text,)
        vector = None if bundle.embedding is None else tuple(float(x) for x in bundle.embedding)
        return TransformResult(
            query=query,
            method=self.method,
            queries=(text,),
            hypothetical=tuple(s for s in dict.fromkeys(strs) if s not in (query, text)),
            include_query=False,
            usage=_usage_of(calls, getattr(self.core, "_llm", None)),
            specs=(SearchSpec(text=text, embedding_strs=strs, embedding=vector),),
        )


def as_transformer(
    transform: QueryTransformer | BaseQueryTransform, metadata: dict[str, Any] | None = None
) -> QueryTransformer:
    """``transform`` as a `QueryTransformer`: ours as is, a core ``BaseQueryTransform``
    wrapped in a `CoreTransform` (with ``metadata``, core's ``transform_metadata``);
    anything else is a `TypeError` naming ``transformer``."""
    if isinstance(transform, QueryTransformer):
        if metadata is not None:
            raise ValueError(
                "transform_metadata is passed to a core BaseQueryTransform's run(); "
                f"{type(transform).__name__} takes its options in its constructor"
            )
        return transform
    if isinstance(transform, BaseQueryTransform):
        return CoreTransform(transform, metadata=metadata)
    raise TypeError(
        "transformer must be a QueryTransformer or a LlamaIndex BaseQueryTransform, "
        f"not {type(transform).__name__}"
    )
