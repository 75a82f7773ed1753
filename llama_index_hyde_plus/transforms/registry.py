"""Transforms by name, as the CLI, the RCP server and the evaluation runner call them."""

from __future__ import annotations

from typing import Any

from llama_index.core.llms import LLM

from .base import QueryTransformer, TransformResult
from .decompose import Decompose
from .feedback import Rocchio
from .hyde import HyDE
from .multi_query import MultiQuery
from .rewrite import Rewrite
from .step_back import StepBack

METHODS: tuple[str, ...] = ("hyde", "multi-query", "step-back", "decompose", "rewrite")
"""Names of the built-in LLM transforms (the RCP ``transform.methods``)."""

TRANSFORMS: tuple[str, ...] = ("none", *METHODS, "rocchio")
"""Every transform `make_transform` builds: the baseline, the LLM transforms and the
LLM-free Rocchio feedback."""


class Identity(QueryTransformer):
    """No transform: search with the question as asked (the baseline, "none")."""

    method = "none"

    def transform(self, query: str) -> TransformResult:
        return TransformResult(query=query, method="none", queries=(query,), include_query=True)

    async def atransform(self, query: str) -> TransformResult:
        return self.transform(query)


_CLASSES: dict[str, type[QueryTransformer]] = {
    "none": Identity,
    "hyde": HyDE,
    "multi-query": MultiQuery,
    "step-back": StepBack,
    "decompose": Decompose,
    "rewrite": Rewrite,
    "rocchio": Rocchio,
}


def transform_class(name: str) -> type[QueryTransformer]:
    """The class behind the transform called ``name``."""
    key = name.strip().lower().replace("_", "-")
    key = {"multiquery": "multi-query", "stepback": "step-back"}.get(key, key)
    if key not in _CLASSES:
        raise ValueError(f"unknown transform {name!r}; choose one of: {', '.join(TRANSFORMS)}")
    return _CLASSES[key]


RUNTIME_OPTIONS = frozenset({"llm", "cache", "callback_manager", "prices", "retry", "breaker"})
"""Options that are objects of the running program, never read from a config file."""


def check_options(name: str, options: dict[str, Any]) -> None:
    """A `ValueError` naming the problem when ``options`` cannot build the transform
    ``name`` (an unknown option, a value of the wrong type or range); nothing when they
    can. Used on config files and tune grids before any work is done."""
    for key in options:
        if key in RUNTIME_OPTIONS:
            raise ValueError(f"option {key!r} of {name} cannot come from a config or grid")
    try:
        make_transform(name, None, **dict(options))
    except TypeError as exc:
        text = (
            str(exc)
            .replace("__init__()", "")
            .replace("got an unexpected keyword argument", "has no option")
        )
        raise ValueError(f"{name}: {text.strip()}") from exc


def make_transform(name: str, llm: LLM | None = None, **options: Any) -> QueryTransformer:
    """Build the transform called ``name`` ("none" or one of `METHODS`).

    ``options`` are the transform's own keyword arguments; ``n`` is ignored by
    transforms that produce a single query, so callers can pass it uniformly.
    """
    key = name.strip().lower().replace("_", "-")
    if key == "none":
        return Identity()
    if key == "rocchio":
        options.pop("n", None)
        return Rocchio(**options)
    if key in ("hyde",):
        options.pop("n", None)
        return HyDE(llm, **options)
    if key in ("multi-query", "multiquery"):
        return MultiQuery(llm, **options)
    if key in ("decompose",):
        return Decompose(llm, **options)
    if key in ("step-back", "stepback"):
        options.pop("n", None)
        return StepBack(llm, **options)
    if key in ("rewrite",):
        options.pop("n", None)
        return Rewrite(llm, **options)
    raise ValueError(f"unknown transform {name!r}; choose one of: {', '.join(TRANSFORMS)}")
