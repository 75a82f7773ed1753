"""How to install an extra, in the two ways the package is run: installed with pip, or
from a clone of the source with ``uv run`` (whose ``--extra`` flags choose the extras)."""

from __future__ import annotations

CLONE_EXTRAS = ("local",)
"""The extras the README's clone commands run with (``uv run --frozen --extra local``)."""


def install_hint(extra: str) -> str:
    """Both ways to get ``extra``: ``pip install "llama-index-hyde-plus[eval]"``, or in
    a clone, ``--extra eval`` added to ``uv run`` (shown beside the README's own
    ``--extra local``)."""
    flags = " ".join(f"--extra {e}" for e in dict.fromkeys((*CLONE_EXTRAS, extra)))
    return (
        f'pip install "llama-index-hyde-plus[{extra}]"; in a clone of the source, add '
        f"--extra {extra} to uv run (uv run --frozen {flags} hyde-plus ...)"
    )
