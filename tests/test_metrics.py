from __future__ import annotations

import math

import pytest

from llama_index_hyde_plus.evaluation import evaluate, paired_t_test, percentile

QRELS = {"q1": {"d1": 1}, "q2": {"d2": 2, "d5": 1}, "q3": {"d3": 1}}
RUN = {
    "q1": {"d4": 3.0, "d1": 2.0, "d2": 1.0},
    "q2": {"d5": 3.0, "d3": 2.0, "d2": 1.0},
    "q3": {"d1": 2.0, "d2": 1.0},
}


def test_metrics_match_hand_computed_values() -> None:
    scores = evaluate(QRELS, RUN)
    log2 = math.log2
    ndcg_q1 = (1 / log2(3)) / 1.0  # relevant doc at rank 2
    ndcg_q2 = (1 / log2(2) + 2 / log2(4)) / (2 / log2(2) + 1 / log2(3))  # linear gains
    assert scores.per_query["nDCG@10"] == pytest.approx({"q1": ndcg_q1, "q2": ndcg_q2, "q3": 0})
    assert scores.mean["nDCG@10"] == pytest.approx((ndcg_q1 + ndcg_q2) / 3)
    assert scores.mean["R@10"] == pytest.approx(2 / 3)
    assert scores.mean["R@100"] == pytest.approx(2 / 3)
    assert scores.mean["RR@10"] == pytest.approx((1 / 2 + 1 + 0) / 3)


def test_queries_missing_from_the_run_count_as_zero() -> None:
    scores = evaluate(QRELS, {"q1": {"d1": 1.0}})
    assert scores.per_query["nDCG@10"] == {"q1": 1.0, "q2": 0.0, "q3": 0.0}


def test_percentile_interpolates() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 95) == 5
    assert math.isnan(percentile([], 50))


def test_paired_t_test() -> None:
    a = {"q1": 0.9, "q2": 0.8, "q3": 0.95, "q4": 0.85}
    b = {"q1": 0.1, "q2": 0.2, "q3": 0.15, "q4": 0.05}
    assert paired_t_test(a, b) < 0.01
    assert paired_t_test(a, a) == 1.0
