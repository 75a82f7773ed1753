"""Transforms by name, as the CLI, the RCP server and the evaluation runner call them.

Each transform is one `Entry`, one line of `BUILTINS`: its class, and what those
callers read beside the class (the option a uniform count sets, what ``hyde-plus
tune`` sweeps and how simple each configuration is, prompts by task). The classes
themselves carry only what a search needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from llama_index.core.llms import LLM

from .._suggest import did_you_mean
from .base import QueryTransformer, TransformResult
from .condense import Condense
from .decompose import Decompose
from .feedback import Rocchio
from .hyde import HyDE
from .multi_query import MultiQuery
from .options import constructor_options
from .prompts import HYDE_PAPER_PROMPTS
from .rewrite import Rewrite
from .step_back import StepBack


class Identity(QueryTransformer):
    """No transform: search with the question as asked (the baseline, "none")."""

    method = "none"

    def transform(self, query: str) -> TransformResult:
        """The question as asked: plain search (``none``), the baseline of `eval`."""
        return TransformResult(query=query, method="none", queries=(), include_query=True)

    async def atransform(self, query: str) -> TransformResult:
        """`transform`: no I/O, so it runs on the event loop."""
        return self.transform(query)


Grid = tuple[Mapping[str, Any], ...]
"""Configurations of a transform's keyword options, simplest first."""


def frozen_grid(*configs: Mapping[str, Any]) -> Grid:
    """``configs`` as a `Grid` no caller can change (each a read-only mapping)."""
    return tuple(MappingProxyType(dict(c)) for c in configs)


DEFAULTS_ONLY = frozen_grid({})
"""The sweep of a transform without search options: its defaults."""


def no_machinery(options: Mapping[str, Any]) -> int:
    """The `Entry.complexity` of a transform whose options all cost the same: 0."""
    return 0


@dataclass(frozen=True)
class Entry:
    """One transform as the CLI, the RCP server and ``hyde-plus tune`` know it: the
    class, and what they read beside it. Its name is the class's ``method``."""

    cls: type[QueryTransformer]
    count: str | None = None
    """The option a uniform count sets (``transform -n``, ``eval hyde-3``, RCP ``n``):
    ``"n"``, HyDE's ``"num_passages"``, or None for a transform that takes no count."""
    grid: Grid = DEFAULTS_ONLY
    """The configurations ``hyde-plus tune`` sweeps, simplest first: options that
    change how the output is searched, not what the LLM writes, so a sweep makes one
    generation per query. One by default: the class's defaults."""
    complexity: Callable[[Mapping[str, Any]], int] = no_machinery
    """How much machinery a configuration switches on (lower is simpler): ``tune``
    picks the simplest configuration within its tolerance of the best."""
    task_prompts: Mapping[str, str] | None = None
    """Prompts by task (a dataset name such as ``scifact``) that `prompt_for_task`
    picks from; None: the transform has no prompt per task."""

    @property
    def method(self) -> str:
        """The transform's name (its class's ``method``)."""
        return self.cls.method

    @property
    def uses_llm(self) -> bool:
        """Whether the transform calls an LLM (the CLI and the runner load one only then)."""
        return self.cls.uses_llm

    def option_names(self) -> tuple[str, ...]:
        """The keyword options of the constructor (the LLM excluded), the count first,
        as a config file, a tune grid, a CLI or the RCP server may set them."""
        names = [name for name in constructor_options(self.cls) if name != "n"]
        if self.count == "n":
            names.insert(0, "n")
        return tuple(names)

    def prompt_for_task(self, task: str) -> str | None:
        """The prompt for ``task``: the one `task_prompts` holds for that name, else
        ``task`` itself as a template; None for a transform without `task_prompts`."""
        if self.task_prompts is None:
            return None
        return self.task_prompts.get(task, task)


FANOUT_WEIGHTS = (1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0)
FANOUT_GRID = frozen_grid(
    {"include_query": False},
    *({"include_query": True, "original_weight": w} for w in FANOUT_WEIGHTS),
)
"""A fan-out's sweep (`QueryListTransform`): the question's list at increasing fusion
weight (a generated query counts 1), and without the question at all, for the record."""

HYDE_QUERY_WEIGHTS = (0.5, 0.6, 0.7, 0.8, 0.9)
HYDE_BLENDS = (0.1, 0.2, 0.3, 0.5)
HYDE_GATES = (0.5, 0.6, 0.7)


def _hyde_grid() -> Grid:
    configs: list[dict[str, Any]] = [{"include_query": False}, {"include_query": True}]
    for grounded in (0, 3):
        for gate in (None, *HYDE_GATES):
            base: dict[str, Any] = {}
            if grounded:
                base["grounded"] = grounded
            if gate is not None:
                base["gate"] = gate
            configs.extend({**base, "query_weight": w} for w in HYDE_QUERY_WEIGHTS)
            configs.extend({**base, "strategy": "rerank", "blend": b} for b in HYDE_BLENDS)
    return frozen_grid(*configs)


