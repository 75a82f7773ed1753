"""The fan-outs' shipped fusion by generator: a capable model's queries get
question weight 5 (3 for decompose) and RRF k 10, the bundled model's stay near no-ops
(weight 100 or 50, k 60); `TransformRetriever` fuses with the transform's own k."""

from __future__ import annotations

import pytest

from llama_index_hyde_plus import Decompose, MultiQuery, Rewrite, StepBack, TransformRetriever
from llama_index_hyde_plus.testing import ScriptedLLM, StaticRetriever

from .conftest import DOCS

Q = "Why did revenue drop?"
SMALL, CAPABLE = "SmolLM2-135M-Instruct-Q4_1", "gpt-4o-mini"
GENERATED = "enterprise renewals slipped"


@pytest.mark.parametrize(
    ("cls", "small", "capable"),
    [
        (MultiQuery, 100.0, 5.0),
        (Decompose, 100.0, 3.0),
        (StepBack, 50.0, 5.0),
        (Rewrite, 50.0, 5.0),
    ],
)
def test_the_shipped_fusion_depends_on_the_generator(
    cls: type[MultiQuery], small: float, capable: float
) -> None:
    for model, weight, k in ((SMALL, small, 60), (CAPABLE, capable, 10)):
        t = cls(ScriptedLLM([f"1. {GENERATED}"], model_name=model))
        assert (t.original_weight, t.rrf_k) == (weight, k)
        assert t.transform(Q).searches()[0].weight == weight


def test_a_given_rrf_k_wins_over_the_shipped_one_and_is_checked() -> None:
    assert MultiQuery(ScriptedLLM(["1. a"], model_name=CAPABLE), rrf_k=60).rrf_k == 60
    assert MultiQuery(ScriptedLLM(["1. a"], model_name=SMALL), rrf_k=5).rrf_k == 5
    for bad in (0, 1001):
        with pytest.raises(ValueError, match="rrf_k"):
            MultiQuery(ScriptedLLM(["1. a"]), rrf_k=bad)
    with pytest.raises(TypeError, match="rrf_k"):
        MultiQuery(ScriptedLLM(["1. a"]), rrf_k=2.5)  # type: ignore[arg-type]


def test_rrf_k_is_a_search_option_outside_the_cache_key() -> None:
    llm = ScriptedLLM(["1. a"], model_name=CAPABLE)
    assert "rrf_k" in MultiQuery.SEARCH_OPTIONS
    assert MultiQuery(llm, rrf_k=10).cache_key_for(Q) == MultiQuery(llm, rrf_k=60).cache_key_for(Q)


@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize(("k", "place"), [(10, 2), (60, 0)])
async def test_the_retriever_fuses_with_the_transforms_rrf_k(
    k: int, place: int, use_async: bool
) -> None:
    # the question ranks six documents, the generated query only the question's last:
    # at weight 5, k 10 lifts it to third (5/16 + 1/11 between 5/12 and 5/13), k 60 to
    # first (5/66 + 1/61 > 5/61): the smaller k, the more the question's top ranks hold
    order = ["renewals", "hiring", "office", "pto", "security", "pricing"]
    base = StaticRetriever(DOCS, results={Q: order, GENERATED: ["pricing"]})
    llm = ScriptedLLM([f"1. {GENERATED}"], model_name=CAPABLE, forbid_sync=use_async)
    retriever = TransformRetriever(base, MultiQuery(llm, n=1, original_weight=5.0, rrf_k=k))
    result = await retriever.asearch(Q) if use_async else retriever.search(Q)
    assert [n.node.node_id for n in result.nodes].index("pricing") == place
