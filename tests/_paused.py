"""Run a hyde-plus command that pauses for good at one point of its work, so a test can
kill it there (the hook lives here, not in the package):

    python -m tests._paused FLAG WHEN:MODULE.FUNCTION ARGV...

wraps ``MODULE.FUNCTION`` so that ``before`` or ``after`` it runs (WHEN) the process
writes FLAG and sleeps until killed, then runs ``hyde-plus ARGV...``.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path
from typing import Any


def pause_at(flag: Path, where: str) -> None:
    """Make ``where`` (``before:`` or ``after:`` a dotted function name) pause for good."""
    when, _, target = where.partition(":")
    module_name, _, name = target.rpartition(".")
    module = importlib.import_module(module_name)
    real = getattr(module, name)

    def paused(*args: Any, **kwargs: Any) -> Any:
        if when == "before":
            _pause(flag)
        result = real(*args, **kwargs)
        if when == "after":
            _pause(flag)
        return result

    setattr(module, name, paused)


def _pause(flag: Path) -> None:
    flag.write_text("paused")
    while True:
        time.sleep(1)


if __name__ == "__main__":
    pause_at(Path(sys.argv[1]), sys.argv[2])
    from llama_index_hyde_plus.cli import main

    sys.argv = ["hyde-plus", *sys.argv[3:]]
    main()
