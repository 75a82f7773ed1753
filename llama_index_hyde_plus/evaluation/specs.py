"""What `eval --transforms` and `tune` read: a transform spec (``hyde``, ``hyde-n4+q``,
``NAME:key=value,...``), checked against the transform's options before any work."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .._suggest import did_you_mean
from ..transforms.registry import TRANSFORMS, check_options, entry_for, transform_class

_ALIAS = re.compile(r"^(?P<name>[a-z-]+?)(?:-n(?P<n>\d+))?(?P<q>\+q)?$")


@dataclass(frozen=True)
class TransformSpec:
    """A transform to evaluate: its label in reports, registry name and options."""

    label: str
    name: str
    options: dict[str, Any] = field(default_factory=dict)


def parse_value(text: str) -> Any:
    """An option's value as written on the command line: ``true``/``false`` as
    booleans, numbers as numbers, anything else as the text."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def split_transforms(text: str) -> list[str]:
    """``"none,hyde:query_weight=0.8,gate=0.7,rocchio"`` -> ``["none",
    "hyde:query_weight=0.8,gate=0.7", "rocchio"]``: a comma starts a new transform
    unless what follows is another ``key=value`` of the previous one."""
    out: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if out and ":" in out[-1] and "=" in piece and ":" not in piece:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def parse_transform_spec(spec: str) -> TransformSpec:
    """Parse ``none``, ``hyde``, ``hyde-n4`` (num_passages / n), ``hyde+q``
    (include_query), ``hyde-n4+q``, or ``NAME:key=value,...``."""
    spec = spec.strip()
    if ":" in spec:
        name, _, rest = spec.partition(":")
        parsed: dict[str, Any] = {}
        for item in filter(None, rest.split(",")):
            key, sep, val = item.partition("=")
            if not sep:
                raise ValueError(f"transform option {item!r} in {spec!r} must be key=value")
            parsed[key.strip()] = parse_value(val.strip())
        return _checked(TransformSpec(spec, name.strip(), parsed))
    match = _ALIAS.match(spec.lower())
    if not match:
        raise ValueError(f"cannot read transform {spec!r}")
    name = match["name"]
    options: dict[str, Any] = {}
    if match["n"]:
        count = entry_for(name).count if name in TRANSFORMS else None
        options[count or "n"] = int(match["n"])
    if match["q"]:
        options["include_query"] = True
    return _checked(TransformSpec(spec, name, options))


def _checked(spec: TransformSpec) -> TransformSpec:
    """``spec`` with its name made canonical, once its options are known to build the
    transform (a `ValueError` naming the spec before any work is done)."""
    try:
        name = transform_class(spec.name).method
    except ValueError:
        raise ValueError(
            f"unknown transform {spec.name!r} in {spec.label!r}"
            f"{did_you_mean(spec.name, TRANSFORMS)}; use one of {', '.join(TRANSFORMS)}"
        ) from None
    try:
        check_options(name, dict(spec.options))
    except ValueError as exc:
        raise ValueError(f"{spec.label}: {exc}") from None
    return replace(spec, name=name)


def with_none(specs: Sequence[TransformSpec]) -> list[TransformSpec]:
    """``specs`` with ``none`` first (the stand-in compares within each seed)."""
    rest = [s for s in specs if s.name != "none"]
    head = [s for s in specs if s.name == "none"] or [TransformSpec("none", "none")]
    return head[:1] + rest
