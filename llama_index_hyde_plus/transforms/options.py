"""`LLMOptions`: the keyword options every built-in LLM transform takes, declared once.

A transform's own options (HyDE's ``num_passages``, MultiQuery's ``n``) are explicit
keyword arguments of its class; these shared ones arrive as ``**options`` typed with
``Unpack[LLMOptions]``, so editors and mypy still check them by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from llama_index.core.callbacks import CallbackManager
from llama_index.core.prompts import BasePromptTemplate

from ..cache import TransformCache
from ..reliability import CircuitBreaker, RetryPolicy
from ..usage import ModelPrice

Profile = Literal["auto", "small", "capable"]
"""Which shipped defaults a transform uses (see `LLMOptions`)."""
PROFILES: tuple[str, ...] = ("auto", "small", "capable")


class LLMOptions(TypedDict, total=False):
    """Options shared by HyDE, MultiQuery, StepBack, Decompose and Rewrite.

    - ``prompt``: a template with ``{query}`` (and the transform's other placeholders)
      replacing the default; also swappable later with ``update_prompts``.
    - ``temperature``: passed on every call; ``None`` keeps the LLM's own.
    - ``timeout``: seconds for one LLM call, retries included (absent: the one policy
      of `timeouts.timeout_for`, by the model's kind; ``None``: no bound).
    - ``prices``: USD per 1M tokens by model id, for the cost in ``usage``.
    - ``callback_manager``: where LLM events are reported besides the LLM's own
      manager (``Settings.callback_manager`` when absent).
    - ``cache``: a `TransformCache` of generations (``MemoryCache``, ``SQLiteCache``).
    - ``retry``: a `RetryPolicy` for transient provider errors (the default policy
      when absent).
    - ``breaker``: a `CircuitBreaker` (share one across transforms of one provider);
      absent: a new breaker of the transform's own; ``None``: no breaker.
    - ``profile``: which shipped defaults apply to the options left unset:
      ``"small"`` (tuned for the bundled SmolLM2-135M: the question dominates),
      ``"capable"`` (tuned for a strong model's text), or ``"auto"`` (the default:
      ``"small"`` for the bundled model's name, else ``"capable"``). Shown in ``repr``.
    """

    prompt: str | BasePromptTemplate | None
    temperature: float | None
    timeout: float | None
    prices: Mapping[str, ModelPrice] | None
    callback_manager: CallbackManager | None
    cache: TransformCache | None
    retry: RetryPolicy | None
    breaker: CircuitBreaker | None
    profile: Profile


LLM_OPTION_NAMES: frozenset[str] = frozenset(LLMOptions.__annotations__)
"""The names in `LLMOptions`."""


def check_option_names(owner: str, options: Mapping[str, Any]) -> None:
    """A `TypeError` like Python's own for a keyword ``owner`` does not take."""
    for key in options:
        if key not in LLM_OPTION_NAMES:
            raise TypeError(f"{owner}() got an unexpected keyword argument {key!r}")


def breaker_from(options: Mapping[str, Any], name: str) -> CircuitBreaker | None:
    """The breaker ``options`` ask for: a new one named ``name`` when absent, none for
    ``None``; anything else but a `CircuitBreaker` is a `TypeError`."""
    if "breaker" not in options:
        return CircuitBreaker(name=name)
    breaker = options["breaker"]
    if breaker is None or isinstance(breaker, CircuitBreaker):
        return breaker
    raise TypeError("breaker must be a CircuitBreaker or None")
