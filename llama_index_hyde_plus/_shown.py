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
BREAKS = re.compile(r"[\t\n\u2028\u2029]")
"""What ends a line or jumps to a tab stop: text keeps them (`spelled_out`), a name
spells them (`spelled_name`)."""


def spelled(found: re.Match[str]) -> str:
    """A matched character spelled as its escape: ``\\x1b``, ``\\u202e``."""
    code = ord(found.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def spelled_out(text: str) -> str:
    """``text`` with every character that would not show as itself (control
    characters, lone surrogates, bidirectional marks) spelled as its escape."""
    return BIDI.sub(spelled, UNPRINTABLE.sub(spelled, text))


def spelled_name(name: str) -> str:
    """A name (a path, a file's, a transform's or a data set's) as written, on one
    line: `spelled_out`, with tabs and line breaks spelled too (``\\x09``, ``\\x0a``),
    so no name starts a line of its own or takes a width a table did not count."""
    return BREAKS.sub(spelled, spelled_out(name))


def spelled_tabs(text: str) -> str:
    """``text`` with its tabs spelled (``\\x09``): what a line that folds at sensible
    points (`_folding.Label`, which cannot measure a tab) shows of one."""
    return text.replace("\t", "\\x09")


def literal(text: str) -> str:
    """``text`` (a document's, a model's or the user's) to print as it is: Rich markup
    escaped; control characters other than line breaks and tabs, lone surrogates and
    bidirectional marks spelled as escapes (``\\x1b``, ``\\u202e``): no text styles,
    moves, reorders or retitles the terminal, or stops the print."""
    from rich.markup import escape

    return escape(spelled_out(text))


def named(name: str) -> str:
    """A name (`spelled_name`) to print in Rich markup: as `literal`, on one line."""
    from rich.markup import escape

    return escape(spelled_name(name))
