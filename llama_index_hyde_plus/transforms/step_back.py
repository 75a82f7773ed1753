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
    prompt_key: ClassVar[str] = "step_back_prompt"
    default_prompt: ClassVar[str] = STEP_BACK_PROMPT
    SHIPPED_ORIGINAL_WEIGHT: ClassVar[dict[str, float]] = {"small": 50.0, "capable": 20.0}
    """Chosen on SciFact train (BENCHMARKS.md). ``"small"``: with the bundled 135M
    model this default is close to a no-op on purpose (the question's list outweighs
    its queries so far that they only break near-ties): at lower weights its queries
    cost 1 to 11 nDCG@10 points. ``"capable"``: with the strong-generator stand-in
    (its query a relevant document's title) weight 20 gains +1.1 when the model is
    right and costs 0.9 when half its queries are plausible but wrong; lower weights
    gain more and cost more (BENCHMARKS.md). Weigh it with ``hyde-plus tune``."""
