"""Present an `EvalResult`: a terminal table, ``results.json``, ``results.md`` and a
PNG bar chart."""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, JustifyMethod, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from .. import _folding
from .._owned import check_folder, check_outputs, claim, say_replacing, write_all_atomic
from .._plural import counted
from .._shown import spelled_name, spelled_out
from .metrics import LABELS, MEASURES
from .results import EvalResult, TransformReport
from .tune import TuneResult


def _queries(n: int) -> str:
    return counted(n, "query", "queries")


def _latency(seconds: float) -> str:
    """A latency as every table shows it: ``34 ms`` under 10 s, ``15 s`` from there,
    ``cached`` when no query was timed (every generation came from the cache)."""
    if math.isnan(seconds):
        return "cached"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.0f} s"


def _p(report: TransformReport) -> str:
    if report.p_value_vs_none is None:
        return "-"
    return f"{report.p_value_vs_none:.3f}" + (" *" if report.p_value_vs_none < 0.05 else "")


def _wtl(report: TransformReport) -> str:
    if report.delta_vs_none is None:
        return "-"
    return f"{report.wins}/{report.ties}/{report.losses}"


def _delta(report: TransformReport) -> str:
    if report.delta_vs_none is None:
        return "-"
    return f"{report.delta_vs_none * 100:+.1f}"


def _tokens(report: TransformReport) -> str:
    if not report.usage.calls:
        return "0"
    per_query = report.usage.total_tokens / max(report.queries, 1)
    return f"{per_query:.0f}"


def _unmeasured(report: TransformReport) -> bool:
    """Whether a table row says "not measured" instead of comparing with `none`: `none`
    ran beside it, and more than a tenth of its queries fell back
    (`TransformReport.measured`)."""
    return report.delta_vs_none is not None and not report.measured


def _row(report: TransformReport, best: dict[str, float]) -> list[str]:
    """A row of ``results.md``: every measure (the best of each in bold, `_best`), and
    the comparison with `none`, or "not measured" and its fallbacks (`_unmeasured`)."""
    cells = []
    for m in MEASURES:
        value = report.scores[m]
        text = f"{value:.4f}"
        cells.append(f"**{text}**" if _is_best(report, m, best[m]) else text)
    if _unmeasured(report):  # mostly plain search's score: no comparison is drawn
        compared = [f"not measured ({report.fell_back})", "-", "-"]
    else:
        compared = [_delta(report), _wtl(report), _p(report)]
    return [
        _md_name(report.label),
        *cells,
        *compared,
        _latency(report.latency_p50_s),
        _latency(report.latency_p95_s),
        _tokens(report),
        report.usage.cost_text(places=4),
        str(report.fallbacks),
    ]


HEADERS = [
    "transform",
    *(LABELS[m] for m in MEASURES),
    "Δ nDCG@10 (pts)",
    "wins/ties/losses",
    "p vs none",
    "latency p50",
    "latency p95",
    "LLM tokens/query",
    "cost",
    "fallbacks",
]


def _is_best(report: TransformReport, measure: str, best: float) -> bool:
    """Whether ``report``'s ``measure`` is shown as the best: it equals ``best``
    (`_best`) and the report is measured (a score that is mostly plain search's is
    never the best, even where it equals it)."""
    return report.measured and abs(report.scores[measure] - best) < 1e-12


def _best(result: EvalResult) -> dict[str, float]:
    """The best value of each measure among the transforms measured (a score that is
    mostly plain search's is never the best); NaN, which no value equals, when none
    was."""
    measured = [r for r in result.reports if r.measured]
    return {m: max((r.scores[m] for r in measured), default=math.nan) for m in MEASURES}


TERMINAL_HEADERS = ["transform", "nDCG@10", "Δ pts [95% CI]", "W/T/L", "p", "chg", "skip/fb", "p50"]
"""The terminal table's columns: what fits 80 columns (``results.md`` has them all)."""


def _interval(report: TransformReport) -> str:
    if report.delta_vs_none is None:
        return "-"
    low, high = report.interval_vs_none or (math.nan, math.nan)
    if math.isnan(low):
        return _delta(report)
    return f"{_delta(report)} [{low * 100:+.1f},{high * 100:+.1f}]"


def _share(count: int, report: TransformReport) -> str:
    if report.delta_vs_none is None:
        return "-"
    return f"{100 * count / max(report.queries, 1):.0f}%"


