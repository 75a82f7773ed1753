"""The search plan: what `TransformRetriever` does with a transform's output, as data.

One pure function, `plan`, turns ``(result, guards, hits)`` into the step to carry
out (rerank the question's hits, keep them, Rocchio feedback, or a fan-out of searches
with their fusion weights); `question_first`, `wants_gate` and `gate_verdict` decide
what happens before it. Nothing here embeds, searches or names a transform: the sync
and async search paths both execute these decisions and differ only in their I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..transforms.base import Guards, SearchSpec, TransformResult

__all__ = [
    "Fanout",
    "Feedback",
    "KeepHits",
    "Plan",
    "Rerank",
    "Step",
    "UnusableVector",
    "check_vectors",
    "context_for",
    "degraded",
    "gate_verdict",
    "is_question",
    "overlaps",
    "plan",
    "question_alone",
    "question_first",
    "wants_gate",
]


@dataclass(frozen=True)
class Rerank:
    """Reorder the question's own hits by ``(1 - blend) * score + blend * similarity``
    to the mean of ``passages``."""

    passages: tuple[str, ...]
    blend: float


@dataclass(frozen=True)
class KeepHits:
    """The question's own hits, as found (an expansion that cannot be used)."""


@dataclass(frozen=True)
class Feedback:
    """Search with ``alpha * e(question) + beta * mean(vectors of the top k hits)``."""

    k: int
    alpha: float
    beta: float


@dataclass(frozen=True)
class Fanout:
    """One search per spec, fused with the specs' weights; ``reuse[i]`` says spec ``i``
    is the plain question, whose hits were already fetched."""

    specs: tuple[SearchSpec, ...]
    reuse: tuple[bool, ...]

    def todo(self) -> list[int]:
        """Indexes of the specs that still need a search."""
        return [i for i, done in enumerate(self.reuse) if not done]


Step = Rerank | KeepHits | Feedback | Fanout


@dataclass(frozen=True)
class Plan:
    """The step to carry out, and which guard had to be dropped for want of an
    embedding model (None when none was)."""

    step: Step
    missing_embedder: str | None = None


def question_first(guards: Guards) -> bool:
    """Whether the question is searched before the transform runs: a grounded
    transform is shown its top hits."""
    return guards.context_k > 0


def overlaps(guards: Guards, searches_question: bool) -> bool:
    """Whether the question is searched while the transform runs (the plan will use its
    hits: rerank candidates, Rocchio's feedback, a fan-out's own list of the question),
    so that the search costs no time of its own after the LLM has answered."""
    if question_first(guards):
        return False
    return guards.needs_question_hits or searches_question


def context_for(guards: Guards, hits: Sequence[Any] | None) -> list[str] | None:
    """The question's top passages a grounded transform is shown (None: not grounded)."""
    if not guards.context_k or not hits:
        return None
    return [item.node.get_content() for item in hits[: guards.context_k]]


def _expanded(result: TransformResult) -> bool:
    return bool(result.hypothetical) and not result.fallback and not result.skipped


def wants_gate(result: TransformResult, guards: Guards) -> bool:
    """Whether the gate must compare the generated text with the question."""
    gated = guards.gate is not None or guards.gate_relative is not None
    return gated and _expanded(result)


def gate_verdict(
    result: TransformResult, guards: Guards, similarity: float, top: float | None = None
) -> TransformResult:
    """``result``, or ``result`` marked skipped when the generated text's cosine
    ``similarity`` to the question is below the gate, or more than ``gate_relative``
    below ``top``, the question's cosine to its own top hit (None: no hit, so the
    relative gate has nothing to compare with); degraded when a cosine is not a number."""
    if not math.isfinite(similarity) or (top is not None and not math.isfinite(top)):
        return degraded(result, "the gate's similarity is not a number (a non-finite vector)")
    if guards.gate is not None and similarity < guards.gate:
        reason = (
            f"generated text disagrees with the question (cosine {similarity:.3f} < gate "
            f"{guards.gate:g}); searched with the question alone"
        )
        return replace(result, skipped=reason)
    relative = guards.gate_relative
    if relative is not None and top is not None and similarity < top - relative:
        reason = (
            f"generated text is further from the question than its own top hit "
            f"(cosine {similarity:.3f} < top hit {top:.3f} - gate_relative "
            f"{relative:g}); searched with the question alone"
        )
        return replace(result, skipped=reason)
    return result


