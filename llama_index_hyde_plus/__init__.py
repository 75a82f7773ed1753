"""Query transformation for LlamaIndex: HyDE, multi-query, step-back, decompose and
rewrite, with rank fusion, safe fallbacks and honest cost accounting.

The public names are imported on first use (PEP 562), so ``hyde-plus`` can check its
arguments before LlamaIndex loads (several seconds on a small machine)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from .caching.cache import MemoryCache, SQLiteCache
    from .chunking import splitter_for
    from .pipeline import HyDERAG, HyDERAGResult, aquery_for_evaluation, query_for_evaluation
    from .provenance import transform_of
    from .search.fusion import FusionMode, fuse
    from .search.retriever import SearchResult, TransformRetriever
    from .stores.faiss import load_index
    from .transforms import (
        Condense,
        Decompose,
        HyDE,
        MultiQuery,
        QueryTransformer,
        Rewrite,
        Rocchio,
        StepBack,
        TransformResult,
        chat_history,
    )
    from .usage import ModelPrice, Usage

#: Each public name and the module that defines it.
_HOMES = {
    "MemoryCache": ".caching.cache",
    "splitter_for": ".chunking",
    "SQLiteCache": ".caching.cache",
    "FusionMode": ".search.fusion",
    "fuse": ".search.fusion",
    "load_index": ".stores.faiss",
    "HyDERAG": ".pipeline",
    "HyDERAGResult": ".pipeline",
    "aquery_for_evaluation": ".pipeline",
    "query_for_evaluation": ".pipeline",
    "transform_of": ".provenance",
    "SearchResult": ".search.retriever",
    "TransformRetriever": ".search.retriever",
    "Condense": ".transforms",
    "chat_history": ".transforms",
    "Decompose": ".transforms",
    "HyDE": ".transforms",
    "MultiQuery": ".transforms",
    "QueryTransformer": ".transforms",
    "Rewrite": ".transforms",
    "Rocchio": ".transforms",
    "StepBack": ".transforms",
    "TransformResult": ".transforms",
    "ModelPrice": ".usage",
    "Usage": ".usage",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))


__all__ = [
    "Condense",
    "Decompose",
    "FusionMode",
    "HyDE",
    "HyDERAG",
    "HyDERAGResult",
    "MemoryCache",
    "ModelPrice",
    "MultiQuery",
    "QueryTransformer",
    "Rewrite",
    "Rocchio",
    "SQLiteCache",
    "SearchResult",
    "StepBack",
    "TransformResult",
    "TransformRetriever",
    "Usage",
    "__version__",
    "aquery_for_evaluation",
    "chat_history",
    "fuse",
    "load_index",
    "query_for_evaluation",
    "splitter_for",
    "transform_of",
]
