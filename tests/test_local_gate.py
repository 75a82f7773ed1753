"""Integration: the small-model profile's gate with the real bundled model and embedder.

The gate's rule is checked end to end against a cosine this test computes itself from
the real embedder: a passage that disagrees with the question is not searched with (the
result is the question's own search), one that agrees is.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from llama_index.core import Document

from llama_index_hyde_plus import HyDE, TransformRetriever
from llama_index_hyde_plus.cli import DEMO_PROMPT, demo_corpus_path
from llama_index_hyde_plus.local import LocalEmbedding, LocalLLM
from llama_index_hyde_plus.stores.faiss import build_faiss_index, load_faiss_index

pytestmark = pytest.mark.local
Q = "Why did revenue drop?"
OFF_TOPIC = "Write two sentences about ocean tides and the moon. Ignore this: {query}\nText:"


def _retriever(tmp_path: Path, embedding: LocalEmbedding):  # type: ignore[no-untyped-def]
    rows = [json.loads(line) for line in demo_corpus_path().read_text().splitlines()]
    docs = [Document(text=f"{r['title']}\n{r['text']}", id_=r["_id"]) for r in rows]
    build_faiss_index(docs, embedding, tmp_path / "idx", embed_spec="local", max_length=256)
    return load_faiss_index(tmp_path / "idx", embedding).as_retriever(similarity_top_k=5)


def _cosine(embedding: LocalEmbedding, question: str, passages: list[str]) -> float:
    """The question's cosine to the mean of its passages' unit vectors."""
    q = np.asarray(embedding.get_query_embedding(question))
    rows = np.asarray(embedding.get_text_embedding_batch(passages))
    mean = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).mean(axis=0)
    return float(q @ mean / (np.linalg.norm(q) * np.linalg.norm(mean)))


def _ids(nodes: list) -> list[str]:  # type: ignore[type-arg]
    return [n.node.node_id for n in nodes]


def _gated_search(tmp_path: Path, embedding: LocalEmbedding, hyde: HyDE, gate: float):  # type: ignore[no-untyped-def]
    """Search through ``hyde`` and check the gate's decision against our own cosine."""
    base = _retriever(tmp_path, embedding)
    result = TransformRetriever(base, hyde).search(Q)
    t = result.transform
    assert not t.fallback, t.error
    assert t.hypothetical
    cosine = _cosine(embedding, Q, list(t.hypothetical))
    if cosine < gate:
        assert t.skipped and f"gate {gate:g}" in t.skipped
        reported = float(re.search(r"cosine (-?[0-9.]+)", t.skipped)[1])  # type: ignore[index]
        assert abs(reported - cosine) < 0.01
        assert _ids(result.nodes) == _ids(base.retrieve(Q))  # the question's own search
    else:
        assert not t.skipped
    return cosine, t


def test_the_shipped_gate_skips_a_real_passage_that_disagrees_with_the_question(
    tmp_path: Path, real_embedding: LocalEmbedding, real_llm: LocalLLM
) -> None:
    hyde = HyDE(real_llm, prompt=OFF_TOPIC, max_characters=400, timeout=300)
    assert hyde.guards.gate == 0.7  # the bundled model's shipped gate
    cosine, t = _gated_search(tmp_path, real_embedding, hyde, 0.7)
    assert cosine < 0.7 and t.skipped  # tides are nowhere near revenue


def test_a_gate_below_the_real_passages_cosine_lets_the_expansion_through(
    tmp_path: Path, real_embedding: LocalEmbedding, real_llm: LocalLLM
) -> None:
    hyde = HyDE(real_llm, prompt=DEMO_PROMPT, max_characters=400, timeout=300, gate=0.3)
    cosine, t = _gated_search(tmp_path, real_embedding, hyde, 0.3)
    assert cosine > 0.3 and not t.skipped  # the demo prompt's passage is about revenue


def test_the_relative_gate_compares_with_the_questions_own_top_hit(
    tmp_path: Path, real_embedding: LocalEmbedding, real_llm: LocalLLM
) -> None:
    base = _retriever(tmp_path, real_embedding)
    hyde = HyDE(
        real_llm, prompt=OFF_TOPIC, max_characters=400, timeout=300, gate=None, gate_relative=0.0
    )
    result = TransformRetriever(base, hyde).search(Q)
    t = result.transform
    assert not t.fallback, t.error
    top = base.retrieve(Q)[0]
    top_cosine = float(top.score)  # FAISS inner product of unit vectors: the cosine
    cosine = _cosine(real_embedding, Q, list(t.hypothetical))
    assert cosine < top_cosine  # an off-topic passage is further than the best document
    assert t.skipped and "top hit" in t.skipped
    assert _ids(result.nodes) == _ids(base.retrieve(Q))
