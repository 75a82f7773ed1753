"""`Condense`: a follow-up message and the chat so far as one standalone question."""

from __future__ import annotations

import contextvars
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.llms import LLM
from llama_index.core.memory.types import BaseMemory

from .._checks import check_int, validate_query
from ..calls import door
from ..calls.door import Deadline, await_within
from ..calls.reliability import describe
from ._listing import QueryListTransform
from .base import TransformResult
from .options import LLMOptions
from .parsing import MAX_QUERY_CHARACTERS
from .prompts import CONDENSE_PROMPT
from .templates import render_template as _render_template

if TYPE_CHECKING:
    from typing_extensions import Unpack

History = tuple[str, ...]
"""The conversation as it reaches the prompt: one ``"User: ..."`` or
``"Assistant: ..."`` line per message, oldest first."""

_SPEAKERS = {MessageRole.USER: "User", MessageRole.ASSISTANT: "Assistant"}
_ROLES = {"user": MessageRole.USER, "assistant": MessageRole.ASSISTANT}

REFERRING_WORDS = frozenset(
    [
        "it",
        "its",
        "it's",
        "itself",
        "they",
        "them",
        "their",
        "theirs",
        "themselves",
        "this",
        "that",
        "these",
        "those",
        "he",
        "him",
        "his",
        "himself",
        "she",
        "her",
        "hers",
        "herself",
        "there",
        "then",
        "one",
        "ones",
        "other",
        "others",
        "another",
        "else",
        "also",
        "too",
        "same",
        "former",
        "latter",
        "above",
        "previous",
        "mentioned",
        "aforementioned",
        "such",
        "both",
        "either",
        "neither",
    ]
)
"""Words that point back into a conversation: a message holding one of them is
always condensed (`Condense.stands_alone`)."""

_WORD = re.compile(r"[\w']+")

MEMORY = "the chat memory"
"""What a memory is called in errors. A sync read runs on the memory's own threads
(`calls.door`, ``kind="store"``), so a memory that hangs is given up at the
transform's ``timeout`` and the message is searched as written."""

_CALL_HISTORY: contextvars.ContextVar[History | None] = contextvars.ContextVar(
    "hyde_plus_chat_history", default=None
)


def read_messages(messages: Any, name: str = "chat_history") -> list[ChatMessage]:
    """``messages`` as LlamaIndex ``ChatMessage`` objects: a sequence of
    ``ChatMessage`` or of ``{"role": ..., "content": ...}`` mappings (the OpenAI
    shape, as RCP sends it). Anything else is a `TypeError` / `ValueError` naming
    ``name`` and the item."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"{name} must be a list of chat messages, not {type(messages).__name__}")
    out: list[ChatMessage] = []
    for i, item in enumerate(messages):
        if isinstance(item, ChatMessage):
            out.append(item)
            continue
        if not isinstance(item, Mapping):
            raise TypeError(
                f"{name}[{i}] must be a ChatMessage or a {{role, content}} mapping, "
                f"not {type(item).__name__}"
            )
        role, content = item.get("role"), item.get("content")
        if role not in _ROLES:
            raise ValueError(f"{name}[{i}].role must be 'user' or 'assistant', not {role!r}")
        if not isinstance(content, str):
            raise TypeError(f"{name}[{i}].content must be a string")
        out.append(ChatMessage(role=_ROLES[role], content=content))
    return out


@contextmanager
def chat_history(messages: Sequence[ChatMessage] | Sequence[Mapping[str, Any]]) -> Iterator[None]:
    """Within the block, every `Condense` without a ``chat_history`` argument of its own
    reads ``messages`` as the conversation so far (instead of its ``memory``): how a
    `TransformRetriever` search, a chat engine's retrieval or a chain gets the chat of
    the one request it serves. Per task and thread (a context variable), so concurrent
    requests never see each other's chat. Checked here (`read_messages`)."""
    token = _CALL_HISTORY.set(_lines(read_messages(messages)))
    try:
        yield
    finally:
        _CALL_HISTORY.reset(token)


def _lines(messages: Sequence[ChatMessage]) -> History:
    """The user and assistant messages with text, as prompt lines (system prompts, tool
    calls and tool results are not the conversation a question refers to)."""
    out = []
    for message in messages:
        speaker = _SPEAKERS.get(message.role)
        text = (message.content or "").strip() if speaker else ""
        if text:
            out.append(f"{speaker}: {' '.join(text.split())}")
    return tuple(out)


