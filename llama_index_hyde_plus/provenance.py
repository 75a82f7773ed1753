"""What a transform did, carried from `TransformRetriever.retrieve` to a query engine's
response, and read back with `transform_of`.

LlamaIndex's response synthesizers build ``response.metadata`` as ``{node_id:
node.metadata}`` from the source nodes, so the returned nodes' metadata is the one
carrier a plain ``RetrieverQueryEngine`` passes on untouched. The FIRST returned node is
a copy that holds a small JSON-able summary under `METADATA_KEY`, a key excluded from
the text the answer LLM and the embedding model see; one carrier is enough (the
response holds every source node's metadata), and copying every node cost 64 µs per
search of 10 nodes against 5 µs for one (BENCHMARKS.md).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from llama_index.core.schema import BaseNode, NodeWithScore

from .transforms.base import TransformResult

__all__ = ["METADATA_KEY", "summary", "tag_nodes", "transform_of"]

METADATA_KEY = "hyde_plus"
"""The node metadata key that holds the transform's summary."""


def summary(
    transform: TransformResult, failed_searches: Sequence[str] = (), latency_s: float = 0.0
) -> dict[str, Any]:
    """A compact, JSON-able account of one search: the method, the question, the
    generated queries and HyDE passages, the LLM usage (tokens, cost, calls), whether
    it fell back (and why), why an expansion was skipped, whether it came from a cache,
    the sub-searches that failed, and the search's wall time in seconds."""
    return {
        "method": transform.method,
        "query": transform.query,
        "queries": list(transform.queries),
        "hypothetical": list(transform.hypothetical),
        "usage": transform.usage.to_dict(),
        "fallback": transform.fallback,
        "error": transform.error,
        "skipped": transform.skipped,
        "cached": transform.cached,
        "failed_searches": list(failed_searches),
        "latency_s": round(latency_s, 6),
    }


def _tagged(node: BaseNode, info: Mapping[str, Any]) -> BaseNode:
    """A copy of ``node`` whose metadata also holds ``info`` under `METADATA_KEY`,
    hidden from the LLM and embedding views; ``node`` itself is left as it was."""

    def hidden(keys: list[str]) -> list[str]:
        return keys if METADATA_KEY in keys else [*keys, METADATA_KEY]

    return node.model_copy(
        update={
            "metadata": {**node.metadata, METADATA_KEY: info},
            "excluded_llm_metadata_keys": hidden(list(node.excluded_llm_metadata_keys)),
            "excluded_embed_metadata_keys": hidden(list(node.excluded_embed_metadata_keys)),
        }
    )


def tag_nodes(nodes: Iterable[NodeWithScore], info: Mapping[str, Any]) -> list[NodeWithScore]:
    """``nodes`` (same wrappers, order and scores) with the first replaced by a wrapper
    around a tagged copy of its node; no node of the wrapped store is changed."""
    out = list(nodes)
    if out:
        first = out[0]
        out[0] = NodeWithScore(node=_tagged(first.node, dict(info)), score=first.score)
    return out


def _from_metadata(metadata: Any) -> dict[str, Any] | None:
    if not isinstance(metadata, Mapping):
        return None
    found = metadata.get(METADATA_KEY)
    if isinstance(found, Mapping):
        return copy.deepcopy(dict(found))
    for value in metadata.values():  # a response's {node_id: node.metadata}
        if isinstance(value, Mapping) and isinstance(value.get(METADATA_KEY), Mapping):
            return copy.deepcopy(dict(value[METADATA_KEY]))
    return None


def transform_of(response: Any) -> dict[str, Any] | None:
    """What the query transform did for ``response`` (see `summary` for the fields),
    or None when nothing carries it (no source nodes, or not a `TransformRetriever`).

    ``response`` is a query engine's response (sync, async or streaming: anything with
    ``metadata`` or ``source_nodes``), or a list of nodes from
    ``TransformRetriever.retrieve``. Returns a copy.
    """
    found = _from_metadata(getattr(response, "metadata", None))
    if found is not None:
        return found
    nodes = getattr(response, "source_nodes", response)
    if not isinstance(nodes, Iterable) or isinstance(nodes, (str, bytes, Mapping)):
        return None
    for item in nodes:
        node = item.node if isinstance(item, NodeWithScore) else item
        if isinstance(node, BaseNode):
            found = _from_metadata(node.metadata)
            if found is not None:
                return found
    return None
