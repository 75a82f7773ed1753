"""`MultiQuery`: several paraphrases of the question, searched and fused."""

from __future__ import annotations

from typing import ClassVar

from ._listing import QueryListTransform
from .prompts import MULTI_QUERY_PROMPT


class MultiQuery(QueryListTransform):
    """``n`` differently worded queries for the same need (1 <= n <= 10).

    Each is searched (concurrently, by `TransformRetriever`) along with the original
    question when ``include_query``, and the lists are fused with RRF. Prompt key:
    ``"multi_query_prompt"``; the prompt may use ``{n}`` as well as ``{query}``.
    """

    method: ClassVar[str] = "multi-query"
    DEFAULT_N: ClassVar[int | None] = 3
    default_prompt: ClassVar[str] = MULTI_QUERY_PROMPT
    SHIPPED_ORIGINAL_WEIGHT: ClassVar[dict[str, float]] = {"small": 100.0, "capable": 5.0}
    """By generator; see `QueryListTransform.SHIPPED_ORIGINAL_WEIGHT`."""
