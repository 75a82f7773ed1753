"""The ``--config`` file format: a transform's name and options, as ``hyde-plus tune``
writes them and ``query``, ``serve`` and ``eval`` read them.

The file is JSON: ``{"hyde_plus_config": 1, "transform": NAME, "options": {...}}``
plus a free-form ``"tuned_on"`` record of how the options were chosen.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .registry import TRANSFORMS, check_options

CONFIG_FORMAT = 1
"""The ``hyde_plus_config`` version this package writes and reads."""
MAX_CONFIG_BYTES = 1 << 20


def label_for(name: str, options: dict[str, Any]) -> str:
    """``hyde:query_weight=0.8,gate=0.5``: the `eval` spelling of a configuration."""
    if not options:
        return name
    return name + ":" + ",".join(f"{k}={_fmt(v)}" for k, v in options.items())


def _fmt(value: Any) -> str:
    return "none" if value is None else str(value)


@dataclass(frozen=True)
class TransformConfig:
    """A transform name and its options, as `tune` writes them."""

    transform: str
    options: dict[str, Any]
    tuned_on: dict[str, Any] = field(default_factory=dict, compare=False)
    """How the options were chosen, as `tune` records it (free-form; empty when the
    file says nothing): its ``question_set`` is what the set it was tuned on is made
    from (`evaluation.questions.SET_IDENTITY`), so `eval` can tell that set."""

    @property
    def label(self) -> str:
        """The `eval` spelling of the configuration (`label_for`)."""
        return label_for(self.transform, self.options)


def load_config(path: Path | str) -> TransformConfig:
    """Read a config file; a clear `ValueError` naming the file when it is missing,
    not JSON, not a hyde-plus config, or holds options the transform refuses."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise ValueError(f"--config must be a file, not a folder: {p}")
    if not p.is_file():
        raise ValueError(f"config file not found: {p}")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{p} is over 1 MiB: not a hyde-plus config")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{p} is not a JSON config file ({type(exc).__name__})") from exc
    version = data.get("hyde_plus_config") if isinstance(data, dict) else None
    if type(version) is not int or version != CONFIG_FORMAT:
        raise ValueError(f"{p} is not a hyde-plus config (write one with `hyde-plus tune`)")
    name, options = data.get("transform"), data.get("options", {})
    if not isinstance(name, str) or name not in TRANSFORMS:
        raise ValueError(f"{p}: 'transform' must be one of {', '.join(TRANSFORMS)}")
    if not isinstance(options, dict):
        raise ValueError(f"{p}: 'options' must be an object")
    for key, value in options.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{p}: option {key!r} must be finite")
    try:
        check_options(name, options)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{p}: {exc}") from exc
    tuned_on = data.get("tuned_on")
    return TransformConfig(name, dict(options), tuned_on if isinstance(tuned_on, dict) else {})