def _terminal_row(report: TransformReport, best: float) -> list[str]:
    """A row of the terminal tables; a row not measured (more than a tenth of its
    queries fell back) says so instead of a difference with `none`."""
    score = f"{report.scores['nDCG@10']:.3f}"
    if _unmeasured(report):
        compared = ["not measured", "-", "-", "-"]  # mostly plain search's: no comparison
    else:
        p = "-" if report.p_value_vs_none is None else f"{report.p_value_vs_none:.2f}"
        compared = [_interval(report), _wtl(report), p, _share(report.changed, report)]
    return [
        report.label,
        f"[bold green]{score}[/]" if _is_best(report, "nDCG@10", best) else score,
        *compared,
        f"{report.skipped}/{report.fallbacks}",
        _latency(report.latency_p50_s),
    ]


class ResultsTable:
    """Rows of results (a label, then one value per header) as a person reads them at
    any width: a table within 80 columns while every column fits whole (the title and
    the labels fold at sensible points, `_folding`; the numbers never wrap, the
    interval, ``headers[2]``, only at its space), else each row as a block, its label on
    a line of its own, then ``header value`` pairs that fold between pairs, never
    inside a number (`blocks`)."""

    def __init__(self, title: _folding.Label, headers: list[str]) -> None:
        self.title = title
        self.headers = headers
        self.rows: list[tuple[_folding.Label, list[str], str | None]] = []

    def add_row(self, label: str, cells: list[str], style: str | None = None) -> None:
        """A row: ``label`` (a name, spelled as `_folding.label` shows it), then its
        ``cells`` (markup: the values this module writes) in the headers' order."""
        self.rows.append((_folding.label(label, style or ""), cells, style))

    def _spans(self) -> list[tuple[int, int]]:
        """Each column's narrowest and widest width with every header and value whole:
        the labels fold into 12 columns or more; the interval (``headers[2]``) folds at
        its spaces; every other value takes its width."""
        labels = [self.headers[0], *(label.plain for label, _, _ in self.rows)]
        spans = [(max(12, cell_len(self.headers[0])), max(map(cell_len, labels)))]
        for i, header in enumerate(self.headers[1:]):
            said = [header, *(Text.from_markup(cells[i]).plain for _, cells, _ in self.rows)]
            widest = max(map(cell_len, said))
            if i == 1:  # the interval
                spans.append((max(cell_len(w) for text in said for w in text.split()), widest))
            else:
                spans.append((widest, widest))
        return spans

    def needed(self) -> int:
        """The columns the table takes at its narrowest (`_spans`), with its edges and
        the gaps between its columns."""
        spans = self._spans()
        return sum(low for low, _ in spans) + 2 * len(spans)

    def table(self, width: int) -> Table:
        """The table in ``width`` columns (at least `needed`): what they leave beyond
        its narrowest widens the interval to its widest, then the labels."""
        spans = self._spans()
        widths = [low for low, _ in spans]
        slack = width - self.needed()
        for i in (2, 0):
            grown = min(spans[i][1] - widths[i], max(slack, 0))
            widths[i] += grown
            slack -= grown
        table = Table(
            title=self.title,
            title_justify="left",
            box=box.SIMPLE_HEAD,
            padding=(0, 0, 0, 1),
            pad_edge=False,
        )
        table.add_column(self.headers[0], width=widths[0])
        for header, wide in zip(self.headers[1:], widths[1:]):
            wraps = header == self.headers[2]
            justify: JustifyMethod = "right" if header else "left"  # a mark, unheaded
            table.add_column(header, justify=justify, width=wide, no_wrap=not wraps)
        for label, cells, style in self.rows:
            table.add_row(label, *cells, style=style)
        return table

    def blocks(self, console: Console, width: int) -> Iterator[RenderableType]:
        """The title, then each row: its label on a line of its own, then its values,
        two columns in, each after its header (a value of ``-`` left out), as many on
        a line as fit; a pair wider than a line folds at its spaces."""
        yield self.title
        room = max(width - 2, 1)
        for label, cells, style in self.rows:
            yield label
            pairs = []
            for header, cell in zip(self.headers[1:], cells):
                value = Text.from_markup(cell, style=style or "")
                if value.plain == "-":
                    continue
                pair = Text(f"{header} ", style="dim") if header else Text()
                pairs.append(pair.append_text(value))
            line = Text()
            for pair in pairs:
                if line and cell_len(line.plain) + 2 + cell_len(pair.plain) <= room:
                    line.append("  ").append_text(pair)
                    continue
                if line:
                    yield Text("  ").append_text(line)
                folded = _folding.Label(pair.plain, spans=pair.spans)
                folded.tiers = (frozenset(" "),)  # at a space, not inside a number
                *whole, line = folded.wrap(console, room)
                yield from (Text("  ").append_text(part) for part in whole)
            if line:
                yield Text("  ").append_text(line)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.needed() <= options.max_width:
            yield self.table(options.max_width)
        else:
            yield from self.blocks(console, options.max_width)