class Condense(QueryListTransform):
    """The latest message rewritten, with the chat so far, as a question that can be
    searched on its own ("and for the enterprise plan?" after a question on pricing:
    "What does the enterprise plan cost?"). Prompt key: ``"condense_prompt"``; the
    prompt may use ``{history}`` as well as ``{query}``.

    The conversation, the first of: the ``chat_history`` argument of `transform`;
    the messages of an enclosing `chat_history` block; ``memory``, any LlamaIndex
    ``BaseMemory`` (``Memory``, ``ChatMemoryBuffer``, ``ChatSummaryMemoryBuffer``)
    shared with a chat engine or an agent, read at each call (``get()``, or ``aget()``
    on the async path) within the transform's ``timeout`` (a memory that fails or hangs:
    the message as written). Only user and assistant messages with text count; a last
    user message equal to the one being condensed (an agent has stored it already) is
    dropped. What reaches the prompt is bounded: the last ``history_messages`` user and
    assistant messages (6: three exchanges), newest first within ``history_characters``
    characters (an older message that does not fit is cut at its end, and nothing older
    is kept).

    No call (zero usage, ``skipped`` says why) when there is no conversation, or the
    message stands alone (`stands_alone`: at least ``standalone_words`` words and no
    word of `REFERRING_WORDS`; ``standalone_words=None`` condenses every message that
    has history). The message as written is searched too (``include_query``), fused
    with the condensed question at ``original_weight``, so a wrong condense cannot lose
    what the user typed. A failed call, an unusable reply or an unreadable memory
    searches the message as written (``fallback``).
    """

    method: ClassVar[str] = "condense"
    default_prompt: ClassVar[str] = CONDENSE_PROMPT
    prompt_vars: ClassVar[frozenset[str]] = frozenset({"query", "history"})
    SHIPPED_ORIGINAL_WEIGHT: ClassVar[dict[str, float]] = {"small": 2.0, "capable": 0.25}
    """The message's own list against the condensed question's, by generator: chosen on
    the train split of a QReCC sample (223 follow-ups of 54 conversations) among 0.1 to
    100, with the bundled model for ``small`` (2: its condensed question moves the
    ranking, the message as written still leads) and the stand-in that writes the human
    rewrite for ``capable`` (0.25: the condensed question leads, the message breaks its
    ties) (`benchmarks/conversational.py choose`)."""
    parse_excludes_query: ClassVar[bool] = False
    SEARCH_OPTIONS: ClassVar[frozenset[str]] = QueryListTransform.SEARCH_OPTIONS | {
        "memory",
        "history_messages",
        "history_characters",
        "standalone_words",
    }
    """Not generation options of their own: the history that ``memory`` gives and the
    ``history_*`` bounds keep is in the cache key as the prompt it renders (and as
    ``context``); ``standalone_words`` decides whether to call, not what is written."""

    def __init__(
        self,
        llm: LLM | None = None,
        *,
        memory: BaseMemory | None = None,
        history_messages: int = 6,
        history_characters: int = 2000,
        standalone_words: int | None = 8,
        include_query: bool = True,
        original_weight: float | None = None,
        rrf_k: int | None = None,
        max_characters: int = MAX_QUERY_CHARACTERS,
        **options: Unpack[LLMOptions],
    ) -> None:
        if memory is not None and not isinstance(memory, BaseMemory):
            raise TypeError(
                "memory must be a LlamaIndex memory (Memory, ChatMemoryBuffer), "
                f"not {type(memory).__name__}"
            )
        check_int(history_messages, "history_messages", 1, 100)
        check_int(history_characters, "history_characters", 1, 100_000)
        if standalone_words is not None:
            check_int(standalone_words, "standalone_words", 1, 1000)
        super().__init__(
            llm,
            include_query=include_query,
            original_weight=original_weight,
            rrf_k=rrf_k,
            max_characters=max_characters,
            **options,
        )
        self.memory = memory
        self.history_messages = history_messages
        self.history_characters = history_characters
        self.standalone_words = standalone_words

    # -- the conversation ------------------------------------------------------------
    def stands_alone(self, query: str) -> bool:
        """Whether ``query`` is searched as written without a call: it has at least
        ``standalone_words`` words and none of `REFERRING_WORDS` (a cheap rule; a
        message it misjudges is still searched as written either way)."""
        if self.standalone_words is None:
            return False
        words = [w.lower() for w in _WORD.findall(query)]
        return len(words) >= self.standalone_words and not REFERRING_WORDS.intersection(words)

    def bounded(self, lines: Sequence[str], query: str) -> History:
        """What of the conversation ``lines`` reaches the prompt for ``query`` (see the
        class: the last turns, within the characters, without the message itself)."""
        lines = list(lines)
        if lines and lines[-1] == f"User: {' '.join(query.split())}":
            lines.pop()
        kept: list[str] = []
        room = self.history_characters
        for line in reversed(lines[-self.history_messages :]):
            if room <= 0:
                break
            kept.append(line if len(line) <= room else line[: room - 1].rstrip() + "…")
            room -= len(kept[-1])
        return tuple(reversed(kept))

    def _given_lines(self, chat_history: Any) -> History | None:
        """The per-call conversation: the argument, else an enclosing `chat_history`."""
        if chat_history is not None:
            return _lines(read_messages(chat_history))
        return _CALL_HISTORY.get()

    # -- the call ----------------------------------------------------------------------
    def transform(
        self,
        query: str,
        *,
        chat_history: Sequence[ChatMessage] | Sequence[Mapping[str, Any]] | None = None,
        context: Sequence[str] | None = None,
    ) -> TransformResult:
        """The standalone question for ``query`` (see the class for where the
        conversation comes from); ``context`` is not used (nothing is grounded)."""
        validate_query(query)
        start = time.perf_counter()
        lines = self._given_lines(chat_history)
        if lines is None and self.memory is not None:
            try:
                read = door.run(
                    self.memory.get,
                    on=self.memory,
                    kind="store",
                    deadline=Deadline.start(self.timeout),
                    what=MEMORY,
                )
                lines = _lines(read)
            except Exception as exc:
                return self._unread(query, exc, start)
        return self._condensed(query, lines, start) or super().transform(
            query, context=self.bounded(lines or (), query)
        )

    async def atransform(
        self,
        query: str,
        *,
        chat_history: Sequence[ChatMessage] | Sequence[Mapping[str, Any]] | None = None,
        context: Sequence[str] | None = None,
    ) -> TransformResult:
        """Async twin of `transform` (the memory read with ``aget``)."""
        validate_query(query)
        start = time.perf_counter()
        lines = self._given_lines(chat_history)
        if lines is None and self.memory is not None:
            try:
                read = await await_within(self.memory.aget(), Deadline.start(self.timeout), MEMORY)
                lines = _lines(read)
            except Exception as exc:
                return self._unread(query, exc, start)
        return self._condensed(query, lines, start) or await super().atransform(
            query, context=self.bounded(lines or (), query)
        )

    def _condensed(self, query: str, lines: History | None, start: float) -> TransformResult | None:
        """The message as written, with no call, when there is nothing to condense;
        None when the LLM is to be asked."""
        history = self.bounded(lines or (), query)
        if not history:
            reason = "no chat history: the message is searched as written"
        elif self.stands_alone(query):
            reason = "the message stands alone: searched as written"
        else:
            return None
        return TransformResult(
            query=query,
            method=self.method,
            queries=(),
            skipped=reason,
            latency_s=time.perf_counter() - start,
            **self._search_fields(),
        )

    def _unread(self, query: str, exc: BaseException, start: float) -> TransformResult:
        """The message as written when the memory could not be read."""
        return self._fallback(query, [RuntimeError(f"memory unreadable: {describe(exc)}")], start)

    def _context(self, context: Sequence[str] | None) -> tuple[str, ...] | None:
        # the bounded history, passed on by `transform`: keyed (``context``) and rendered
        return tuple(context) if context else None

    def _render(self, query: str, context: Sequence[str] | None = None) -> str:
        return _render_template(self._prompt, query=query, history="\n".join(context or ()))

    def _instruction(self) -> str:
        # what an echo of the prompt repeats: its text without question or history
        return _render_template(self._prompt, query="", history="")
