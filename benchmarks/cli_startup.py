"""CLI startup benchmark: wall and CPU time of ``hyde-plus`` answers that need no model.

Each cell is the median of ``--repeat`` fresh processes of the installed console script
(``hyde-plus`` next to this Python). Two columns of bytecode:

- ``cached``: compiled modules are reused (as after any first run, or a ``pip install``
  that compiles); one untimed run first fills a private cache;
- ``none`` (``--cold``): every run compiles every module it imports, as with
  ``PYTHONDONTWRITEBYTECODE=1`` and nothing compiled yet (a fresh clone run by uv, which
  compiles nothing at install).

    uv run --frozen --all-extras python benchmarks/cli_startup.py [--repeat 5] [--cold]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES: tuple[tuple[str, ...], ...] = (
    ("--version",),
    ("--help",),
    ("serve", "--help"),
    ("query", "--help"),
    ("serve", "--token", ""),
)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(command: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """``(wall s, CPU s, exit code)`` of one run of ``command``."""
    cpu, start = _children_cpu(), time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, check=False)
    return time.perf_counter() - start, _children_cpu() - cpu, done.returncode


def measure(args: tuple[str, ...], env: dict[str, str], repeat: int) -> tuple[float, float, int]:
    """The medians of ``repeat`` runs of ``hyde-plus *args``, and the exit code."""
    command = [str(Path(sys.executable).with_name("hyde-plus")), *args]
    runs = [run_once(command, env) for _ in range(repeat)]
    wall = statistics.median(r[0] for r in runs)
    return wall, statistics.median(r[1] for r in runs), runs[-1][2]


def environment(cache: Path, *, compiled: bool) -> dict[str, str]:
    """The environment of a run: its own bytecode folder, written to or not."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    if not compiled:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cold", action="store_true", help="Also time runs without bytecode.")
    options = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    header = "| command | exit | wall, cached (s) | CPU, cached (s) |"
    rule = "|---|---:|---:|---:|"
    if options.cold:
        header += " wall, no bytecode (s) | CPU, no bytecode (s) |"
        rule += "---:|---:|"
    print(header)
    print(rule)
    with tempfile.TemporaryDirectory() as warm, tempfile.TemporaryDirectory() as cold:
        cached = environment(Path(warm), compiled=True)
        for args in CASES:
            run_once([str(Path(sys.executable).with_name("hyde-plus")), *args], cached)
            wall, cpu, code = measure(args, cached, options.repeat)
            shown = " ".join(a or '""' for a in args)
            row = f"| `hyde-plus {shown}` | {code} "
            row += f"| {wall:.2f} | {cpu:.2f} |"
            if options.cold:
                wall, cpu, _ = measure(
                    args, environment(Path(cold), compiled=False), options.repeat
                )
                row += f" {wall:.2f} | {cpu:.2f} |"
            print(row, flush=True)


if __name__ == "__main__":
    main()