def rich_table(result: EvalResult) -> ResultsTable:
    """The terminal table of an `eval` run, within 80 columns (`ResultsTable`): one
    row per transform with nDCG@10 (the best of those measured in bold green, `_best`),
    its difference from `none` in points with the 95% interval, wins/ties/losses and p
    ("not measured" instead when too many fell back), the share of queries whose
    ranking it changed (``chg``), how many a gate skipped and how many fell back to
    plain search (``skip/fb``; a fallback is a timeout, an unusable reply or an error),
    and the median latency. ``results.md`` has every measure.

    Args:
        result: the run.
    """
    title = (
        f"{spelled_name(result.dataset)}: {_queries(result.queries)}, "
        f"{result.documents} {result.unit}"
    )
    table = ResultsTable(_folding.Label(title, style="table.title"), TERMINAL_HEADERS)
    best = _best(result)["nDCG@10"]
    for report in result.reports:
        name, *row = _terminal_row(report, best)
        table.add_row(name, row)
    return table


def verdicts(result: EvalResult) -> list[str]:
    """One line per transform: its comparison with `none` in words, and how many of
    its queries a gate skipped or fell back; "not measured" and why alone when too many
    fell back (`TransformReport.measured`)."""
    lines = []
    for report in result.reports:
        if report.delta_vs_none is None:
            continue
        if not report.measured:  # its interval is mostly plain search's: not shown
            lines.append(f"{spelled_name(report.label)}: {report.verdict}")
            continue
        extra = []
        low, high = report.interval_vs_none or (math.nan, math.nan)
        if not math.isnan(low):
            extra.append(f"95% CI {low * 100:+.1f} to {high * 100:+.1f} points")
        if report.skipped:
            extra.append(f"{report.skipped} skipped by the gate")
        if report.fallbacks:
            extra.append(report.fell_back)
        if report.identical_to_none:
            extra.append("identical to none on every query: it changes nothing here")
        tail = f" ({'; '.join(extra)})" if extra else ""
        lines.append(f"{spelled_name(report.label)}: {report.verdict}{tail}")
    return lines


def recommendation(result: EvalResult, alpha: float = 0.05) -> str:
    """The one thing to do after an `eval` run: use the best transform whose gain over
    `none` is significant (p < ``alpha`` and a positive difference), with its options;
    else keep plain search, naming the best candidate and why it is not enough. A
    transform that fell back on more than a tenth of its queries is never recommended
    (its score is partly plain search's): every such transform is named, with its
    fallbacks.

    Args:
        result: the run.
        alpha: the significance level of the paired t-test against `none`.
    """
    rows = [r for r in result.reports if r.delta_vs_none is not None]
    if not rows:
        return "Recommendation: nothing to compare (run `none` beside a transform)."
    gaining = [r for r in rows if r.gains(alpha)]
    if gaining:
        said = _use(max(gaining, key=lambda r: r.scores["nDCG@10"]))
    else:
        said = _keep_plain(
            rows, "transform", "the highest-scoring", "the closest of the transforms"
        )
    unmeasured = [r for r in rows if not r.measured]
    if unmeasured and len(unmeasured) < len(rows):  # else `_keep_plain` named them all
        said += f" Not measured: {_fell_back(unmeasured)}."
    return said


def _fell_back(rows: list[TransformReport]) -> str:
    """``"`hyde` fell back on 4 of 7: timeouts; `step-back` fell back on ..."``."""
    return "; ".join(f"`{spelled_name(r.label)}` {r.fell_back}" for r in rows)


def _use(report: TransformReport, how: str = "") -> str:
    return (
        f"Recommendation: use `{spelled_name(report.label)}`{how} ({_interval(report)} "
        "nDCG@10 points, "
        f"p = {report.p_value_vs_none or 0:.3f}, {_wtl(report)} wins/ties/losses)."
    )


