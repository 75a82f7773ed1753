"""The report shows how sure a difference is: Δ vs `none` with its 95% interval, the
number of queries, and "no clear difference" when the interval crosses zero."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llama_index_hyde_plus.evaluation.metrics import paired_interval, paired_t_test
from llama_index_hyde_plus.evaluation.report import chart, verdicts, write_outputs
from llama_index_hyde_plus.evaluation.runner import EvalResult, TransformReport, compare
from llama_index_hyde_plus.usage import Usage


def test_the_interval_is_the_paired_t_interval() -> None:
    base = {"a": 0.0, "b": 0.0, "c": 0.0}
    low, high = paired_interval({"a": 1.0, "b": 2.0, "c": 3.0}, base)
    half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t(0.975, 2) * sd / sqrt(n)
    assert low == pytest.approx(2 - half) and high == pytest.approx(2 + half)
    assert paired_interval({"a": 0.5, "b": 0.5}, {"a": 0.25, "b": 0.25}) == (0.25, 0.25)
    assert all(math.isnan(x) for x in paired_interval({"a": 1.0}, {"a": 0.0}))


@pytest.mark.parametrize("shift", [0.0, 0.02, 0.05, 0.1, 0.3])
def test_the_interval_leaves_out_zero_exactly_when_p_is_below_five_percent(shift: float) -> None:
    base = {f"q{i}": (i * 37 % 11) / 11 for i in range(12)}
    mine = {k: v + shift + ((i * 5 % 7) - 3) / 30 for i, (k, v) in enumerate(base.items())}
    low, high = paired_interval(mine, base)
    assert (low > 0 or high < 0) == (paired_t_test(mine, base) < 0.05)


def _report(label: str, per_query: dict[str, float]) -> TransformReport:
    mean = sum(per_query.values()) / len(per_query)
    scores = {"nDCG@10": mean, "R@10": mean, "R@100": mean, "RR@10": mean}
    n = len(per_query)
    return TransformReport(label, scores, per_query, 0.1, 0.2, n, Usage(), 0, 0, n)


def _seven_queries() -> EvalResult:
    """+7 points on 7 queries with a wide spread (p = 0.33), and a clear loss."""
    base = {f"q{i}": 0.1 * i for i in range(7)}
    noisy = [0.3, -0.1, 0.2, -0.15, 0.25, 0.0, 0.0]
    hyde = {k: v + d for (k, v), d in zip(base.items(), noisy)}
    worse = {k: v - 0.2 - 0.01 * i for i, (k, v) in enumerate(base.items())}
    reports = [_report("none", base), _report("hyde", hyde), _report("rocchio", worse)]
    compare(reports)
    return EvalResult("my-docs", 7, 40, {}, reports, index_seconds=1.0, index_cached=False)


def test_the_report_gives_each_delta_its_interval(tmp_path: Path) -> None:
    result = _seven_queries()
    hyde = result.reports[1]
    assert hyde.verdict.startswith("no clear difference: +7.1 nDCG@10")
    assert hyde.interval_vs_none is not None and hyde.interval_vs_none[0] < 0
    lines = verdicts(result)
    assert "95% CI" in lines[0] and lines[1].startswith("rocchio: hurts")
    json_path, md_path, png = write_outputs(result, tmp_path)
    row = json.loads(json_path.read_text())["results"][1]
    low, high = row["delta_ndcg@10_ci95_vs_none"]
    assert low < 0 < high and low < row["delta_ndcg@10_vs_none"] < high
    assert "95% interval" in md_path.read_text() and png.stat().st_size > 0


def test_the_chart_shows_deltas_with_intervals_queries_and_verdicts() -> None:
    import matplotlib.pyplot as plt

    fig = chart(_seven_queries())
    try:
        assert fig._suptitle.get_text() == "my-docs: 7 queries, 40 documents"
        _, deltas = fig.axes
        assert "Δ nDCG@10 vs none" in deltas.get_ylabel()
        notes = [t.get_text() for t in deltas.texts]
        assert len(notes) == 2 and notes[0].startswith("+7.1\n95% CI -")
        verdicts = [note.split("\n")[-2] for note in notes]  # the last line counts queries
        assert verdicts == ["no clear difference", "hurts"]
        assert all(note.split("\n")[-1].endswith("changed") for note in notes)
        assert len(deltas.containers) == 2  # the bars and their error bars
        assert [b.get_hatch() for b in deltas.patches] == ["//", None]
    finally:
        plt.close(fig)


def test_a_run_without_none_has_no_delta_panel() -> None:
    import matplotlib.pyplot as plt

    only = EvalResult("d", 1, 1, {}, [_report("hyde", {"q": 0.5})], 0.0, False)
    fig = chart(only)
    try:
        assert len(fig.axes) == 1
    finally:
        plt.close(fig)
