"""Token usage and cost of the LLM calls a transform makes.

`Usage` is summed across calls with ``+``. Token counts come from the provider's
response when it carries them (OpenAI-style ``prompt_tokens``/``completion_tokens``,
llama.cpp's identical fields, or Anthropic-style ``input_tokens``/``output_tokens``);
otherwise they are estimated with LlamaIndex's global tokenizer and marked
``usage_source="estimated"``. Cost comes from a price table (USD per million tokens),
a user's own prices (``cost_source="custom"``), is zero for local models
(``"local"``), or is unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from ._checks import check_number

UsageSource = Literal["provider", "estimated", "none"]
"""Where token counts come from: the provider's response, an estimate, or no call."""
CostSource = Literal["price-table", "custom", "local", "unknown", "none"]
"""Where a cost comes from: `PRICE_TABLE`, the caller's ``prices=``, a local model
(free), a model of unknown price, or no call."""


MAX_PRICE = 1e6
"""The highest price per million tokens `ModelPrice` takes (USD)."""


@dataclass(frozen=True)
class ModelPrice:
    """USD per one million input and output tokens: finite numbers from 0 to
    `MAX_PRICE` (a bool is not one; anything else is a `TypeError` or `ValueError`
    naming the field, so a NaN price never turns every cost into NaN)."""

    input_per_mtok: float
    output_per_mtok: float

    def __post_init__(self) -> None:
        for name in ("input_per_mtok", "output_per_mtok"):
            price = check_number(getattr(self, name), f"ModelPrice {name}", 0.0, MAX_PRICE)
            object.__setattr__(self, name, price)

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        """USD for the tokens at these prices.

        Args:
            input_tokens: prompt tokens.
            output_tokens: completion tokens.
        """
        return (
            input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok
        ) / 1_000_000


PRICE_TABLE: Mapping[str, ModelPrice] = {
    "gpt-3.5-turbo": ModelPrice(0.50, 1.50),
    "gpt-4": ModelPrice(30.00, 60.00),
    "gpt-4-turbo": ModelPrice(10.00, 30.00),
    "gpt-4o": ModelPrice(2.50, 10.00),
    "gpt-4o-mini": ModelPrice(0.15, 0.60),
    "gpt-4.1": ModelPrice(2.00, 8.00),
    "gpt-4.1-mini": ModelPrice(0.40, 1.60),
    "gpt-4.1-nano": ModelPrice(0.10, 0.40),
    "gpt-5": ModelPrice(1.25, 10.00),
    "gpt-5-mini": ModelPrice(0.25, 2.00),
    "gpt-5-nano": ModelPrice(0.05, 0.40),
    "o3-mini": ModelPrice(1.10, 4.40),
    "o4-mini": ModelPrice(1.10, 4.40),
}
"""List prices (USD per 1M tokens, standard tier) of common OpenAI models, as
published by OpenAI. Override or extend per model with ``prices=`` on a transform."""

_SOURCE_RANK = {"none": 0, "provider": 1, "estimated": 2}
_COST_RANK = {"none": 0, "local": 1, "price-table": 2, "custom": 3, "unknown": 4}


