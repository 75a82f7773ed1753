"""`LLMOptions`: the keyword options every built-in LLM transform takes, declared once.

A transform's own options (HyDE's ``num_passages``, MultiQuery's ``n``) are explicit
keyword arguments of its class; these shared ones arrive as ``**options`` typed with
``Unpack[LLMOptions]``, so editors and mypy still check them by name.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from llama_index.core.callbacks import CallbackManager
from llama_index.core.prompts import BasePromptTemplate

from .._checks import check_number
from ..caching.cache import TransformCache
from ..caching.keys import NOT_GENERATION_OPTIONS
from ..calls.reliability import MAX_SECONDS, CircuitBreaker, RetryPolicy
from ..usage import ModelPrice
from .base import QueryTransformer

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


def constructor_options(cls: type[QueryTransformer]) -> tuple[str, ...]:
    """The keyword-only parameters of ``cls``'s constructor in order, then, for a class
    that calls an LLM and takes ``**options``, the `LLMOptions` names; none for a class
    without a constructor of its own."""
    owner = next(c for c in cls.__mro__ if "__init__" in vars(c))
    if owner in QueryTransformer.__mro__:
        return ()  # QueryTransformer's or LlamaIndex's constructor: no options
    params = inspect.signature(cls.__init__).parameters.values()
    names = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    if cls.uses_llm and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        names.extend(sorted(LLM_OPTION_NAMES))
    return tuple(names)


@functools.cache
def generation_options(
    cls: type[QueryTransformer], search_options: frozenset[str]
) -> tuple[str, ...]:
    """The options of ``cls`` in its cache key: its `constructor_options` but
    `NOT_GENERATION_OPTIONS` and ``search_options`` (the class's ``SEARCH_OPTIONS``)."""
    skip = NOT_GENERATION_OPTIONS | search_options
    return tuple(name for name in constructor_options(cls) if name not in skip)


def check_option_names(owner: str, options: Mapping[str, Any]) -> None:
    """A `TypeError` like Python's own for a keyword ``owner`` does not take."""
    for key in options:
        if key not in LLM_OPTION_NAMES:
            raise TypeError(f"{owner}() got an unexpected keyword argument {key!r}")


def check_options(owner: str, options: Mapping[str, Any]) -> None:
    """Every `LLMOptions` value in ``options`` checked up front, here and only here: a
    `TypeError` (wrong type; a bool is not a number) or a `ValueError` (out of range)
    naming the option, so that a bad value never reaches a call, where it would make
    every call fall back (``retry="3"``, ``callback_manager=object()``,
    ``prices={"m": 5}``) or leave a breaker stuck.

    Args:
        owner: the transform's class name, for an unknown keyword's error.
        options: the keyword options as given (absent keys keep their defaults).
    """
    check_option_names(owner, options)
    get = options.get
    if get("temperature") is not None:
        check_number(get("temperature"), "temperature", 0.0, 2.0)
    if get("timeout") is not None:
        check_number(get("timeout"), "timeout", 0.0, MAX_SECONDS)
        if get("timeout") == 0:
            raise ValueError("timeout must be > 0 seconds (and finite), or None")
    _check_type(get("cache"), "cache", TransformCache, "a TransformCache (get and set)")
    _check_type(get("retry"), "retry", RetryPolicy, "a RetryPolicy")
    _check_type(get("breaker"), "breaker", CircuitBreaker, "a CircuitBreaker")
    _check_type(get("callback_manager"), "callback_manager", CallbackManager, "a CallbackManager")
    _check_type(get("prompt"), "prompt", (str, BasePromptTemplate), "a string or a template")
    check_prices(get("prices"))
    profile = get("profile", "auto")
    if not isinstance(profile, str) or profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, not {profile!r}")


def check_prices(prices: Any) -> None:
    """A `TypeError` / `ValueError` naming ``prices`` unless it is None or what the
    docs call a price table: a mapping of model ids (non-empty strings) to
    `ModelPrice` (USD per 1M input and output tokens), like `usage.PRICE_TABLE`."""
    if prices is None:
        return
    if not isinstance(prices, Mapping):
        raise TypeError(
            "prices must map model ids to ModelPrice, like {'my-model': "
            f"ModelPrice(input_per_mtok=0.3, output_per_mtok=1.2)}}, not {type(prices).__name__}"
        )
    for model, price in prices.items():
        if not isinstance(model, str) or not model:
            raise TypeError(f"prices: each key must be a model id (a string), not {model!r}")
        if not isinstance(price, ModelPrice):
            raise TypeError(
                f"prices[{model!r}] must be a ModelPrice(input_per_mtok=..., "
                f"output_per_mtok=...), not {type(price).__name__}"
            )


def _check_type(value: Any, name: str, kind: type | tuple[type, ...], what: str) -> None:
    """A `TypeError` naming ``name`` unless ``value`` is None or a ``kind``."""
    if value is not None and not isinstance(value, kind):
        raise TypeError(f"{name} must be {what} or None, not {type(value).__name__}")


def breaker_from(options: Mapping[str, Any], name: str) -> CircuitBreaker | None:
    """The breaker ``options`` ask for: a new one named ``name`` when absent, none for
    ``None``; anything else but a `CircuitBreaker` is a `TypeError`."""
    if "breaker" not in options:
        return CircuitBreaker(name=name)
    breaker = options["breaker"]
    if breaker is None or isinstance(breaker, CircuitBreaker):
        return breaker
    raise TypeError("breaker must be a CircuitBreaker or None")
