from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from llama_index_hyde_plus.evaluation import load_beir, run_eval
from llama_index_hyde_plus.evaluation.report import markdown, rich_table, write_outputs
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM

TINY = Path(__file__).parent / "data" / "tiny-beir"


def result(tmp_path: Path):  # type: ignore[no-untyped-def]
    llm = ScriptedLLM(respond=lambda p: "Enterprise renewals slipped.")
    return run_eval(
        load_beir(TINY),
        ["none", "hyde"],
        llm=llm,
        embed_model=DeterministicEmbedding(),
        embed_label="det",
        cache_root=tmp_path,
        config={"concurrency": 4},
    )


def test_outputs_are_written(tmp_path: Path) -> None:
    res = result(tmp_path)
    paths = write_outputs(res, tmp_path / "out", command="hyde-plus eval --dataset x")
    assert [p.name for p in paths] == ["results.json", "results.md", "results.png"]
    data = json.loads(paths[0].read_text())
    assert data["command"] == "hyde-plus eval --dataset x"
    assert [r["transform"] for r in data["results"]] == ["none", "hyde"]
    assert {
        "nDCG@10",
        "R@10",
        "R@100",
        "RR@10",
        "latency_p50_s",
        "cost_usd",
        "p_value_vs_none",
    } <= set(data["results"][1])
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = paths[1].read_text()
    assert "| transform | nDCG@10 | Recall@10 | Recall@100 | MRR@10 |" in md
    assert md.count("\n| ") >= 3


def test_terminal_table_fits_80_columns_with_every_header_and_the_changed_share(
    tmp_path: Path,
) -> None:
    res = result(tmp_path)
    res.reports[1].label = "hyde:include_query=true,question_weight=0.7"
    console = Console(width=80, record=True)
    console.print(rich_table(res))
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    header = next(line for line in text.splitlines() if "transform" in line)
    for name in ("transform", "nDCG@10", "Δ pts [95% CI]", "W/T/L", "chg", "skip/fb", "p50"):
        assert name in header, name
    changed = res.reports[1].changed
    assert 0 < changed <= res.reports[1].queries  # the scripted passage moves rankings
    assert f"{100 * changed / res.reports[1].queries:.0f}%" in text
    assert "…" not in text  # nothing cut off


def test_results_json_has_per_question_scores_and_the_changed_count(tmp_path: Path) -> None:
    res = result(tmp_path)
    data = json.loads(write_outputs(res, tmp_path / "out")[0].read_text())
    hyde = data["results"][1]
    assert hyde["changed_rankings"] == res.reports[1].changed
    assert set(hyde["per_query_ndcg@10"]) == set(res.reports[1].per_query_ndcg)
    assert all(0 <= v <= 1 for v in hyde["per_query_ndcg@10"].values())


def test_terminal_table_lists_every_transform(tmp_path: Path) -> None:
    console = Console(width=200, record=True)
    console.print(rich_table(result(tmp_path)))
    text = console.export_text()
    assert "none" in text and "hyde" in text and "nDCG@10" in text
    assert "hyde" in markdown(result(tmp_path))


def test_a_re_run_replaces_its_own_results_and_says_so_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Results in a folder hyde-plus owns are its own output (edited or not): a re-run
    replaces them, saying so; files of the user's beside them are kept."""
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    res = result(tmp_path)
    out = tmp_path / "out"
    write_outputs(res, out, command="first")
    assert not caplog.records
    (out / "results.md").write_text("# edited\n")
    (out / "notes.txt").write_text("mine")
    write_outputs(res, out, command="second")  # a re-run into the same folder
    assert json.loads((out / "results.json").read_text())["command"] == "second"
    assert "second" in (out / "results.md").read_text()
    assert (out / "notes.txt").read_text() == "mine"
    [line] = [r.getMessage() for r in caplog.records]
    assert line == f"replacing results.json, results.md, results.png in {out} from the previous run"


def test_a_folder_hyde_plus_does_not_own_is_never_written_into(tmp_path: Path) -> None:
    res = result(tmp_path)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "results.md").write_text("# My own results\n")
    with pytest.raises(
        ValueError, match=rf"--out {out} is neither empty nor a hyde-plus eval-results"
    ):
        write_outputs(res, out)
    assert [p.name for p in out.iterdir()] == ["results.md"]
    assert (out / "results.md").read_text() == "# My own results\n"


