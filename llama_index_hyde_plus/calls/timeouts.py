"""The one table of timeouts: how long a call to each kind of dependency may take.

- `REMOTE_TIMEOUT_S` and `timeout_for`: one LLM call of a transform when nobody said
  (no ``timeout=`` option, no ``--timeout`` flag);
- `MODEL_TIMEOUT_S`: the models a search calls after the LLM (embedder, store,
  reranker: `TransformRetriever`'s ``model_timeout``);
- `CACHE_TIMEOUT_S`: one read or write of a transform cache outside the process;
- `DOWN_RETRY_S`: how long a dependency that failed or overran is skipped before one
  call probes it (`outage.Outage`).

The rule follows the model's kind, never the caller (library, ``query``, ``serve``,
``eval``, ``tune`` and `HyDERAG` all get it from `LLMTransform`):

- a model on this machine (``is_local``) gets a budget from the tokens it may write:
  ``LOCAL_START_S + max_tokens * slots / tokens_per_s``, where ``slots`` is how many
  calls it decodes together (``n_parallel``: each gets a share of the throughput) and
  ``tokens_per_s`` is the model's own ``tokens_per_s`` when it reports one, else
  `LOCAL_TOKENS_PER_S`, a nominal rate for the bundled model on a busy 2-core machine
  (a twentieth of its idle speed);
- a remote model gets `REMOTE_TIMEOUT_S`.
"""

from __future__ import annotations

import math
from typing import Any

from .._attrs import optional_attr
from .._checks import is_number

LOCAL_START_S = 10.0
"""Seconds a local call may spend before its first token (reading the prompt; its
wait for a free slot comes before its clock starts, bounded by `LocalLLM.slot_wait`)."""
LOCAL_TOKENS_PER_S = 8.0
"""Nominal tokens per second of a local model when it reports no rate of its own: the
bundled model writes about 150 on an idle 2-core machine, and well under a tenth of
that on one shared by several busy jobs (the budget must hold there)."""
LOCAL_MAX_TOKENS = 256
"""Tokens a local reply may take when neither the model nor the transform caps it."""
REMOTE_TIMEOUT_S = 30.0
"""Seconds for one call to a remote (API) model."""
MODEL_TIMEOUT_S = 30.0
"""Seconds the models after the LLM may take, together, in one search."""
CACHE_TIMEOUT_S = 2.0
"""Seconds one read or write of a transform cache outside the process (SQLite, Redis,
any KV store) may take: past it a read is a miss and a write is dropped."""
DOWN_RETRY_S = 5.0
"""Seconds a dependency that failed or overran is skipped before one call probes it."""

POLICY = (
    f"by the model: local {LOCAL_START_S:g} s + max_tokens x slots / "
    f"{LOCAL_TOKENS_PER_S:g} tokens/s, remote {REMOTE_TIMEOUT_S:g} s"
)
"""The rule in words, for ``--help``."""


def is_local(llm: Any) -> bool:
    """True for LLMs that run on this machine and cost nothing per token."""
    return bool(optional_attr(llm, "is_local", False))


def _positive(value: Any) -> float | None:
    if not is_number(value):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def timeout_for(llm: Any, max_tokens: int | None = None) -> float:
    """Seconds one call to ``llm`` may take under the policy (module docstring);
    ``max_tokens`` is the transform's own cap on a reply, if it has one."""
    if not is_local(llm):
        return REMOTE_TIMEOUT_S
    caps = [c for c in (_positive(getattr(llm, "max_tokens", None)), _positive(max_tokens)) if c]
    tokens = min(caps) if caps else LOCAL_MAX_TOKENS
    slots = _positive(getattr(llm, "n_parallel", None)) or 1.0
    rate = _positive(getattr(llm, "tokens_per_s", None)) or LOCAL_TOKENS_PER_S
    return round(LOCAL_START_S + tokens * slots / rate, 1)


def describe_timeout(llm: Any, given: float | None = None) -> str:
    """``"138 s per LLM call (local model policy)"``: what a banner shows."""
    if given is not None:
        return f"{given:g} s per LLM call (--timeout)"
    kind = "local" if is_local(llm) else "remote"
    return f"{timeout_for(llm):g} s per LLM call ({kind} model policy)"


def with_slot_wait(llm: Any, timeout: float | None) -> float | None:
    """``timeout`` plus the wait for a slot of a model that hands them out
    (`LocalLLM.slot_wait_s`): how long a call's caller may wait for it, since the call's
    own clock starts once it has a slot. None stays None (no bound)."""
    try:
        extra = optional_attr(llm, "slot_wait_s")
    except Exception:  # an LLM that cannot be resolved hands out no slots
        extra = None
    return timeout + extra if timeout is not None and is_number(extra) else timeout
