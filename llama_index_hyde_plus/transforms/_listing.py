"""Shared constructor and parsing for the transforms whose reply is a list of queries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from llama_index.core.callbacks import CallbackManager
from llama_index.core.llms import LLM
from llama_index.core.prompts import BasePromptTemplate

from ..cache import TransformCache
from ..reliability import CircuitBreaker, RetryPolicy
from ..usage import ModelPrice, Usage
from .base import TransformResult
from .llm_base import DEFAULT_TIMEOUT_S, LLMTransform, UnusableReplyError
from .parsing import MAX_QUERY_CHARACTERS, parse_queries

MAX_N = 10


class QueryListTransform(LLMTransform):
    """An LLM transform whose reply parses to at most ``n`` search queries, each at most
    ``max_characters`` long (trimmed at a sentence end, else a word break)."""

    prompt_vars: ClassVar[frozenset[str]] = frozenset({"query", "n"})

    def __init__(
        self,
        llm: LLM | None = None,
        *,
        n: int,
        include_query: bool,
        prompt: str | BasePromptTemplate | None = None,
        temperature: float | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        prices: Mapping[str, ModelPrice] | None = None,
        callback_manager: CallbackManager | None = None,
        cache: TransformCache | None = None,
        retry: RetryPolicy | None = None,
        breaker: CircuitBreaker | bool = True,
        max_characters: int = MAX_QUERY_CHARACTERS,
    ) -> None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError("n must be an int")
        if isinstance(max_characters, bool) or not isinstance(max_characters, int):
            raise TypeError("max_characters must be an int")
        if max_characters < 1:
            raise ValueError("max_characters must be >= 1")
        if not 1 <= n <= MAX_N:
            raise ValueError(f"n must be between 1 and {MAX_N}")
        super().__init__(
            llm,
            prompt=prompt,
            temperature=temperature,
            timeout=timeout,
            prices=prices,
            callback_manager=callback_manager,
            cache=cache,
            retry=retry,
            breaker=breaker,
        )
        self.n = n
        self.include_query = bool(include_query)
        self.max_characters = max_characters

    def _params(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "n": self.n,
            "include_query": self.include_query,
            "max_characters": self.max_characters,
        }

    def _format_vars(self) -> dict[str, Any]:
        return {"n": self.n} if "n" in self._prompt.template_vars else {}

    def _build(self, query: str, replies: list[str], usage: Usage) -> TransformResult:
        exclude = (query,) if self.include_query else ()
        limit = self.max_characters
        queries = parse_queries(replies[0], self.n, exclude=exclude, max_characters=limit)
        if not queries:
            if parse_queries(replies[0], 1, max_characters=limit):
                # the model only repeated the question: nothing new, but not a failure
                queries = [query]
            else:
                raise UnusableReplyError("no query could be parsed from the reply")
        return TransformResult(
            query=query,
            method=self.method,
            queries=tuple(queries),
            include_query=self.include_query,
            usage=usage,
        )