@dataclass(frozen=True)
class Usage:
    """Tokens and cost of one or more LLM calls.

    When calls of different provenance are added, the result reports the weakest:
    any estimated count makes the sum ``"estimated"``, and any call of unknown price
    makes the cost ``"unknown"`` (the known part is still summed in ``cost``).
    """

    input_tokens: int = 0
    """Prompt tokens, as the provider reported them or estimated (see ``usage_source``)."""
    output_tokens: int = 0
    """Completion tokens, as the provider reported them or estimated (see
    ``usage_source``)."""
    total_tokens: int = 0
    """All tokens, as the provider reported them or estimated (see ``usage_source``)."""
    cost: float = 0.0
    """USD; only the known part when ``cost_source`` is ``"unknown"``."""
    usage_source: UsageSource = "none"
    """``"provider"``, ``"estimated"`` or ``"none"`` (no call)."""
    cost_source: CostSource = "none"
    """``"price-table"``, ``"custom"``, ``"local"``, ``"unknown"`` or ``"none"`` (no call)."""
    calls: int = 0
    """LLM calls made; 0 for a cache hit."""
    cached: bool = field(default=False)
    """Every usage summed was a cache hit's (not kept by `to_dict`)."""
    tokens_saved: int = 0
    """Completion tokens not generated because a streamed reply was stopped once it
    held all that is kept (HyDE's ``max_characters``): at most, since it is the cap
    (``max_tokens``) less the tokens written, and the model may have ended sooner."""

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            cost=self.cost + other.cost,
            usage_source=max(self.usage_source, other.usage_source, key=_SOURCE_RANK.__getitem__),
            cost_source=max(self.cost_source, other.cost_source, key=_COST_RANK.__getitem__),
            calls=self.calls + other.calls,
            cached=self.cached and other.cached,
            tokens_saved=self.tokens_saved + other.tokens_saved,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Usage:
        """The `Usage` of a `to_dict` record; a missing key is zero or ``"none"``
        (and ``cached`` is False).

        Args:
            data: the record.
        """
        return cls(
            input_tokens=int(data.get("input_tokens", 0)),
            output_tokens=int(data.get("output_tokens", 0)),
            total_tokens=int(data.get("total_tokens", 0)),
            cost=float(data.get("cost", 0.0)),
            usage_source=data.get("usage_source", "none"),
            cost_source=data.get("cost_source", "none"),
            calls=int(data.get("calls", 0)),
            tokens_saved=int(data.get("tokens_saved", 0)),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able form, as `from_dict` reads it: every field in order but
        ``cached``, and ``tokens_saved`` only when some were."""
        record = {name: getattr(self, name) for name in _RECORDED}
        if self.tokens_saved:
            record["tokens_saved"] = self.tokens_saved
        return record

    def cost_text(self, places: int = 6) -> str:
        """The cost in words: ``"$0.000420 (price-table)"``, ``"free (local)"``,
        ``"unknown (no price for the model)"``, or, when only some calls had a price,
        ``"over $0.000420 (no price for some calls' model)"``.

        Args:
            places: the decimals of a dollar amount.
        """
        dollars = f"${self.cost:.{places}f}"
        if self.cost_source == "local":
            return "free (local)"
        if self.cost_source == "none":
            return "$0"
        if self.cost_source != "unknown":
            return f"{dollars} ({self.cost_source})"
        if round(self.cost, places) > 0:
            return f"over {dollars} (no price for some calls' model)"
        whose = "some calls'" if self.cost > 0 else "the"
        return f"unknown (no price for {whose} model)"


_RECORDED = tuple(f.name for f in fields(Usage) if f.name not in ("cached", "tokens_saved"))
"""The fields `Usage.to_dict` always keeps, in order (``tokens_saved``, the last field,
only when some were)."""


def sum_usage(usages: list[Usage]) -> Usage:
    """Sum of several usages; an empty list is zero usage.

    Args:
        usages: the usages to add up.
    """
    if len(usages) == 1 and not usages[0].cached:
        return usages[0]  # what adding it to zero makes (frozen: shared as it is)
    total = Usage()
    for usage in usages:
        total = total + usage
    return total


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


MAX_TOKENS_PER_CALL = 100_000_000
"""More tokens than any model reads or writes in one call (context windows are a few
million at most): a larger count is not a count."""


def _token_count(value: Any) -> int | None:
    """``value`` when it can be a provider's token count: an ``int`` (not a bool) from 0
    to `MAX_TOKENS_PER_CALL`; else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= MAX_TOKENS_PER_CALL else None


def provider_token_counts(
    raw: Any, additional_kwargs: Mapping[str, Any] | None = None
) -> tuple[int, int] | None:
    """Input and output tokens reported by the provider, or None if it reported none.

    Reads OpenAI/llama.cpp (``usage.prompt_tokens``/``completion_tokens``) and
    Anthropic-style (``usage.input_tokens``/``output_tokens``) shapes, from a dict or
    an SDK object, falling back to LlamaIndex's ``additional_kwargs``. A pair is taken
    only when both are sane counts (`_token_count`): a negative, huge, boolean or
    non-integer count is no report, and the caller estimates instead.
    """
    candidates: list[Any] = []
    if raw is not None:
        candidates.append(_get(raw, "usage"))
        candidates.append(_get(raw, "usage_metadata"))
    if additional_kwargs:
        candidates.append(additional_kwargs)
    for usage in candidates:
        if usage is None:
            continue
        prompt = _get(usage, "prompt_tokens")
        if prompt is None:
            prompt = _get(usage, "input_tokens")
        completion = _get(usage, "completion_tokens")
        if completion is None:
            completion = _get(usage, "output_tokens")
        prompt, completion = _token_count(prompt), _token_count(completion)
        if prompt is not None and completion is not None:
            return prompt, completion
    return None


def estimate_tokens(text: str) -> int:
    """Token count of ``text`` with LlamaIndex's global tokenizer (tiktoken, offline)."""
    from llama_index.core.utils import get_tokenizer

    return len(get_tokenizer()(text))


def price_for(
    model: str | None, prices: Mapping[str, ModelPrice] | None = None
) -> tuple[ModelPrice | None, CostSource]:
    """The price of ``model`` and where it came from.

    User ``prices`` win over the built-in table; a dated model id
    (``gpt-4o-mini-2024-07-18``) falls back to its undated family.
    """
    if not model:
        return None, "unknown"
    for table, source in ((prices or {}, "custom"), (PRICE_TABLE, "price-table")):
        name = model
        while True:
            if name in table:
                return table[name], source  # type: ignore[return-value]
            head, sep, _tail = name.rpartition("-")
            if not sep or not head:
                break
            name = head
    return None, "unknown"


def usage_for_call(
    *,
    prompt: str,
    completion: str,
    raw: Any,
    additional_kwargs: Mapping[str, Any] | None,
    model: str | None,
    local: bool,
    prices: Mapping[str, ModelPrice] | None = None,
) -> Usage:
    """The `Usage` of one LLM call, from the provider's counts or an estimate."""
    counts = provider_token_counts(raw, additional_kwargs)
    source: UsageSource
    if counts is not None:
        input_tokens, output_tokens = counts
        source = "provider"
    else:
        input_tokens, output_tokens = estimate_tokens(prompt), estimate_tokens(completion)
        source = "estimated"
    cost = 0.0
    cost_source: CostSource
    price, price_source = price_for(model, prices)
    if price is not None and (price_source == "custom" or not local):
        cost = price.cost(input_tokens, output_tokens)
        cost_source = price_source
    elif local:
        cost_source = "local"
    else:
        cost_source = "unknown"
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=input_tokens + output_tokens,
        cost=cost,
        usage_source=source,
        cost_source=cost_source,
        calls=1,
    )
