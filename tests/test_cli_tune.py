"""`hyde-plus tune` and the `--config` it writes, end to end on the tiny BEIR fixture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llama_index_hyde_plus.cli import app

from .conftest import says, team_docs

runner = CliRunner()
TINY = Path(__file__).parent / "data" / "tiny-beir"


def _tune(tmp_path: Path, *args: str) -> tuple[object, Path]:
    out = tmp_path / "tuned.json"
    result = runner.invoke(
        app,
        [
            "tune",
            "--dataset",
            str(TINY),
            "--split",
            "test",
            "--embed",
            "local",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(out),
            "--report",
            str(tmp_path / "tune.md"),
            *args,
        ],
    )
    return result, out


def test_tune_rocchio_sweeps_writes_a_config_and_eval_and_query_accept_it(
    tmp_path: Path,
) -> None:
    result, out = _tune(tmp_path, "--transform", "rocchio", "--write-anyway")
    assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
    output = result.output  # type: ignore[attr-defined]
    assert "warning" in output and "test split" in output  # tuning on test is flagged
    assert "Chosen:" in output and "baseline" in output
    config = json.loads(out.read_text())
    assert config["transform"] == "rocchio" and set(config["options"]) == {"k", "beta"}
    assert config["tuned_on"]["queries"] == 3 and config["tuned_on"]["split"] == "test"
    table = (tmp_path / "tune.md").read_text()
    assert table.count("| rocchio:k=") == 15  # the whole grid is in the report

    evaluated = runner.invoke(
        app,
        [
            "eval",
            "--dataset",
            str(TINY),
            "--transforms",
            "none",
            "--config",
            str(out),
            "--embed",
            "local",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "eval"),
        ],
    )
    assert evaluated.exit_code == 0, evaluated.output
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    [tuned] = [r for r in results["results"] if "rocchio:" in r["transform"]]
    assert tuned["nDCG@10"] == pytest.approx(config["tuned_on"]["ndcg@10"], abs=1e-4)
    assert {"wins", "ties", "losses", "verdict"} <= set(tuned)
    assert tuned["wins"] + tuned["ties"] + tuned["losses"] == 3

    twice = runner.invoke(
        app,
        [
            *("eval", "--dataset", str(TINY), "--transforms", "none", "--embed", "local"),
            *("--config", str(out), "--config", str(out), "--out", str(tmp_path / "e2")),
        ],
    )
    assert twice.exit_code == 2 and "listed twice" in twice.output
    index = tmp_path / "cache" / "indexes"
    [folder] = [p for p in index.iterdir() if p.is_dir()]
    clash = runner.invoke(
        app, ["query", "q", "--index", str(folder), "-t", "hyde", "--config", str(out)]
    )
    assert clash.exit_code == 2 and "is a rocchio config; drop -t hyde" in clash.output
    agree = runner.invoke(
        app, ["query", "renewals", "--index", str(folder), "-t", "rocchio", "--config", str(out)]
    )
    assert agree.exit_code == 0, agree.output


def test_config_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = runner.invoke(
        app, ["eval", "--dataset", str(TINY), "--config", str(bad), "--embed", "local"]
    )
    assert result.exit_code == 2
    assert "error:" in result.output and "bad.json" in result.output
    assert "Traceback" not in result.output


def test_tune_refuses_a_folder_as_out_and_an_unknown_transform(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["tune", "--dataset", str(TINY), "--out", str(tmp_path), "--embed", "local"]
    )
    assert result.exit_code == 2 and "folder" in result.output
    result = runner.invoke(app, ["tune", "--dataset", str(TINY), "--transform", "magic"])
    assert result.exit_code == 2 and "--transform must be one of" in result.output


def _count_generations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count every generation of the local model (all its calls, sync, async and
    streamed, go through ``LocalLLM._request``); the list holds one item a call."""
    from llama_index_hyde_plus.local.llm import LocalLLM

    calls: list[int] = []
    real = LocalLLM._request

    def counted(self: LocalLLM, *args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LocalLLM, "_request", counted)
    return calls