def _keep_plain(
    rows: list[TransformReport], what: str, role: str, behind: str | None = None
) -> str:
    """Why plain search stays, for a person: no row was measured (each fell back on
    more than a tenth of its queries), or the ``role`` row (the highest-scoring
    measured one, or the chosen one) gains nothing that could not be chance. When that
    row scores no higher than plain search it is named as ``behind`` says (``role``
    when None): a row below plain search is the closest to it, not the highest."""
    keep = "Recommendation: keep plain search (`none`)"
    measured = [r for r in rows if r.measured]
    if not measured:
        whose = "its score is" if len(rows) == 1 else "each score is"
        return (
            f"{keep}: no {what} was measured here: {_fell_back(rows)} (more than a "
            f"tenth of the queries, so {whose} mostly plain search's)."
        )
    top = max(measured, key=lambda r: r.scores["nDCG@10"])
    p = _p(top).rstrip(" *")
    if (top.delta_vs_none or 0.0) > 0:
        return (
            f"{keep}: no {what} gains significantly here; {role}, `{spelled_name(top.label)}`, is "
            f"{_interval(top)} nDCG@10 points, which could be chance (p = {p})."
        )
    return (
        f"{keep}: no {what} scores above plain search here; {behind or role}, "
        f"`{spelled_name(top.label)}`, is "
        f"{_interval(top)} nDCG@10 points (p = {p})."
    )


def tune_recommendation(result: TuneResult, config: Path | None) -> str:
    """The one thing to do after a `tune` sweep: use the chosen configuration (with
    ``--config`` ``config``) when it beats `none` (`TransformReport.gains`), else keep
    plain search.

    Args:
        result: the sweep.
        config: where the configuration was written; None: it was not.
    """
    winner = result.winner
    if winner.gains():
        how = f" (--config {config})" if config is not None else ""
        return _use(winner, how)
    said = _keep_plain([winner], "configuration", "the chosen one")
    return said + (" No config written." if config is None else "")


def markdown(result: EvalResult, command: str | None = None) -> str:
    """``results.md``: the command, how to read the table, the table, the verdicts,
    the configuration and where the time went.

    Args:
        result: the run.
        command: the command line that made it, shown first; None: not shown.
    """
    lines: list[str] = []
    if command:
        lines += ["```bash", command, "```", ""]
    if result.config.get("stand_in"):
        lines += [f"**Not a real model.** {result.config['stand_in']}.", ""]
    lines += [
        f"{_md_name(result.dataset)}: {_queries(result.queries)}, {result.documents} "
        f"{result.unit}. Best value per column in bold; a transform that fell back to plain "
        "search on more than a tenth of its queries is not measured: never bold, nor compared with "
        "`none`. Δ is nDCG@10 minus `none`'s in points; wins/ties/"
        "losses count queries whose nDCG@10 is above/equal to/below `none`'s; p is a paired "
        "t-test of per-query nDCG@10 against `none` (* below 0.05), and the 95% interval "
        "of Δ under the table comes from the same test (results.png draws it). Latency is "
        "per query (transform + search, "
        f"{result.config.get('concurrency', '?')} queries in flight), measured on "
        "freshly generated transforms.",
        "",
    ]
    lines.append("| " + " | ".join(HEADERS) + " |")
    lines.append("| --- | " + " | ".join("---:" for _ in HEADERS[1:]) + " |")
    best = _best(result)
    for report in result.reports:
        lines.append("| " + " | ".join(_row(report, best)) + " |")
    lines.append("")
    said = verdicts(result)
    if said:
        lines += [f"- {line}" for line in said] + [""]
    lines += fallback_reasons(result)
    lines += [f"**{recommendation(result)}**", ""]
    note = result.config.get("questions")
    if isinstance(note, str):  # generated questions: what to know about them, in words
        lines += [f"About these questions: {note}", ""]
    config = ", ".join(
        f"{k}={v}" for k, v in result.config.items() if not (k == "questions" and note is v)
    )
    lines.append(f"Config: {config}.")
    lines += ["", timing_line(result)]
    return "\n".join(lines) + "\n"


REASONS_SHOWN = 3
"""How many fallbacks' reasons ``results.md`` shows per transform (``results.json``
keeps every one, in ``fallback_reasons``)."""

MAX_REASON_CHARS = 300
"""The most characters of one fallback's reason ``results.md`` shows."""


