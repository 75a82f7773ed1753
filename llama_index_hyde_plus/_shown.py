"""Text a person sees as it is written: a user's, a document's or a model's text,
printed to a terminal (`literal`) with nothing in it read as markup or sent to the
terminal as a control sequence."""

from __future__ import annotations

import re

UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
"""Control characters other than tab and line feed, and lone surrogates: what no
query, cache entry or terminal should hold (the CLI prints them spelled out)."""
BIDI = re.compile(r"[\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""Marks that reorder the text after them on screen: spelled, as control characters."""


def spelled(found: re.Match[str]) -> str:
    """A matched character spelled as its escape: ``\\x1b``, ``\\u202e``."""
    code = ord(found.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def spelled_out(text: str) -> str:
    """``text`` with every character that would not show as itself (control
    characters, lone surrogates, bidirectional marks) spelled as its escape."""
    return BIDI.sub(spelled, UNPRINTABLE.sub(spelled, text))


def literal(text: str) -> str:
    """``text`` (a document's, a model's or the user's) to print as it is: Rich markup
    escaped; control characters other than line breaks and tabs, lone surrogates and
    bidirectional marks spelled as escapes (``\\x1b``, ``\\u202e``): no text styles,
    moves, reorders or retitles the terminal, or stops the print."""
    from rich.markup import escape

    return escape(spelled_out(text))
