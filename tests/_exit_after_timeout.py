"""Run by test_local: a local generation outlives its timeout, then the script ends
while the interpreter's teardown is slow (as a large app's is); it must exit 0."""

from __future__ import annotations

import time

from llama_index_hyde_plus.calls.llm import CallOptions, LLMTimeoutError, complete
from llama_index_hyde_plus.local import local_llm


class SlowTeardown:
    """Freed during interpreter teardown, slowly: a generation still running in
    llama.cpp calls back into Python meanwhile."""

    def __del__(self) -> None:
        time.sleep(5)


keep = SlowTeardown()
llm = local_llm(max_tokens=1500, n_parallel=1, seed=1)
llm.warm_up()
try:
    complete(llm, "Write a very long essay about the history of rivers.", CallOptions(timeout=0.3))
except LLMTimeoutError:
    print("timed out", flush=True)
