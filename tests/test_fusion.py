from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from llama_index.core.schema import NodeWithScore, TextNode

from llama_index_hyde_plus import FusionMode, fuse
from llama_index_hyde_plus.search.fusion import explain


def ranked(*pairs: tuple[str, float | None]) -> list[NodeWithScore]:
    return [NodeWithScore(node=TextNode(id_=i, text=i), score=s) for i, s in pairs]


A = ranked(("a", 0.9), ("b", 0.5), ("c", 0.1))
B = ranked(("b", 3.0), ("d", 2.0), ("a", 1.0))


def ids(nodes: list[NodeWithScore]) -> list[str]:
    return [n.node.node_id for n in nodes]


def scores(nodes: list[NodeWithScore]) -> dict[str, float]:
    return {n.node.node_id: n.score for n in nodes}  # type: ignore[misc]


def test_rrf_matches_hand_computed_values() -> None:
    out = fuse([A, B], FusionMode.RRF)
    expected = {
        "a": 1 / 61 + 1 / 63,
        "b": 1 / 62 + 1 / 61,
        "c": 1 / 63,
        "d": 1 / 62,
    }
    assert ids(out) == ["b", "a", "d", "c"]
    assert scores(out) == pytest.approx(expected)


def test_rrf_weights_change_the_order() -> None:
    assert ids(fuse([A, B], FusionMode.RRF)) == ["b", "a", "d", "c"]
    heavy_a = fuse([A, B], FusionMode.RRF, weights=[3.0, 1.0])
    # a = 3/61 + 1/63 > b = 3/62 + 1/61 > c = 3/63 > d = 1/62
    assert ids(heavy_a) == ["a", "b", "c", "d"]
    assert scores(heavy_a)["a"] == pytest.approx(3 / 61 + 1 / 63)


def test_rrf_custom_k() -> None:
    out = fuse([A], FusionMode.RRF, k=1)
    assert scores(out) == pytest.approx({"a": 1 / 2, "b": 1 / 3, "c": 1 / 4})


def test_relative_score_min_max_then_sum() -> None:
    out = fuse([A, B], FusionMode.RELATIVE_SCORE)
    # A: a=1, b=0.5, c=0 ; B: b=1, d=0.5, a=0
    assert scores(out) == pytest.approx({"a": 1.0, "b": 1.5, "c": 0.0, "d": 0.5})
    assert ids(out) == ["b", "a", "d", "c"]


def test_dist_based_score_uses_mean_plus_minus_three_sigma() -> None:
    out = fuse([A], FusionMode.DIST_BASED_SCORE)
    raw = [0.9, 0.5, 0.1]
    mean = sum(raw) / 3
    std = (sum((x - mean) ** 2 for x in raw) / 3) ** 0.5
    lo, hi = mean - 3 * std, mean + 3 * std
    assert scores(out) == pytest.approx({k: (v - lo) / (hi - lo) for k, v in zip("abc", raw)})


def test_interleave_round_robins_and_skips_duplicates() -> None:
    out = fuse([A, B], FusionMode.INTERLEAVE)
    # depth 1: a (A), b (B); depth 2: b again (skipped), d (B); depth 3: c (A), a again
    assert ids(out) == ["a", "b", "d", "c"]
    assert [n.score for n in out] == pytest.approx([1.0, 1 / 2, 1 / 3, 1 / 4])


def test_max_keeps_best_weighted_raw_score() -> None:
    out = fuse([A, B], FusionMode.MAX, weights=[1.0, 0.1])
    assert scores(out) == pytest.approx({"a": 0.9, "b": 0.5, "c": 0.1, "d": 0.2})


def test_zero_weight_drops_a_list() -> None:
    out = fuse([A, B], FusionMode.RRF, weights=[1.0, 0.0])
    assert ids(out) == ["a", "b", "c"]


def test_top_k_truncates() -> None:
    assert ids(fuse([A, B], top_k=2)) == ["b", "a"]


