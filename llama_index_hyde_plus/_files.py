"""Small, pure helpers for reading files: a streamed sha256 and JSON lines."""

from __future__ import annotations

import hashlib
import json
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
        if not isinstance(row, dict):
            raise error(f"{where}:{lineno}: expected a JSON object")
        yield lineno, row
