"""``eval``/``tune --timeout`` and the advice when generations run out of time."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from llama_index_hyde_plus.cli import app
from llama_index_hyde_plus.cli.eval import timeout_hint, with_timeout

runner = CliRunner()


@pytest.mark.parametrize("command", ["eval", "tune"])
def test_eval_and_tune_take_a_timeout(command: str) -> None:
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0 and "--timeout" in result.output


@pytest.mark.parametrize("command", ["eval", "tune"])
def test_a_timeout_that_is_not_positive_is_refused_before_anything_loads(command: str) -> None:
    result = runner.invoke(app, [command, "--timeout", "0"])
    assert result.exit_code != 0 and "--timeout" in result.output


def test_the_timeout_goes_to_the_transforms_that_call_the_llm() -> None:
    assert with_timeout({"n": 3}, "multi-query", 5.0) == {"n": 3, "timeout": 5.0}
    assert with_timeout({}, "none", 5.0) == {}
    assert with_timeout({"n": 3}, "multi-query", None) == {"n": 3}


def test_timeouts_suggest_fewer_in_flight() -> None:
    said = "fell back on 23 of 40: timeouts"
    reports = [
        SimpleNamespace(timeouts=0),
        SimpleNamespace(label="hyde", timeouts=23, fell_back=said),
    ]
    hint = timeout_hint(reports, 8)
    assert hint is not None and f"hyde {said}" in hint and "--concurrency 4" in hint
    assert timeout_hint([SimpleNamespace(timeouts=0)], 8) is None


def test_a_timed_out_generation_is_counted_in_the_report(tmp_path: Path) -> None:
    from llama_index_hyde_plus import HyDE
    from llama_index_hyde_plus.evaluation.beir import BeirDataset
    from llama_index_hyde_plus.evaluation.runner import EvalSession
    from llama_index_hyde_plus.testing import HANG, DeterministicEmbedding, ScriptedLLM

    ds = BeirDataset(
        name="tiny",
        corpus={"d1": {"title": "", "text": "revenue dropped"}},
        queries={"q1": "Why did revenue drop?"},
        qrels={"q1": {"d1": 1}},
        corpus_sha256="0" * 64,
    )
    embed = DeterministicEmbedding()
    session = EvalSession(ds, embed_model=embed, embed_label="det", cache_root=tmp_path)
    try:
        report = session.score("hyde", HyDE(ScriptedLLM([HANG]), timeout=0.2, breaker=None))
    finally:
        session.close()
    assert report.timeouts == 1 and report.fallbacks == 1