def fallback_reasons(result: EvalResult) -> list[str]:
    """``results.md``'s lines saying why queries fell back: for each transform, the
    first `REASONS_SHOWN` of its fallbacks (query id and reason, on one line each), and
    how many more ``results.json`` has; no lines when none fell back."""
    lines = []
    for report in result.reports:
        reasons = sorted(report.fallback_reasons.items())
        for qid, reason in reasons[:REASONS_SHOWN]:
            lines.append(f"- {_md_name(report.label)}, query {_md_text(qid)}: {_md_text(reason)}")
        if len(reasons) > REASONS_SHOWN:
            more = len(reasons) - REASONS_SHOWN
            lines.append(f"- {_md_name(report.label)}: {more} more in results.json")
    if not lines:
        return []
    return [
        "Why queries fell back (every reason is in results.json's `fallback_reasons`):",
        "",
        *lines,
        "",
    ]


def _md_text(text: str) -> str:
    """``text`` (a model's reply or error, a query id) as one line of Markdown that
    shows it as written: cut at `MAX_REASON_CHARS`, line breaks and tabs as spaces,
    other control characters and bidirectional marks spelled (``\\x1b``, ``\\u202e``),
    Markdown's marks escaped."""
    if len(text) > MAX_REASON_CHARS:
        text = f"{text[:MAX_REASON_CHARS]}... ({len(text) - MAX_REASON_CHARS:,} more characters)"
    text = re.sub(r"[\r\n\t\x0b\x0c\x85\u2028\u2029]+", " ", text)
    return re.sub(r"([\\`*_{}\[\]<>|~])", r"\\\1", spelled_out(text))


def _md_name(name: str) -> str:
    """A name (a label, a data set's) in ``results.md`` as written, on one line
    (`spelled_name`), a ``|`` escaped (it would end a table's cell)."""
    return spelled_name(name).replace("|", r"\|")


def timing_line(result: EvalResult) -> str:
    """Each phase's seconds and the total: ``Time: models 3 s, questions 585 s, index
    40 s (cached), none 10 s, hyde 411 s; total 1,049 s.``"""
    parts = []
    for name, seconds in result.phases.items():
        cached = " (cached)" if name == "index" and result.index_cached else ""
        parts.append(f"{name} {seconds:,.0f} s{cached}")
    other = result.wall_seconds - sum(result.phases.values())
    if parts and other >= 1:
        parts.append(f"other {other:,.0f} s")
    listed = f"{', '.join(parts)}; " if parts else ""
    return f"Time: {listed}total {result.wall_seconds:,.0f} s."


CHART_COLOURS = {
    "helps": "#2e8b57",
    "hurts": "#c0392b",
    "no clear difference": "#9e9e9e",
    "not measured": "#e0e0e0",
}
"""Colours of the Δ bars by verdict, and of the absolute scores."""


def delta_label(report: TransformReport) -> str:
    """``+7.0 (-5.1 to +19.1)``, the verdict's first words, and how many queries fell
    back, were skipped or had their ranking changed, for the Δ chart; for a row not
    measured (`_unmeasured`), "not measured" and its fallbacks alone: no difference."""
    if _unmeasured(report):
        count, _, why = report.fell_back.partition(": ")
        return f"not measured\n{count}:\n{why}"
    delta = (report.delta_vs_none or 0.0) * 100
    low, high = report.interval_vs_none or (math.nan, math.nan)
    interval = "" if math.isnan(low) else f"\n95% CI {low * 100:+.1f} to {high * 100:+.1f}"
    counts = [f"{_share(report.changed, report)} changed"]
    if report.skipped:
        counts.append(f"{report.skipped} skipped")
    if report.fallbacks:
        counts.append(f"{report.fallbacks} fell back")  # the verdict line says why
    return f"{delta:+.1f}{interval}\n{report.verdict.split(':')[0]}\n{', '.join(counts)}"


DRAWN_CHARS = 60
"""The most characters of a name the chart draws (the tables and ``results.md`` hold
it whole): a longer tick label leaves no room for the plot."""


def _drawn(label: str) -> str:
    """``label`` (a name) as the chart draws it, as written on one line: tabs, line
    breaks, control characters and bidirectional marks spelled (`spelled_name`; no
    font has them), a ``$`` escaped (matplotlib reads ``$...$`` as mathematics), cut
    with ``…`` past `DRAWN_CHARS`."""
    shown = spelled_name(label)
    if len(shown) > DRAWN_CHARS:
        shown = shown[: DRAWN_CHARS - 1] + "…"
    return shown.replace("$", r"\$")