def degraded(result: TransformResult, reason: str) -> TransformResult:
    """``result`` as a fallback to the question's own search, saying why."""
    return replace(result, fallback=True, error=f"{reason}; searched with the question alone")


class UnusableVector(ValueError):
    """A vector cannot be searched with: empty, of another size than the question's,
    holding NaN or infinity, or all zeros (no direction: every cosine with it is NaN
    or 0); the message says which."""


def check_vectors(vectors: Sequence[Sequence[float]], what: str, dim: int | None = None) -> None:
    """Raise `UnusableVector` when one of ``vectors`` is empty, has another length than
    ``dim`` (default: the first vector's), holds NaN or infinity, or is all zeros;
    ``what`` names them."""
    for vector in vectors:
        if len(vector) == 0:
            raise UnusableVector(f"a {what} vector is empty")
        dim = len(vector) if dim is None else dim
        if len(vector) != dim:
            raise UnusableVector(f"a {what} vector has {len(vector)} dimensions, not {dim}")
        if not all(math.isfinite(x) for x in vector):
            raise UnusableVector(f"a {what} vector holds NaN or infinity")
        if not any(vector):
            raise UnusableVector(f"a {what} vector is all zeros")


def is_question(spec: SearchSpec, query: str) -> bool:
    """Whether ``spec`` is the plain question ``query`` searched as itself: no passages
    mixed in and nothing else embedded for it (a core transform's
    ``custom_embedding_strs`` or ``embedding`` make a different search of the same text)."""
    return (
        not spec.passages
        and spec.embedding is None
        and spec.text == query
        and spec.embedding_strs in ((), (query,))
    )


def question_alone(step: Step | None, query: str) -> bool:
    """Whether ``step`` searches nothing but the question itself (so a failure of it is
    the question's own, with no plainer search to fall back to)."""
    if isinstance(step, KeepHits):
        return True
    if isinstance(step, Fanout):
        return all(is_question(spec, query) for spec in step.specs)
    return False


def _fanout(result: TransformResult, hits: Sequence[Any] | None) -> Fanout:
    specs: tuple[SearchSpec, ...]
    if result.skipped or result.fallback:
        specs = (SearchSpec(text=result.query, embedding_strs=(result.query,)),)
    else:
        specs = tuple(result.searches())
    reuse = tuple(hits is not None and is_question(spec, result.query) for spec in specs)
    return Fanout(specs, reuse)


def plan(
    result: TransformResult,
    guards: Guards,
    hits: Sequence[Any] | None,
    *,
    have_embedder: bool,
) -> Plan:
    """The step that turns ``result`` into ranked nodes. ``hits`` are the question's
    own hits when `question_first` fetched them; ``have_embedder`` says whether the
    guards that need embeddings (rerank, feedback) can run."""
    if hits is not None and guards.strategy == "rerank":
        if not _expanded(result):
            return Plan(KeepHits())
        if not have_embedder:
            return Plan(KeepHits(), missing_embedder="rerank strategy")
        return Plan(Rerank(result.hypothetical, guards.blend))
    feeds_back = guards.feedback_k > 0 and guards.feedback_beta > 0 and not result.fallback
    if hits is not None and feeds_back:
        if not have_embedder:
            return Plan(_fanout(result, hits), missing_embedder="feedback")
        return Plan(Feedback(guards.feedback_k, guards.feedback_alpha, guards.feedback_beta))
    return Plan(_fanout(result, hits))