def _count_cache_use(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the transform cache's hits and writes (``SQLiteCache``, eval's and tune's)."""
    from llama_index_hyde_plus.caching.cache import SQLiteCache

    counts = {"hits": 0, "writes": 0}
    get, put = SQLiteCache.get, SQLiteCache.set

    def counted_get(self: SQLiteCache, key: str) -> Any:
        value = get(self, key)
        counts["hits"] += value is not None
        return value

    def counted_set(self: SQLiteCache, key: str, value: dict[str, Any]) -> None:
        counts["writes"] += 1
        put(self, key, value)

    monkeypatch.setattr(SQLiteCache, "get", counted_get)
    monkeypatch.setattr(SQLiteCache, "set", counted_set)
    return counts


@pytest.mark.local
def test_tune_hyde_end_to_end_with_the_local_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real thing on the fixture: SmolLM2 writes free and grounded passages once
    per query, every configuration of the grid reuses them, and a rerun generates
    nothing: every passage comes from the transform cache."""
    calls, cache = _count_generations(monkeypatch), _count_cache_use(monkeypatch)
    result, out = _tune(
        tmp_path, "--transform", "hyde", "--llm", "local", "--concurrency", "2", "--write-anyway"
    )
    assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
    config = json.loads(out.read_text())
    assert config["transform"] == "hyde"
    assert config["tuned_on"]["ndcg@10"] >= 0
    table = (tmp_path / "tune.md").read_text()
    assert "hyde:grounded=3" in table and "strategy=rerank" in table
    first_calls = len(calls)
    assert first_calls > 0 and cache["writes"] > 0  # the counters see the first run
    cache.update(hits=0, writes=0)
    rerun, _ = _tune(tmp_path, "--transform", "hyde", "--llm", "local", "--write-anyway")
    assert rerun.exit_code == 0, rerun.output  # type: ignore[attr-defined]
    assert len(calls) == first_calls, f"the rerun generated {len(calls) - first_calls} times"
    assert cache["hits"] > 0 and cache["writes"] == 0, cache


def test_tune_checks_tolerance_paths_and_grid_before_any_work(tmp_path: Path) -> None:
    base = ["tune", "--dataset", str(TINY), "--split", "test", "-t", "rocchio", "--embed", "local"]
    out = ["--out", str(tmp_path / "c.json")]
    result = runner.invoke(app, [*base, *out, "--tolerance", "100"])
    assert result.exit_code == 2 and "0 and 100 nDCG@10 points" in result.output
    afile = tmp_path / "afile"
    afile.write_text("x")
    result = runner.invoke(app, [*base, *out, "--report", str(afile / "r.md")])
    assert result.exit_code == 2 and "--report" in result.output
    result = runner.invoke(app, [*base, *out, "--grid", "k=3;bogus=1"])
    assert result.exit_code == 2 and "bogus" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "c.json").exists()


def test_eval_config_options_pass_through_as_written(tmp_path: Path) -> None:
    config = tmp_path / "prompt.json"
    config.write_text(
        json.dumps(
            {
                "hyde_plus_config": 1,
                "transform": "rocchio",
                "options": {"k": 2, "beta": 0.2},
            }
        )
    )
    result = runner.invoke(
        app,
        [
            "eval",
            "--dataset",
            str(TINY),
            "--transforms",
            "none",
            "--config",
            str(config),
            "--embed",
            "local",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "eval"),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    assert rows[1]["transform"] == "prompt: rocchio:k=2,beta=0.2"
    assert rows[1]["options"] == {"k": 2, "beta": 0.2}


@pytest.mark.parametrize("flag", ["--out", "--report"])
def test_tune_refuses_to_overwrite_a_file_it_did_not_write(tmp_path: Path, flag: str) -> None:
    """An existing --out must be a config tune wrote, an existing --report a report it
    wrote; anything else (a user's document, another JSON) is refused before any work."""
    mine = tmp_path / ("settings.json" if flag == "--out" else "notes.md")
    mine.write_text('{"theme": "dark"}' if flag == "--out" else "# My notes\n")
    before = mine.read_bytes()
    result, _ = _tune(tmp_path, "--transform", "rocchio", flag, str(mine))
    assert result.exit_code == 2, result.output  # type: ignore[attr-defined]
    output = result.output  # type: ignore[attr-defined]
    assert f"{flag} {mine} exists and is not" in output and "it is left alone" in output
    assert "Traceback" not in output and "queries; tuning" not in output  # before loading
    assert mine.read_bytes() == before


def test_tune_overwrites_its_own_config_and_report(tmp_path: Path) -> None:
    first, out = _tune(tmp_path, "--transform", "rocchio", "--grid", "k=3", "--write-anyway")
    assert first.exit_code == 0, first.output  # type: ignore[attr-defined]
    again, _ = _tune(tmp_path, "--transform", "rocchio", "--grid", "k=5", "--write-anyway")
    assert again.exit_code == 0, again.output  # type: ignore[attr-defined]
    assert json.loads(out.read_text())["options"]["k"] == 5
    assert "rocchio:k=5" in (tmp_path / "tune.md").read_text()


def test_a_sweep_that_does_not_beat_plain_search_says_keep_it_and_writes_no_config(
    tmp_path: Path,
) -> None:
    result, out = _tune(tmp_path, "--transform", "rocchio", "--grid", "k=3")
    assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
    output = " ".join(result.output.split())  # type: ignore[attr-defined]
    said = output[output.rindex("Recommendation:") :]  # the last thing said
    assert said.startswith("Recommendation: keep plain search (`none`)"), output
    assert said.endswith("No config written.")
    assert not out.exists()
    report = (tmp_path / "tune.md").read_text()
    assert "keep plain search" in report and "skip/fb" in report


def test_tune_refuses_outputs_inside_the_documents(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "guide.md").write_text("# Guide\nRenewals happen every year in March.\n")
    for flag, path in (("--out", docs / "tuned.json"), ("--report", docs / "sweep.md")):
        args = ["tune", "--docs", str(docs), "-t", "rocchio", "--llm", "scripted"]
        result = runner.invoke(app, [*args, "--embed", "local", flag, str(path)])
        assert result.exit_code == 2, result.output
        assert f"{flag} {path} is inside --docs" in result.output
    assert (docs / "guide.md").read_text().startswith("# Guide")
    assert sorted(p.name for p in docs.iterdir()) == ["guide.md"]


def test_a_rerun_replaces_its_own_config_and_says_so_in_one_line(tmp_path: Path) -> None:
    """A config tune wrote is its output (its ``hyde_plus_config`` key names it), edited
    or not: the next run replaces it and says so."""
    first, out = _tune(tmp_path, "--transform", "rocchio", "--grid", "k=3", "--write-anyway")
    assert first.exit_code == 0, first.output  # type: ignore[attr-defined]
    assert "replacing" not in first.output  # type: ignore[attr-defined]
    config = json.loads(out.read_text())
    out.write_text(json.dumps({**config, "my_comment": "edited"}, indent=2))
    again, _ = _tune(tmp_path, "--transform", "rocchio", "--grid", "k=5", "--write-anyway")
    assert again.exit_code == 0, again.output  # type: ignore[attr-defined]
    assert f"replacing {out.name} in" in again.output  # type: ignore[attr-defined]
    assert json.loads(out.read_text())["options"]["k"] == 5


def test_tune_refuses_one_path_for_out_and_report_before_any_work(tmp_path: Path) -> None:
    same = tmp_path / "same.x"
    result, _ = _tune(tmp_path, "--transform", "rocchio", "--report", str(same), "--out", str(same))
    assert result.exit_code == 2, result.output  # type: ignore[attr-defined]
    assert "is the --out file" in result.output  # type: ignore[attr-defined]
    assert not same.exists()


def test_a_cache_dir_that_is_a_file_is_refused_before_any_work(tmp_path: Path) -> None:
    afile = tmp_path / "c7"
    afile.write_text("mine")
    for command in (["tune", "-t", "rocchio"], ["eval", "--transforms", "none"]):
        result = runner.invoke(
            app,
            [
                *command,
                "--dataset",
                str(TINY),
                "--embed",
                "local",
                "--cache-dir",
                str(afile),
                "--out",
                str(tmp_path / ("t.json" if command[0] == "tune" else "e")),
            ],
        )
        assert result.exit_code == 2, result.output
        assert f"--cache-dir {afile} is a file" in result.output
        assert "Traceback" not in result.output and afile.read_text() == "mine"


def test_a_cache_inside_the_documents_is_refused(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "guide.md").write_text("# Guide\nRenewals happen every year in March.\n")
    for command in (["tune", "-t", "rocchio", "--out", str(tmp_path / "t.json")], ["eval"]):
        result = runner.invoke(
            app,
            [
                *command,
                "--docs",
                str(docs),
                "--llm",
                "scripted",
                "--embed",
                "local",
                "--cache-dir",
                str(docs / "cache"),
            ],
        )
        assert result.exit_code == 2, result.output
        assert "--cache-dir" in result.output and "is inside --docs" in result.output
    assert sorted(p.name for p in docs.iterdir()) == ["guide.md"]


def test_a_refused_tune_leaves_no_output_folder_behind(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "tune",
            "--dataset",
            str(TINY),
            "--split",
            "nosuch",
            "-t",
            "rocchio",
            "--embed",
            "local",
            "--out",
            str(tmp_path / "t" / "c.json"),
        ],
    )
    assert result.exit_code != 0
    assert not (tmp_path / "t").exists()


def test_tune_never_overwrites_the_report_eval_wrote(tmp_path: Path) -> None:
    evaluated = runner.invoke(
        app,
        [
            "eval",
            "--dataset",
            str(TINY),
            "--transforms",
            "none",
            "--embed",
            "local",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "ev"),
        ],
    )
    assert evaluated.exit_code == 0, evaluated.output
    theirs = tmp_path / "ev" / "results.md"
    before = theirs.read_bytes()
    result, _ = _tune(tmp_path, "--transform", "rocchio", "--report", str(theirs))
    assert result.exit_code == 2, result.output  # type: ignore[attr-defined]
    assert "is not a tune report hyde-plus wrote" in result.output  # type: ignore[attr-defined]
    assert theirs.read_bytes() == before