def _scores_panel(ax: Any, result: EvalResult) -> None:
    labels = [_drawn(r.label) for r in result.reports]
    xs = range(len(labels))
    width = 0.38
    for shift, measure, colour in ((-1, "nDCG@10", "#3b6ea8"), (1, "R@100", "#9cc3e6")):
        values = [r.scores[measure] for r in result.reports]
        bars = ax.bar([x + shift * width / 2 for x in xs], values, width, color=colour)
        bars.set_label(LABELS[measure])
        ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=2)
    ax.set_xticks(list(xs), labels, rotation=20, ha="right")
    ax.set_ylim(0, 1.18)
    ax.set_ylabel("score")
    ax.set_title("score per transform")
    ax.legend(loc="upper center", ncol=2, frameon=False)
    ax.grid(axis="y", alpha=0.3)


def _delta_panel(ax: Any, compared: list[TransformReport]) -> None:
    """Δ nDCG@10 vs `none` in points, with the 95% interval as error bars, coloured by
    verdict; an interval that crosses 0 is "no clear difference". A row not measured
    (`_unmeasured`) has no bar nor interval: its label says so."""
    xs = list(range(len(compared)))
    shown = [r.delta_vs_none is not None and not _unmeasured(r) for r in compared]
    deltas = [(r.delta_vs_none or 0.0) * 100 if s else 0.0 for r, s in zip(compared, shown)]
    spans = [(r.interval_vs_none or (0, 0)) if s else (0, 0) for r, s in zip(compared, shown)]
    low = [d - span[0] * 100 for d, span in zip(deltas, spans)]
    high = [span[1] * 100 - d for d, span in zip(deltas, spans)]
    errors = [[0.0 if math.isnan(v) else max(v, 0.0) for v in side] for side in (low, high)]
    colours = [CHART_COLOURS.get(r.verdict.split(":")[0], "#9e9e9e") for r in compared]
    bars = ax.bar(xs, deltas, 0.55, color=colours)
    drawn = [i for i, s in enumerate(shown) if s]
    if drawn:  # the intervals of the rows measured only: no cap drawn at 0 for the others
        ax.errorbar(
            [xs[i] for i in drawn],
            [deltas[i] for i in drawn],
            yerr=[[side[i] for i in drawn] for side in errors],
            fmt="none",
            capsize=6,
            ecolor="#333333",
        )
    for bar, report in zip(bars, compared):
        if report.verdict.startswith("no clear difference"):
            bar.set_hatch("//")
    ax.axhline(0, color="#333333", linewidth=0.8)
    reach = max([abs(d) + max(e) for d, *e in zip(deltas, *errors)] + [1.0])
    for x, report in zip(xs, compared):
        ax.annotate(delta_label(report), (x, -reach * 1.12), ha="center", va="top", fontsize=7)
    ax.set_ylim(-reach * 1.75, reach * 1.2)
    ax.set_xticks(xs, [_drawn(r.label) for r in compared], rotation=20, ha="right")
    ax.set_ylabel("Δ nDCG@10 vs none (points)")
    ax.set_title("Δ vs none, 95% interval (paired t)")
    ax.grid(axis="y", alpha=0.3)


