"""Numeric argument checks: a bool is never a number, the parameter is named."""

from __future__ import annotations

import math

import pytest

from llama_index_hyde_plus._checks import check_int, check_number, is_int, is_number
from llama_index_hyde_plus.caching.cache import MemoryCache
from llama_index_hyde_plus.search.retriever import TransformRetriever
from llama_index_hyde_plus.testing import StaticRetriever
from llama_index_hyde_plus.transforms import Rewrite


@pytest.mark.parametrize("value", [True, False, 1.0, "1", None])
def test_is_int_refuses_bools_floats_and_strings(value: object) -> None:
    assert not is_int(value)


@pytest.mark.parametrize("value", [True, "1.5", None, [1]])
def test_is_number_refuses_bools_and_non_numbers(value: object) -> None:
    assert not is_number(value)


def test_ints_and_floats_are_numbers() -> None:
    assert is_int(0) and is_int(-3) and is_number(0) and is_number(2.5) and is_number(math.nan)


def test_check_int_names_the_parameter() -> None:
    with pytest.raises(TypeError, match="top_k must be an int"):
        check_int(True, "top_k", 1, None)
    with pytest.raises(ValueError, match="n must be between 1 and 10, not 11"):
        check_int(11, "n", 1, 10)
    assert check_int(3, "n", 1, 10) == 3


def test_check_number_refuses_non_finite_and_bools() -> None:
    with pytest.raises(TypeError, match="alpha"):
        check_number(False, "alpha", 0, 1)
    with pytest.raises(ValueError, match="alpha"):
        check_number(math.inf, "alpha", 0, 1)
    assert check_number(1, "alpha", 0, 1) == 1.0


@pytest.mark.parametrize("bad", [True, 2.5])
def test_retriever_top_k_must_be_a_whole_number(bad: object) -> None:
    with pytest.raises(ValueError, match="top_k must be an int"):
        TransformRetriever(StaticRetriever({}), Rewrite(), top_k=bad)  # type: ignore[arg-type]


def test_memory_cache_refuses_a_bool_size() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        MemoryCache(max_entries=True)