def test_a_long_sweep_counts_against_its_grid_and_says_where_the_whole_table_is(
    tmp_path: Path,
) -> None:
    grid = "k=3,5,10; beta=0.1,0.2,0.3,0.5,0.8,0.9"  # 18 configurations, 15 shown
    out = tmp_path / "hyde.json"
    args = ["tune", "--dataset", str(TINY), "--split", "test", "--embed", "local"]
    args += ["--cache-dir", str(tmp_path / "cache"), "-t", "rocchio", "--grid", grid]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    bar = next(line for line in lines if line.startswith("configurations"))
    assert "18/18" in bar and "eta" in bar  # the grid is the bar's total: it has an ETA
    assert max(len(line) for line in lines if str(tmp_path) not in line) <= 80
    assert f"15 of 18 shown; all in {tmp_path / 'hyde.md'}" in result.output
    assert (tmp_path / "hyde.md").read_text().count("| rocchio:k=") == 18

    given = runner.invoke(app, [*args, "--out", str(out), "--report", str(tmp_path / "r.md")])
    assert f"15 of 18 shown; all in {tmp_path / 'r.md'}" in given.output

    (tmp_path / "mine.md").write_text("my notes\n")  # a user's file is never replaced
    kept = runner.invoke(app, [*args, "--out", str(tmp_path / "mine.json")])
    assert kept.exit_code == 0, kept.output
    assert "15 of 18 shown; --report FILE writes them all" in kept.output
    assert (tmp_path / "mine.md").read_text() == "my notes\n"


