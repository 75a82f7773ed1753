from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_quickstart_runs_as_written_without_a_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    runpy.run_path(str(EXAMPLES / "quickstart.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "Without HyDE: Revenue team members" in out
    assert "With HyDE:    Enterprise renewals slipped" in out
    # the scripted LLM gets the capable-model defaults (question weight 0.7, no gate):
    # with the toy bag-of-words embedding the question's ranking stays, and it says which
    assert "Guarded HyDE: Revenue team members" in out
    assert "the capable model's defaults: question weight 0.7" in out
    assert "the question's own ranking kept first place" in out  # said, not left to guess
