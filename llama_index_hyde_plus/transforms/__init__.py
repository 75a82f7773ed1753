"""The transforms. Import them from the package root."""

from .base import ChainTransform, QueryTransformer, SearchSpec, TransformResult
from .condense import Condense, chat_history
from .decompose import Decompose
from .feedback import Rocchio
from .hyde import HyDE
from .multi_query import MultiQuery
from .rewrite import Rewrite
from .step_back import StepBack

__all__ = [
    "ChainTransform",
    "Condense",
    "Decompose",
    "HyDE",
    "MultiQuery",
    "QueryTransformer",
    "Rewrite",
    "Rocchio",
    "SearchSpec",
    "StepBack",
    "TransformResult",
    "chat_history",
]
