"""Checks of arguments, written once and light enough for the command line's early
checks: a question's text, and numbers (a ``bool`` is never a number here: ``True``
is an ``int`` to Python, but ``top_k=True`` is a mistake, not 1)."""

from __future__ import annotations

import math
import re
from typing import Any, TypeGuard


def is_int(value: Any) -> TypeGuard[int]:
    """Whether ``value`` is an int and not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[int | float]:
    """Whether ``value`` is an int or a float and not a bool (NaN and infinity are
    numbers here: range checks refuse them)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(value: Any, name: str, low: int, high: int | None) -> int:
    """``value`` if it is an int (not a bool) in ``[low, high]``; else a `TypeError` or
    a `ValueError` naming ``name``."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise ValueError(f"{name} must be {bound}, not {value}")
    return value


def check_number(value: Any, name: str, low: float, high: float) -> float:
    """``value`` as a float if it is a finite real number (not a bool) in
    ``[low, high]``; else a `TypeError` or a `ValueError` naming ``name``."""
    if not is_number(value):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(
            f"{name} must be a finite number between {low:g} and {high:g}, not {value!r}"
        )
    return float(value)


def check_folder(path: Any, name: str) -> None:
    """Raise a `ValueError` naming ``name`` when ``path`` (a `pathlib.Path`) is not an
    existing folder, saying which of the two it is: missing, or something else."""
    if path.is_dir():
        return
    if not path.exists():
        raise ValueError(f"{name} does not exist: {path}")
    raise ValueError(f"{name} must be a folder, not a file: {path}")


_VISIBLE = re.compile(r"[^\s\u00ad\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]")
"""A character that shows: not a space, nor a zero-width or direction mark."""


def validate_query(query: Any) -> str:
    """``query`` if it is a string holding a visible character (not only spaces or
    zero-width marks), else a `TypeError`/`ValueError`."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, not {type(query).__name__}")
    if not query.strip():
        raise ValueError("query must be a non-empty string")
    if _VISIBLE.search(query) is None:
        raise ValueError("query must be a non-empty string: it holds only invisible characters")
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            "query must be valid Unicode text: it holds a lone surrogate (bytes that were "
            "not UTF-8)"
        ) from None
    return query