def test_progress_bars_keep_the_count_elapsed_and_eta_whole_at_80_columns() -> None:
    from rich.console import Console

    from llama_index_hyde_plus.cli._console import progress_bar

    bars = progress_bar()
    label = "hyde:grounded=3,query_weight=0.6,gate=0.4,strategy=rerank"
    bars.add_task("configurations", total=74, completed=30, rate=f"last: {label}")
    bars.add_task(label, total=7, rate="0.1 q/s, 4 fell back, 3 in flight")
    console = Console(width=80, record=True)
    console.print(bars.make_tasks_table(bars.tasks))
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines)
    rows = [line for line in lines if "eta" in line]  # a bar's first line: the rest is its label
    assert len(rows) == 2 and "30/74" in rows[0]
    assert all(line.rstrip().endswith("eta -:--:--") and "0:00:00" in line for line in rows)


def test_progress_descriptions_show_whole_words_at_80_columns() -> None:
    from rich.console import Console

    from llama_index_hyde_plus.cli._console import progress_bar, task

    bars = progress_bar()
    label = "multi-query:n=3,rrf_k=60,original_weight=2.0"
    for description in ("Writing questions", "Embedding corpus", label):
        advance = task(bars, description, 100, "q/s")
        advance(30, fell_back=4, note="3 in flight")
    console = Console(width=80, record=True)
    console.print(bars.make_tasks_table(bars.tasks))
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in "".join(lines)[:20]
    assert lines[0].startswith("Writing questions ") and lines[1].startswith("Embedding corpus ")
    assert [line.split()[0] for line in lines[2:]] == [
        "multi-query:n=3,",
        "rrf_k=60,",
        "original_weight=",
        "2.0",
    ]


