"""Local generation planned from the speed this machine gives now: the llama.cpp thread
count the probe finds faster, the calls budgeted by it, a long run said up front, and a
progress bar with an ETA and the fallbacks so far."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from llama_index_hyde_plus.cli import _console
from llama_index_hyde_plus.cli._evaluation import ModelChoice
from llama_index_hyde_plus.local.speed import SpeedPlan, plan_threads


class _Probe:
    """A stand-in for `LocalLLM` whose speed depends on its thread count."""

    def __init__(self, threads: int, speeds: dict[int, float], seen: list[Any]) -> None:
        self.threads, self.speeds, self.seen = threads, speeds, seen

    def measure_speed(self, tokens: int = 32, budget_s: float | None = None) -> float:
        self.seen.append((self.threads, budget_s))
        return self.speeds[self.threads]

    def close(self) -> None:
        pass

    def warm_up(self) -> None:
        pass


def _plan(speeds: dict[int, float], cores: int) -> tuple[SpeedPlan, list[Any]]:
    seen: list[Any] = []
    plan = plan_threads(lambda n: _Probe(n, speeds, seen), cores)  # type: ignore[arg-type, return-value]
    return plan, seen


def test_one_thread_is_kept_when_every_core_is_slower_on_a_busy_machine() -> None:
    plan, seen = _plan({1: 22.0, 2: 1.3}, cores=2)
    assert _plan({1: 22.0, 2: 0.0}, cores=2)[0].describe().endswith("(2 threads: under 1)")
    assert (plan.threads, plan.tokens_per_s) == (1, 22.0)
    assert seen[0] == (1, None) and seen[1][0] == 2
    assert seen[1][1] is not None and seen[1][1] < 1.0  # 1.5x the first probe's time
    assert plan.describe() == "22.0 tokens/s with 1 llama.cpp thread (2 threads: 1.3)"
    assert plan.budget_rate == 11.0  # half: the machine may get busier


def test_every_core_is_kept_when_it_is_faster_and_one_core_tries_once() -> None:
    plan, _ = _plan({1: 20.0, 4: 55.0}, cores=4)
    assert (plan.threads, plan.tokens_per_s) == (4, 55.0)
    plan, seen = _plan({1: 20.0}, cores=1)
    assert plan.threads == 1 and len(seen) == 1


def _models(max_tokens: int = 160) -> ModelChoice:
    return ModelChoice("local", "local", 256, 0.7, max_tokens, 0, 4)


def test_a_long_run_is_said_up_front_with_the_option_that_shortens_it() -> None:
    models = _models()
    assert models.speed_line(100, "--questions 25") is None  # nothing measured
    models.planned.append(SpeedPlan(1, 4.0, {1: 4.0, 2: 1.0}))
    line = models.speed_line(350, "--questions 25")
    assert line is not None
    assert line.startswith("Local model: 4.0 tokens/s with 1 llama.cpp thread (2 threads: 1.0)")
    assert "up to about 233 min (350 generations of up to 160 tokens)" in line
    assert line.endswith("--questions 25 shortens it.")
    short = models.speed_line(3, "--questions 1")
    assert short is not None and "shortens" not in short


def test_the_progress_bar_shows_an_eta_and_the_fallbacks_so_far() -> None:
    console = Console(width=120, record=True, force_terminal=False)
    progress = _console.progress_bar()
    advance = _console.task(progress, "hyde", 10, "q/s")
    advance(1)
    advance(1, fell_back=1)
    advance(1, fell_back=1)
    console.print(progress.get_renderable())
    text = console.export_text()
    assert "3/10" in text and "2 fell back" in text and "eta" in text


@pytest.mark.local
def test_the_bundled_model_s_speed_is_measured_and_used_for_its_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HYDE_PLUS_LLM_THREADS", raising=False)
    from llama_index_hyde_plus.calls.timeouts import timeout_for

    models = _models(max_tokens=40)
    llm = models.make_llm()
    plan = models.planned[0]
    assert plan.tokens_per_s > 0 and set(plan.tried) >= {1}
    assert (llm.threads, llm.tokens_per_s) == (plan.threads, plan.budget_rate)
    assert timeout_for(llm) == pytest.approx(10 + 40 * 4 / plan.budget_rate, abs=0.1)
    again = models.make_llm()  # measured once a run
    assert again.tokens_per_s == plan.budget_rate and len(models.planned) == 1
