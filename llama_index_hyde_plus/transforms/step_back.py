"""`StepBack`: search for the general principle behind a specific question."""

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
from .prompts import STEP_BACK_PROMPT


class StepBack(QueryListTransform):
    """One more general "step-back" question (Zheng et al., 2023), searched with the
    original question when ``include_query`` (default True), fused with RRF.
    Prompt key: ``"step_back_prompt"``."""

    method: ClassVar[str] = "step-back"
    prompt_key: ClassVar[str] = "step_back_prompt"
    default_prompt: ClassVar[str] = STEP_BACK_PROMPT
    DEFAULT_ORIGINAL_WEIGHT: ClassVar[float] = 50.0
    """Tuned on SciFact train with the local models (BENCHMARKS.md)."""

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
