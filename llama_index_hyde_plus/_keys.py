"""Whether a model choice needs an API key that is not set: one check, importing nothing
heavy, so the CLI can run it before LlamaIndex loads."""

from __future__ import annotations

import os


def missing_openai_key(flag: str) -> str | None:
    """The error for ``FLAG openai`` when ``OPENAI_API_KEY`` is unset or blank, else None."""
    if os.environ.get("OPENAI_API_KEY", "").strip():
        return None
    return f"{flag} openai needs an API key: set OPENAI_API_KEY, or use {flag} local"


def require_openai_key(flag: str) -> None:
    """Raise `ValueError` when ``FLAG openai`` cannot work for want of a key."""
    message = missing_openai_key(flag)
    if message is not None:
        raise ValueError(message)
