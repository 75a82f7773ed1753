"""Pure arithmetic behind the quality guards: weighted search vectors, the keyword
query that keeps the question dominant, blended reranking and Rocchio feedback.

Nothing here embeds or searches; `TransformRetriever` feeds these functions the
vectors and scores it has, so every rule can be tested (and tuned) in isolation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from .._checks import is_number

Vector = Sequence[float]
Array = npt.NDArray[np.float64]

_WORD = re.compile(r"\w+")
MAX_KEYWORD_REPEAT = 20
"""The most times the question is repeated in a keyword query."""


def check_weight(value: float | None, name: str, *, allow_none: bool = True) -> float | None:
    """``value`` if it is None (when allowed) or a number in [0, 1], else a `ValueError`
    naming ``name``."""
    if value is None:
        if allow_none:
            return None
        raise ValueError(f"{name} must be a number between 0 and 1")
    if not is_number(value):
        raise TypeError(f"{name} must be a number between 0 and 1, not {type(value).__name__}")
    if not (0.0 <= float(value) <= 1.0) or math.isnan(float(value)):
        raise ValueError(f"{name} must be between 0 and 1, got {value!r}")
    return float(value)


def unit(vector: Vector | Array) -> Array:
    """``vector`` scaled to length 1 (a zero vector stays zero)."""
    arr = np.asarray(vector, dtype=np.float64)
    norm = float(np.linalg.norm(arr))
    return arr / norm if norm > 0 else arr


def mean_unit(vectors: Sequence[Vector] | Array) -> Array:
    """The mean of the unit-length ``vectors``, itself scaled to unit length."""
    return unit(unit_rows_mean(vectors))


def cosine(a: Vector | Array, b: Vector | Array) -> float:
    """Cosine similarity of two vectors (0 when either is zero)."""
    return float(np.dot(unit(a), unit(b)))


def unit_rows_mean(vectors: Sequence[Vector] | Array) -> Array:
    """The mean of ``vectors`` after scaling each to unit length (not rescaled)."""
    arr = np.asarray(vectors, dtype=np.float64)
    if arr.ndim != 2 or not len(arr):
        raise ValueError("need a non-empty list of vectors")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    result: Array = (arr / norms).mean(axis=0)
    return result


def weighted_vector(query: Vector, passages: Sequence[Vector], query_weight: float) -> list[float]:
    """``unit(w * q + (1 - w) * mean(passages))`` with every input at unit length
    (the mean itself is not rescaled, so ``w = 1 / (N + 1)`` is exactly the paper's
    plain mean of the N passages and the question).

    ``query_weight`` 0 searches with the passages alone (HyDE as in the paper without
    the query), 1 with the question alone; the paper's "average the query with N
    passages" is ``1 / (N + 1)``.
    """
    w = check_weight(query_weight, "query_weight", allow_none=False)
    assert w is not None
    q = unit(query)
    if not passages or w >= 1.0:
        return [float(x) for x in q]
    p = unit_rows_mean(passages)
    if p.shape != q.shape:
        raise ValueError(
            f"the question's vector has {q.shape[0]} dimensions and the passages' "
            f"{p.shape[0]}: embed both with the index's model"
        )
    return [float(x) for x in unit(w * q + (1.0 - w) * p)]


def word_count(text: str) -> int:
    """How many words (runs of letters, digits and underscores) ``text`` has.

    Args:
        text: any text.
    """
    return len(_WORD.findall(text))


def keyword_repeats(query: str, passages: Sequence[str], query_weight: float) -> int:
    """How often to repeat the question so that its words make up about
    ``query_weight`` of a keyword query that also holds ``passages`` (Query2doc and
    MuGI repeat the question so BM25 is not swamped by a long passage)."""
    w = check_weight(query_weight, "keyword_weight", allow_none=False)
    assert w is not None
    return _repeats(query, passages, w)


def _repeats(query: str, passages: Sequence[str], w: float) -> int:
    """`keyword_repeats` of a weight already checked."""
    if w <= 0.0:
        return 0
    q_words = max(1, word_count(query))
    p_words = sum(word_count(p) for p in passages)
    if w >= 1.0 or p_words == 0:
        return 1
    wanted = w * p_words / ((1.0 - w) * q_words)
    return max(1, min(MAX_KEYWORD_REPEAT, round(wanted)))


def keyword_query(query: str, passages: Sequence[str], query_weight: float) -> str:
    """The text a keyword or hybrid store matches: the question repeated (see
    `keyword_repeats`), then the passages; the question alone at weight 1, the
    passages alone at weight 0."""
    w = check_weight(query_weight, "keyword_weight", allow_none=False)
    assert w is not None
    if w >= 1.0 or not passages:
        return query
    repeats = _repeats(query, passages, w)
    return "\n\n".join([query] * repeats + list(passages))


def minmax(values: Sequence[float]) -> list[float]:
    """``values`` rescaled to [0, 1]; all equal -> all 1. The range is the finite
    values'; a NaN or infinite value (a broken score) counts as the lowest, 0, so the
    others keep the places they would have without it."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return [0.0 for _ in values]
    low, high = min(finite), max(finite)
    if high - low <= 1e-12:
        return [1.0 if math.isfinite(v) else 0.0 for v in values]
    return [(v - low) / (high - low) if math.isfinite(v) else 0.0 for v in values]


def blend_order(
    question_scores: Sequence[float], generated_sims: Sequence[float], blend: float
) -> list[int]:
    """Positions of the candidates, best first, by ``(1 - blend) * s_q + blend * s_h``
    where both score lists are min-max normalised over the candidates. Ties keep the
    question's order, so ``blend=0`` returns the question's ranking unchanged."""
    return best_first(blend_scores(question_scores, generated_sims, blend))


def best_first(scores: Sequence[float]) -> list[int]:
    """Positions of ``scores``, highest first; ties keep the input order."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def blend_scores(
    question_scores: Sequence[float], generated_sims: Sequence[float], blend: float
) -> list[float]:
    """The blended score of each candidate, in input order (see `blend_order`)."""
    b = check_weight(blend, "blend", allow_none=False)
    assert b is not None
    if len(question_scores) != len(generated_sims):
        raise ValueError("question_scores and generated_sims must have the same length")
    sq, sh = minmax(list(question_scores)), minmax(list(generated_sims))
    return [(1.0 - b) * q + b * h for q, h in zip(sq, sh)]


def rocchio_vector(
    query: Vector, feedback: Sequence[Vector], alpha: float, beta: float
) -> list[float]:
    """Vector pseudo-relevance feedback: ``unit(alpha * q + beta * mean(feedback))``
    with unit-length inputs (Rocchio, as in pyserini's dense PRF)."""
    if not (math.isfinite(alpha) and math.isfinite(beta)):
        raise ValueError("alpha and beta must be finite")
    if alpha < 0 or beta < 0 or (alpha == 0 and beta == 0):
        raise ValueError("alpha and beta must be >= 0 and not both 0")
    q = unit(query)
    if not feedback or beta == 0:
        return [float(x) for x in q]
    scale = max(alpha, beta)  # only the ratio matters: keep the arithmetic in range
    return [float(x) for x in unit(alpha / scale * q + beta / scale * mean_unit(feedback))]
