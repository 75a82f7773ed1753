"""Round 9's findings in the worker threads: the process's line for thread slots."""

from __future__ import annotations

import threading
import time

import pytest

from llama_index_hyde_plus import _workers


def test_a_long_line_for_slots_behind_a_full_pool_never_deepens_the_stack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # round 9, D1: each freed slot was handed down the line recursively (give_back ->
    # admit -> pool full -> give_back ...): 1,500 calls in line killed the worker with
    # RecursionError, the slots were lost and the calls never ran
    monkeypatch.setattr(_workers, "_thread_slots", threading.BoundedSemaphore(2))
    monkeypatch.setattr(_workers, "_slot_line", _workers._SlotLine())
    release = threading.Event()
    hogs = _workers.DaemonWorkers(max_busy=2, name="hog")
    held = [hogs.submit(lambda: release.wait(30)) for _ in range(2)]
    pool = _workers.DaemonWorkers(max_busy=1, name="p")
    jobs = [pool.submit(lambda i=i: i) for i in range(1500)]
    assert _workers._slot_line.waiting() == 1500
    release.set()
    deadline = time.monotonic() + 60
    for job in held + jobs:
        assert job.done.wait(max(0.0, deadline - time.monotonic()))
    assert [job.result() for job in jobs] == list(range(1500))
    time.sleep(0.2)
    assert _workers._thread_slots._value == 2  # type: ignore[attr-defined]
    assert _workers._slot_line.waiting() == 0
