"""Transforms by name, as the CLI, the RCP server and the evaluation runner call them."""

from __future__ import annotations

from typing import Any

from llama_index.core.llms import LLM

from .._suggest import did_you_mean
from .base import QueryTransformer, TransformResult
from .condense import Condense
from .decompose import Decompose
from .feedback import Rocchio
from .hyde import HyDE
from .multi_query import MultiQuery
from .rewrite import Rewrite
from .step_back import StepBack


class Identity(QueryTransformer):
    """No transform: search with the question as asked (the baseline, "none")."""

    method = "none"

    def transform(self, query: str) -> TransformResult:
        """The question as asked: plain search (``none``), the baseline of `eval`."""
        return TransformResult(query=query, method="none", queries=(query,), include_query=True)

    async def atransform(self, query: str) -> TransformResult:
        """`transform`: no I/O, so it runs on the event loop."""
        return self.transform(query)


BUILTINS: tuple[type[QueryTransformer], ...] = (
    Identity,
    HyDE,
    MultiQuery,
    StepBack,
    Decompose,
    Rewrite,
    Rocchio,
    Condense,
)
"""Every transform `make_transform` builds, by its ``method`` name. A new transform is
a module with its class plus one line here (CONTRIBUTING.md)."""

_CLASSES: dict[str, type[QueryTransformer]] = {cls.method: cls for cls in BUILTINS}

TRANSFORMS: tuple[str, ...] = tuple(_CLASSES)
"""Every transform name: the baseline ``none``, the LLM transforms and the LLM-free
Rocchio feedback."""

METHODS: tuple[str, ...] = tuple(cls.method for cls in BUILTINS if cls.uses_llm)
"""Names of the built-in LLM transforms (the RCP ``transform.methods``)."""


def transform_class(name: str) -> type[QueryTransformer]:
    """The class behind the transform called ``name`` (case, ``_`` for ``-`` and the
    spellings ``multiquery``/``stepback`` are forgiven)."""
    key = name.strip().lower().replace("_", "-")
    key = {"multiquery": "multi-query", "stepback": "step-back"}.get(key, key)
    if key not in _CLASSES:
        raise ValueError(
            f"unknown transform {name!r}{did_you_mean(name, TRANSFORMS)}; "
            f"choose one of: {', '.join(TRANSFORMS)}"
        )
    return _CLASSES[key]


def uses_llm(name: str) -> bool:
    """Whether the transform called ``name`` calls an LLM."""
    return transform_class(name).uses_llm


RUNTIME_OPTIONS = frozenset({"llm", "cache", "callback_manager", "prices", "retry", "breaker"})
"""Options that are objects of the running program, never read from a config file."""


def check_options(name: str, options: dict[str, Any]) -> None:
    """A `ValueError` naming the problem when ``options`` cannot build the transform
    ``name`` (an unknown option, a value of the wrong type or range); nothing when they
    can. Used on config files and tune grids before any work is done."""
    cls = transform_class(name)
    takes = cls.option_names()
    for key in options:
        if key in RUNTIME_OPTIONS:
            raise ValueError(f"option {key!r} of {name} cannot come from a config or grid")
        if key not in takes:
            raise ValueError(
                f"{name} has no option {key!r}; its options: {', '.join(takes) or 'none'}"
            )
    try:  # every name is known: what is left is a value of the wrong type
        cls(**_for_class(cls, None, options))
    except TypeError as exc:
        raise ValueError(f"{name}: {exc}") from exc


def _for_class(
    cls: type[QueryTransformer], llm: LLM | None, options: dict[str, Any]
) -> dict[str, Any]:
    """The keyword arguments of ``cls``: ``llm`` when it calls one; ``n`` only when
    it is the class's count option, so callers can pass ``n`` uniformly."""
    kwargs = dict(options)
    if cls.count_option() != "n":
        kwargs.pop("n", None)
    if cls.uses_llm:
        kwargs["llm"] = llm
    return kwargs


def make_transform(name: str, llm: LLM | None = None, **options: Any) -> QueryTransformer:
    """Build the transform called ``name`` (one of `TRANSFORMS`).

    ``options`` are the transform's own keyword arguments; ``n`` is ignored by
    transforms that take no ``n``, so callers can pass it uniformly; ``llm`` is ignored
    by transforms that call no LLM.
    """
    cls = transform_class(name)
    return cls(**_for_class(cls, llm, options))
