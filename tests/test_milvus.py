"""Hybrid search on a real Milvus Lite database in tmp_path: the FAISS cases, plus one
where the user's own words must reach BM25."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.vector_stores.types import VectorStoreQuery

from llama_index_hyde_plus import Decompose, HyDE, MultiQuery, StepBack, TransformRetriever
from llama_index_hyde_plus.milvus import (
    build_milvus_index,
    hybrid_retriever,
    load_milvus_index,
    read_milvus_meta,
)
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM

from .conftest import DOCS

pytest.importorskip("pymilvus")

MILVUS_DOCS = {
    **DOCS,
    "zx-router": "ZX9000 router manual: supported for five years after purchase.",
    "warranty": "The warranty covers parts and labour for two years on all laptops and "
    "repairs are free within the warranty period.",
}
Q = "Why did revenue drop?"
P1 = "Revenue dropped because enterprise renewals slipped last quarter."
EMBED = DeterministicEmbedding(dim=256)


@pytest.fixture(scope="module")
def milvus_index(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, VectorStoreIndex]:
    uri = str(tmp_path_factory.mktemp("milvus") / "hybrid.db")
    docs = [Document(text=t, id_=i) for i, t in MILVUS_DOCS.items()]
    index = build_milvus_index(docs, EMBED, uri, collection="docs", embed_spec="det")
    return uri, index


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[VectorStoreQuery]:
    from llama_index.vector_stores.milvus import MilvusVectorStore

    seen: list[VectorStoreQuery] = []
    sync, asy = MilvusVectorStore.query, MilvusVectorStore.aquery

    def query(self, q, **kw):  # type: ignore[no-untyped-def]
        seen.append(q)
        return sync(self, q, **kw)

    async def aquery(self, q, **kw):  # type: ignore[no-untyped-def]
        seen.append(q)
        return await asy(self, q, **kw)

    monkeypatch.setattr(MilvusVectorStore, "query", query)
    monkeypatch.setattr(MilvusVectorStore, "aquery", aquery)
    return seen


def ids(result) -> list[str]:  # type: ignore[no-untyped-def]
    return [n.node.node_id for n in result.nodes]


def test_collection_reopens_from_the_file(milvus_index: tuple[str, VectorStoreIndex]) -> None:
    uri, _ = milvus_index
    assert read_milvus_meta(uri, "docs") == {
        "documents": len(MILVUS_DOCS),
        "dim": 256,
        "embed": "det",
        "max_length": 256,
        "collection": "docs",
    }
    index = load_milvus_index(uri, EMBED, collection="docs")
    hits = hybrid_retriever(index, 2).retrieve("paid time off each year")
    assert hits[0].node.node_id == "pto"


def test_missing_database_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no Milvus Lite database"):
        load_milvus_index(str(tmp_path / "none.db"), EMBED)


@pytest.mark.parametrize("use_async", [False, True])
async def test_dense_side_gets_the_hyde_mean_and_bm25_side_the_text(
    milvus_index: tuple[str, VectorStoreIndex], spy: list[VectorStoreQuery], use_async: bool
) -> None:
    _, index = milvus_index
    hyde = HyDE(ScriptedLLM([P1, P1]), include_query=True)
    retriever = TransformRetriever(hybrid_retriever(index, 3), hyde)
    assert retriever.search_type == "hybrid"
    result = await retriever.asearch(Q) if use_async else retriever.search(Q)
    [query] = spy
    assert query.query_str == f"{Q}\n\n{P1}"
    expected = np.mean([EMBED.vector(P1), EMBED.vector(Q)], axis=0)
    np.testing.assert_allclose(query.query_embedding, expected, atol=1e-6)
    assert "renewals" in ids(result)[:2]


def test_without_include_query_bm25_sees_only_the_passage_and_warns(
    milvus_index: tuple[str, VectorStoreIndex],
    spy: list[VectorStoreQuery],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    _, index = milvus_index
    retriever = TransformRetriever(
        hybrid_retriever(index, 3), HyDE(ScriptedLLM([P1]), include_query=False)
    )
    retriever.search(Q)
    assert spy[0].query_str == P1
    assert any(
        "include_query=False" in r.getMessage() and "hybrid" in r.getMessage()
        for r in caplog.records
    )


def test_keyword_match_of_the_question_needs_include_query(
    milvus_index: tuple[str, VectorStoreIndex],
) -> None:
    """The passage is generic; only the question names the product (a rare word that
    BM25 weighs heavily), so only include_query=True finds its manual."""
    _, index = milvus_index
    question = "How long is the ZX9000 warranty?"
    passage = "Warranty covers parts and labour; repairs are free within that period."

    def rank(include_query: bool) -> int:
        hyde = HyDE(ScriptedLLM([passage]), include_query=include_query)
        found = ids(TransformRetriever(hybrid_retriever(index, 5), hyde).search(question))
        return found.index("zx-router") + 1 if "zx-router" in found else 99

    with_query, without = rank(True), rank(False)
    assert with_query <= 2 and with_query < without


@pytest.mark.parametrize(
    "transform",
    [
        lambda: MultiQuery(ScriptedLLM(["1. paid time off days\n2. laptop disk encryption"]), n=2),
        lambda: StepBack(ScriptedLLM(["What company policies exist?"])),
        lambda: Decompose(ScriptedLLM(["1. paid time off\n2. laptop encryption"]), n=2),
    ],
)
async def test_fan_out_over_the_hybrid_retriever(
    milvus_index: tuple[str, VectorStoreIndex], spy: list[VectorStoreQuery], transform
) -> None:  # type: ignore[no-untyped-def]
    _, index = milvus_index
    retriever = TransformRetriever(hybrid_retriever(index, 3), transform())
    result = await retriever.asearch("employee policies")
    assert len(spy) >= 2 and result.nodes and not result.transform.fallback


@pytest.mark.local
def test_cli_indexes_and_queries_milvus_lite(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app

    runner = CliRunner()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "corpus.jsonl").write_text(
        "\n".join(json.dumps({"_id": i, "text": t}) for i, t in MILVUS_DOCS.items())
    )
    uri = str(tmp_path / "cli.db")
    built = runner.invoke(
        app, ["index", str(docs), "--store", "milvus", "--uri", uri, "--embed", "local"]
    )
    assert built.exit_code == 0, built.output
    assert "BM25 + dense" in built.output
    found = runner.invoke(
        app,
        [
            "query",
            "How long is the ZX9000 covered?",
            "--uri",
            uri,
            "-t",
            "none",
            "-k",
            "2",
            "--json",
        ],
    )
    assert found.exit_code == 0, found.output
    assert json.loads(found.stdout)["results"][0]["id"] == "zx-router"
    both = runner.invoke(app, ["query", "q", "--uri", uri, "--index", str(tmp_path)])
    assert both.exit_code == 2 and "exactly one" in both.output


def test_eval_on_milvus_scores_the_hybrid_store(tmp_path: Path) -> None:
    from llama_index_hyde_plus.evaluation import load_beir, run_eval

    tiny = Path(__file__).parent / "data" / "tiny-beir"
    llm = ScriptedLLM(respond=lambda p: "Enterprise renewals slipped; paid time off; laptops.")
    kwargs = dict(
        llm=llm,
        embed_model=EMBED,
        embed_label="det",
        cache_root=tmp_path,
        store="milvus",
        milvus_uri=str(tmp_path / "eval.db"),
        top_k=5,
    )
    first = run_eval(load_beir(tiny), ["none", "hyde+q"], **kwargs)  # type: ignore[arg-type]
    assert not first.index_cached and [r.label for r in first.reports] == ["none", "hyde+q"]
    assert all(0 < r.scores["R@100"] <= 1 for r in first.reports)
    second = run_eval(load_beir(tiny), ["none"], **kwargs)  # type: ignore[arg-type]
    assert second.index_cached
    assert second.reports[0].scores == first.reports[0].scores
