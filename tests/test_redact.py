"""Secrets never reach a recorded command line or a shown store location."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llama_index_hyde_plus._redact import redact_argv, redact_uri
from llama_index_hyde_plus.cli import app

TINY = Path(__file__).parent / "data" / "tiny-beir"
runner = CliRunner()


def test_secret_options_and_uri_credentials_are_hidden() -> None:
    args = [
        *("--token", "s3cret", "--milvus-token=s3cret2", "--api-key", "s3cret3"),
        *("--uri", "https://root:s3cret4@milvus.example:19530", "--limit", "3"),
        "--uri=https://milvus.example/?token=s3cret5&db=x",
    ]
    shown = " ".join(redact_argv(args))
    assert "s3cret" not in shown
    assert "--limit 3" in shown and "milvus.example:19530" in shown and "db=x" in shown
    assert redact_uri("index.db") == "index.db"


@pytest.mark.slow  # the real local embedder
@pytest.mark.parametrize("form", [["--milvus-token", "s3cret"], ["--milvus-token=s3cret"]])
def test_eval_records_no_token_in_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: list[str]
) -> None:
    out = tmp_path / "out"
    args = [
        *("eval", "--dataset", str(TINY), "--transforms", "none", "--embed", "local"),
        *("--store", "milvus", "--uri", str(tmp_path / "m.db"), *form),
        *("--out", str(out), "--cache-dir", str(tmp_path / "cache")),
    ]
    monkeypatch.setattr(sys, "argv", ["hyde-plus", *args])
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    recorded = json.loads((out / "results.json").read_text())["command"]
    assert "--milvus-token" in recorded and "s3cret" not in recorded
    assert "s3cret" not in (out / "results.md").read_text()
    assert "s3cret" not in (out / "results.json").read_text()


@pytest.mark.slow  # the real local embedder
def test_tune_report_records_no_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report, config = tmp_path / "sweep.md", tmp_path / "tuned.json"
    args = [
        *("tune", "--dataset", str(TINY), "--split", "test", "-t", "rocchio", "--write-anyway"),
        *("--grid", "alpha=1.0", "--embed", "local", "--milvus-token", "s3cret"),
        *("--out", str(config), "--report", str(report), "--cache-dir", str(tmp_path / "c")),
    ]
    monkeypatch.setattr(sys, "argv", ["hyde-plus", *args])
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "--milvus-token" in report.read_text() and "s3cret" not in report.read_text()
    assert "s3cret" not in config.read_text()


def test_a_milvus_location_hides_the_password_in_its_uri() -> None:
    from llama_index_hyde_plus.stores import MilvusStore

    store = MilvusStore("https://root:s3cret@milvus.example:19530", token="s3cret2")
    assert "s3cret" not in store.location and "milvus.example:19530" in store.location
    assert "s3cret" not in store.describe()


@pytest.mark.parametrize("command", ["query", "index", "eval", "tune", "serve"])
def test_milvus_token_is_one_flag_with_one_meaning(command: str) -> None:
    """``--milvus-token`` is the Milvus token on every command that opens a store;
    ``--token`` is only ``serve``'s own bearer secret, never the Milvus one."""
    shown = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
    assert "--milvus-token" in shown
    token_lines = [line for line in shown.splitlines() if "--token " in line]
    if command == "serve":
        assert len(token_lines) == 1 and "Bearer" in token_lines[0]
    else:
        assert token_lines == []


def test_query_refuses_the_old_token_flag(tmp_path: Path) -> None:
    result = runner.invoke(app, ["query", "q", "--uri", str(tmp_path / "m.db"), "--token", "x"])
    assert result.exit_code != 0 and "--token" in result.output
