"""What every command shows a person: consoles, logging, errors, progress, tables.

Importing this module imports neither rich nor LlamaIndex (``--help`` and argument
errors answer before either loads): `console` and `err` are made on first use, and each
function imports what it draws with."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import typer

from .._shown import literal as literal
from .._shown import named as named
from .._shown import spelled_tabs
from .._suggest import did_you_mean

if TYPE_CHECKING:
    from ..evaluation.index_cache import Advance

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from ..search.retriever import SearchResult
    from ..usage import Usage

    console: Console
    """Standard output."""
    err: Console
    """Standard error: progress, warnings, errors."""


@functools.cache
def _made_console(stderr: bool) -> Console:
    """The console of standard error (``stderr``) or output, made on first use."""
    from rich.console import Console

    return Console(stderr=stderr)


def __getattr__(name: str) -> Any:
    """`console` and `err`, made on first use (PEP 562)."""
    if name in ("console", "err"):
        return _made_console(name == "err")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The loggers whose warnings a user sees without ``-v``: ours.
OWN_LOGGER = __name__.split(".")[0]


def own_or_severe(record: logging.LogRecord) -> bool:
    """Whether a log record is shown without ``-v``: ours at WARNING and above, another
    library's (faiss's "Could not load library" notes, pypdf's repairs of a damaged
    file) only from ERROR up."""
    ours = record.name == OWN_LOGGER or record.name.startswith(OWN_LOGGER + ".")
    return ours or record.levelno >= logging.ERROR


def setup_logging(verbose: bool) -> None:
    """Log to stderr: everything from INFO with ``verbose``, else only our warnings and
    anyone's errors. Replaces whatever handlers a library's import installed. Every
    command calls it first: `console` and `err` are then made anew for this run, in
    its environment (a console reads ``COLUMNS`` when it is made)."""
    from rich.logging import RichHandler

    _made_console.cache_clear()
    handler = RichHandler(console=_made_console(True), show_path=False)
    if not verbose:
        handler.addFilter(own_or_severe)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[handler],
        force=True,
    )
    if not verbose:
        # Milvus Lite's in-process gRPC server logs harmless "Method not implemented"
        # tracebacks (AllocTimestamp) at ERROR; they are noise to a user
        logging.getLogger("grpc._server").setLevel(logging.CRITICAL)


def fail(message: str) -> typer.Exit:
    """Print an ``error:`` message (as written: `literal`); the caller raises the
    returned exit (code 2); a tab in it (a name's) is spelled, ``\\x09``. On a
    terminal its words wrap to the terminal's width, a word longer than a line (a path)
    whole on a line of its own, where it can be copied; piped or redirected, it is one
    line, for a log or ``grep`` to read whole."""
    from rich.console import Group
    from rich.text import Text

    from .._folding import Prose

    stderr = _made_console(True)
    said = Text.from_markup(f"[bold red]error:[/] {literal(spelled_tabs(message))}")
    if stderr.is_terminal:  # in a Group: print() would join a bare Text into a plain one
        stderr.print(Group(Prose(said.plain, spans=said.spans)), crop=False)
    else:
        stderr.print(said, soft_wrap=True)
    return typer.Exit(code=2)


def user_errors() -> tuple[type[Exception], ...]:
    """Errors the user can fix, printed as one ``error:`` line instead of a traceback."""
    import openai

    from ..local.assets import ModelNotAvailableError
    from ..models import MissingExtraError

    errors: tuple[type[Exception], ...] = (
        ValueError,
        ModelNotAvailableError,
        MissingExtraError,
        openai.OpenAIError,
    )
    try:  # a Milvus error not turned into a ValueError yet (the milvus extra)
        from pymilvus.exceptions import MilvusException
    except ImportError:
        return errors
    return (*errors, MilvusException)


def describe_error(exc: Exception) -> str:
    import openai

    if isinstance(exc, openai.AuthenticationError):
        return "OpenAI rejected the API key (HTTP 401); check OPENAI_API_KEY, or use local models"
    if isinstance(exc, openai.OpenAIError):
        return (
            f"the OpenAI request failed ({type(exc).__name__}: {exc}); check the network and "
            "OPENAI_API_KEY, or use local models"
        )
    if type(exc).__name__ == "MilvusException":
        return f"Milvus failed: {getattr(exc, 'message', '') or exc}"
    return str(exc)


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """Turn the errors a user can fix into one ``error:`` line and exit code 2."""
    try:
        yield
    except user_errors() as exc:
        raise fail(describe_error(exc)) from exc


@contextlib.contextmanager
def working(description: str) -> Iterator[None]:
    """A spinner with the elapsed time on stderr while a model works (transient: it
    disappears when done, leaving no blank line: `_display`), so a slow local model
    never looks like a hang."""
    from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

    spinner = _display(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True
    )
    with spinner:
        spinner.add_task(literal(description), total=None)
        yield


def _display(*columns: Any, transient: bool) -> Progress:
    """A progress display on stderr that, once stopped, leaves nothing when it is
    ``transient`` or shows no bar (Rich ends one that is not on a terminal with a
    blank line, even then)."""
    from rich.progress import Progress

    class Display(Progress):
        def stop(self) -> None:
            if self.live.transient or not any(t.visible for t in self.tasks):
                self.live.transient = True
                self.live.stop()
            else:
                super().stop()

    return Display(*columns, console=_made_console(True), transient=transient)


def progress_bar() -> Progress:
    """Bars within 80 columns, so the count, the elapsed time and the ETA always show
    whole: the description folds onto more lines at sensible points (`_folding`: a
    transform's options after ``:`` and ``,``) in the room they leave, at most 20
    columns and 4 lines, a word wider than that room shortened with an ellipsis, never
    folded inside; the rate is shortened with an ellipsis when long. A bar made
    invisible (nothing to do) leaves no line behind (`_display`)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        ProgressColumn,
        Task,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.table import Column
    from rich.text import Text

    from .._folding import Label

    class Described(Label):
        most_lines = 4  # a terminal too narrow to fold into: cut after 4 lines
        cut, shortened = False, True  # a word wider than the column: "configurat…"

    class Description(ProgressColumn):
        """A bar's description (markup-escaped by `task`) as a `Label`."""

        def render(self, task: Task) -> Text:
            said = Text.from_markup(task.description)
            return Described(said.plain, style="progress.description", spans=said.spans)

    def squeezable(width: int) -> Column:
        return Column(max_width=width, no_wrap=True, overflow="ellipsis")

    whole = Column(no_wrap=True)
    return _display(
        Description(table_column=Column(max_width=20)),
        BarColumn(bar_width=6),
        MofNCompleteColumn(table_column=whole),
        TextColumn("{task.fields[rate]}", table_column=squeezable(26)),
        TimeElapsedColumn(table_column=whole),
        TextColumn("eta", table_column=whole),
        TimeRemainingColumn(table_column=whole),
        transient=False,
    )


def task(progress: Progress, description: str, total: int, unit: str) -> Advance:
    """Add a bar to ``progress`` described by ``description`` (a name: on one line,
    `named`) and return ``advance(n, fell_back=0, note="")``, which
    also shows the rate, once any did, how many of the items fell back so far, and the
    ``note`` (how many queries are in flight, once fewer than asked)."""
    task_id = progress.add_task(named(description), total=total, rate="")
    start = time.perf_counter()
    done = fallbacks = 0

    def advance(n: int, fell_back: int = 0, note: str = "") -> None:
        nonlocal done, fallbacks
        done, fallbacks = done + n, fallbacks + fell_back
        rate = done / max(time.perf_counter() - start, 1e-9)
        said = f", [yellow]{fallbacks} fell back[/]" if fallbacks else ""
        said += f", {note}" if note else ""
        progress.update(task_id, advance=n, rate=f"{rate:.1f} {unit}{said}")

    return advance


def usage_line(usage: Usage) -> str:
    return (
        f"{usage.calls} LLM call(s), {usage.input_tokens} in / {usage.output_tokens} out "
        f"tokens ({usage.usage_source}), cost {usage.cost_text()}"
    )


def results_table(title: str, result: SearchResult, highlight: str | None = None) -> Table:
    from rich.table import Table

    table = Table(title=literal(title), title_justify="left", expand=False)
    table.add_column("#", justify="right")
    table.add_column("score", justify="right")
    table.add_column("id")
    table.add_column("text", overflow="fold", max_width=70)
    for rank, item in enumerate(result.nodes, 1):
        style = "bold green" if highlight and item.node.node_id == highlight else None
        text = item.node.get_content().replace("\n", " ")
        score = f"{item.score:.3f}" if item.score is not None else "-"
        table.add_row(
            str(rank), score, literal(item.node.node_id), literal(text[:200]), style=style
        )
    return table


GENERATED = {
    "multi-query": "generated queries",
    "step-back": "step-back question",
    "decompose": "sub-questions",
    "rewrite": "rewritten query",
}
"""What each method's generated queries are called when `print_transform` lists them."""


def print_transform(result: SearchResult) -> None:
    """What the transform did: why it fell back, how many of the queries asked for it
    kept and why it left the rest out (`QueryCount`, when fewer), or why a gate kept
    the question's own search, and everything it wrote (passages as panels, every
    generated query, step-back question or sub-question as bullets), for each stage of
    a composed transform."""
    _print_result(_made_console(False), result.transform)


def _print_result(out: Console, t: Any) -> None:
    from rich.panel import Panel

    method = literal(t.method)
    if t.fallback:
        out.print(f"[yellow]{method} fell back to the original query:[/] {literal(t.error or '')}")
    elif t.parsed is not None and (t.parsed.short or t.parsed.trimmed):
        out.print(f"[yellow]{method}:[/] {literal(t.parsed.summary())}")
    if t.skipped:
        said = literal(t.skipped)
        out.print(f"[yellow]{method}: the gate kept the question's own search:[/] {said}")
    for i, passage in enumerate(t.hypothetical, 1):
        out.print(Panel(literal(passage), title=f"hypothetical passage {i}", title_align="left"))
    if t.queries and not t.hypothetical:
        out.print(f"[bold]{method}: {GENERATED.get(t.method, 'generated queries')}[/]")
        for q in t.queries:
            out.print(f"  • {literal(q)}")
    for child in t.children:
        _print_result(out, child)


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise fail(
            f"{name} must be one of: {', '.join(choices)}; got {value!r}"
            f"{did_you_mean(value, choices)}"
        )


def warm_up(model: Any) -> None:
    """Load a model that loads lazily (the local LLM) and run one tiny call, so that
    neither counts against the first requests' timeout."""
    from ..models import describe_llm

    load = getattr(model, "warm_up", None)
    if not callable(load):
        return
    start, stderr = time.perf_counter(), _made_console(True)
    with stderr.status(f"Loading {describe_llm(model)}..."):
        load()
        try:
            model.complete("Hello", max_tokens=1)
        except Exception as exc:  # the model loaded; a failed probe is not fatal
            stderr.print(f"[yellow]warning:[/] warm-up call failed ({type(exc).__name__}: {exc})")
    stderr.print(f"{describe_llm(model)} loaded in {time.perf_counter() - start:.1f} s")
