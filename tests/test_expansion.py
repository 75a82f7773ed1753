"""The arithmetic behind the quality guards (`llama_index_hyde_plus.search.expansion`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from llama_index_hyde_plus.search.expansion import (
    MAX_KEYWORD_REPEAT,
    blend_order,
    blend_scores,
    check_weight,
    cosine,
    keyword_query,
    keyword_repeats,
    mean_unit,
    minmax,
    rocchio_vector,
    unit,
    unit_rows_mean,
    weighted_vector,
)

DIM = 6
coord = st.floats(min_value=-10, max_value=10, allow_nan=False, allow_infinity=False)
vector = st.lists(coord, min_size=DIM, max_size=DIM).filter(
    lambda v: float(np.linalg.norm(v)) > 1e-3
)
passages = st.lists(vector, min_size=1, max_size=5)
weight = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
words = st.lists(
    st.sampled_from(["alpha", "beta", "gamma", "delta", "omega", "sigma"]), min_size=1, max_size=8
).map(" ".join)
scores = st.lists(st.floats(min_value=-5, max_value=5, allow_nan=False), min_size=1, max_size=12)

SETTINGS = settings(max_examples=60, deadline=None)


def _raw_mix(q: list[float], ps: list[list[float]], w: float) -> np.ndarray:
    return w * unit(q) + (1 - w) * unit_rows_mean(ps)


# -- check_weight ------------------------------------------------------------------
@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), float("inf")])
def test_out_of_range_weight_is_a_value_error_naming_the_parameter(bad: float) -> None:
    with pytest.raises(ValueError, match="my_weight"):
        check_weight(bad, "my_weight")


@pytest.mark.parametrize("bad", [True, "0.5", [0.5]])
def test_non_number_weight_is_a_type_error_naming_the_parameter(bad: object) -> None:
    with pytest.raises(TypeError, match="my_weight"):
        check_weight(bad, "my_weight")  # type: ignore[arg-type]


def test_none_weight_is_allowed_only_when_asked() -> None:
    assert check_weight(None, "w") is None
    with pytest.raises(ValueError, match="w must"):
        check_weight(None, "w", allow_none=False)


@pytest.mark.parametrize("good", [0, 1, 0.0, 0.25, 1.0])
def test_weights_in_range_come_back_as_floats(good: float) -> None:
    out = check_weight(good, "w")
    assert out == good and isinstance(out, float)


# -- unit / mean / cosine -------------------------------------------------------------
def test_zero_vector_stays_zero_and_has_zero_cosine() -> None:
    assert unit([0.0, 0.0]).tolist() == [0.0, 0.0]
    assert cosine([0.0, 0.0], [1.0, 0.0]) == 0.0


def test_mean_of_no_vectors_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        unit_rows_mean([])


def test_rows_are_scaled_before_averaging() -> None:
    # a long vector must not dominate the mean
    np.testing.assert_allclose(unit_rows_mean([[100.0, 0.0], [0.0, 1.0]]), [0.5, 0.5])
    np.testing.assert_allclose(mean_unit([[100.0, 0.0], [0.0, 1.0]]), [2**-0.5, 2**-0.5])


# -- weighted_vector ------------------------------------------------------------------
@SETTINGS
@given(q=vector, ps=passages, w=weight)
def test_weighted_vector_is_unit_length(q: list[float], ps: list[list[float]], w: float) -> None:
    assume(float(np.linalg.norm(_raw_mix(q, ps, w))) > 1e-6)
    assert math.isclose(float(np.linalg.norm(weighted_vector(q, ps, w))), 1.0, abs_tol=1e-9)


@SETTINGS
@given(q=vector, ps=passages)
def test_query_weight_one_is_the_question_direction(q: list[float], ps: list[list[float]]) -> None:
    np.testing.assert_allclose(weighted_vector(q, ps, 1.0), unit(q), atol=1e-12)


@SETTINGS
@given(q=vector, ps=passages)
def test_query_weight_zero_is_the_passages_alone(q: list[float], ps: list[list[float]]) -> None:
    assume(float(np.linalg.norm(unit_rows_mean(ps))) > 1e-6)
    np.testing.assert_allclose(weighted_vector(q, ps, 0.0), mean_unit(ps), atol=1e-9)


@SETTINGS
@given(q=vector, ps=passages)
def test_weight_one_over_n_plus_one_is_the_papers_plain_mean(
    q: list[float], ps: list[list[float]]
) -> None:
    everything = [q, *ps]
    assume(float(np.linalg.norm(unit_rows_mean(everything))) > 1e-6)
    w = 1.0 / (len(ps) + 1)
    np.testing.assert_allclose(weighted_vector(q, ps, w), mean_unit(everything), atol=1e-9)


@SETTINGS
@given(q=vector, ps=passages, a=weight, b=weight)
def test_a_larger_query_weight_never_moves_the_vector_away_from_the_question(
    q: list[float], ps: list[list[float]], a: float, b: float
) -> None:
    low, high = sorted((a, b))
    assume(float(np.linalg.norm(_raw_mix(q, ps, low))) > 1e-6)
    assume(float(np.linalg.norm(_raw_mix(q, ps, high))) > 1e-6)
    assert cosine(weighted_vector(q, ps, high), q) >= cosine(weighted_vector(q, ps, low), q) - 1e-9


def test_weighted_vector_without_passages_is_the_question() -> None:
    np.testing.assert_allclose(weighted_vector([3.0, 4.0], [], 0.2), [0.6, 0.8])


def test_weighted_vector_concrete_value() -> None:
    # unit(0.25 * [1, 0] + 0.75 * [0, 1])
    got = weighted_vector([2.0, 0.0], [[0.0, 5.0]], 0.25)
    np.testing.assert_allclose(got, unit([0.25, 0.75]))


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), None])
def test_weighted_vector_rejects_bad_weights_by_name(bad: float | None) -> None:
    with pytest.raises(ValueError, match="query_weight"):
        weighted_vector([1.0, 0.0], [[0.0, 1.0]], bad)  # type: ignore[arg-type]


# -- keyword query --------------------------------------------------------------------
@SETTINGS
@given(q=words, ps=st.lists(words, min_size=1, max_size=3))
def test_keyword_query_at_weight_zero_is_the_passages_and_at_one_the_question(
    q: str, ps: list[str]
) -> None:
    assert keyword_query(q, ps, 0.0) == "\n\n".join(ps)
    assert keyword_query(q, ps, 1.0) == q


@SETTINGS
@given(q=words, ps=st.lists(words, min_size=1, max_size=3), w=weight)
def test_keyword_query_is_the_question_repeated_then_the_passages(
    q: str, ps: list[str], w: float
) -> None:
    assume(w < 1.0)
    r = keyword_repeats(q, ps, w)
    assert keyword_query(q, ps, w) == "\n\n".join([q] * r + ps)
    assert 0 <= r <= MAX_KEYWORD_REPEAT
    assert (r == 0) == (w == 0.0)


@SETTINGS
@given(q=words, ps=st.lists(words, min_size=1, max_size=3), a=weight, b=weight)
def test_the_questions_word_share_grows_with_the_weight(
    q: str, ps: list[str], a: float, b: float
) -> None:
    low, high = sorted((a, b))
    assume(high < 1.0)
    assert keyword_repeats(q, ps, high) >= keyword_repeats(q, ps, low)


def test_keyword_repeats_reach_the_asked_share() -> None:
    q = "revenue drop"  # 2 words
    p = " ".join(["word"] * 20)  # 20 words
    # share = 2r / (2r + 20) = 0.5 -> r = 10
    assert keyword_repeats(q, [p], 0.5) == 10
    assert keyword_repeats(q, [p], 0.999) == MAX_KEYWORD_REPEAT  # capped


def test_keyword_query_without_passages_is_the_question() -> None:
    assert keyword_query("q words", [], 0.3) == "q words"


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan")])
def test_keyword_query_rejects_bad_weights_by_name(bad: float) -> None:
    with pytest.raises(ValueError, match="keyword_weight"):
        keyword_query("q", ["p"], bad)


# -- minmax / blend -------------------------------------------------------------------
@SETTINGS
@given(values=scores)
def test_minmax_maps_onto_zero_one(values: list[float]) -> None:
    out = minmax(values)
    assert len(out) == len(values) and all(0.0 <= v <= 1.0 for v in out)
    if max(values) - min(values) > 1e-12:
        assert out[values.index(min(values))] == 0.0
        assert out[values.index(max(values))] == 1.0
    else:
        assert out == [1.0] * len(values)


def test_minmax_of_nothing_is_nothing() -> None:
    assert minmax([]) == []


@SETTINGS
@given(data=st.data(), b=weight)
def test_blend_order_is_a_permutation(data: st.DataObject, b: float) -> None:
    qs = data.draw(scores)
    hs = data.draw(st.lists(st.floats(-1, 1), min_size=len(qs), max_size=len(qs)))
    assert sorted(blend_order(qs, hs, b)) == list(range(len(qs)))


@SETTINGS
@given(data=st.data())
def test_blend_zero_keeps_the_questions_order(data: st.DataObject) -> None:
    qs = sorted(data.draw(scores), reverse=True)
    hs = data.draw(st.lists(st.floats(-1, 1), min_size=len(qs), max_size=len(qs)))
    assert blend_order(qs, hs, 0.0) == list(range(len(qs)))


@SETTINGS
@given(data=st.data())
def test_blend_one_orders_by_similarity_to_the_generated_text(data: st.DataObject) -> None:
    # distinct similarities (min-max treats differences below 1e-12 as ties)
    steps = data.draw(st.lists(st.integers(-100, 100), min_size=1, max_size=10, unique=True))
    hs = [s / 100 for s in steps]
    qs = data.draw(st.lists(st.floats(0, 1), min_size=len(hs), max_size=len(hs)))
    assert blend_order(qs, hs, 1.0) == sorted(range(len(hs)), key=lambda i: -hs[i])


def test_blend_can_change_the_order() -> None:
    # the question's runner-up is much closer to the generated text
    assert blend_order([1.0, 0.9, 0.0], [0.0, 1.0, 0.5], 0.5) == [1, 0, 2]
    assert blend_scores([1.0, 0.9, 0.0], [0.0, 1.0, 0.5], 0.5) == pytest.approx([0.5, 0.95, 0.25])


def test_blend_order_rejects_lists_of_different_length() -> None:
    with pytest.raises(ValueError, match="same length"):
        blend_order([1.0, 0.5], [0.3], 0.5)


def test_blend_scores_rejects_lists_of_different_length() -> None:
    with pytest.raises(ValueError, match="same length"):
        blend_scores([1.0, 0.5, 0.2], [0.3], 0.5)


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan")])
def test_blend_rejects_bad_weights_by_name(bad: float) -> None:
    with pytest.raises(ValueError, match="blend"):
        blend_order([1.0], [1.0], bad)
    with pytest.raises(ValueError, match="blend"):
        blend_scores([1.0], [1.0], bad)


# -- rocchio --------------------------------------------------------------------------
@SETTINGS
@given(q=vector, fb=passages, alpha=st.floats(0.01, 5))
def test_rocchio_with_beta_zero_is_the_question(
    q: list[float], fb: list[list[float]], alpha: float
) -> None:
    np.testing.assert_allclose(rocchio_vector(q, fb, alpha, 0.0), unit(q), atol=1e-12)


@SETTINGS
@given(q=vector, fb=passages, alpha=st.floats(0, 5), beta=st.floats(0.01, 5))
def test_rocchio_is_alpha_q_plus_beta_mean_of_feedback(
    q: list[float], fb: list[list[float]], alpha: float, beta: float
) -> None:
    raw = alpha * unit(q) + beta * mean_unit(fb)
    assume(float(np.linalg.norm(raw)) > 1e-6)
    np.testing.assert_allclose(rocchio_vector(q, fb, alpha, beta), unit(raw), atol=1e-9)


def test_rocchio_without_feedback_is_the_question() -> None:
    np.testing.assert_allclose(rocchio_vector([0.0, 2.0], [], 1.0, 0.5), [0.0, 1.0])


@pytest.mark.parametrize(("alpha", "beta"), [(-1.0, 0.5), (1.0, -0.5), (0.0, 0.0)])
def test_rocchio_rejects_negative_or_all_zero_weights(alpha: float, beta: float) -> None:
    with pytest.raises(ValueError, match="alpha and beta"):
        rocchio_vector([1.0, 0.0], [[0.0, 1.0]], alpha, beta)
