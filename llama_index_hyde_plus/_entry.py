"""The ``hyde-plus`` entry point: refuse what needs no library to refuse (the ``cli``
extra not installed; an explicit ``--llm openai`` or ``--embed openai`` without a key)
before the CLI loads LlamaIndex, which takes several seconds on a small machine."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

from ._extras import install_hint
from ._keys import missing_openai_key

#: The flags that name a model, as ``auto``, ``local`` or ``openai[:MODEL]``.
MODEL_FLAGS = ("--llm", "--embed")


def model_choices(argv: Sequence[str]) -> list[tuple[str, str]]:
    """Each ``(flag, value)`` of `MODEL_FLAGS` in ``argv`` (``--llm X`` or ``--llm=X``)."""
    found = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag not in MODEL_FLAGS:
            continue
        if eq:
            found.append((flag, value))
        elif i + 1 < len(argv):
            found.append((flag, argv[i + 1]))
    return found


def early_error(argv: Sequence[str]) -> str | None:
    """The error the command would give late for a choice of OpenAI without a key, or
    None (also when help or the version is asked for, which need no model)."""
    if any(arg in ("--help", "--version") for arg in argv):
        return None
    for flag, value in model_choices(argv):
        if value.strip().partition(":")[0].lower() == "openai":
            message = missing_openai_key(flag)
            if message is not None:
                return message
    return None


#: What the command itself is written with: the ``cli`` extra.
CLI_MODULES = ("typer", "rich")


def missing_cli() -> str | None:
    """The error for a base install (the library alone), which has no command, or None."""
    missing = [m for m in CLI_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (
        f"the hyde-plus command needs the 'cli' extra ({', '.join(missing)} not installed): "
        f"{install_hint('cli')}"
    )


def main() -> None:
    message = missing_cli() or early_error(sys.argv[1:])
    if message is not None:
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)
    from .cli import main as run

    run()
