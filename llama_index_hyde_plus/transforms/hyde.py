"""`HyDE`: search with hypothetical documents instead of the question."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import ClassVar

from llama_index.core.callbacks import CallbackManager
from llama_index.core.llms import LLM
from llama_index.core.prompts import BasePromptTemplate

from ..cache import TransformCache
from ..reliability import CircuitBreaker, RetryPolicy
from ..usage import ModelPrice, Usage
from .base import TransformResult
from .llm_base import DEFAULT_TIMEOUT_S, LLMTransform, UnusableReplyError
from .parsing import dedupe, trim_passage
from .prompts import HYDE_PROMPT

_ECHO = re.compile(
    r"^\s*(?:passage|hypothetical (?:document|passage)|document|answer)\s*:\s*", re.IGNORECASE
)


class HyDE(LLMTransform):
    """Hypothetical Document Embeddings (Gao et al., 2022).

    An LLM writes ``num_passages`` passages that answer the question; each is trimmed
    to ``max_characters`` at a sentence end (else a word break). Dense search embeds
    the passages, plus the question when ``include_query=True``, and searches with the
    mean vector, as the paper does. Keyword and hybrid search get the passage text
    (``query + "\\n\\n" + passage`` with ``include_query=True``).

    ``temperature`` is passed to the LLM call when set; the paper samples several
    passages at 0.7, so set it when ``num_passages > 1`` or every passage is the same.
    ``timeout`` bounds each LLM call in seconds. ``prices`` overrides the price table
    per model id. The prompt key for ``update_prompts`` is ``"hyde_prompt"``.
    """

    method: ClassVar[str] = "hyde"
    prompt_key: ClassVar[str] = "hyde_prompt"
    default_prompt: ClassVar[str] = HYDE_PROMPT

    def __init__(
        self,
        llm: LLM | None = None,
        *,
        prompt: str | BasePromptTemplate | None = None,
        max_characters: int = 2000,
        include_query: bool = False,
        num_passages: int = 1,
        temperature: float | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        prices: Mapping[str, ModelPrice] | None = None,
        callback_manager: CallbackManager | None = None,
        cache: TransformCache | None = None,
        retry: RetryPolicy | None = None,
        breaker: CircuitBreaker | bool = True,
    ) -> None:
        if isinstance(max_characters, bool) or not isinstance(max_characters, int):
            raise TypeError("max_characters must be an int")
        if max_characters < 1:
            raise ValueError("max_characters must be >= 1")
        if isinstance(num_passages, bool) or not isinstance(num_passages, int):
            raise TypeError("num_passages must be an int")
        if not 1 <= num_passages <= 16:
            raise ValueError("num_passages must be between 1 and 16")
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
        self.max_characters = max_characters
        self.include_query = bool(include_query)
        self.num_passages = num_passages

    def _params(self) -> dict[str, object]:
        # include_query only changes how passages are searched, not the passages
        return {
            "temperature": self.temperature,
            "max_characters": self.max_characters,
            "num_passages": self.num_passages,
        }

    def _num_calls(self) -> int:
        return self.num_passages

    def _build(self, query: str, replies: list[str], usage: Usage) -> TransformResult:
        passages = [trim_passage(_ECHO.sub("", r), self.max_characters) for r in replies]
        passages = [p for p in passages if p]
        if not passages:
            raise UnusableReplyError("the LLM returned an empty passage")
        if len(passages) > 1 and len(dedupe(passages)) < len(passages):
            # identical samples add nothing to the mean; keep the weight honest
            passages = dedupe(passages)
        return TransformResult(
            query=query,
            method=self.method,
            queries=(query,),
            hypothetical=tuple(passages),
            include_query=self.include_query,
            usage=usage,
        )
