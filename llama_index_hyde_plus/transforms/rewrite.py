"""`Rewrite`: one cleaned-up query in place of the user's raw one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from llama_index.core.callbacks import CallbackManager
from llama_index.core.llms import LLM
from llama_index.core.prompts import BasePromptTemplate

from ..cache import TransformCache
from ..reliability import CircuitBreaker, RetryPolicy
from ..usage import ModelPrice
from ._listing import QueryListTransform
from .llm_base import DEFAULT_TIMEOUT_S
from .parsing import MAX_QUERY_CHARACTERS
from .prompts import REWRITE_PROMPT


class Rewrite(QueryListTransform):
    """A single rewritten query (spelling fixed, abbreviations expanded, filler
    dropped) searched instead of the original. Prompt key: ``"rewrite_prompt"``."""

    method: ClassVar[str] = "rewrite"
    prompt_key: ClassVar[str] = "rewrite_prompt"
    default_prompt: ClassVar[str] = REWRITE_PROMPT
    DEFAULT_ORIGINAL_WEIGHT: ClassVar[float] = 50.0
    """Tuned on SciFact train with the local models (BENCHMARKS.md)."""
    parse_excludes_query: ClassVar[bool] = False

    def __init__(
        self,
        llm: LLM | None = None,
        *,
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
            n=1,
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
