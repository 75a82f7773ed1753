"""Query transformation for LlamaIndex: HyDE, multi-query, step-back, decompose and
rewrite, with rank fusion, safe fallbacks and honest cost accounting."""

from ._version import __version__
from .cache import MemoryCache, SQLiteCache
from .fusion import FusionMode, fuse
from .indexing import load_index
from .pipeline import HyDERAG, HyDERAGResult, aquery_for_evaluation, query_for_evaluation
from .provenance import transform_of
from .retriever import SearchResult, TransformRetriever
from .transforms import (
    Decompose,
    Guards,
    HyDE,
    MultiQuery,
    QueryTransformer,
    Rewrite,
    Rocchio,
    StepBack,
    TransformResult,
)
from .usage import ModelPrice, Usage

__all__ = [
    "Decompose",
    "FusionMode",
    "Guards",
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
    "fuse",
    "load_index",
    "query_for_evaluation",
    "transform_of",
]
