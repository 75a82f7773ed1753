"""`build`: the one place a transform is made from a name, options and a config file,
for the CLI (``query``, ``transform``, ``eval``, ``tune``) and the RCP server.

Options are layered: the config file's (``hyde-plus tune``), then the caller's (flags
given on the command line win). The LLM is passed only to a transform that calls one,
with the cache when one is given. No caller sets a timeout of its own: an absent
``timeout`` option means the one policy of `timeouts.timeout_for`, applied by the
transform for its model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llama_index.core.llms import LLM

from ..caching.cache import TransformCache
from .base import QueryTransformer
from .config import TransformConfig
from .registry import entry_for, make_transform, transform_class


def resolve_name(name: str | None, config: TransformConfig | None, default: str = "hyde") -> str:
    """The transform to build: ``name``, else the config's, else ``default``; a
    `ValueError` when ``name`` and the config disagree."""
    if config is None:
        return transform_class(name).method if name else default
    if name is not None and transform_class(name).method != config.transform:
        raise ValueError(
            f"the config is a {config.transform} config; drop the transform {name!r} "
            "or use a config of that transform"
        )
    return config.transform


def build(
    name: str | None,
    llm: LLM | None = None,
    options: Mapping[str, Any] | None = None,
    *,
    config: TransformConfig | None = None,
    cache: TransformCache | None = None,
    task: str | None = None,
) -> QueryTransformer:
    """The transform ``name`` (or the config's) with the config's options overlaid by
    ``options``; ``llm`` and ``cache`` go to a transform that calls an LLM, and
    ``task`` (a dataset name such as ``scifact``, or a template) picks the class's own
    prompt for that task when no prompt was given (`registry.Entry.prompt_for_task`)."""
    method = resolve_name(name, config)
    entry = entry_for(method)
    merged = {**(config.options if config else {}), **(options or {})}
    if not entry.uses_llm:
        return make_transform(method, None, **merged)
    if task and "prompt" not in merged:
        prompt = entry.prompt_for_task(task)
        if prompt is not None:
            merged["prompt"] = prompt
    if cache is not None:
        merged["cache"] = cache
    return make_transform(method, llm, **merged)
