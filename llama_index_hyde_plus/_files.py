"""Small helpers for reading files: a streamed sha256, JSON lines, and regular files
(what hyde-plus writes, and how safely, is `_owned`)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def sha256_file(path: Path) -> str:
    """The hex sha256 of ``path``, read in 1 MB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def json_lines(
    lines: Iterator[str] | list[str], where: str, error: type[ValueError] = ValueError
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line; ``error`` names
    ``where:line`` for a line that is not a JSON object."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise error(f"{where}:{lineno}: not valid JSON ({exc})") from exc
        except RecursionError:
            raise error(f"{where}:{lineno}: JSON nested too deeply to read") from None
        if not isinstance(row, dict):
            raise error(f"{where}:{lineno}: expected a JSON object")
        yield lineno, row


def read_regular_bytes(path: Path) -> bytes:
    """The bytes of the regular file ``path`` (a link to one is followed); a
    `ValueError` for anything else. Opened non-blocking and checked on the open file,
    so a FIFO put in its place never blocks the read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ValueError(f"{path} is not a regular file")
        return handle.read()


def not_regular_reason(path: Path) -> str | None:
    """Why ``path`` is not a file to read: None for a regular file (or a link to one),
    ``""`` for a folder, else the reason in words (a link to nothing, a link loop, a
    FIFO, a socket, a device), so a caller can list it rather than drop it silently."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "a symbolic link to nothing (dangling)" if path.is_symlink() else "vanished"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link loop"
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return ""
    kind = (
        "a named pipe (FIFO)"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a device"
    )
    return f"{kind}, not a regular file; not read"
