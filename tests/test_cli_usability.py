"""What a person meets at the command line: quiet logs, early errors, hints, version."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llama_index_hyde_plus import __version__
from llama_index_hyde_plus._entry import early_error
from llama_index_hyde_plus.cli import app

from .test_readers import pdf_bytes

runner = CliRunner()


def _hyde_plus(*args: str) -> subprocess.CompletedProcess[str]:
    """The command in a fresh process, as a user runs it (libraries imported anew)."""
    return subprocess.run(
        [sys.executable, "-m", "llama_index_hyde_plus.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=300,
        check=False,
    )


def test_third_party_logs_stay_quiet_unless_verbose(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("The nightly backup window closes at 04:00 UTC.")
    # a PDF whose startxref pointer is off: pypdf repairs it and logs warnings
    broken = pdf_bytes("Quarterly revenue rose.").replace(b"startxref\n", b"startxref\n1")
    (docs / "r.pdf").write_bytes(broken)

    quiet = _hyde_plus("index", str(docs), "--out", str(tmp_path / "q"), "--embed", "local")
    assert quiet.returncode == 0, quiet.stderr
    assert "Indexed 2 documents" in quiet.stdout
    assert "Could not load library" not in quiet.stderr and "faiss" not in quiet.stderr
    assert "startxref" not in quiet.stderr and "INFO" not in quiet.stderr

    loud = _hyde_plus("index", str(docs), "--out", str(tmp_path / "v"), "--embed", "local", "-v")
    assert loud.returncode == 0, loud.stderr
    assert "faiss" in loud.stderr and "startxref" in loud.stderr


def test_version_prints_the_package_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"hyde-plus {__version__}"


def test_openai_without_a_key_is_refused_before_llama_index_loads() -> None:
    probe = (
        "import sys\n"
        "from llama_index_hyde_plus._entry import main\n"
        "sys.argv = ['hyde-plus', *sys.argv[1:]]\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    print(exc.code, 'llama_index.core' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    for args in (
        ["transform", "q", "--llm", "openai"],
        ["eval", "--docs", "d", "--llm=openai:gpt-4o-mini"],
        ["index", "d", "--out", "o", "--embed", "OpenAI"],
    ):
        done = subprocess.run(
            [sys.executable, "-c", probe, *args], capture_output=True, text=True, env=env
        )
        assert done.stdout.split() == ["2", "False"], (args, done.stdout, done.stderr)
        assert done.stderr.startswith("error:") and "OPENAI_API_KEY" in done.stderr


def test_the_early_key_check_leaves_help_and_other_models_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert early_error(["transform", "q", "--llm", "openai", "--help"]) is None
    assert early_error(["transform", "q", "--llm", "local", "--embed", "auto"]) is None
    assert early_error(["transform", "--llm"]) is None  # click names the missing value
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert early_error(["transform", "q", "--llm", "openai"]) is None


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["query", "q", "--index", "IDX", "-t", "hdye"], "did you mean 'hyde'?"),
        (["eval", "--dataset", "DATA", "--transforms", "none,hdye"], "did you mean 'hyde'?"),
        (["tune", "--dataset", "DATA", "-t", "multi_qery"], "did you mean 'multi-query'?"),
        (["eval", "--dataset", "DATA", "--transforms", "none,zzz"], None),
    ],
)
def test_a_mistyped_transform_name_gets_the_closest_one(
    tmp_path: Path, args: list[str], hint: str | None
) -> None:
    data = Path(__file__).parent / "data" / "tiny-beir"
    paths = {"IDX": str(tmp_path), "DATA": str(data)}
    result = runner.invoke(app, [paths.get(a, a) for a in args])
    assert result.exit_code == 2 and result.output.startswith("error:"), result.output
    if hint is None:
        assert "did you mean" not in result.output
    else:
        assert hint in result.output


def test_a_missing_index_path_says_it_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-index"
    result = runner.invoke(app, ["query", "q", "--index", str(missing), "-t", "none"])
    assert result.exit_code == 2 and "does not exist" in result.output
    assert not missing.exists()


def _long_docs(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    sections = [
        f"## Part {i}\n\nThe ferry timetable for pier {i} changes in spring and autumn. Boats "
        "leave every twenty minutes from the northern quay, and tickets are sold at the "
        "kiosk beside the harbour office until late in the evening."
        for i in range(8)
    ]
    (docs / "guide.md").write_text("# Ferry guide\n\n" + "\n\n".join(sections))
    (docs / "lines.jsonl").write_text('{"_id": "office", "text": "The Lisbon office moved."}\n')
    return docs


def test_the_query_table_gives_the_terminal_width_to_the_text(tmp_path: Path) -> None:
    out = tmp_path / "index"
    built = runner.invoke(
        app, ["index", str(_long_docs(tmp_path)), "--out", str(out), "--embed", "local"]
    )
    assert built.exit_code == 0, built.output
    argv = ["query", "ferry timetable for pier 5", "--index", str(out), "-t", "none", "-k", "2"]
    wide = runner.invoke(app, argv, env={"COLUMNS": "160"})
    assert wide.exit_code == 0, wide.output
    lines = wide.output.splitlines()
    header = next(line for line in lines if "score" in line)
    assert [c.strip() for c in header.strip("┃ ").split("┃")] == ["#", "score", "source", "text"]
    first = next(line for line in lines if line.startswith("│ 1 "))
    _, _, source, text = (c.strip() for c in first.strip("│ ").split("│"))
    assert source == "guide.md#7"  # the file and the chunk, once (chunk 1 is the title)
    assert len(text) > 110 and len(first) <= 160  # the text has the room the terminal has
    narrow = runner.invoke(app, argv, env={"COLUMNS": "80"})
    assert max(len(line) for line in narrow.output.splitlines()) <= 80

    line = runner.invoke(app, ["query", "Lisbon office", "--index", str(out), "-t", "none"])
    assert "lines.jsonl:office" in line.output  # a line of a .jsonl file by its id


def test_the_report_times_every_phase_and_the_whole_run(tmp_path: Path) -> None:
    tiny = Path(__file__).parent / "data" / "tiny-beir"
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            *("eval", "--dataset", str(tiny), "--transforms", "none,rocchio"),
            *("--embed", "local", "--out", str(out), "--cache-dir", str(tmp_path / "c")),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    phases = data["phase_seconds"]
    assert list(phases) == ["models", "dataset", "index", "none", "rocchio"]
    assert all(seconds >= 0 for seconds in phases.values())
    assert sum(phases.values()) <= data["wall_seconds"] + 0.5  # rounded to 0.1 s each
    time_line = (out / "results.md").read_text().strip().splitlines()[-1]
    assert time_line.startswith("Time: models ") and ", rocchio " in time_line
    total = re.search(r"; total ([\d,]+) s\.$", time_line)
    assert total and abs(int(total[1].replace(",", "")) - data["wall_seconds"]) <= 1


def test_the_time_line_names_a_cached_index_and_time_outside_the_phases() -> None:
    from llama_index_hyde_plus.evaluation.report import timing_line
    from llama_index_hyde_plus.evaluation.runner import EvalResult

    result = EvalResult("d", 7, 30, {}, [], index_seconds=0.2, index_cached=True)
    result.phases = {"index": 0.2, "none": 9.6, "hyde": 410.0}
    result.include_earlier({"models": 3.1, "questions": 585.0}, total=1049.4)
    assert timing_line(result) == (
        "Time: models 3 s, questions 585 s, index 0 s (cached), none 10 s, hyde 410 s, "
        "other 42 s; total 1,049 s."
    )


def test_the_index_summary_wraps_at_80_columns(tmp_path: Path) -> None:
    out = tmp_path / "a-folder-[/]-whose-name-is-long-enough-to-push-the-summary-past-80"
    built = runner.invoke(
        app,
        ["index", str(_long_docs(tmp_path)), "--out", str(out), "--embed", "local"],
        env={"COLUMNS": "80"},
    )
    assert built.exit_code == 0, built.output
    assert "Indexed 2 documents" in built.output and "unchanged" in built.output
    # the folder's name as it is, not read as markup (a long name is folded, not cut)
    assert "a-folder-[/]-whose" in built.output.replace("\n", "")
    assert max(len(line) for line in built.output.splitlines()) <= 80


def test_evals_note_on_questions_wraps_at_80_columns_and_stays_out_of_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from llama_index_hyde_plus.cli import _console as ui
    from llama_index_hyde_plus.cli.eval import _show
    from llama_index_hyde_plus.evaluation import load_beir, run_eval
    from llama_index_hyde_plus.testing import DeterministicEmbedding

    note = "7 of 30 generated questions kept [rejected: 13 names too little]. " * 10
    result = run_eval(
        load_beir(Path(__file__).parent / "data" / "tiny-beir"),
        ["none"],
        llm=None,
        embed_model=DeterministicEmbedding(),
        embed_label="det",
        cache_root=tmp_path / "cache",
        config={"questions": note},
    )
    monkeypatch.setenv("COLUMNS", "80")
    ui.setup_logging(verbose=False)
    _show(result, tmp_path / "out[/]", note=note)
    shown = capsys.readouterr()
    said = shown.err + shown.out
    assert "About these questions:" in said and "[rejected: 13 names too little]" in said
    assert max(len(line) for line in said.splitlines()) <= 80
    assert "out[/]" in said.replace("\n", "")  # the folder's name, not markup
    md = (tmp_path / "out[/]" / "results.md").read_text()
    assert f"About these questions: {note}" in md
    config = next(line for line in md.splitlines() if line.startswith("Config:"))
    assert "rejected" not in config and "questions=" not in config


def test_the_demo_heading_counts_the_passages_it_searched_with() -> None:
    from llama_index_hyde_plus.cli.demo import paper_title

    assert paper_title(4, 4) == "HyDE as in the paper (the mean of 4 passages and the question)"
    assert paper_title(4, 2) == (
        "HyDE as in the paper (the mean of 2 passages and the question; 4 asked for)"
    )
    assert paper_title(1, 1) == "HyDE as in the paper (the mean of 1 passage and the question)"
    assert paper_title(4, 0) == "HyDE as in the paper (no passage written: the question alone)"


def test_the_local_models_speed_line_wraps_at_80_columns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from types import SimpleNamespace

    from llama_index_hyde_plus.cli import _console as ui
    from llama_index_hyde_plus.cli.eval import show_plan

    line = (
        "Local model: 25.8 tokens/s with 1 llama.cpp thread (2 threads: under 1), measured "
        "now. Generating may take up to about 15 min (60 generations of up to 160 tokens); "
        "--questions 25 shortens it."
    )
    models = SimpleNamespace(speed_line=lambda *work: line)
    source = SimpleNamespace(writes_questions=True, planned_work=lambda *a: (60, "--questions 25"))
    monkeypatch.setenv("COLUMNS", "80")
    ui.setup_logging(verbose=False)
    show_plan(models, source, 1)
    shown = capsys.readouterr().err
    assert " ".join(shown.split()) == line
    assert max(len(row) for row in shown.splitlines()) <= 80


def _error_lines(tmp_path: Path, env: dict[str, str]) -> list[str]:
    """The stderr lines of an error naming a long path (``--out`` inside ``DIR``)."""
    docs = tmp_path / "docs"
    docs.mkdir(exist_ok=True)
    (docs / "a.txt").write_text("The nightly backup window closes at 04:00 UTC.")
    out = docs / ("index-[bold]-" + "x" * 90)
    result = runner.invoke(app, ["index", str(docs), "--out", str(out)], env=env)
    assert result.exit_code == 2
    plain = re.sub(r"\x1b\[[0-9;]*m", "", result.stderr)
    assert "\x1b" not in plain  # styles only: nothing of the message reached the terminal
    return plain.splitlines()


def test_an_error_on_a_terminal_wraps_its_words_and_keeps_a_long_path_whole(
    tmp_path: Path,
) -> None:
    lines = _error_lines(tmp_path, {"COLUMNS": "80", "TTY_COMPATIBLE": "1"})
    assert lines[0].startswith("error: ") and len(lines) > 2
    path = str(tmp_path / "docs" / ("index-[bold]-" + "x" * 90))
    assert path in lines  # on a line of its own, whole, as written (no markup read)
    assert all(len(line) <= 80 for line in lines if line != path)


def test_an_error_piped_is_one_line(tmp_path: Path) -> None:
    lines = _error_lines(tmp_path, {"COLUMNS": "80"})
    assert len(lines) == 1 and lines[0].startswith("error: --out ")


def test_top_level_help_gives_each_command_a_whole_sentence_within_80_columns() -> None:
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    commands = result.output.split("Commands:")[1].strip().splitlines()
    names = ["index", "query", "transform", "eval", "tune", "serve", "demo", "models"]
    assert [line.split()[0] for line in commands] == names
    assert all(line.endswith(".") and "..." not in line and len(line) <= 80 for line in commands)


def test_query_leaves_no_blank_lines_where_its_spinners_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llama_index.core import Document

    from llama_index_hyde_plus import models
    from llama_index_hyde_plus.stores.faiss import build_faiss_index
    from llama_index_hyde_plus.testing import DeterministicEmbedding

    out = tmp_path / "idx"
    texts = {"a": "Revenue dropped in the third quarter.", "b": "The office moved."}
    docs = [Document(text=t, id_=i) for i, t in texts.items()]
    build_faiss_index(docs, DeterministicEmbedding(dim=64), out, embed_spec="det", max_length=256)
    monkeypatch.setattr(models, "resolve_embedding", lambda *a, **k: DeterministicEmbedding(dim=64))
    args = [
        "query",
        "Why did revenue drop?",
        "--index",
        str(out),
        "-t",
        "hyde",
        "--llm",
        "scripted",
    ]
    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert result.stderr == ""  # the two spinners (index, model) left nothing behind
    assert "\n\n" not in result.stdout