def _docs_run(tmp_path: Path, command: str, *args: str, seed: int = 0) -> str:
    """``command`` on questions a scripted model writes from 12 one-line documents
    (the set in ``set<seed>``); its output, whitespace folded."""
    docs = tmp_path / "docs"
    if not docs.exists():
        team_docs(tmp_path)
    common = ["--docs", str(docs), "--questions", "6", "--seed", str(seed), "--embed", "local"]
    common += ["--questions-dir", str(tmp_path / f"set{seed}"), "--cache-dir", str(tmp_path / "c")]
    result = runner.invoke(app, [command, *common, *args])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def _scripted_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every model `eval` and `tune` load writes a fair question for a chunk, and a
    passage that names nothing for HyDE."""
    import re

    from llama_index_hyde_plus.cli._evaluation import ModelChoice
    from llama_index_hyde_plus.testing import ScriptedLLM

    def reply(prompt: str) -> str:
        teams = re.findall(r"Team (\d+) owns", prompt)
        return f"Which team owns service {int(teams[0]) * 7}?" if teams else "Nothing."

    monkeypatch.setattr(ModelChoice, "make_llm", lambda self: ScriptedLLM(respond=reply))


def test_eval_warns_of_optimistic_scores_only_with_a_config_tuned_on_the_same_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _scripted_writer(monkeypatch)
    warned = "was tuned on this very question set: its scores here are optimistic"
    sweep = ["-t", "hyde", "--grid", "query_weight=0.5", "--report", str(tmp_path / "t.md")]
    said = _docs_run(tmp_path, "tune", *sweep, "--out", str(tmp_path / "none.json"))
    assert "No config written" in said and not (tmp_path / "none.json").exists()
    plain = ["--transforms", "none,hyde", "--out", str(tmp_path / "e1")]
    assert "are optimistic" not in _docs_run(tmp_path, "eval", *plain)  # no tuned config in use

    from llama_index_hyde_plus.evaluation.questions import made_from

    tuned = tmp_path / "tuned.json"
    _docs_run(tmp_path, "tune", *sweep, "--out", str(tuned), "--write-anyway")
    recorded = json.loads(tuned.read_text())["tuned_on"]["question_set"]
    assert recorded == made_from(tmp_path / "set0") and recorded["seed"] == 0
    scored = ["--transforms", "none", "--config", str(tuned), "--out", str(tmp_path / "e2")]
    assert says(_docs_run(tmp_path, "eval", *scored), f"warning: {tuned} {warned}")
    other = ["--transforms", "none", "--config", str(tuned), "--out", str(tmp_path / "e3")]
    assert "are optimistic" not in _docs_run(tmp_path, "eval", *other, seed=1)  # another set


def test_tune_help_describes_its_own_dataset_and_eval_help_the_conversational_one() -> None:
    def flat(command: str) -> str:
        shown = runner.invoke(app, [command, "--help"], env={"COLUMNS": "300"}).output
        return " ".join(shown.replace("│", " ").split())

    tune = flat("tune")
    assert "--dataset <path> BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv)." in tune
    assert "for eval" not in tune and "conversational" not in tune  # tune refuses one
    assert "or a conversational set (corpus.jsonl, turns/SPLIT.jsonl)" in flat("eval")


def test_tune_on_the_users_labels_calls_them_labelled_not_generated(tmp_path: Path) -> None:
    docs = team_docs(tmp_path)
    labels = tmp_path / "labels.tsv"
    labels.write_text("".join(f"Who owns service {7 * t}?\tt{t}.txt\t1\n" for t in (1, 2, 3)))
    out = tmp_path / "r.json"
    args = ["tune", "--docs", str(docs), "--qrels", str(labels), "-t", "rocchio"]
    args += ["--grid", "k=3", "--write-anyway", "--embed", "local", "--out", str(out)]
    args += ["--questions-dir", str(tmp_path / "set"), "--cache-dir", str(tmp_path / "c")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "docs labelled questions: 3 queries; tuning rocchio" in said
    assert "tune rocchio on docs labelled (3 queries" in said and "generated" not in said
    assert json.loads(out.read_text())["tuned_on"]["split"] == "labelled"


def test_a_warning_logged_during_progress_bars_goes_through_their_console() -> None:
    import logging

    from rich.logging import RichHandler

    from llama_index_hyde_plus.cli._console import progress_bar, setup_logging

    setup_logging(False)
    bars = progress_bar()
    [handler] = logging.getLogger().handlers
    assert isinstance(handler, RichHandler) and handler.console is bars.console  # above the bars


@pytest.mark.parametrize("width", range(40, 56))
def test_progress_descriptions_never_fold_inside_a_word_in_a_narrow_terminal(width: int) -> None:
    from rich.console import Console

    from llama_index_hyde_plus.cli._console import progress_bar, task

    bars = progress_bar()
    for description in ("configurations", "Writing questions"):
        task(bars, description, 100, "q/s")
    console = Console(width=width, record=True)
    console.print(bars.make_tasks_table(bars.tasks))
    words = [line.split()[0] for line in console.export_text().splitlines() if line.strip()]
    for word in words:
        shown = word.rstrip("…")
        assert shown in ("configurations", "Writing", "questions") or word.endswith("…"), word
