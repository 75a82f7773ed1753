"""Choosing a configuration (`evaluation.tune`) and saying what a transform did
(`verdict`, `TransformReport.compare_with`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llama_index_hyde_plus.evaluation.runner import TransformReport, verdict
from llama_index_hyde_plus.evaluation.tune import (
    DEFAULT_TOLERANCE,
    TuneResult,
    complexity,
    config_payload,
    pick_winner,
    write_config,
)
from llama_index_hyde_plus.transforms.config import (
    CONFIG_FORMAT,
    TransformConfig,
    label_for,
    load_config,
)
from llama_index_hyde_plus.transforms.registry import make_transform
from llama_index_hyde_plus.usage import Usage


def report(
    label: str,
    ndcg: float,
    options: dict[str, Any] | None = None,
    per_query: dict[str, float] | None = None,
) -> TransformReport:
    return TransformReport(
        label=label,
        scores={"nDCG@10": ndcg},
        per_query_ndcg=per_query or {},
        latency_p50_s=0.0,
        latency_p95_s=0.0,
        latency_n=0,
        usage=Usage(),
        fallbacks=0,
        cached=0,
        queries=len(per_query or {}),
        options=options or {},
    )


# -- complexity / pick_winner ---------------------------------------------------------
def test_complexity_orders_the_machinery() -> None:
    assert complexity("hyde", {}) == 0
    assert complexity("hyde", {"query_weight": 0.8}) == 0
    assert complexity("hyde", {"strategy": "rerank", "blend": 0.3}) == 1
    assert complexity("hyde", {"strategy": "replace"}) == 0
    assert complexity("hyde", {"gate": 0.4}) == 2
    assert complexity("hyde", {"gate": None}) == 0
    assert complexity("hyde", {"grounded": 3}) == 4
    assert complexity("hyde", {"grounded": 0}) == 0
    assert complexity("hyde", {"grounded": 3, "gate": 0.4, "strategy": "rerank"}) == 7


def test_pick_winner_prefers_the_simpler_config_within_tolerance() -> None:
    simple = report("simple", 0.500, {"query_weight": 0.7})
    fancy = report("fancy", 0.501, {"query_weight": 0.7, "grounded": 3, "gate": 0.4})
    assert pick_winner([fancy, simple], DEFAULT_TOLERANCE, "hyde") is simple


def test_pick_winner_takes_the_best_when_it_is_clearly_better() -> None:
    simple = report("simple", 0.500, {"query_weight": 0.7})
    fancy = report("fancy", 0.520, {"grounded": 3})
    assert pick_winner([simple, fancy], DEFAULT_TOLERANCE, "hyde") is fancy


def test_pick_winner_among_equally_simple_takes_the_best() -> None:
    a = report("a", 0.500, {"query_weight": 0.6})
    b = report("b", 0.5015, {"query_weight": 0.8})
    c = report("c", 0.400, {})
    assert pick_winner([a, b, c], DEFAULT_TOLERANCE, "hyde") is b


def test_pick_winner_tolerance_boundary() -> None:
    simple = report("simple", 0.498, {})
    gated = report("gated", 0.500, {"gate": 0.4})
    assert pick_winner([gated, simple], 0.002, "hyde") is simple  # exactly at the tolerance
    assert pick_winner([gated, simple], 0.0019, "hyde") is gated
    assert pick_winner([gated, simple], 0.0, "hyde") is gated


def test_pick_winner_of_nothing_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="no configurations"):
        pick_winner([], 0.002, "hyde")


# -- label_for ------------------------------------------------------------------------
def test_label_for() -> None:
    assert label_for("hyde", {}) == "hyde"
    assert label_for("hyde", {"query_weight": 0.8, "gate": 0.5}) == "hyde:query_weight=0.8,gate=0.5"
    assert label_for("hyde", {"gate": None}) == "hyde:gate=none"
    assert label_for("multi-query", {"include_query": True}) == "multi-query:include_query=True"


def test_labels_parse_back_to_the_same_options() -> None:
    from llama_index_hyde_plus.evaluation.runner import parse_transform_spec

    options = {"query_weight": 0.8, "strategy": "rerank", "grounded": 3, "include_query": True}
    spec = parse_transform_spec(label_for("hyde", options))
    assert spec.name == "hyde" and spec.options == options


# -- write_config / load_config ---------------------------------------------------------
def tune_result(winner_options: dict[str, Any]) -> TuneResult:
    baseline = report("none", 0.40, per_query={"q1": 0.4, "q2": 0.4})
    winner = report(label_for("hyde", winner_options), 0.45, winner_options)
    best = report("hyde:grounded=3", 0.451, {"grounded": 3})
    winner.wins, winner.ties, winner.losses = 3, 1, 2
    winner.p_value_vs_none = 0.0123456
    return TuneResult(
        transform="hyde",
        dataset="scifact",
        split="train",
        queries=300,
        baseline=baseline,
        reports=[winner, best],
        best=best,
        winner=winner,
        tolerance=DEFAULT_TOLERANCE,
        extra={"store": "faiss", "top_k": 100},
    )


def test_write_then_load_config_round_trips(tmp_path: Path) -> None:
    options = {"query_weight": 0.8, "gate": 0.4}
    path = write_config(tune_result(options), tmp_path / "sub" / "hyde.json")
    assert path == tmp_path / "sub" / "hyde.json"
    assert [p.name for p in path.parent.iterdir()] == ["hyde.json"]  # no temporary left
    config = load_config(path)
    assert config == TransformConfig("hyde", options)
    assert config.label == "hyde:query_weight=0.8,gate=0.4"
    # the loaded options build the transform
    hyde = make_transform(config.transform, None, **config.options)
    assert hyde.query_weight == 0.8 and hyde.guards.gate == 0.4  # type: ignore[attr-defined]


def test_config_records_how_the_winner_was_chosen(tmp_path: Path) -> None:
    data = json.loads(write_config(tune_result({}), tmp_path / "c.json").read_text())
    assert data["hyde_plus_config"] == CONFIG_FORMAT and data["transform"] == "hyde"
    tuned = data["tuned_on"]
    assert tuned["split"] == "train" and tuned["queries"] == 300
    assert tuned["ndcg@10"] == 0.45 and tuned["none_ndcg@10"] == 0.4
    assert tuned["wins_ties_losses"] == [3, 1, 2]
    assert tuned["p_value_vs_none"] == 0.01235
    assert tuned["best_label"] == "hyde:grounded=3" and tuned["store"] == "faiss"
    assert config_payload(tune_result({}))["options"] == {}


def test_a_config_says_its_tolerance_in_points_as_the_command_line_does() -> None:
    tuned = config_payload(tune_result({}))["tuned_on"]
    assert tuned["tolerance_points"] == round(DEFAULT_TOLERANCE * 100, 4)  # 0.2, as --tolerance
    assert "tolerance" not in tuned and tuned["fallbacks"] == 0


def test_tune_recommends_the_winner_only_when_it_beats_plain_search(tmp_path: Path) -> None:
    from llama_index_hyde_plus.evaluation.report import tune_markdown, tune_recommendation

    result = tune_result({"query_weight": 0.8})
    result.winner.delta_vs_none, result.winner.interval_vs_none = 0.05, (0.01, 0.09)
    said = tune_recommendation(result, tmp_path / "c.json")
    assert said.startswith("Recommendation: use `hyde:query_weight=0.8` (--config ")
    assert "+5.0 [+1.0,+9.0]" in said and "p = 0.012" in said
    result.winner.p_value_vs_none = 0.4
    said = tune_recommendation(result, None)
    assert said.startswith("Recommendation: keep plain search (`none`)")
    assert said.endswith("No config written.")
    assert said in tune_markdown(result)


def test_write_config_overwrites_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    write_config(tune_result({"query_weight": 0.5}), path)
    write_config(tune_result({"query_weight": 0.9}), path)
    assert load_config(path).options == {"query_weight": 0.9}


def test_a_written_config_follows_the_umask(tmp_path: Path) -> None:
    """A service under another account can read the config (it was 0600)."""
    import os

    previous = os.umask(0o022)
    try:
        path = write_config(tune_result({}), tmp_path / "c.json")
    finally:
        os.umask(previous)
    assert (path.stat().st_mode & 0o777) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]


def test_write_config_to_a_folder_is_a_value_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=str(tmp_path)):
        write_config(tune_result({}), tmp_path)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.json", None, "not found"),
        ("notjson.json", "{not json", "not a JSON config"),
        ("list.json", "[1, 2]", "not a hyde-plus config"),
        ("format.json", '{"hyde_plus_config": 99, "transform": "hyde"}', "not a hyde-plus"),
        ("noformat.json", '{"transform": "hyde", "options": {}}', "not a hyde-plus"),
        ("unknown.json", '{"hyde_plus_config": 1, "transform": "magic"}', "'transform' must"),
        ("nontext.json", '{"hyde_plus_config": 1, "transform": 3}', "'transform' must"),
        (
            "options.json",
            '{"hyde_plus_config": 1, "transform": "hyde", "options": [1]}',
            "'options'",
        ),
        (
            "nan.json",
            '{"hyde_plus_config": 1, "transform": "hyde", "options": {"gate": NaN}}',
            "finite",
        ),
    ],
)
def test_load_config_errors_name_the_file(
    tmp_path: Path, name: str, content: str | None, message: str
) -> None:
    path = tmp_path / name
    if content is not None:
        _write(path, content)
    with pytest.raises(ValueError, match=message) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_load_config_of_binary_garbage_is_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / "bin.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match="not a JSON config") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_load_config_of_a_folder_is_a_value_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        load_config(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_load_config_defaults_options_to_empty(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.json", '{"hyde_plus_config": 1, "transform": "rocchio"}')
    assert load_config(str(path)) == TransformConfig("rocchio", {})


# -- verdict ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("delta", "p", "want"),
    [
        (0.023, 0.01, "helps: +2.3 nDCG@10, p = 0.010"),
        (-0.023, 0.01, "hurts: -2.3 nDCG@10, p = 0.010"),
        (0.05, 0.2, "no clear difference: +5.0 nDCG@10, p = 0.200"),
        (-0.004, 0.049, "hurts: -0.4 nDCG@10, p = 0.049"),
        (-0.004, 0.05, "no clear difference: -0.4 nDCG@10, p = 0.050"),
        (0.0, 0.001, "no clear difference: +0.0 nDCG@10, p = 0.001"),
        (0.01, None, "no clear difference: +1.0 nDCG@10, p = 1"),
        (None, None, "baseline"),
    ],
)
def test_verdict_in_words(delta: float | None, p: float | None, want: str) -> None:
    assert verdict(delta, p) == want


# -- compare_with -----------------------------------------------------------------------
def test_compare_with_counts_wins_ties_and_losses() -> None:
    base = report("none", 0.5, per_query={"a": 0.4, "b": 0.3, "c": 0.5, "d": 0.1, "e": 0.9})
    mine = report(
        "hyde",
        0.45,
        per_query={"a": 0.5, "b": 0.3, "c": 0.2, "d": 0.1 + 1e-12, "e": 0.95, "x": 1.0},
    )
    mine.compare_with(base)
    # a, e win; b, d tie (d within 1e-9); c loses; x is not in the baseline
    assert (mine.wins, mine.ties, mine.losses) == (2, 2, 1)
    assert mine.delta_vs_none == pytest.approx(-0.05)
    assert mine.p_value_vs_none is not None and 0.0 < mine.p_value_vs_none <= 1.0
    data = mine.to_dict()
    assert (data["wins"], data["ties"], data["losses"]) == (2, 2, 1)
    assert data["verdict"].startswith("no clear difference: -5.0 nDCG@10")


def test_compare_with_a_consistent_loss_says_hurts() -> None:
    keys = [f"q{i}" for i in range(20)]
    base = report("none", 0.6, per_query={k: 0.6 + 0.01 * (i % 3) for i, k in enumerate(keys)})
    mine = report("hyde", 0.5, per_query={k: 0.5 + 0.01 * (i % 2) for i, k in enumerate(keys)})
    mine.compare_with(base)
    assert (mine.wins, mine.ties, mine.losses) == (0, 0, 20)
    assert mine.verdict.startswith("hurts: -10.0 nDCG@10, p = 0.000")


def test_compare_with_itself_is_all_ties_and_no_difference() -> None:
    base = report("none", 0.5, per_query={"a": 0.4, "b": 0.6})
    same = report("hyde", 0.5, per_query={"a": 0.4, "b": 0.6})
    same.compare_with(base)
    assert (same.wins, same.ties, same.losses) == (0, 2, 0)
    assert same.p_value_vs_none == 1.0
    assert same.verdict == "no clear difference: +0.0 nDCG@10, p = 1.000"


def test_a_report_not_compared_has_no_verdict_in_its_dict() -> None:
    assert report("none", 0.5).to_dict()["verdict"] is None


def test_parse_grid_is_the_product_in_order() -> None:
    from llama_index_hyde_plus.evaluation.tune import parse_grid

    assert parse_grid("query_weight=0.7,1; gate=none,0.5") == [
        {"query_weight": 0.7, "gate": None},
        {"query_weight": 0.7, "gate": 0.5},
        {"query_weight": 1, "gate": None},
        {"query_weight": 1, "gate": 0.5},
    ]
    assert parse_grid("strategy=rerank;blend=0.2") == [{"strategy": "rerank", "blend": 0.2}]


@pytest.mark.parametrize("text", ["", "query_weight", "a=1;a=2", "=1", "k="])
def test_parse_grid_rejects_what_it_cannot_read(text: str) -> None:
    from llama_index_hyde_plus.evaluation.tune import parse_grid

    with pytest.raises(ValueError, match="grid"):
        parse_grid(text)


def _config(tmp_path: Path, transform: str, options: object, version: object = 1) -> Path:
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps({"hyde_plus_config": version, "transform": transform, "options": options})
    )
    return path


@pytest.mark.parametrize(
    ("transform", "options", "match"),
    [
        ("hyde", {"bogus": 1}, "bogus"),
        ("hyde", {"query_weight": "abc"}, "query_weight"),
        ("hyde", {"grounded": True}, "grounded"),
        ("hyde", {"cache": "x"}, "cache"),
        ("hyde", {"llm": "x"}, "llm"),
        ("rocchio", {"bogus": 1}, "bogus"),
        ("rocchio", {"alpha": "1"}, "alpha"),
        ("multi-query", {"original_weight": "x"}, "original_weight"),
        ("rewrite", {"include_query": False, "original_weight": 5}, "include_query"),
    ],
)
def test_a_config_that_cannot_build_its_transform_is_a_value_error_naming_the_file(
    tmp_path: Path, transform: str, options: dict, match: str
) -> None:
    path = _config(tmp_path, transform, options)
    with pytest.raises(ValueError, match=match) as info:
        load_config(path)
    assert "c.json" in str(info.value)


def test_config_format_must_be_the_integer_one_and_json_not_too_deep(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a hyde-plus config"):
        load_config(_config(tmp_path, "hyde", {}, version=True))
    deep = tmp_path / "deep.json"
    deep.write_text('{"hyde_plus_config": 1, "options": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ValueError, match="not a JSON config"):
        load_config(deep)
    with pytest.raises(ValueError, match="folder"):
        load_config(tmp_path)


def test_a_grid_is_checked_whole_before_any_work() -> None:
    from llama_index_hyde_plus.evaluation.tune import MAX_GRID, check_grid

    with pytest.raises(ValueError, match="rocchio:k=3,bogus=1"):
        check_grid("rocchio", [{"k": 3}, {"k": 3, "bogus": 1}])
    with pytest.raises(ValueError, match="at most"):
        check_grid("rocchio", [{"k": 3}] * (MAX_GRID + 1))
    assert check_grid("rocchio", [{"k": 3}]) == [{"k": 3}]


def test_a_grid_over_the_cap_is_refused_before_its_product_is_built() -> None:
    """Counted first: 30 x 30 is refused by `parse_grid` itself, and 3 axes of 300
    values (27 million configurations) are refused without building them."""
    from llama_index_hyde_plus.evaluation.tune import parse_grid

    values = ",".join(str(i) for i in range(30))
    with pytest.raises(ValueError, match=r"30 x 30 = 900 configurations; at most 500"):
        parse_grid(f"a={values}; b={values}")
    many = ",".join(str(i) for i in range(300))
    with pytest.raises(ValueError, match="27000000 configurations"):
        parse_grid(f"a={many}; b={many}; c={many}")
    assert len(parse_grid(f"a={values}; b=1,2")) == 60


@pytest.mark.parametrize("extreme", [1e200, 1e308, 1e-320])
def test_a_config_with_extreme_rocchio_weights_is_refused_naming_the_file(
    tmp_path: Path, extreme: float
) -> None:
    path = _config(tmp_path, "rocchio", {"alpha": extreme, "beta": extreme})
    with pytest.raises(ValueError, match=r"c\.json: .*alpha must"):
        load_config(path)


def test_the_choice_says_why_it_is_not_the_best_scoring_row() -> None:
    from llama_index_hyde_plus.evaluation.report import tune_choice, tune_markdown

    result = tune_result({"query_weight": 0.7})
    said = tune_choice(result)
    assert said.startswith("Chosen: `hyde:query_weight=0.7`")
    assert "not the best-scoring `hyde:grounded=3` (0.4510, 0.1 points higher)" in said
    assert "the simplest configuration within 0.2 points (--tolerance) of the best" in said
    assert said in tune_markdown(result)
    result.winner = result.best
    assert tune_choice(result).endswith(", the best-scoring configuration.")


def test_the_tune_table_fits_80_columns_with_long_configurations_and_a_legend() -> None:
    from rich.console import Console

    from llama_index_hyde_plus.evaluation.report import tune_table

    result = tune_result({"query_weight": 0.7, "gate": 0.4, "strategy": "rerank", "grounded": 3})
    long = {"query_weight": 0.9, "gate": 0.55, "strategy": "rerank", "include_query": True}
    result.best = report(label_for("hyde", long), 0.452, long)
    result.reports.append(result.best)
    console = Console(width=80, record=True)
    console.print(tune_table(result))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    legend = "ga: gate, gr: grounded, iq: include_query, qw: query_weight, s: strategy"
    assert lines[1].strip() == legend
    text = "\n".join(lines)
    for part in ("qw=0.9,", "ga=0.55,", "s=rerank,", "iq=True", "qw=0.7,", "gr=3"):
        assert part in text  # lines end between options, never inside one
    assert "hyde:" not in text.split("\n", 2)[2]  # the title names the transform


def test_short_labels_keep_short_options_whole_and_name_the_defaults() -> None:
    from llama_index_hyde_plus.evaluation.report import short_labels

    shown, legend = short_labels(["hyde", "hyde:gate=0.4,k=3", "none"], "hyde")
    assert shown == ["defaults", "gate=0.4, k=3", "none"] and legend == ""
    shown, legend = short_labels(["rocchio:feedback_depth=10,alpha=1.0"], "rocchio")
    assert shown == ["fd=10, a=1.0"] and legend == "a: alpha, fd: feedback_depth"


def test_a_configuration_that_mostly_fell_back_is_not_measured_and_never_chosen() -> None:
    from rich.console import Console

    from llama_index_hyde_plus.evaluation.report import tune_choice, tune_markdown, tune_table

    base = report("none", 0.40, per_query={f"q{i}": 0.4 for i in range(7)})
    plain = report("hyde", 0.41, {}, per_query={f"q{i}": 0.41 for i in range(7)})
    fell = report("hyde:grounded=3", 0.43, {"grounded": 3}, {f"q{i}": 0.43 for i in range(7)})
    fell.fallbacks = fell.timeouts = 4  # 4 of 7: its score is mostly plain search's
    for r in (plain, fell):
        r.compare_with(base)
    assert pick_winner([fell, plain], DEFAULT_TOLERANCE, "hyde") is plain
    result = TuneResult(
        transform="hyde", dataset="docs", split="generated", queries=7, baseline=base,
        reports=[plain, fell], best=plain, winner=plain, tolerance=DEFAULT_TOLERANCE,
    )  # fmt: skip
    assert result.ranked() == [plain, fell] and result.unmeasured == 1
    console = Console(width=80, record=True)
    console.print(tune_table(result))
    row = next(line for line in console.export_text().splitlines() if "grounded=3" in line)
    assert "not measured" in row and "0/4" in row and "+3.0" not in row and "7/0/0" not in row
    said = tune_choice(result)
    assert "1 of 2 configurations is not measured (it fell back" in said
    assert "and is never chosen" in said
    assert said in tune_markdown(result)
    assert config_payload(result)["tuned_on"]["configurations_not_measured"] == 1
    fell_alone = pick_winner([fell], DEFAULT_TOLERANCE, "hyde")
    result.reports, result.best, result.winner = [fell], fell_alone, fell_alone
    assert tune_choice(result).startswith("No configuration was measured")
    assert not fell_alone.gains()
    console = Console(width=80, record=True)
    console.print(tune_table(result))
    assert "chosen" not in console.export_text()  # none is: the table agrees


def test_tune_and_eval_print_a_label_as_written_never_as_markup_or_control_codes() -> None:
    from rich.console import Console

    from llama_index_hyde_plus.cli._console import literal
    from llama_index_hyde_plus.evaluation.metrics import MEASURES
    from llama_index_hyde_plus.evaluation.report import (
        recommendation,
        rich_table,
        tune_choice,
        tune_table,
        verdicts,
    )
    from llama_index_hyde_plus.evaluation.results import EvalResult

    base = report("none", 0.40, per_query={f"q{i}": 0.4 for i in range(7)})
    odd = report(
        "[bold red]x[/]\x1b]0;t\x07", 0.43, {}, per_query={f"q{i}": 0.43 for i in range(7)}
    )
    for r, score in ((base, 0.40), (odd, 0.43)):
        r.scores = dict.fromkeys(MEASURES, score)
    odd.compare_with(base)
    tuned = TuneResult(
        transform="hyde", dataset="[blink]d", split="train", queries=7, baseline=base,
        reports=[odd], best=odd, winner=odd, tolerance=DEFAULT_TOLERANCE,
    )  # fmt: skip
    run = EvalResult(
        dataset="[blink]d", queries=7, documents=3, config={}, reports=[base, odd],
        index_seconds=0.0, index_cached=True,
    )  # fmt: skip
    console = Console(width=80, record=True, force_terminal=True)
    console.print(tune_table(tuned))
    console.print(rich_table(run))
    for line in [tune_choice(tuned), *verdicts(run), recommendation(run)]:
        console.print(literal(line))
    text = console.export_text(styles=False)
    assert "\x1b" not in text and "\x07" not in text
    assert text.count("[bold red]x[/]") >= 3 and "[blink]d" in text  # choice, verdict, advice
    assert "[boldred]x[/]" in "".join(text.split())  # the tables', folded


def test_a_configuration_label_wider_than_its_column_folds_between_options() -> None:
    from rich.console import Console

    from llama_index_hyde_plus.evaluation.report import tune_table

    result = tune_result({"query_weight": 0.7})
    long = {"query_weight": 0.912345678, "keyword_weight": 0.5, "strategy": "rerank-by-source"}
    result.best = report(label_for("hyde", long), 0.452, long)
    result.reports.append(result.best)
    console = Console(width=80, record=True)
    console.print(tune_table(result))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    start = next(i for i, line in enumerate(lines) if line.startswith(" qw=0.912345678,"))
    pieces = [line.split()[0] for line in lines[start : start + 4]]
    assert pieces == ["qw=0.912345678,", "kw=0.5,", "s=rerank-by-", "source"]


@pytest.mark.parametrize("width", [40, 50, 60])
def test_a_tune_table_too_wide_for_the_terminal_shows_each_configuration_as_a_block(
    width: int,
) -> None:
    from rich.console import Console

    from llama_index_hyde_plus.evaluation.report import tune_table

    result = tune_result({"query_weight": 0.7, "gate": 0.4})
    console = Console(width=width, record=True)
    console.print(tune_table(result))
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width
    assert "…" not in text and "─" not in text
    assert "chosen" in text and "baseline" in text and "none" in text
    assert "qw=0.7, ga=0.4" in text or "query_weight=0.7," in text
    assert "nDCG@10 0.450" in text and "p 0.01" in text
