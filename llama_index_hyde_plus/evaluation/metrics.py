"""Retrieval metrics (ir-measures), latency percentiles and a paired significance test
with its confidence interval."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Run = Mapping[str, Mapping[str, float]]  # query id -> doc id -> score
Qrels = Mapping[str, Mapping[str, int]]

MEASURES = ("nDCG@10", "R@10", "R@100", "RR@10")
LABELS = {"nDCG@10": "nDCG@10", "R@10": "Recall@10", "R@100": "Recall@100", "RR@10": "MRR@10"}


@dataclass(frozen=True)
class Scores:
    """Mean scores over queries, and per-query values of each measure."""

    mean: dict[str, float]
    per_query: dict[str, dict[str, float]]  # measure -> query id -> value


def evaluate(qrels: Qrels, run: Run, measures: Sequence[str] = MEASURES) -> Scores:
    """Score ``run`` against ``qrels`` with ir-measures (trec_eval semantics). Queries
    in ``qrels`` that the run has no results for count as zero."""
    import ir_measures

    parsed = [ir_measures.parse_measure(m) for m in measures]
    qrel_list = [
        ir_measures.Qrel(qid, did, int(rel))
        for qid, docs in qrels.items()
        for did, rel in docs.items()
    ]
    run_list = [
        ir_measures.ScoredDoc(qid, did, float(score))
        for qid, docs in run.items()
        for did, score in docs.items()
    ]
    per_query: dict[str, dict[str, float]] = {m: {qid: 0.0 for qid in qrels} for m in measures}
    names = {str(p): m for p, m in zip(parsed, measures)}
    for metric in ir_measures.iter_calc(parsed, qrel_list, run_list):
        per_query[names[str(metric.measure)]][metric.query_id] = float(metric.value)
    mean = {m: (sum(v.values()) / len(v) if v else 0.0) for m, v in per_query.items()}
    return Scores(mean, per_query)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def paired_t_test(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Two-sided p-value of a paired t-test of per-query scores ``a`` vs ``b`` (scipy);
    1.0 when the two are identical on every query."""
    from scipy import stats

    keys = sorted(set(a) & set(b))
    diffs = [a[k] - b[k] for k in keys]
    if len(keys) < 2 or all(abs(d) < 1e-12 for d in diffs):
        return 1.0
    result = stats.ttest_rel([a[k] for k in keys], [b[k] for k in keys])
    p = float(result.pvalue)
    return 1.0 if math.isnan(p) else p


def paired_interval(
    a: Mapping[str, float], b: Mapping[str, float], confidence: float = 0.95
) -> tuple[float, float]:
    """The ``confidence`` interval of the mean per-query difference ``a - b`` (paired
    t, the interval behind `paired_t_test`: at 0.95 it leaves out 0 when p < 0.05);
    ``(d, d)`` when every query differs by the same ``d``, NaNs below 2 queries."""
    import statistics

    from scipy import stats

    keys = sorted(set(a) & set(b))
    diffs = [a[k] - b[k] for k in keys]
    if len(diffs) < 2:
        return math.nan, math.nan
    mean = statistics.fmean(diffs)
    spread = statistics.stdev(diffs)
    if spread < 1e-12:
        return mean, mean
    half = float(stats.t.ppf((1 + confidence) / 2, len(diffs) - 1)) * spread / math.sqrt(len(diffs))
    return mean - half, mean + half
