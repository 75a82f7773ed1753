"""The ``hyde-plus`` command: index, query, transform, eval, tune, serve, models, demo.

One module per command group; this one builds the app and registers them.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from .._version import __version__
from ._console import setup_logging
from .demo import DEMO_PROMPT, demo, demo_corpus_path
from .eval import eval_cmd
from .index import index
from .models import models_list, models_pull
from .query import query, transform_cmd
from .serve import serve
from .tune import tune

__all__ = ["DEMO_PROMPT", "app", "demo_corpus_path", "main", "models_app"]

app = typer.Typer(
    name="hyde-plus",
    help="Query transformation for LlamaIndex: HyDE, multi-query, step-back, decompose, rewrite.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: flags without type tags, one line per option
)
models_app = typer.Typer(
    help="Fetch and list the local default models.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(models_app, name="models")


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
    """Quiet logging before any command imports a library that logs on import (faiss
    lists the builds it could not load at INFO); a command's ``-v`` turns INFO on."""
    setup_logging(verbose=False)


app.command()(index)
app.command()(query)
app.command("transform")(transform_cmd)
app.command("eval")(eval_cmd)
app.command()(tune)
app.command()(serve)
app.command()(demo)
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
