"""Counts in words, for messages: ``1 timeout``, ``3 timeouts``."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` followed by ``noun``, or by its plural unless ``n`` is 1 (``plural``
    when given, else ``noun`` with an ``s``): ``counted(1, "failure")`` is
    ``"1 failure"``, ``counted(2, "query", "queries")`` is ``"2 queries"``."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