@pytest.mark.parametrize("thing", ["folder", "link"])
def test_a_users_folder_or_link_where_a_result_goes_is_refused_naming_it(
    tmp_path: Path, thing: str
) -> None:
    res = result(tmp_path)
    out = tmp_path / "out"
    write_outputs(res, out)
    target = out / "results.md"
    target.unlink()
    if thing == "folder":
        target.mkdir()
    else:
        target.symlink_to(tmp_path / "elsewhere.md")
    with pytest.raises(ValueError, match=rf"--out: {target} is a {thing} hyde-plus did not write"):
        write_outputs(res, out)
    assert not (tmp_path / "elsewhere.md").exists()


def test_a_re_run_replaces_results_atomically_so_hard_links_keep_the_old_run(
    tmp_path: Path,
) -> None:
    res = result(tmp_path)
    out, archive = tmp_path / "out", tmp_path / "archive"
    write_outputs(res, out, command="first run")
    archive.mkdir()
    for name in ("results.json", "results.md", "results.png"):
        os.link(out / name, archive / name)
    before = {p.name: p.read_bytes() for p in archive.iterdir()}
    write_outputs(res, out, command="second run")
    assert {p.name: p.read_bytes() for p in archive.iterdir()} == before
    assert "second run" in (out / "results.md").read_text()
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_full_disk_while_writing_results_leaves_the_old_run_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    res = result(tmp_path)
    out = tmp_path / "out"
    write_outputs(res, out, command="first run")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_open = os.open

    def full_at_the_chart(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if Path(path).name.startswith(".results.png."):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", full_at_the_chart)
    with pytest.raises(OSError, match="No space left"):
        write_outputs(res, out, command="second run")
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no run mixed, no .tmp


def test_an_eval_ends_with_one_recommendation_a_user_can_act_on(tmp_path: Path) -> None:
    from llama_index_hyde_plus.evaluation.report import recommendation

    res = result(tmp_path)
    hyde = res.reports[1]
    hyde.label, hyde.queries = "hyde:question_weight=0.7", 300
    hyde.delta_vs_none, hyde.p_value_vs_none, hyde.interval_vs_none = 0.021, 0.004, (0.008, 0.034)
    hyde.wins, hyde.ties, hyde.losses, hyde.fallbacks = 40, 240, 20, 0
    said = recommendation(res)
    assert said.startswith("Recommendation: use `hyde:question_weight=0.7`")
    assert "+2.1 [+0.8,+3.4]" in said and "p = 0.004" in said

    hyde.p_value_vs_none = 0.3  # a gain that could be chance
    said = recommendation(res)
    assert said.startswith("Recommendation: keep plain search (`none`)")
    assert "no transform gains significantly" in said and "p = 0.30" in said

    hyde.p_value_vs_none, hyde.fallbacks = 0.004, 31  # the score is partly plain search's
    said = recommendation(res)
    assert "keep plain search" in said and "no transform was measured" in said
    assert "`hyde:question_weight=0.7` fell back on 31 of 300" in said
    assert "the best" not in said
    assert said in markdown(res)


def test_the_chart_labels_say_how_many_queries_fell_back_or_changed(tmp_path: Path) -> None:
    from llama_index_hyde_plus.evaluation.report import delta_label

    hyde = result(tmp_path).reports[1]
    hyde.queries, hyde.changed, hyde.skipped, hyde.fallbacks = 300, 150, 12, 23
    label = delta_label(hyde)
    assert "50% changed" in label and "12 skipped" in label and "23 fell back" in label


def test_titles_count_chunks_for_questions_written_from_chunks(tmp_path: Path) -> None:
    res = result(tmp_path)
    res.unit = "chunks"
    assert f"{res.documents} chunks" in markdown(res)
    console = Console(width=80, record=True)
    console.print(rich_table(res))
    assert f"{res.documents} chunks" in console.export_text()


@pytest.mark.parametrize(
    ("p50", "shown"), [(0.034, "34 ms"), (9.5, "9500 ms"), (15.2, "15 s"), (float("nan"), "cached")]
)
def test_the_terminal_table_and_results_md_show_a_latency_the_same_way(
    tmp_path: Path, p50: float, shown: str
) -> None:
    res = result(tmp_path)
    res.reports[1].latency_p50_s = p50
    console = Console(width=80, record=True)
    console.print(rich_table(res))
    [terminal] = [line for line in console.export_text().splitlines() if "hyde" in line]
    [row] = [line for line in markdown(res).splitlines() if line.startswith("| hyde |")]
    assert terminal.rstrip().endswith(shown)
    assert f"| {shown} |" in row


def test_a_transform_that_mostly_fell_back_is_not_measured_with_one_count_everywhere(
    tmp_path: Path,
) -> None:
    from llama_index_hyde_plus.cli.eval import timeout_hint
    from llama_index_hyde_plus.evaluation.report import recommendation, verdicts

    res = result(tmp_path)
    hyde = res.reports[1]
    hyde.queries, hyde.fallbacks, hyde.timeouts = 15, 11, 11
    hyde.delta_vs_none, hyde.p_value_vs_none = 0.001, 0.8
    said = "fell back on 11 of 15: timeouts"
    assert hyde.verdict == f"not measured: {said}"
    lines = verdicts(res)
    assert lines == [f"hyde: not measured: {said}"]  # the count once, never "no clear..."
    record = hyde.to_dict()
    assert record["verdict"] == hyde.verdict and record["fallbacks"] == 11
    assert record["measured"] is False and record["fallback_timeouts"] == 11
    assert said in recommendation(res) and said in markdown(res)
    assert "no clear difference" not in markdown(res)
    console = Console(width=80, record=True)
    console.print(rich_table(res))
    assert " 0/11 " in console.export_text()  # skip/fb
    hint = timeout_hint(res.reports, 4)
    assert hint is not None and f"hyde {said}" in hint


def test_fallbacks_say_how_many_timed_out_had_unusable_replies_and_raised(
    tmp_path: Path,
) -> None:
    hyde = result(tmp_path).reports[1]
    hyde.queries, hyde.fallbacks, hyde.timeouts = 50, 5, 3
    assert hyde.fell_back == "fell back on 5 of 50: 3 timeouts, 2 errors"
    assert hyde.measured  # a tenth: still its own score
    hyde.timeouts = 0
    assert hyde.fell_back == "fell back on 5 of 50: errors"
    hyde.unusable = 5  # the model answered with nothing that could be parsed
    assert hyde.fell_back == "fell back on 5 of 50: unusable replies"
    hyde.unusable, hyde.timeouts = 1, 3
    assert hyde.fell_back == "fell back on 5 of 50: 3 timeouts, 1 unusable reply, 1 error"
    hyde.fallbacks, hyde.timeouts, hyde.unusable = 1, 0, 1
    assert hyde.fell_back == "fell back on 1 of 50: an unusable reply"
    hyde.unusable = 0
    assert hyde.fell_back == "fell back on 1 of 50: an error"
    hyde.fallbacks = 6
    assert not hyde.measured and hyde.verdict.startswith("not measured")


def test_a_recommendation_never_calls_a_loss_or_an_unmeasured_row_the_best(
    tmp_path: Path,
) -> None:
    from llama_index_hyde_plus.evaluation.report import recommendation

    res = result(tmp_path)
    hyde = res.reports[1]
    hyde.queries = 300
    hyde.delta_vs_none, hyde.p_value_vs_none, hyde.interval_vs_none = -0.003, 0.97, (-0.19, 0.18)
    hyde.fallbacks = 0
    said = recommendation(res)
    assert "the best" not in said and "no transform scores above plain search" in said
    assert "-0.3 [-19.0,+18.0] nDCG@10 points" in said
    assert "the closest of the transforms, `hyde`, is -0.3" in said
    assert "highest" not in said  # a transform below plain search scores highest of none
    hyde.delta_vs_none = 0.02  # a gain that could be chance says so
    assert "which could be chance (p = 0.970)" in recommendation(res)


def _two_unmeasured(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The tiny run with `hyde` and a `multi-query` copy of it both falling back on
    4 of 7 queries, as in a user's run: `hyde` scoring above `none` on every measure,
    `multi-query` the same as `none`."""
    import copy

    res = result(tmp_path)
    none, hyde = res.reports
    multi = copy.deepcopy(hyde)
    multi.label = "multi-query"
    res.reports.append(multi)
    for report, timeouts, gain in ((hyde, 4, 0.01), (multi, 3, 0.0)):
        report.queries, report.fallbacks, report.timeouts = 7, 4, timeouts
        report.scores = {m: v + gain for m, v in none.scores.items()}
        report.delta_vs_none, report.p_value_vs_none = gain, 0.36
        report.wins, report.ties, report.losses = 1, 6, 0
    return res


def test_results_md_says_not_measured_where_the_terminal_does_and_never_bolds_it(
    tmp_path: Path,
) -> None:
    from llama_index_hyde_plus.evaluation.report import recommendation

    res = _two_unmeasured(tmp_path)
    data = json.loads(write_outputs(res, tmp_path / "out")[0].read_text())
    md = (tmp_path / "out" / "results.md").read_text()
    rows = {line.split(" | ")[0][2:]: line for line in md.splitlines() if line.startswith("| ")}
    hyde, multi = rows["hyde"], rows["multi-query"]
    assert "| not measured (fell back on 4 of 7: timeouts) | - | - |" in hyde
    assert "| not measured (fell back on 4 of 7: 3 timeouts, 1 error) | - | - |" in multi
    for row in (hyde, multi):  # not bold, even where it equals the best (`none`'s)
        assert "**" not in row and "1/6/0" not in row and "0.360" not in row
    assert "+1.0" not in hyde and "+0.0" not in multi
    assert f"**{res.reports[0].scores['nDCG@10']:.4f}**" in rows["none"]  # the best measured
    console = Console(width=80, record=True, force_terminal=True)
    console.print(rich_table(res))
    terminal = console.export_text(styles=True).splitlines()
    styled = [line for line in terminal if "not measured" in line]
    assert len(styled) == 2 and not any("\x1b[1;32m" in line for line in styled)
    assert any("\x1b[1;32m" in line for line in terminal if " none " in line)
    said = recommendation(res)
    assert "`hyde` fell back on 4 of 7: timeouts" in said
    assert "`multi-query` fell back on 4 of 7: 3 timeouts, 1 error " in said
    assert said in md
    for record in data["results"][1:]:  # the raw numbers, and the same verdict
        assert record["measured"] is False and record["fallbacks"] == 4
        assert record["p_value_vs_none"] == 0.36 and record["wins"] == 1
        assert record["verdict"].startswith("not measured: fell back on 4 of 7: ")
        assert f"- {record['transform']}: {record['verdict']}" in md


def test_a_recommendation_names_a_transform_not_measured_beside_a_measured_one(
    tmp_path: Path,
) -> None:
    from llama_index_hyde_plus.evaluation.report import recommendation

    res = _two_unmeasured(tmp_path)
    hyde = res.reports[1]
    hyde.fallbacks = hyde.timeouts = 0  # measured: no gain that is not chance
    said = recommendation(res)
    assert "no transform gains significantly here; the highest-scoring, `hyde`" in said
    assert said.endswith("Not measured: `multi-query` fell back on 4 of 7: 3 timeouts, 1 error.")
    hyde.p_value_vs_none = 0.01  # a significant gain: used, and the other still named
    said = recommendation(res)
    assert said.startswith("Recommendation: use `hyde`") and "Not measured: `multi-query`" in said


@pytest.mark.parametrize(
    ("fallbacks", "timeouts", "why"),
    [
        (1, 1, "fell back on 1 of 7: a timeout"),
        (1, 0, "fell back on 1 of 7: an error"),
        (2, 1, "fell back on 2 of 7: 1 timeout, 1 error"),
        (5, 4, "fell back on 5 of 7: 4 timeouts, 1 error"),
        (5, 1, "fell back on 5 of 7: 1 timeout, 4 errors"),
        (3, 3, "fell back on 3 of 7: timeouts"),
    ],
)
def test_a_fallback_reason_counts_in_words_that_agree_with_the_count(
    tmp_path: Path, fallbacks: int, timeouts: int, why: str
) -> None:
    hyde = result(tmp_path).reports[1]
    hyde.queries, hyde.fallbacks, hyde.timeouts = 7, fallbacks, timeouts
    assert hyde.fell_back == why


def _three_kinds_of_reply(prompt: str) -> str:
    """multi-query's replies for the tiny set: an error for the revenue question, the
    question repeated (nothing usable) for the vacation one, usable queries otherwise."""
    if "revenue" in prompt:
        raise RuntimeError("the server said [bold]no[/] | \x1b[31m" + "x" * 500)
    if "vacation" in prompt:
        return "1. How many vacation days do staff get?"
    return "1. laptop encryption policy\n2. device security controls\n3. endpoint protection"


def test_each_fallback_keeps_its_kind_and_reason_in_every_output(tmp_path: Path) -> None:
    from llama_index_hyde_plus.cli.eval import fallback_hints
    from llama_index_hyde_plus.evaluation.report import recommendation

    res = run_eval(
        load_beir(TINY),
        ["none", "multi-query"],
        llm=ScriptedLLM(respond=_three_kinds_of_reply),
        embed_model=DeterministicEmbedding(),
        embed_label="det",
        cache_root=tmp_path,
        config={"concurrency": 1},
    )
    multi = res.reports[1]
    assert (multi.fallbacks, multi.timeouts, multi.unusable, multi.errors) == (2, 0, 1, 1)
    said = "fell back on 2 of 3: 1 unusable reply, 1 error"
    assert multi.verdict == f"not measured: {said}"
    assert said in recommendation(res)
    reasons = multi.fallback_reasons
    assert sorted(reasons) == ["q1", "q2"]
    assert reasons["q1"].startswith("RuntimeError: the server said [bold]no[/]")
    assert reasons["q2"].startswith("UnusableReplyError: no query could be parsed")
    data = json.loads(write_outputs(res, tmp_path / "out")[0].read_text())
    record = data["results"][1]
    assert record["fallback_reasons"] == reasons
    assert (record["fallback_unusable_replies"], record["fallback_errors"]) == (1, 1)
    examples = {e["qid"]: e for e in record["examples"]}
    assert examples["q1"]["fallback_reason"] == reasons["q1"]
    assert examples["q3"]["fallback"] is False and examples["q3"]["fallback_reason"] is None
    md = (tmp_path / "out" / "results.md").read_text()
    [q1] = [line for line in md.splitlines() if "query q1:" in line]
    assert "RuntimeError: the server said \\[bold\\]no\\[/\\] \\| \\\\x1b\\[31m" in q1
    assert q1.endswith("more characters)") and "\x1b" not in md
    [q2] = [line for line in md.splitlines() if "query q2:" in line]
    assert "UnusableReplyError: no query could be parsed from the reply" in q2
    unusable, errors = fallback_hints(res.reports)
    assert unusable.startswith("multi-query: the model's replies held nothing usable")
    assert "larger --llm" in unusable and "check that --llm answers" in errors
    assert fallback_hints(res.reports[:1]) == []


def test_results_md_shows_a_few_reasons_per_transform_and_counts_the_rest(
    tmp_path: Path,
) -> None:
    res = result(tmp_path)
    hyde = res.reports[1]
    hyde.fallbacks = hyde.unusable = 5
    hyde.fallback_reasons = {f"q{i}": f"UnusableReplyError: reply {i}" for i in range(5)}
    hyde.fallback_reasons["q0"] = "RuntimeError: \u202edesrever\u202c\u2028\ud800"
    md = markdown(res)
    assert "RuntimeError: \\\\u202edesrever\\\\u202c \\\\ud800" in md
    assert md.count("- hyde, query q") == 3 and "- hyde: 2 more in results.json" in md
    hyde.fallbacks = hyde.unusable = 0
    hyde.fallback_reasons = {}
    assert "Why queries fell back" not in markdown(res)


def test_the_chart_shows_no_difference_for_a_transform_not_measured(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    from llama_index_hyde_plus.evaluation.report import chart, delta_label

    res = _two_unmeasured(tmp_path)  # hyde +1.0 and multi-query +0.0, both not measured
    res.reports[1].interval_vs_none = (-0.05, 0.07)
    res.reports[2].interval_vs_none = (0.0, 0.0)
    for report in res.reports[1:]:
        label = delta_label(report)
        assert label.startswith("not measured\nfell back on 4 of 7:")
        assert "+" not in label and "95% CI" not in label
    fig = chart(res)
    try:
        deltas = fig.axes[1]
        assert [bar.get_height() for bar in deltas.patches] == [0.0, 0.0]
        assert len(deltas.lines) == 1 and not deltas.collections  # the 0 line: no interval
        texts = " ".join(t.get_text() for t in deltas.texts)
        assert "not measured" in texts and "+0.0" not in texts and "+1.0" not in texts
    finally:
        plt.close(fig)
    res.reports[2].fallbacks = res.reports[2].timeouts = 0  # measured: its bar and interval
    res.reports[2].delta_vs_none, res.reports[2].interval_vs_none = 0.02, (-0.01, 0.05)
    fig = chart(res)
    try:
        deltas = fig.axes[1]
        assert [round(bar.get_height(), 6) for bar in deltas.patches] == [0.0, 2.0]
        assert deltas.collections  # the measured row's interval
        assert "+2.0\n95% CI -1.0 to +5.0" in " ".join(t.get_text() for t in deltas.texts)
    finally:
        plt.close(fig)


def test_the_chart_draws_a_label_as_written_with_no_warning(tmp_path: Path) -> None:
    import warnings

    import matplotlib.pyplot as plt

    from llama_index_hyde_plus.evaluation.report import bar_chart, chart

    res = _two_unmeasured(tmp_path)
    res.dataset = "cost $\\frac$ x\x1b"  # mathematics that does not parse, a control
    odd = ["cost $5 vs $x$", "a\x1b]0;t\x07b \u202eevil"]
    for report, label in zip(res.reports[1:], odd):
        report.label = label
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a missing glyph or a mathtext error would raise
        assert bar_chart(res).startswith(b"\x89PNG")
        fig = chart(res)
    try:
        drawn = [t.get_text() for ax in fig.axes for t in ax.get_xticklabels()]
        assert r"cost \$5 vs \$x\$" in drawn and "a\\x1b]0;t\\x07b \\u202eevil" in drawn
        assert fig.texts[0].get_text().startswith(r"cost \$\frac\$ x\x1b:")
    finally:
        plt.close(fig)


def test_the_chart_draws_a_very_long_label_cut_with_no_warning(tmp_path: Path) -> None:
    import warnings

    import matplotlib.pyplot as plt

    from llama_index_hyde_plus.evaluation.report import DRAWN_CHARS, chart

    res = _two_unmeasured(tmp_path)
    res.reports[1].label = "hyde:prompt=" + "L" * 300 + "{query}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Tight layout not applied" would raise
        fig = chart(res)
    try:
        drawn = [t.get_text() for ax in fig.axes for t in ax.get_xticklabels()]
        assert any(d.startswith("hyde:prompt=LLL") and d.endswith("…") for d in drawn)
        assert max(len(d) for d in drawn) <= DRAWN_CHARS
    finally:
        plt.close(fig)


def test_a_progress_bar_shows_its_description_as_written() -> None:
    from rich.console import Console
    from rich.progress import Progress

    from llama_index_hyde_plus.cli._console import task

    console = Console(width=80, record=True, force_terminal=True)
    with Progress(console=console) as progress:
        task(progress, "[bold red]x\x1b]0;t", 1, "queries")(1)
    text = console.export_text(styles=False)
    assert "[bold red]x\\x1b]0;t" in text and "\x1b]0;t" not in text


def test_terminal_table_labels_and_a_long_data_set_name_fold_after_punctuation_not_mid_word(
    tmp_path: Path,
) -> None:
    res = result(tmp_path)
    res.dataset = "my-company-handbook_" + "-".join(["section"] * 12)  # wider than the table
    res.reports[1].label = "hyde:query_weight=0.9,gate=0.6,multi_query_fusion=rrf"
    console = Console(width=80, record=True)
    console.print(rich_table(res))
    lines = console.export_text().splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    words = {"query", "weight", "gate", "multi", "fusion", "section", "handbook"}
    ends = [line.rstrip() for line in lines]
    cut = [w for w in words for end in ends for i in range(2, len(w)) if end.endswith(w[:i])]
    assert not cut  # no line ends inside a word (snake_case's words are words)
    label = "".join(line.split()[0] for line in lines[4:] if line.split())
    assert "hyde:query_weight=0.9,gate=0.6,multi_query_fusion=rrf" in label


@pytest.mark.parametrize("width", [20, 40, 50, 60])
def test_an_eval_table_too_wide_for_the_terminal_shows_each_row_as_a_block_every_value_whole(
    tmp_path: Path, width: int
) -> None:
    res = result(tmp_path)
    res.reports[1].label = "hyde:include_query=true,question_weight=0.7"
    wide = Console(width=200, record=True)
    wide.print(rich_table(res))
    console = Console(width=width, record=True)
    console.print(rich_table(res))
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width
    assert "…" not in text and "─" not in text  # blocks, not a table that lost columns
    joined = "".join(text.split())
    for row in wide.export_text().splitlines()[4:]:  # the wide table's rows: every value
        for value in row.split()[1:]:
            assert value in text or value in joined, value
    for label in ("none", "hyde:include_query=true,question_weight=0.7"):
        assert label in joined
    assert "nDCG@10 0.876" in text or "nDCG@10 0.8" in text


def test_an_eval_table_keeps_its_columns_at_80_with_the_interval_whole(tmp_path: Path) -> None:
    res = result(tmp_path)
    console = Console(width=80, record=True)
    console.print(rich_table(res))
    lines = console.export_text().splitlines()
    header = next(line for line in lines if "transform" in line)
    shown = ["transform", "nDCG@10", "Δ", "pts", "[95%", "CI]", "W/T/L", "p", "chg", "skip/fb"]
    assert header.split() == [*shown, "p50"]
    hyde = next(line for line in lines if line.lstrip().startswith("hyde"))
    assert re.search(r" [+-]\d+\.\d \[[+-]\d+\.\d,[+-]\d+\.\d\] ", hyde), hyde


def test_names_show_on_one_line_with_tabs_and_line_feeds_spelled_in_table_markdown_and_chart(
    tmp_path: Path,
) -> None:
    import matplotlib.pyplot as plt

    from llama_index_hyde_plus.evaluation.report import chart

    res = result(tmp_path)
    res.dataset = "plain\n\n transform  nDCG@10\n none 0.999 FORGED\tx"
    res.reports[1].label = "h\t\u2028x"
    for width in (40, 80):
        console = Console(width=width, record=True)
        console.print(rich_table(res))
        text = console.export_text()
        assert "\t" not in text and "\u2028" not in text
        spelled = "plain\\x0a\\x0atransformnDCG@10\\x0anone0.999FORGED\\x09x:3queries"
        assert spelled in "".join(text.split())  # the name whole, its line feeds spelled
        assert "h\\x09\\u2028x" in text
    md = markdown(res, "hyde-plus eval --dataset $'plain\\x0a'")
    title = next(line for line in md.splitlines() if line.startswith("plain"))
    assert title.startswith("plain\\x0a\\x0a transform  nDCG@10\\x0a none 0.999 FORGED\\x09x: ")
    assert "| h\\x09\\u2028x |" in md and "\t" not in md
    fig = chart(res)
    try:
        assert "\n" not in fig.texts[0].get_text() and "\\x09x" in fig.texts[0].get_text()
    finally:
        plt.close(fig)


@pytest.mark.parametrize(
    "name",
    [
        "plain name",
        "tab\there",
        "line\nbreak",
        "esc\x1b[31mred",
        "next line\x85c1",
        "csi\x9bc1",
        "bidi\u202eevil",
        "quote ' and \\ backslash",
        "emoji 🚀 日本語",
        os.fsdecode(b"not utf-8 \xff\xfe"),
    ],
)
def test_a_name_in_the_results_command_reads_back_as_the_same_bytes_in_bash(
    name: str,
) -> None:
    import shutil
    import subprocess

    from llama_index_hyde_plus.cli._evaluation import shell_word

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    word = shell_word(name)
    assert "\n" not in word and "\t" not in word and "\x1b" not in word
    env = {"LC_ALL": "C.UTF-8", "PATH": os.environ.get("PATH", "")}
    done = subprocess.run(
        [bash, "-c", f"printf %s {word}"], capture_output=True, env=env, check=True
    )
    assert done.stdout == os.fsencode(name)
