"""`Rewrite`: one cleaned-up query in place of the user's raw one."""

from __future__ import annotations

from typing import ClassVar

from ._listing import QueryListTransform
from .prompts import REWRITE_PROMPT


class Rewrite(QueryListTransform):
    """A single rewritten query (spelling fixed, abbreviations expanded, filler
    dropped) searched instead of the original. Prompt key: ``"rewrite_prompt"``."""

    method: ClassVar[str] = "rewrite"
    prompt_key: ClassVar[str] = "rewrite_prompt"
    default_prompt: ClassVar[str] = REWRITE_PROMPT
    SHIPPED_ORIGINAL_WEIGHT: ClassVar[dict[str, float]] = {"small": 50.0, "capable": 20.0}
    """Chosen on SciFact train (BENCHMARKS.md). ``"small"``: with the bundled 135M
    model this default is close to a no-op on purpose (the question's list outweighs
    its queries so far that they only break near-ties): at lower weights its queries
    cost 1 to 11 nDCG@10 points. ``"capable"``: with the strong-generator stand-in
    (its query a relevant document's title) weight 20 gains +1.1 when the model is
    right and costs 0.9 when half its queries are plausible but wrong; lower weights
    gain more and cost more (BENCHMARKS.md). Weigh it with ``hyde-plus tune``."""
    parse_excludes_query: ClassVar[bool] = False
