"""Text that folds at sensible points in a narrow column: `Label`.

Rich folds a word longer than its column mid-word (``hyde:query_weigh`` /
``t=0.9``). A label, a data set's name or a path has better places to end a line:
after a space, ``,``, ``;`` or ``:`` first, else after ``=``, ``-``, ``_``, ``/``,
``.``, ``#`` or ``+`` (not inside a number); only a piece longer than the whole column
is cut inside.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, JustifyMethod, OverflowMethod
from rich.containers import Lines
from rich.measure import Measurement
from rich.text import Text

from ._shown import spelled_name

STRONG = frozenset(" \t,;:")
"""Characters a line ends after by preference."""
WEAK = frozenset("=-_/.#+")
"""Characters a line ends after when no `STRONG` one fits."""


def _after(line: str, start: int, marks: frozenset[str]) -> Iterator[int]:
    """The offsets past ``start`` just after one of ``marks`` (where a line may end),
    never inside a number (``0.9``, ``-1``, ``+3``)."""
    for i in range(start, len(line) - 1):
        if line[i] in marks and not (line[i] in ".-+" and line[i + 1].isdigit()):
            yield i + 1


def _fits(line: str, start: int, end: int, width: int) -> bool:
    return cell_len(line[start:end].rstrip()) <= width


def line_breaks(
    line: str, width: int, tiers: tuple[frozenset[str], ...] = (STRONG, WEAK), cut: bool = True
) -> list[int]:
    """The offsets at which ``line`` (no line feeds) is cut into lines of at most
    ``width`` cells: after the last mark of the first of ``tiers`` that has one that
    fits, else (a piece wider than ``width``) at the last character that fits, or with
    ``cut`` False after the piece, however wide. The spaces a line ends with are left
    at its end (where they take no room: `Label` strips them)."""
    width = max(width, 1)
    breaks: list[int] = []
    start = 0
    while not _fits(line, start, len(line), width):
        end = 0
        for marks in tiers:
            fitting = (i for i in _after(line, start, marks) if _fits(line, start, i, width))
            end = max(fitting, default=0)
            if end:
                break
        if not end and cut:  # one piece is wider than the column: cut where it fills it
            end = start + 1
            while end < len(line) and cell_len(line[start : end + 1]) <= width:
                end += 1
        elif not end:  # the piece whole, on a line of its own
            end = next((i for marks in tiers for i in _after(line, start, marks)), len(line))
        while end < len(line) and line[end] in " \t":
            end += 1
        if end >= len(line):
            break
        breaks.append(end)
        start = end
    return breaks


def pieces(text: str) -> list[str]:
    """``text`` cut at every place `line_breaks` may end a line (line feeds too)."""
    found = []
    for line in text.split("\n"):
        cuts = [0, *sorted({*_after(line, 0, STRONG), *_after(line, 0, WEAK)}), len(line)]
        found += [line[a:b].rstrip() for a, b in itertools.pairwise(cuts) if line[a:b].strip()]
    return found


class Label(Text):
    """A `Text` whose lines end at sensible points (`line_breaks`) rather than inside a
    word. Its narrowest width is its widest piece (`pieces`), its widest its longest
    line, so a table gives its column what it needs. Made from plain text: nothing in it
    is read as markup (spell out what must not reach the terminal first). Printed on
    its own, it goes in a `rich.console.Group`: ``Console.print`` joins bare texts into
    a plain `Text`, which wraps as Rich does."""

    tiers: tuple[frozenset[str], ...] = (STRONG, WEAK)
    """Where a line may end, by preference (`line_breaks`)."""
    cut: bool = True
    """Whether a piece wider than a line is cut (else it overflows the line, or is
    shortened with an ellipsis where `shortened`)."""
    shortened: bool = False
    """Whether a piece wider than a line, not `cut`, ends with an ellipsis at the
    line's end (it is not copied from the screen, only read)."""
    most_lines: int = 0
    """The lines it may take (0: as many as it needs); the last one shown ends with
    an ellipsis when there is more, as does the one line it takes in fewer than 8
    columns (too few to fold into)."""

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widest = max((cell_len(line) for line in self.plain.split("\n")), default=0)
        narrowest = max((cell_len(piece) for piece in pieces(self.plain)), default=0)
        return Measurement(narrowest, widest)

    def wrap(
        self,
        console: Console,
        width: int,
        *,
        justify: JustifyMethod | None = None,
        overflow: OverflowMethod | None = None,
        tab_size: int = 8,
        no_wrap: bool | None = None,
    ) -> Lines:
        if self.most_lines and width < 8:
            no_wrap, overflow = True, "ellipsis"
        if no_wrap:
            return super().wrap(
                console, width, justify=justify, overflow=overflow, tab_size=tab_size, no_wrap=True
            )
        lines = Lines()
        for line in self.split("\n", allow_blank=True):
            for part in line.divide(line_breaks(line.plain, width, self.tiers, self.cut)):
                part.rstrip()
                if self.shortened:
                    part.truncate(width, overflow="ellipsis")
                lines.append(part)
        if self.most_lines and len(lines) > self.most_lines:
            rest = Text(" ").join(lines[self.most_lines - 1 :])
            rest.truncate(width, overflow="ellipsis")
            lines = Lines([*lines[: self.most_lines - 1], rest])
        if justify:
            lines.justify(console, width, justify=justify, overflow=overflow or "fold")
        return lines


class Prose(Label):
    """Sentences that wrap at spaces only, a word wider than a line (a path, a URL) whole
    on a line of its own, to be copied as it is: print with ``crop=False``."""

    tiers = (frozenset(" \t"),)
    cut = False


def label(text: str, style: str = "") -> Label:
    """A `Label` of a name (a path, a label, a data set's name) as it is written, on
    one line (with ``style``): tabs, line breaks, other control characters and
    bidirectional marks spelled as escapes (`spelled_name`; a `Label` reads no
    markup)."""
    return Label(spelled_name(text), style=style)
