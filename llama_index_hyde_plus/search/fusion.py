"""Rank fusion: several ranked lists of nodes in, one ranked list out.

All functions are pure: inputs are never mutated, each output item is a new
``NodeWithScore`` (sharing the node itself), nodes are deduplicated by ``node_id``,
and ties are broken by first appearance (earlier list, then better rank), so the same
input always gives the same order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum

from llama_index.core.schema import BaseNode, NodeWithScore

from .._checks import check_int, check_number, is_number


class FusionMode(str, Enum):
    """How `fuse` combines lists."""

    RRF = "rrf"
    """Reciprocal rank fusion: sum of ``w / (k + rank)``, ranks from 1, k=60."""
    RELATIVE_SCORE = "relative_score"
    """Min-max normalise each list's scores to [0, 1], then weighted sum."""
    DIST_BASED_SCORE = "dist_based_score"
    """Normalise each list with mean +/- 3 standard deviations, then weighted sum."""
    INTERLEAVE = "interleave"
    """Round robin over the lists (first of each, then second of each...)."""
    MAX = "max"
    """Each node keeps its best weighted raw score across the lists."""


RRF_K = 60

Lists = Sequence[Sequence[NodeWithScore]]


def _is_sequence(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _check_lists(lists: Lists) -> None:
    """A `TypeError` naming ``lists`` unless it is a sequence of sequences of
    ``NodeWithScore`` (a list of ids, texts or Nones is a mistake, not a ranking)."""
    expected = "lists must be a sequence of lists of NodeWithScore"
    if not _is_sequence(lists):
        raise TypeError(f"{expected}, not {type(lists).__name__}")
    for nodes in lists:
        if not _is_sequence(nodes):
            raise TypeError(f"{expected}: one list is {type(nodes).__name__}")
        for item in nodes:
            if not isinstance(item, NodeWithScore):
                raise TypeError(f"{expected}: one holds {type(item).__name__}")


def _validate(lists: Lists, weights: Sequence[float] | None, top_k: int | None) -> list[float]:
    _check_lists(lists)
    if top_k is not None:
        check_int(top_k, "top_k", 1, None)
    if weights is None:
        return [1.0] * len(lists)
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise TypeError(f"weights must be a sequence of numbers, not {type(weights).__name__}")
    if len(weights) != len(lists):
        raise ValueError(
            f"weights must have one entry per list: got {len(weights)} for {len(lists)} lists"
        )
    if any(not is_number(w) or not math.isfinite(w) or w < 0 for w in weights):
        raise ValueError("weights must be finite and >= 0")
    return [float(w) for w in weights]


def _first_seen(lists: Lists) -> dict[str, tuple[int, NodeWithScore]]:
    """node_id -> (order of first appearance, first NodeWithScore)."""
    seen: dict[str, tuple[int, NodeWithScore]] = {}
    for nodes in lists:
        for item in nodes:
            if item.node.node_id not in seen:
                seen[item.node.node_id] = (len(seen), item)
    return seen


def scored(node: BaseNode, score: float | None) -> NodeWithScore:
    """A new ``NodeWithScore`` without pydantic's validation (both fields are already
    what it would check): a search makes dozens of these, and validation was most of
    the cost of fusing."""
    return NodeWithScore.model_construct(node=node, score=score)


def _ranked(
    scores: dict[str, float], seen: dict[str, tuple[int, NodeWithScore]], top_k: int | None
) -> list[NodeWithScore]:
    order = sorted(scores, key=lambda nid: (-scores[nid], seen[nid][0]))
    if top_k is not None:
        order = order[:top_k]
    return [scored(seen[nid][1].node, scores[nid]) for nid in order]


def unique_nodes(nodes: Sequence[NodeWithScore]) -> list[NodeWithScore]:
    """A list's nodes with repeats removed (the best-ranked occurrence stays)."""
    ids: set[str] = set()
    out = []
    for item in nodes:
        nid = item.node.node_id  # a property: read once
        if nid not in ids:
            ids.add(nid)
            out.append(item)
    return out


def _rrf(lists: Lists, weights: list[float], k: int) -> dict[str, float]:
    scores: dict[str, float] = {}
    for nodes, w in zip(lists, weights):
        for rank, item in enumerate(unique_nodes(nodes), start=1):
            nid = item.node.node_id
            scores[nid] = scores.get(nid, 0.0) + w / (k + rank)
    return scores


def _raw(nodes: Sequence[NodeWithScore]) -> list[float]:
    """The scores of ``nodes``, None as 0."""
    return [item.score if item.score is not None else 0.0 for item in nodes]


def _normalised(raw: list[float], dist_based: bool) -> list[float]:
    """``raw`` scaled to [0, 1] by min-max or by mean +/- 3 standard deviations, both
    taken over the finite scores; a non-finite score (NaN, infinity: a broken one)
    counts as the lowest, 0, so the others rank as they would without it."""
    finite = [s for s in raw if math.isfinite(s)]
    if not finite:
        return [0.0] * len(raw)
    if dist_based:
        mean = sum(finite) / len(finite)
        std = math.sqrt(sum((s - mean) ** 2 for s in finite) / len(finite))
        low, high = mean - 3 * std, mean + 3 * std
    else:
        low, high = min(finite), max(finite)
    return [
        0.0 if not math.isfinite(s) else 1.0 if high == low else (s - low) / (high - low)
        for s in raw
    ]


def _normalised_sum(lists: Lists, weights: list[float], dist_based: bool) -> dict[str, float]:
    scores: dict[str, float] = {}
    for nodes, w in zip(lists, weights):
        unique = unique_nodes(nodes)
        for item, norm in zip(unique, _normalised(_raw(unique), dist_based)):
            nid = item.node.node_id
            scores[nid] = scores.get(nid, 0.0) + w * norm
    return scores


def _max(lists: Lists, weights: list[float]) -> dict[str, float]:
    """Each node's best weighted score; a non-finite score counts as its list's lowest
    finite one (0 when none is)."""
    scores: dict[str, float] = {}
    for nodes, w in zip(lists, weights):
        raw = _raw(nodes)
        floor = min((s for s in raw if math.isfinite(s)), default=0.0)
        for item, score in zip(nodes, raw):
            s = w * (score if math.isfinite(score) else floor)
            nid = item.node.node_id
            scores[nid] = max(scores.get(nid, -math.inf), s)
    return scores


def _interleave(lists: Lists, weights: list[float], top_k: int | None) -> list[NodeWithScore]:
    active = [unique_nodes(nodes) for nodes, w in zip(lists, weights) if w > 0]
    out: list[NodeWithScore] = []
    ids: set[str] = set()
    depth = 0
    while any(depth < len(nodes) for nodes in active):
        for nodes in active:
            if depth < len(nodes) and nodes[depth].node.node_id not in ids:
                ids.add(nodes[depth].node.node_id)
                out.append(nodes[depth])
        depth += 1
    if top_k is not None:
        out = out[:top_k]
    return [scored(item.node, 1.0 / pos) for pos, item in enumerate(out, 1)]


def fusion_mode(mode: FusionMode, weights: Sequence[float]) -> FusionMode:
    """The mode a fan-out's lists with ``weights`` are fused by: ``mode``, or RRF when
    it is interleaving and the weights differ (interleaving cannot weigh lists)."""
    if mode is FusionMode.INTERLEAVE and len(set(weights)) > 1:
        return FusionMode.RRF
    return mode


_HOW = {
    FusionMode.RRF: "sum of weight/({k}+rank)",
    FusionMode.RELATIVE_SCORE: "sum of weight x min-max score",
    FusionMode.DIST_BASED_SCORE: "sum of weight x mean±3sd score",
    FusionMode.MAX: "best weight x score",
    FusionMode.INTERLEAVE: "1/position, lists in turn,",
}
"""What a fused score is in each mode, for `explain`."""


def explain(
    mode: FusionMode, weights: Sequence[float], k: int = RRF_K, first: str = "first"
) -> str:
    """One line within 80 columns saying what the scores of lists fused by ``mode``
    with ``weights`` are: ``"fused = sum of weight/(60+rank) over 3 searches
    (question x100, rest x1)"``. ``first`` names the first list, when its weight is
    the one that differs (the question's own search)."""
    line = f"fused = {_HOW[mode].format(k=k)} over {len(weights)} searches"
    if mode is FusionMode.INTERLEAVE or set(weights) == {1.0}:
        return line
    if len(set(weights)) == 1:
        return f"{line} (each x{weights[0]:g})"
    rest = set(weights[1:])
    if len(rest) == 1:
        return f"{line} ({first} x{weights[0]:g}, rest x{rest.pop():g})"
    listed = f"{line} (weights {', '.join(f'{w:g}' for w in weights)})"
    return listed if len(listed) <= 80 else f"{line} (weights differ)"


def fuse(
    lists: Lists,
    mode: FusionMode | str = FusionMode.RRF,
    weights: Sequence[float] | None = None,
    top_k: int | None = None,
    *,
    k: int = RRF_K,
) -> list[NodeWithScore]:
    """Fuse ranked lists into one, best first.

    ``weights`` (one per list, >= 0) scale each list's contribution in every mode; a
    zero weight drops a list. Scores of ``None`` count as 0 in the score-based modes,
    a NaN or infinite one as its list's lowest.
    Interleave assigns ``1 / position`` as the fused score; RRF assigns the RRF sum.
    ``lists`` is a sequence of sequences of ``NodeWithScore``; anything else is a
    ``TypeError`` naming it, as a bad ``mode``, ``k``, ``weights`` or ``top_k`` is.
    """
    try:
        mode = FusionMode(mode)
    except ValueError:
        names = ", ".join(m.value for m in FusionMode)
        raise ValueError(f"mode must be one of {names}, not {mode!r}") from None
    check_number(k, "k", 1, 1e12)
    w = _validate(lists, weights, top_k)
    if mode is FusionMode.INTERLEAVE:
        return _interleave(lists, w, top_k)
    kept = [nodes for nodes, wi in zip(lists, w) if wi > 0]
    kept_w = [wi for wi in w if wi > 0]
    seen = _first_seen(kept)
    if mode is FusionMode.RRF:
        scores = _rrf(kept, kept_w, k)
    elif mode is FusionMode.MAX:
        scores = _max(kept, kept_w)
    else:
        scores = _normalised_sum(kept, kept_w, mode is FusionMode.DIST_BASED_SCORE)
    return _ranked(scores, seen, top_k)
