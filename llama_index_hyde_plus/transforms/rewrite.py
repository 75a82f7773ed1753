"""`Rewrite`: one cleaned-up query in place of the user's raw one."""

from __future__ import annotations

from typing import ClassVar

from ._listing import QueryListTransform
from .prompts import REWRITE_PROMPT


class Rewrite(QueryListTransform):
    """A single rewritten query (spelling fixed, abbreviations expanded, filler
    dropped) searched instead of the original. Prompt key: ``"rewrite_prompt"``."""

    method: ClassVar[str] = "rewrite"
    default_prompt: ClassVar[str] = REWRITE_PROMPT
    SHIPPED_ORIGINAL_WEIGHT: ClassVar[dict[str, float]] = {"small": 50.0, "capable": 5.0}
    """By generator; see `QueryListTransform.SHIPPED_ORIGINAL_WEIGHT`."""
    parse_excludes_query: ClassVar[bool] = False
