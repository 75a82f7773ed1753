"""`Rocchio`: vector pseudo-relevance feedback, carried out by `TransformRetriever`."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.vector_stores.types import VectorStoreQuery

from llama_index_hyde_plus import TransformRetriever
from llama_index_hyde_plus.search.expansion import rocchio_vector
from llama_index_hyde_plus.testing import DeterministicEmbedding, StaticRetriever
from llama_index_hyde_plus.transforms.base import Guards
from llama_index_hyde_plus.transforms.feedback import Rocchio
from llama_index_hyde_plus.transforms.registry import entry_for, make_transform

from .conftest import DOCS

Q = "Why did revenue drop?"


# -- validation -----------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 101, -1, True, 2.5, "3"])
def test_bad_k_is_an_error_naming_it(k: object) -> None:
    with pytest.raises((ValueError, TypeError), match="k must"):
        Rocchio(k=k)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"alpha": -0.1}, "alpha"),
        ({"beta": -1}, "beta"),
        ({"alpha": "1"}, "alpha"),
        ({"beta": True}, "beta"),
        ({"alpha": 0, "beta": 0}, "both be 0"),
    ],
)
def test_bad_weights_are_value_errors_naming_them(kwargs: dict, name: str) -> None:
    with pytest.raises((ValueError, TypeError), match=name):
        Rocchio(**kwargs)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_rejected(bad: float) -> None:
    with pytest.raises(ValueError, match="beta"):
        Rocchio(beta=bad)


@pytest.mark.parametrize("extreme", [1e200, 1e308, 1e-320, 1e-7, 1e7])
def test_extreme_weights_are_refused_by_the_constructor(extreme: float) -> None:
    """Weights this extreme would overflow (or underflow) the search vector to zero:
    every score 0.0, in arbitrary order, with no fallback."""
    with pytest.raises(ValueError, match=r"alpha must .*between .*1e\+06"):
        Rocchio(alpha=extreme, beta=extreme)
    with pytest.raises(ValueError, match="feedback_beta"):
        Guards(feedback_k=3, feedback_beta=extreme)


def test_the_widest_accepted_weights_still_rank() -> None:
    q, docs = [1.0, 0.0], [[0.0, 1.0]]
    for alpha, beta in ((1e6, 1e6), (1e-6, 1e-6), (1e6, 1e-6)):
        vector = rocchio_vector(q, docs, alpha, beta)
        assert np.isfinite(vector).all() and np.linalg.norm(vector) == pytest.approx(1.0)


def test_defaults_and_guards() -> None:
    r = Rocchio()
    assert (r.k, r.alpha, r.beta) == (
        Rocchio.DEFAULT_K,
        Rocchio.DEFAULT_ALPHA,
        Rocchio.DEFAULT_BETA,
    )
    assert r.guards.feedback_k == r.k and r.guards.needs_question_hits
    r = Rocchio(k=3, alpha=2, beta=0.5)
    assert (r.guards.feedback_k, r.guards.feedback_alpha, r.guards.feedback_beta) == (3, 2.0, 0.5)


async def test_on_its_own_the_question_is_unchanged() -> None:
    for result in (Rocchio().transform(Q), await Rocchio().atransform(Q)):
        assert result.queries == () and result.search_queries == (Q,)  # nothing generated
        assert result.method == "rocchio" and not result.fallback
    with pytest.raises(ValueError):
        Rocchio().transform(" ")


def test_registry_builds_rocchio_with_its_options() -> None:
    r = make_transform("rocchio", None, k=4, beta=0.2, n=3)
    assert isinstance(r, Rocchio) and (r.k, r.beta) == (4, 0.2)


def test_every_tune_grid_configuration_builds() -> None:
    for options in entry_for("rocchio").grid:
        Rocchio(**options)


# -- through the retriever ------------------------------------------------------------
def _expected(
    embed: DeterministicEmbedding, hits: list[str], k: int, a: float, b: float
) -> list[float]:
    docs = [embed.vector(DOCS[nid]) for nid in hits[:k]]
    return rocchio_vector(embed.vector(Q), docs, a, b)


@pytest.mark.parametrize("use_async", [False, True])
async def test_faiss_receives_the_rocchio_vector_of_the_questions_top_k(
    faiss_index: VectorStoreIndex,
    embed_model: DeterministicEmbedding,
    spy_queries: list[VectorStoreQuery],
    use_async: bool,
) -> None:
    base = faiss_index.as_retriever(similarity_top_k=5)
    plain = [n.node.node_id for n in base.retrieve(Q)]
    spy_queries.clear()
    retriever = TransformRetriever(base, Rocchio(k=3, alpha=1.0, beta=0.8))
    result = await retriever.asearch(Q) if use_async else retriever.search(Q)
    assert len(spy_queries) == 2  # the question, then the feedback vector
    np.testing.assert_allclose(spy_queries[0].query_embedding, embed_model.vector(Q), atol=1e-6)
    want = _expected(embed_model, plain, 3, 1.0, 0.8)
    np.testing.assert_allclose(spy_queries[1].query_embedding, want, atol=1e-5)
    # and the results are FAISS's answer to that vector
    direct = faiss_index.as_retriever(similarity_top_k=5)._vector_store.query(
        VectorStoreQuery(query_embedding=want, similarity_top_k=5)
    )
    assert [n.node.node_id for n in result.nodes] == [
        faiss_index.index_struct.nodes_dict[i] for i in direct.ids
    ]
    assert not result.transform.fallback


async def test_sync_and_async_agree(faiss_index: VectorStoreIndex) -> None:
    base = faiss_index.as_retriever(similarity_top_k=4)
    retriever = TransformRetriever(base, Rocchio(k=2, beta=0.5))
    sync = retriever.search(Q)
    asynch = await retriever.asearch(Q)
    assert [(n.node.node_id, n.score) for n in sync.nodes] == [
        (n.node.node_id, n.score) for n in asynch.nodes
    ]


def test_feedback_moves_the_ranking(faiss_index: VectorStoreIndex) -> None:
    # a strong beta pulls the search towards the question's top document's wording
    base = faiss_index.as_retriever(similarity_top_k=7)
    plain = [n.node.node_id for n in base.retrieve(Q)]
    fed = [n.node.node_id for n in TransformRetriever(base, Rocchio(k=1, beta=5.0)).search(Q).nodes]
    assert fed[0] == plain[0]
    assert sorted(fed) == sorted(plain)
    assert fed != plain


@pytest.mark.parametrize("use_async", [False, True])
async def test_without_an_embedding_model_it_warns_once_and_returns_the_questions_hits(
    caplog: pytest.LogCaptureFixture, use_async: bool
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    base = StaticRetriever(DOCS, results={Q: ["renewals", "lunch"]})
    retriever = TransformRetriever(base, Rocchio(k=2))
    for _ in range(2):
        result = await retriever.asearch(Q) if use_async else retriever.search(Q)
        assert [n.node.node_id for n in result.nodes] == ["renewals", "lunch"]
    assert base.queries == [Q, Q]  # one search per call: the question's hits are reused
    warnings = [r for r in caplog.records if "embedding model" in r.getMessage()]
    assert len(warnings) == 1 and "feedback" in warnings[0].getMessage()


def test_with_an_explicit_embed_model_a_static_retriever_gets_the_feedback_vector() -> None:
    embed = DeterministicEmbedding()
    base = StaticRetriever(DOCS, results={Q: ["renewals", "lunch"]})
    TransformRetriever(base, Rocchio(k=2, beta=0.5), embed_model=embed).search(Q)
    assert len(base.bundles) == 2
    want = rocchio_vector(
        embed.vector(Q), [embed.vector(DOCS["renewals"]), embed.vector(DOCS["lunch"])], 1.0, 0.5
    )
    np.testing.assert_allclose(base.bundles[1].embedding, want, atol=1e-9)
    assert base.bundles[1].query_str == Q  # the keyword side keeps the question as asked