def chart(result: EvalResult) -> Any:
    """The results as a matplotlib figure: nDCG@10 and Recall@100 per transform, and
    each transform's Δ nDCG@10 against `none` with its 95% interval and verdict (when
    `none` ran), under a title naming the data and the number of queries."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    compared = [r for r in result.reports if r.delta_vs_none is not None]
    panels = 2 if compared else 1
    n = len(result.reports)
    fig, axes = plt.subplots(
        1, panels, figsize=(max(6.0, 1.3 * n) * panels, 4.8), dpi=120, squeeze=False
    )
    _scores_panel(axes[0][0], result)
    if compared:
        _delta_panel(axes[0][1], compared)
    fig.suptitle(
        f"{_drawn(result.dataset)}: {_queries(result.queries)}, {result.documents} {result.unit}"
    )
    fig.tight_layout()
    return fig


def bar_chart(result: EvalResult) -> bytes:
    """`chart` of ``result`` as PNG bytes."""
    import matplotlib.pyplot as plt

    fig = chart(result)
    png = io.BytesIO()
    fig.savefig(png, format="png", metadata={"Software": "hyde-plus eval"})
    plt.close(fig)
    return png.getvalue()


RESULT_FILES = ("results.json", "results.md", "results.png")
RESULTS_KIND = "eval-results"
"""What the marker of an eval ``--out`` folder names (`_owned`)."""


def check_results_folder(out: Path) -> list[Path]:
    """The results files an eval run into ``out`` replaces, if it may write there (new,
    empty, or eval results hyde-plus wrote; no folder or link where a results file
    goes); else a `ValueError` naming ``--out``. `eval` calls it before any work."""
    out = check_folder(out, RESULTS_KIND, "--out")
    return check_outputs([out / name for name in RESULT_FILES], "--out")


def write_outputs(result: EvalResult, out: Path, command: str | None = None) -> list[Path]:
    """Write ``results.json``, ``results.md`` and ``results.png`` into ``out`` (each
    beside its target, then all renamed: a full disk or a kill mid-write leaves the old
    run whole), saying which files of an earlier run it replaces."""
    out = Path(out).expanduser()
    say_replacing(check_results_folder(out))
    claim(out, RESULTS_KIND)
    payload = result.to_dict()
    if command:
        payload["command"] = command
    paths = [out / name for name in RESULT_FILES]
    contents = [
        (json.dumps(payload, indent=2) + "\n").encode("utf-8"),
        markdown(result, command).encode("utf-8"),
        bar_chart(result),
    ]
    write_all_atomic(list(zip(paths, contents, strict=True)))
    return paths


def tune_rows(result: TuneResult, top: int | None = None) -> list[list[str]]:
    """Rows of a tune table, best first (``top`` of them), plus `none` and the chosen
    configuration when they fall outside."""
    ranked = result.ranked()
    shown = ranked if top is None else ranked[:top]
    rows = []
    for report in [*shown, *(r for r in (result.winner,) if r not in shown)]:
        chosen = report is result.winner and report.measured  # else none is chosen
        mark = "chosen" if chosen else ("best" if report is result.best else "")
        rows.append([*_terminal_row(report, math.nan)[:-1], mark])
    base = result.baseline
    rows.append([*_terminal_row(base, math.nan)[:-1], "baseline"])
    return rows


TUNE_HEADERS = ["configuration", "nDCG@10", "Δ pts [95% CI]", "W/T/L", "p", "chg", "skip/fb", ""]
"""The tune table's columns (terminal and ``--report``): as `TERMINAL_HEADERS`, and
the chosen / best / baseline mark."""


def tune_choice(result: TuneResult) -> str:
    """Which configuration was chosen, and why when it is not the best-scoring row: the
    simplest within ``--tolerance`` of the best is chosen."""
    w, best = result.winner, result.best
    said = f"Chosen: `{spelled_name(w.label)}` ({w.verdict})"
    if not w.measured:
        return (
            f"No configuration was measured: each fell back on more than a tenth of its "
            f"queries; none is chosen. Of the highest-scoring, `{spelled_name(w.label)}`: "
            f"{w.fell_back}."
        )
    skipped = _unmeasured_note(result)
    if w is best:
        return f"{said}, the best-scoring configuration.{skipped}"
    gap = (best.scores["nDCG@10"] - w.scores["nDCG@10"]) * 100
    return (
        f"{said}, not the best-scoring `{spelled_name(best.label)}` ({best.scores['nDCG@10']:.4f}, "
        f"{gap:.1f} points higher): the simplest configuration within "
        f"{result.tolerance * 100:.1f} points (--tolerance) of the best is chosen.{skipped}"
    )


def _unmeasured_note(result: TuneResult) -> str:
    count = result.unmeasured
    if not count:
        return ""
    if count == 1:
        return (
            f" 1 of {len(result.reports)} configurations is not measured (it fell back on "
            "more than a tenth of its queries) and is never chosen."
        )
    return (
        f" {count} of {len(result.reports)} configurations are not measured (they fell "
        "back on more than a tenth of their queries) and are never chosen."
    )


def tune_table(result: TuneResult, top: int | None = 15) -> ResultsTable:
    """The terminal table of a `tune` sweep (`tune_rows`, as `ResultsTable` shows
    rows), the chosen configuration in bold green.

    Args:
        result: the sweep.
        top: how many configurations to show, best first; None: all.
    """
    title = (
        f"tune {spelled_name(result.transform)} on {spelled_name(result.dataset)} "
        f"{spelled_name(result.split)} ({_queries(result.queries)}, "
        f"{len(result.reports)} configurations)"
    )
    rows = tune_rows(result, top)
    labels, legend = short_labels([row[0] for row in rows], result.transform)
    if legend:
        title += f"\n{spelled_name(legend)}"
    table = ResultsTable(_folding.Label(title, style="table.title"), TUNE_HEADERS)
    for row, shown in zip(rows, labels):
        table.add_row(shown, row[1:], "bold green" if row[-1] == "chosen" else None)
    return table


TUNE_LABEL_WIDTH = 14
"""Characters of a configuration a line of the terminal tune table shows; longer
options are abbreviated (`short_labels`)."""


def short_labels(labels: list[str], transform: str) -> tuple[list[str], str]:
    """Configuration labels for an 80-column table, and their legend (``""``: none
    needed): without the transform's name (the title says it; its defaults read
    ``defaults``), lines ending between options, and when an option would not fit
    `TUNE_LABEL_WIDTH`, every option name abbreviated (``qw=0.7`` for
    ``query_weight=0.7``, the legend saying ``qw: query_weight``)."""
    prefix = f"{transform}:"
    options = [
        label[len(prefix) :].split(",") if label.startswith(prefix) else [label] for label in labels
    ]
    names = sorted({o.split("=", 1)[0] for opts in options for o in opts if "=" in o})
    if all(len(o) + 1 <= TUNE_LABEL_WIDTH for opts in options for o in opts):
        short = {n: n for n in names}
    else:
        short = _abbreviations(names)
    shown = []
    for label, opts in zip(labels, options):
        if label == transform:
            shown.append("defaults")
            continue
        parts = [
            f"{short[o.split('=', 1)[0]]}={o.split('=', 1)[1]}" if "=" in o else o for o in opts
        ]
        shown.append(", ".join(parts))  # a line ends between two options
    legend = ", ".join(f"{short[n]}: {n}" for n in names if short[n] != n)
    return shown, legend


def _abbreviations(names: list[str]) -> dict[str, str]:
    """A short, distinct name for each of ``names``: the initials of its words
    (``query_weight`` -> ``qw``), the first word's letters lengthened where two would
    read the same (``gate`` -> ``ga``, ``grounded`` -> ``gr``)."""
    length = dict.fromkeys(names, 1)
    while True:
        short = {}
        for name in names:
            first, *rest = name.split("_")
            short[name] = first[: length[name]] + "".join(w[:1] for w in rest)
        clashes = [n for n in names if list(short.values()).count(short[n]) > 1]
        grown = [n for n in clashes if length[n] < len(n.split("_")[0])]
        if not grown:
            return {n: (n if n in clashes else short[n]) for n in names}
        for name in grown:
            length[name] += 1


TUNE_TITLE = "# hyde-plus tune report"
"""The first line of every tune report: an existing ``--report`` is replaced only when
it starts so (`is_tune_report`)."""


def is_tune_report(head: bytes) -> bool:
    """Whether a file starting with ``head`` is a tune report hyde-plus wrote."""
    return head.startswith(TUNE_TITLE.encode())


def tune_markdown(
    result: TuneResult,
    command: str | None = None,
    top: int | None = None,
    config: Path | None = None,
) -> str:
    """The markdown report of a `tune` sweep: the command, the table (`tune_rows`),
    which configuration was chosen and why, and the recommendation.

    Args:
        result: the sweep.
        command: the command line that made it, shown first; None: not shown.
        top: how many configurations to show, best first; None: all.
        config: where the chosen configuration was written; None: it was not.
    """
    lines = [f"{TUNE_TITLE}: {_md_name(result.winner.label)} on {_md_name(result.dataset)}", ""]
    if command:
        lines += ["```bash", command, "```", ""]
    if result.extra.get("stand_in"):
        lines += [f"**Not a real model.** {result.extra['stand_in']}.", ""]
    lines.append("| " + " | ".join(h or "note" for h in TUNE_HEADERS) + " |")
    lines.append("| --- | " + " | ".join("---:" for _ in TUNE_HEADERS[1:-1]) + " | --- |")
    rows = tune_rows(result, top)
    lines += ["| " + " | ".join([_md_name(row[0]), *row[1:]]) + " |" for row in rows]
    lines += [
        "",
        tune_choice(result),
        "",
        f"**{tune_recommendation(result, config)}**",
    ]
    return "\n".join(lines) + "\n"
