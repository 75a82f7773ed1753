"""`StepBack`: search for the general principle behind a specific question."""

from __future__ import annotations

from typing import ClassVar

from ._listing import QueryListTransform
from .prompts import STEP_BACK_PROMPT


class StepBack(QueryListTransform):
    """One more general "step-back" question (Zheng et al., 2023), searched with the
    original question when ``include_query`` (default True), fused with RRF.
    Prompt key: ``"step_back_prompt"``."""

    method: ClassVar[str] = "step-back"
    default_prompt: ClassVar[str] = STEP_BACK_PROMPT
    SHIPPED_ORIGINAL_WEIGHT: ClassVar[dict[str, float]] = {"small": 50.0, "capable": 5.0}
    """By generator; see `QueryListTransform.SHIPPED_ORIGINAL_WEIGHT`."""
