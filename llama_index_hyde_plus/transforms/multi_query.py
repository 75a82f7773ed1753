"""`MultiQuery`: several paraphrases of the question, searched and fused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from llama_index.core.callbacks import CallbackManager
from llama_index.core.llms import LLM
from llama_index.core.prompts import BasePromptTemplate

from ..cache import TransformCache
from ..fusion import FusionMode
from ..reliability import CircuitBreaker, RetryPolicy
from ..usage import ModelPrice
from ._listing import QueryListTransform
from .llm_base import DEFAULT_TIMEOUT_S
from .parsing import MAX_QUERY_CHARACTERS
from .prompts import MULTI_QUERY_PROMPT


class MultiQuery(QueryListTransform):
    """``n`` differently worded queries for the same need (1 <= n <= 10).

    Each is searched (concurrently, by `TransformRetriever`) along with the original
    question when ``include_query``, and the lists are fused with RRF. Prompt key:
    ``"multi_query_prompt"``; the prompt may use ``{n}`` as well as ``{query}``.
    """

    method: ClassVar[str] = "multi-query"
    prompt_key: ClassVar[str] = "multi_query_prompt"
    default_prompt: ClassVar[str] = MULTI_QUERY_PROMPT
    DEFAULT_ORIGINAL_WEIGHT: ClassVar[float] = 100.0
    """Tuned on SciFact train with the local models (BENCHMARKS.md)."""
    default_fusion: ClassVar[FusionMode] = FusionMode.RRF

    def __init__(
        self,
        llm: LLM | None = None,
        *,
        n: int = 3,
        include_query: bool = True,
        original_weight: float | None = None,
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
        super().__init__(
            llm,
            n=n,
            include_query=include_query,
            original_weight=original_weight,
            prompt=prompt,
            temperature=temperature,
            timeout=timeout,
            prices=prices,
            callback_manager=callback_manager,
            cache=cache,
            retry=retry,
            breaker=breaker,
            max_characters=max_characters,
        )
