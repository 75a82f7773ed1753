"""`Decompose`: split a complex question into sub-questions searched separately."""

from __future__ import annotations

from typing import ClassVar

from ..search.fusion import FusionMode
from ._listing import QueryListTransform
from .prompts import DECOMPOSE_PROMPT


class Decompose(QueryListTransform):
    """Up to ``n`` sub-questions (1 <= n <= 10), each searched on its own.

    Fused by interleaving by default, so every sub-question is represented near the
    top. ``include_query`` (default True) also searches the whole question, fused with
    weight ``original_weight`` (then by weighted RRF, since interleaving cannot weigh
    lists). Prompt
    key: ``"decompose_prompt"``; the prompt may use ``{n}`` as well as ``{query}``.
    """

    method: ClassVar[str] = "decompose"
    DEFAULT_N: ClassVar[int | None] = 3
    default_prompt: ClassVar[str] = DECOMPOSE_PROMPT
    SHIPPED_ORIGINAL_WEIGHT: ClassVar[dict[str, float]] = {"small": 100.0, "capable": 3.0}
    """By generator; see `QueryListTransform.SHIPPED_ORIGINAL_WEIGHT`."""
    default_fusion: ClassVar[FusionMode] = FusionMode.INTERLEAVE
    parse_excludes_query: ClassVar[bool] = False
