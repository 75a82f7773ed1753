"""A real Redis server on loopback for the tests (Debian's ``redis-server``).

`redis_server` starts one on a free port in a temporary folder, with persistence off,
and stops it afterwards. Where ``redis-server`` is not installed the tests that need
it are skipped, except under CI (``CI=true``), whose ``.ci/run`` installs it: there a
missing server is a failure, so a green CI always ran them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextlib.contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    """A running Redis server; yields its ``redis://127.0.0.1:PORT/0`` URI."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is not installed (.ci/run installs it)")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    port = _free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(folder)]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not _ping(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"redis-server did not start on port {port}")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