def test_ties_break_by_first_appearance() -> None:
    x = ranked(("x", 1.0))
    y = ranked(("y", 1.0))
    assert ids(fuse([x, y], FusionMode.RRF)) == ["x", "y"]
    assert ids(fuse([y, x], FusionMode.RRF)) == ["y", "x"]


def test_none_scores_count_as_zero() -> None:
    out = fuse([ranked(("a", None), ("b", 1.0))], FusionMode.RELATIVE_SCORE)
    assert scores(out) == {"b": 1.0, "a": 0.0}


@pytest.mark.parametrize("mode", list(FusionMode))
def test_inputs_are_never_mutated(mode: FusionMode) -> None:
    a, b = copy.deepcopy(A), copy.deepcopy(B)
    before = [(n.node.node_id, n.score) for n in a + b]
    out = fuse([a, b], mode)
    assert [(n.node.node_id, n.score) for n in a + b] == before
    assert all(o is not n for o in out for n in a + b)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"weights": [1.0]}, "one entry per list"),
        ({"weights": [1.0, -1.0]}, ">= 0"),
        ({"top_k": 0}, "top_k"),
        ({"k": 0}, "k must be"),
    ],
)
def test_bad_arguments_are_value_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fuse([A, B], **kwargs)


def test_unknown_mode_is_value_error() -> None:
    with pytest.raises(ValueError):
        fuse([A], "nope")


node_lists = st.lists(
    st.lists(
        st.tuples(st.sampled_from("abcdefgh"), st.floats(-5, 5, allow_nan=False)),
        max_size=6,
    ),
    max_size=4,
)


@given(node_lists, st.sampled_from(list(FusionMode)))
def test_fusion_dedupes_and_is_deterministic(raw: list, mode: FusionMode) -> None:
    lists = [ranked(*items) for items in raw]
    out1 = fuse(lists, mode)
    out2 = fuse(lists, mode)
    assert ids(out1) == ids(out2)
    assert len(ids(out1)) == len(set(ids(out1)))
    assert set(ids(out1)) == {i for items in raw for i, _ in items}


@pytest.mark.parametrize("mode", list(FusionMode))
@pytest.mark.parametrize(
    "weights", [[100.0, 1.0, 1.0], [100.0] + [1.0] * 10, [2.0, 2.0], [5.0, 2.0, 1.0, 1.0]]
)
def test_explain_says_what_a_fused_score_is_within_80_columns(
    mode: FusionMode, weights: list[float]
) -> None:
    line = explain(mode, weights, k=1000, first="question")
    assert line.startswith("fused = ") and f"over {len(weights)} searches" in line
    assert len(line) <= 80, line


def test_explain_names_the_weights_the_ranks_were_summed_with() -> None:
    assert explain(FusionMode.RRF, [100.0, 1.0, 1.0], first="question") == (
        "fused = sum of weight/(60+rank) over 3 searches (question x100, rest x1)"
    )
    assert explain(FusionMode.RRF, [1.0, 1.0]) == "fused = sum of weight/(60+rank) over 2 searches"
    assert explain(FusionMode.MAX, [2.0, 2.0]).endswith("over 2 searches (each x2)")
    assert explain(FusionMode.RRF, [3.0, 2.0, 1.0]).endswith("(weights 3, 2, 1)")


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"k": float("nan")}, "k"),
        ({"k": 0}, "k"),
        ({"top_k": float("nan")}, "top_k"),
        ({"weights": "ab"}, "weights"),
        ({"weights": ["x", 1.0]}, "weights"),
        ({"mode": "best"}, "mode"),
    ],
)
def test_fuse_refuses_bad_arguments_naming_them(kwargs: dict[str, Any], name: str) -> None:
    lists = [[NodeWithScore(node=TextNode(id_="a", text="a"), score=1.0)]] * 2
    with pytest.raises((TypeError, ValueError), match=name):
        fuse(lists, **kwargs)
