"""The ``hyde-plus`` command: index, query, transform, eval, tune, serve, models, demo.

One module per command group; this one builds the app and registers them. Building
the app imports only typer and the light modules of this package: ``--version``,
``--help`` and argument errors answer before LlamaIndex loads, because each command
imports what it works with when it runs, after checking its arguments.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from .._version import __version__
from .demo import DEMO_PROMPT, demo, demo_corpus_path
from .eval import eval_cmd
from .index import index
from .models import models_list, models_pull
from .query import query, transform_cmd
from .serve import serve
from .tune import tune

__all__ = ["DEMO_PROMPT", "app", "demo_corpus_path", "main", "models_app"]


class _Group(TyperGroup):
    """A command group whose ``--help`` flag is False when not given, as a flag is.

    typer (0.29) leaves it None, and coerces a None through a pydantic validator: every
    ``hyde-plus COMMAND --help`` then imported pydantic (about half its time) only to
    read a flag nobody gave. A bool skips that coercion."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None and option.default is None:
            option.default = False
        return option


app = typer.Typer(
    cls=_Group,
    name="hyde-plus",
    help="Query transformation for LlamaIndex: HyDE, multi-query, step-back, decompose, rewrite.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: flags without type tags, one line per option
)
models_app = typer.Typer(
    cls=_Group,
    help="Fetch and list the local default models.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(models_app, name="models", short_help="Fetch and list the local default models.")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"hyde-plus {__version__}")
        raise typer.Exit()


@app.callback()
def _start(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", is_eager=True, callback=_print_version
        ),
    ] = False,
) -> None:
    """Only ``--version``: each command sets up logging itself, first (`setup_logging`:
    quiet before a library that logs on import loads; ``-v`` turns INFO on), so that a
    command's ``--help``, which runs this first, loads no logging handler."""


# Each command's line in `hyde-plus --help`: a whole sentence within 80 columns
# (click cuts a docstring's first sentence that does not fit there)
app.command(short_help="Chunk and embed a folder of documents into an index.")(index)
app.command(short_help="Search an index with a transformed question.")(query)
app.command("transform", short_help="Print what a transform makes of a question.")(transform_cmd)
app.command("eval", short_help="Score transforms on a data set or your documents.")(eval_cmd)
app.command(short_help="Choose a transform's options on a training split.")(tune)
app.command(short_help="Serve the Retrieval Context Protocol (HTTP or stdio).")(serve)
app.command(short_help="Run HyDE end to end on a small shipped corpus.")(demo)
models_app.command("pull")(models_pull)
models_app.command("list")(models_list)


def main() -> None:
    """The ``hyde-plus`` command. A file-system error (a full disk, a folder or file
    without write permission) is one ``error:`` line, not a traceback: every write is
    atomic, so what was there before is whole."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        app()
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        print(
            f"error: {exc.strerror or exc}{where}; what was there before is unchanged "
            "(writes are atomic): free space or fix the permissions, then run again",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