HYDE_GRID = _hyde_grid()
"""HyDE's sweep: query weight (replace) or blend (rerank), each without and with a
gate, free and grounded; passages only (no question) and the paper's plain mean of
question and passages first, for the record."""


def hyde_complexity(options: Mapping[str, Any]) -> int:
    """Grounding costs a search and a longer prompt (4), a gate extra embeddings (2,
    the relative gate 2 more: the question's top hit), a rerank the documents'
    vectors (1)."""
    level = 0
    if options.get("grounded"):
        level += 4
    if options.get("gate") is not None:
        level += 2
    if options.get("gate_relative") is not None:
        level += 2
    if options.get("strategy") == "rerank":
        level += 1
    return level


ROCCHIO_GRID = frozen_grid(
    *({"k": k, "beta": b} for k in (3, 5, 10) for b in (0.1, 0.2, 0.3, 0.5, 0.8))
)
"""Rocchio's sweep, 15 configurations: ``k`` in 3, 5, 10 by ``beta`` from 0.1 to 0.8."""

BUILTINS: tuple[Entry, ...] = (
    Entry(Identity),
    Entry(
        HyDE,
        count="num_passages",
        grid=HYDE_GRID,
        complexity=hyde_complexity,
        task_prompts=HYDE_PAPER_PROMPTS,
    ),
    Entry(MultiQuery, count="n", grid=FANOUT_GRID),
    Entry(StepBack, grid=FANOUT_GRID),
    Entry(Decompose, count="n", grid=FANOUT_GRID),
    Entry(Rewrite, grid=FANOUT_GRID),
    Entry(Rocchio, grid=ROCCHIO_GRID),
    Entry(Condense, grid=FANOUT_GRID),
)
"""Every transform `make_transform` builds, by its ``method`` name. A new transform is
a module with its class plus one entry here (CONTRIBUTING.md)."""

_ENTRIES: dict[str, Entry] = {entry.method: entry for entry in BUILTINS}

TRANSFORMS: tuple[str, ...] = tuple(_ENTRIES)
"""Every transform name: the baseline ``none``, the LLM transforms and the LLM-free
Rocchio feedback."""

METHODS: tuple[str, ...] = tuple(entry.method for entry in BUILTINS if entry.uses_llm)
"""Names of the built-in LLM transforms (the RCP ``transform.methods``)."""


def entry_for(name: str) -> Entry:
    """The registry entry of the transform called ``name`` (case, ``_`` for ``-`` and
    the spellings ``multiquery``/``stepback`` are forgiven); a `ValueError` listing
    the names for any other."""
    key = name.strip().lower().replace("_", "-")
    key = {"multiquery": "multi-query", "stepback": "step-back"}.get(key, key)
    if key not in _ENTRIES:
        raise ValueError(
            f"unknown transform {name!r}{did_you_mean(name, TRANSFORMS)}; "
            f"choose one of: {', '.join(TRANSFORMS)}"
        )
    return _ENTRIES[key]


def transform_class(name: str) -> type[QueryTransformer]:
    """The class behind the transform called ``name`` (spellings as `entry_for`)."""
    return entry_for(name).cls


def uses_llm(name: str) -> bool:
    """Whether the transform called ``name`` calls an LLM."""
    return entry_for(name).uses_llm


RUNTIME_OPTIONS = frozenset({"llm", "cache", "callback_manager", "prices", "retry", "breaker"})
"""Options that are objects of the running program, never read from a config file."""


def check_options(name: str, options: dict[str, Any]) -> None:
    """A `ValueError` naming the problem when ``options`` cannot build the transform
    ``name`` (an unknown option, a value of the wrong type or range); nothing when they
    can. Used on config files and tune grids before any work is done."""
    entry = entry_for(name)
    takes = entry.option_names()
    for key in options:
        if key in RUNTIME_OPTIONS:
            raise ValueError(f"option {key!r} of {name} cannot come from a config or grid")
        if key not in takes:
            raise ValueError(
                f"{name} has no option {key!r}; its options: {', '.join(takes) or 'none'}"
            )
    try:  # every name is known: what is left is a value of the wrong type
        entry.cls(**_for_entry(entry, None, options))
    except TypeError as exc:
        raise ValueError(f"{name}: {exc}") from exc


def _for_entry(entry: Entry, llm: LLM | None, options: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``entry``'s class: ``llm`` when it calls one; ``n``
    only when it is the entry's count option, so callers can pass ``n`` uniformly."""
    kwargs = dict(options)
    if entry.count != "n":
        kwargs.pop("n", None)
    if entry.uses_llm:
        kwargs["llm"] = llm
    return kwargs


def make_transform(name: str, llm: LLM | None = None, **options: Any) -> QueryTransformer:
    """Build the transform called ``name`` (one of `TRANSFORMS`).

    ``options`` are the transform's own keyword arguments; ``n`` is ignored by
    transforms that take no ``n``, so callers can pass it uniformly; ``llm`` is ignored
    by transforms that call no LLM.
    """
    entry = entry_for(name)
    return entry.cls(**_for_entry(entry, llm, options))
