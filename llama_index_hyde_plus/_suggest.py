"""A hint for a mistyped name: the closest valid one."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'hyde'?)"`` when ``value`` is close to one of ``choices``
    (ignoring case, ``_`` for ``-`` and spaces), else ``""``; ready to append to an
    error message."""
    options = list(choices)
    key = value.strip().lower().replace("_", "-")
    close = difflib.get_close_matches(key, options, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close and close[0] != value else ""
