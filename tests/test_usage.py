from __future__ import annotations

import pytest

from llama_index_hyde_plus import ModelPrice, Usage
from llama_index_hyde_plus.usage import (
    PRICE_TABLE,
    estimate_tokens,
    price_for,
    provider_token_counts,
    sum_usage,
    usage_for_call,
)


def test_usage_adds_up_and_reports_the_weakest_source() -> None:
    a = Usage(10, 5, 15, 0.1, "provider", "price-table", 1)
    b = Usage(3, 2, 5, 0.0, "estimated", "unknown", 1)
    total = a + b
    assert (total.input_tokens, total.output_tokens, total.total_tokens) == (13, 7, 20)
    assert total.cost == pytest.approx(0.1) and total.calls == 2
    assert total.usage_source == "estimated" and total.cost_source == "unknown"
    assert sum_usage([]) == Usage()
    assert sum_usage([a]).usage_source == "provider"


@pytest.mark.parametrize(
    "raw",
    [
        {"usage": {"prompt_tokens": 7, "completion_tokens": 3}},
        {"usage": {"input_tokens": 7, "output_tokens": 3}},
        type("Raw", (), {"usage": type("U", (), {"prompt_tokens": 7, "completion_tokens": 3})()})(),
    ],
    ids=["openai-dict", "anthropic-dict", "sdk-object"],
)
def test_provider_counts_are_read_from_every_shape(raw: object) -> None:
    assert provider_token_counts(raw) == (7, 3)


def test_no_usage_is_none() -> None:
    assert provider_token_counts({"id": "x"}) is None
    assert provider_token_counts(None) is None


def test_price_table_cost_and_dated_model_ids() -> None:
    price, source = price_for("gpt-4o-mini-2024-07-18")
    assert source == "price-table" and price == PRICE_TABLE["gpt-4o-mini"]
    usage = usage_for_call(
        prompt="p",
        completion="c",
        raw={"usage": {"prompt_tokens": 1_000_000, "completion_tokens": 1_000_000}},
        additional_kwargs=None,
        model="gpt-4o-mini",
        local=False,
    )
    assert usage.cost == pytest.approx(0.15 + 0.60)
    assert usage.cost_source == "price-table" and usage.usage_source == "provider"


def test_custom_price_overrides_the_table() -> None:
    usage = usage_for_call(
        prompt="p",
        completion="c",
        raw={"usage": {"prompt_tokens": 2000, "completion_tokens": 1000}},
        additional_kwargs=None,
        model="gpt-4o",
        local=False,
        prices={"gpt-4o": ModelPrice(1.0, 2.0)},
    )
    assert usage.cost == pytest.approx((2000 * 1.0 + 1000 * 2.0) / 1e6)
    assert usage.cost_source == "custom"


def test_local_models_cost_nothing_and_unknown_models_say_so() -> None:
    local = usage_for_call(
        prompt="p", completion="c", raw=None, additional_kwargs=None, model="smollm2", local=True
    )
    assert local.cost == 0 and local.cost_source == "local"
    unknown = usage_for_call(
        prompt="p",
        completion="c",
        raw=None,
        additional_kwargs=None,
        model="mystery-model",
        local=False,
    )
    assert unknown.cost == 0 and unknown.cost_source == "unknown"


def test_missing_provider_usage_is_estimated_with_a_tokenizer() -> None:
    usage = usage_for_call(
        prompt="hello world " * 10,
        completion="fine thanks",
        raw={},
        additional_kwargs=None,
        model=None,
        local=False,
    )
    assert usage.usage_source == "estimated"
    assert usage.input_tokens == estimate_tokens("hello world " * 10) > 10
    assert usage.output_tokens == estimate_tokens("fine thanks")


def test_negative_price_is_value_error() -> None:
    with pytest.raises(ValueError):
        ModelPrice(-1, 0)


def test_the_cost_in_words_never_shows_a_number_and_unknown_at_once() -> None:
    def priced(source: str, cost: float) -> str:
        return Usage(cost=cost, cost_source=source, calls=1).cost_text()  # type: ignore[arg-type]

    assert priced("unknown", 0.0) == "unknown (no price for the model)"
    assert priced("unknown", 0.00042) == "over $0.000420 (no price for some calls' model)"
    assert priced("unknown", 1e-9) == "unknown (no price for some calls' model)"
    assert priced("price-table", 0.00042) == "$0.000420 (price-table)"
    assert priced("custom", 0.0) == "$0.000000 (custom)"
    assert priced("local", 0.0) == "free (local)"
    assert priced("none", 0.0) == "$0"
    assert Usage(cost=0.0123, cost_source="custom").cost_text(places=4) == "$0.0123 (custom)"
    summed = Usage(cost=0.001, cost_source="price-table") + Usage(cost_source="unknown")
    assert summed.cost_text().startswith("over $0.001000")
