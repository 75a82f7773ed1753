"""Hybrid search on a real Milvus Lite database in tmp_path: the FAISS cases, plus one
where the user's own words must reach BM25."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.schema import QueryBundle
from llama_index.core.vector_stores.types import VectorStoreQuery

from llama_index_hyde_plus import Decompose, HyDE, MultiQuery, StepBack, TransformRetriever
from llama_index_hyde_plus.stores.milvus import (
    build_milvus_index,
    hybrid_retriever,
    load_milvus_index,
    read_milvus_meta,
)
from llama_index_hyde_plus.stores.nodes import EmbeddingMismatchError
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
    meta = read_milvus_meta(uri, "docs")
    assert meta is not None and meta.pop("physical_collection").startswith("docs__")
    assert len(meta.pop("fingerprint")) == 16
    assert (meta.pop("embedded"), meta.pop("reused"), meta.pop("unchanged")) == (
        len(MILVUS_DOCS),
        0,
        False,
    )
    assert meta == {
        "documents": len(MILVUS_DOCS),
        "chunks": len(MILVUS_DOCS),
        "chunking": None,
        "dim": 256,
        "embed": "det",
        "embed_model": "deterministic-bow",
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
    expected = np.mean([EMBED.vector(P1), EMBED.vector(Q)], axis=0)  # the paper's mean,
    expected /= np.linalg.norm(expected)  # sent at unit length
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
    summary = " ".join(built.output.split())  # the summary wraps at the terminal's width
    assert "BM25 + dense" in summary
    n = len(MILVUS_DOCS)
    assert f"Indexed {n} documents as {n} chunks" in summary
    meta = read_milvus_meta(uri) or {}
    assert meta["chunks"] == n and meta["chunking"]["chunk_size"] == 200
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
    top = json.loads(found.stdout)["results"][0]
    assert top["id"] == "zx-router" and top["metadata"]["source"] == "corpus.jsonl"
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


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llama_index_hyde_plus.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


def _fresh_query_ids(uri: str, collection: str) -> list[str]:
    """`hyde-plus query` in a new process, as the README's two-command workflow does."""
    found = _cli(
        "query", "paid time off", "--uri", uri, "--collection", collection, "-t", "none", "--json"
    )
    assert found.returncode == 0, found.stderr
    return [r["id"] for r in json.loads(found.stdout)["results"]]


@pytest.mark.local
def test_index_in_one_process_query_in_another_and_a_killed_rebuild_keeps_the_old(
    tmp_path: Path,
) -> None:
    old_docs, new_docs = tmp_path / "old", tmp_path / "new"
    old_docs.mkdir()
    new_docs.mkdir()
    (old_docs / "pto.txt").write_text(MILVUS_DOCS["pto"])
    (old_docs / "lunch.txt").write_text(MILVUS_DOCS["lunch"])
    (new_docs / "laptops.txt").write_text(MILVUS_DOCS["security"])
    uri, name = str(tmp_path / "kill.db"), "kb"
    args = ["--store", "milvus", "--uri", uri, "--collection", name, "--embed", "local"]
    built = _cli("index", str(old_docs), *args)
    assert built.returncode == 0, built.stderr
    assert _fresh_query_ids(uri, name)[0] == "pto.txt"

    flag = tmp_path / "paused"  # paused by the tests' own hook (`tests._paused`)
    where = "before:llama_index_hyde_plus.stores.milvus_builds.switch_alias"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests._paused", str(flag), where, "index", str(new_docs), *args],
        cwd=Path(__file__).parents[1],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not flag.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)

    # the killed process is gone: this one opens the file and finds the old collection
    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app

    runner = CliRunner()

    def query_ids() -> list[str]:
        found = runner.invoke(
            app,
            ["query", "paid time off", "--uri", uri, "--collection", name, "-t", "none", "--json"],
        )
        assert found.exit_code == 0, found.output
        return [r["id"] for r in json.loads(found.stdout)["results"]]

    assert sorted(query_ids()) == ["lunch.txt", "pto.txt"]
    # the next build switches to the new documents and drops the killed build's data
    rebuilt = runner.invoke(app, ["index", str(new_docs), *args])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert query_ids() == ["laptops.txt"]
    meta = read_milvus_meta(uri, name)
    assert meta is not None and meta["documents"] == 1
    from pymilvus import MilvusClient

    assert len(MilvusClient(uri=uri).list_collections()) == 1


def test_rebuild_switches_the_alias_and_keeps_the_metadata_consistent(tmp_path: Path) -> None:
    uri = str(tmp_path / "re.db")
    build_milvus_index([Document(text=DOCS["pto"], id_="pto")], EMBED, uri, collection="c")
    docs = [Document(text=t, id_=i) for i, t in DOCS.items()]
    build_milvus_index(docs, EMBED, uri, collection="c")
    meta = read_milvus_meta(uri, "c")
    assert meta is not None and meta["documents"] == len(DOCS)
    index = load_milvus_index(uri, EMBED, collection="c")
    assert hybrid_retriever(index, 1).retrieve("Lisbon office")[0].node.node_id == "office"
    stored = json.loads(Path(f"{uri}.c.hyde_plus.json").read_text())["collections"]
    assert list(stored) == [meta["physical_collection"]]


def test_another_embedding_dimension_is_a_clear_error(tmp_path: Path) -> None:
    uri = str(tmp_path / "dim.db")
    build_milvus_index([Document(text=DOCS["pto"], id_="pto")], EMBED, uri, collection="d")
    with pytest.raises(EmbeddingMismatchError, match="256-d"):
        load_milvus_index(uri, DeterministicEmbedding(dim=128), collection="d")
    index = load_milvus_index(uri, EMBED, collection="d")
    wrong = QueryBundle("paid time off", embedding=[0.1] * 128)  # as a transform sends it
    with pytest.raises(EmbeddingMismatchError, match="256-d vectors"):
        hybrid_retriever(index, 1).retrieve(wrong)


@pytest.mark.local
def test_serve_uri_serves_a_milvus_store_with_its_hybrid_mode(tmp_path: Path) -> None:
    import rcp

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "corpus.jsonl").write_text(
        "\n".join(json.dumps({"_id": i, "text": t}) for i, t in MILVUS_DOCS.items())
    )
    uri = str(tmp_path / "served.db")
    cli = [sys.executable, "-m", "llama_index_hyde_plus.cli"]
    built = subprocess.run(
        [*cli, "index", str(docs), "--store", "milvus", "--uri", uri, "--embed", "local"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    client = rcp.connect_stdio([*cli, "serve", "--stdio", "--uri", uri, "--llm", "scripted"])
    try:
        assert client.capabilities["retrieve"]["modes"] == ["hybrid", "dense", "sparse"]
        hits = client.retrieve("How long is the ZX9000 covered?", k=2)
        assert hits[0]["id"] == "zx-router" and len(hits) == 2
        raw = client.call(
            "retrieve", {"query": "How long is the ZX9000 covered?", "k": 2, "rewrite": "rewrite"}
        )
        assert raw["rewrite"]["queries"] and not raw["rewrite"]["fallback"]
        assert {h["id"] for h in raw["hits"]} <= set(MILVUS_DOCS)
    finally:
        client.shutdown()


def test_a_collection_hyde_plus_did_not_build_is_never_dropped(tmp_path: Path) -> None:
    from pymilvus import MilvusClient

    uri = str(tmp_path / "shared.db")
    client = MilvusClient(uri)
    client.create_collection("products", dimension=4)
    client.insert("products", [{"id": i, "vector": [0.1 * i] * 4} for i in range(5)])
    docs = [Document(text=t, id_=i) for i, t in DOCS.items()]
    with pytest.raises(ValueError, match="collection 'products' that hyde-plus did not make"):
        build_milvus_index(docs, EMBED, uri, collection="products")
    assert client.query("products", filter="id >= 0", output_fields=["id"]) != []
    assert client.list_collections() == ["products"]


def test_building_one_collection_leaves_a_longer_named_one_alone(tmp_path: Path) -> None:
    uri = str(tmp_path / "prefix.db")
    docs = [Document(text=t, id_=i) for i, t in DOCS.items()]
    build_milvus_index(docs, EMBED, uri, collection="kb__v2")
    build_milvus_index(docs, EMBED, uri, collection="kb")
    build_milvus_index(docs, EMBED, uri, collection="kb")  # a rebuild cleans only its own
    index = load_milvus_index(uri, EMBED, collection="kb__v2")
    assert hybrid_retriever(index, 2).retrieve("paid time off")[0].node.node_id == "pto"


@pytest.mark.parametrize(
    ("uri", "collection", "message"),
    [
        ("folder", "hyde_plus", "must end in .db"),
        ("ok.db", "", "is not a Milvus name"),
        ("ok.db", "a/b", "is not a Milvus name"),
        ("text.db", "hyde_plus", "is a file, not a Milvus Lite database"),
    ],
)
def test_a_bad_uri_or_collection_is_refused_before_any_embedding(
    tmp_path: Path, uri: str, collection: str, message: str
) -> None:
    from llama_index_hyde_plus.stores import MilvusStore

    (tmp_path / "dir.db").mkdir()
    (tmp_path / "text.db").write_text("not a database")
    embedded: list[int] = []
    target = str(tmp_path / uri)
    with pytest.raises(ValueError, match=message):
        MilvusStore(target, collection=collection).build(
            [Document(text="x", id_="x")],
            EMBED,
            embed_spec="d",
            max_length=64,
            progress=embedded.append,
        )
    assert embedded == []
    assert (tmp_path / "text.db").read_text() == "not a database"


def test_a_fan_out_over_the_hybrid_retriever_keeps_its_top_k(tmp_path: Path) -> None:
    uri = str(tmp_path / "topk.db")
    docs = [Document(text=t, id_=i) for i, t in MILVUS_DOCS.items()]
    index = build_milvus_index(docs, EMBED, uri)
    paraphrases = "1. paid time off days\n2. laptop disk encryption\n3. office move Lisbon"
    retriever = TransformRetriever(
        hybrid_retriever(index, 2), MultiQuery(ScriptedLLM([paraphrases]), n=3)
    )
    assert len(retriever.retrieve("Why did revenue drop?")) == 2


def test_stored_vectors_are_read_from_the_hybrid_retriever_not_re_embedded(
    milvus_index: tuple[str, VectorStoreIndex],
) -> None:
    from llama_index_hyde_plus.search.vectors import DocVectors
    from llama_index_hyde_plus.stores.milvus import hybrid_retriever

    _, index = milvus_index
    retriever = hybrid_retriever(index, 3)
    hits = retriever.retrieve(Q)
    docs = DocVectors(retriever, None)  # no embedder: re-embedding would raise
    vectors = docs.get(hits)
    assert docs.source == "milvus"
    for hit, vec in zip(hits, vectors, strict=True):
        np.testing.assert_allclose(vec, EMBED.vector(MILVUS_DOCS[hit.node.node_id]), atol=1e-5)


@pytest.mark.parametrize("content", ['{"theme": "dark"}', "{not json", "LINK"])
def test_a_users_file_where_the_collection_record_goes_is_never_overwritten(
    tmp_path: Path, content: str
) -> None:
    from llama_index_hyde_plus.stores import MilvusStore

    uri = str(tmp_path / "new.db")
    record = tmp_path / "new.db.kb.hyde_plus.json"
    if content == "LINK":
        (tmp_path / "elsewhere.json").write_text('{"format": 2, "collections": {}}')
        record.symlink_to(tmp_path / "elsewhere.json")
    else:
        record.write_text(content)
    before = record.read_bytes()
    embedded: list[int] = []
    with pytest.raises(ValueError, match="is not hyde-plus's record of the collection"):
        MilvusStore(uri, collection="kb").build(
            [Document(text="x", id_="x")],
            EMBED,
            embed_spec="d",
            max_length=64,
            progress=embedded.append,
        )
    assert record.read_bytes() == before and embedded == []


def test_a_users_folder_named_like_a_database_is_never_written_into(tmp_path: Path) -> None:
    from llama_index_hyde_plus.stores import MilvusStore

    folder = tmp_path / "proj.db"
    folder.mkdir()
    (folder / "aliases.json").write_text('{"mine": 1}')
    (folder / "LOCK").write_text("")
    with pytest.raises(ValueError, match="is a folder that is not a Milvus Lite database"):
        MilvusStore(str(folder), collection="kb").build(
            [Document(text="x", id_="x")], EMBED, embed_spec="d", max_length=64
        )
    assert sorted(p.name for p in folder.iterdir()) == ["LOCK", "aliases.json"]
    assert (folder / "aliases.json").read_text() == '{"mine": 1}'


def _small_docs() -> list[Document]:
    return [Document(text=DOCS[k], id_=k) for k in ("pto", "office")]


def _built_once(tmp_path: Path) -> tuple[str, Any, str]:
    """A first build of `_small_docs` at ``tmp_path/m.db``: the URI, a client of it and
    the build's physical collection."""
    from pymilvus import MilvusClient

    uri = str(tmp_path / "m.db")
    build_milvus_index(_small_docs(), EMBED, uri)
    client = MilvusClient(uri)
    [first] = client.list_collections()
    return uri, client, first


def test_a_rebuild_drops_only_its_own_builds_and_keeps_one_the_user_pinned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:

    uri, client, first = _built_once(tmp_path)
    mine = "hyde_plus__0123456789ab"  # named like a build, but the user's
    client.create_collection(mine, dimension=4)
    client.insert(mine, [{"id": 1, "vector": [0.5] * 4}])
    client.create_alias(first, "prod")
    with caplog.at_level(logging.WARNING):
        build_milvus_index(_small_docs(), EMBED, uri)
    assert client.query(mine, filter="id >= 0", output_fields=["id"]) == [{"id": 1}]
    assert client.describe_alias("prod")["collection_name"] == first
    assert first in caplog.text and "prod" in caplog.text
    assert f'MilvusClient("{uri}").drop_collection("{first}")' in caplog.text  # how to drop it
    index = load_milvus_index(uri, EMBED)  # the alias moved to the new build
    assert hybrid_retriever(index, 1).retrieve("Lisbon office")[0].node.node_id == "office"
    client.drop_alias("prod")  # unpinned, the old build is ours to drop on the next build
    build_milvus_index(_small_docs(), EMBED, uri)
    assert first not in client.list_collections() and mine in client.list_collections()


def test_a_collection_name_that_is_a_users_alias_is_refused_before_any_embedding(
    tmp_path: Path,
) -> None:
    from pymilvus import MilvusClient

    from llama_index_hyde_plus.stores import MilvusStore

    uri = str(tmp_path / "a.db")
    client = MilvusClient(uri)
    client.create_collection("mycol", dimension=4)
    client.create_alias("mycol", "docs")
    embedded: list[int] = []
    with pytest.raises(ValueError, match=r"alias 'docs' .*that hyde-plus did not make"):
        MilvusStore(uri, collection="docs").build(
            _small_docs(), EMBED, embed_spec="d", max_length=64, progress=embedded.append
        )
    assert embedded == [] and client.list_collections() == ["mycol"]
    assert client.describe_alias("docs")["collection_name"] == "mycol"


def test_a_build_that_fails_after_creating_its_collection_drops_it_and_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pymilvus import MilvusClient

    from llama_index_hyde_plus.stores import milvus_builds

    uri = str(tmp_path / "race.db")
    client = MilvusClient(uri)
    switch = milvus_builds.switch_alias

    def user_takes_the_name_first(*args: Any) -> None:  # just before the alias moves
        client.create_collection("mycol", dimension=4)
        client.create_alias("mycol", "kb")
        switch(*args)

    monkeypatch.setattr(milvus_builds, "switch_alias", user_takes_the_name_first)
    with pytest.raises(Exception, match="kb"):
        build_milvus_index(_small_docs(), EMBED, uri, collection="kb")
    assert client.list_collections() == ["mycol"]
    record = json.loads(Path(f"{uri}.kb.hyde_plus.json").read_text())
    assert record["collections"] == {}


def test_a_trailing_slash_names_the_same_database_and_record(tmp_path: Path) -> None:
    from llama_index_hyde_plus.stores import MilvusStore

    MilvusStore(f"{tmp_path / 'm.db'}/").build(_small_docs(), EMBED, embed_spec="d", max_length=64)
    assert (tmp_path / "m.db.hyde_plus.hyde_plus.json").is_file()
    assert not list((tmp_path / "m.db").glob("*hyde_plus.json"))
    meta = MilvusStore(str(tmp_path / "m.db")).meta()
    assert meta is not None and meta["documents"] == 2
    assert MilvusStore(f"{tmp_path / 'm.db'}//").meta() == meta


def test_an_old_record_file_never_gets_a_users_collection_dropped(tmp_path: Path) -> None:
    """A record beside the database saying hyde-plus built ``legacy`` before it used
    aliases (stale, or hand-written) does not make the user's ``legacy`` droppable."""
    from pymilvus import MilvusClient

    uri = str(tmp_path / "x.db")
    client = MilvusClient(uri)
    client.create_collection("legacy", dimension=4)
    client.insert("legacy", [{"id": 1, "vector": [0.1] * 4}])
    record = tmp_path / "x.db.legacy.hyde_plus.json"
    record.write_text('{"format": 1, "dim": 64, "embed": "det", "collection": "legacy"}')
    docs = [Document(text=t, id_=i) for i, t in DOCS.items()]
    with pytest.raises(ValueError, match="collection 'legacy' that hyde-plus did not make"):
        build_milvus_index(docs, EMBED, uri, collection="legacy")
    assert client.query("legacy", filter="id >= 0", output_fields=["id"]) != []
    assert client.list_collections() == ["legacy"]


def test_a_rebuild_drops_its_previous_build_whatever_was_written_into_it_reading_no_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build is hyde-plus's (its record lists it): rows upserted into it since do not
    make it the user's, and the rebuild reads no rows back to decide (with another
    model, nothing to copy: no row is read at all; with the same one, the rows are read
    once to copy unchanged vectors, and the row changed since is not taken)."""
    from pymilvus import MilvusClient

    from llama_index_hyde_plus.stores.row_keys import key_of

    uri, client, first = _built_once(tmp_path)
    row = client.query(first, filter=f'id == "{key_of("pto", "pto")}"', output_fields=["*"])[0]
    row = {k: v for k, v in row.items() if k != "sparse_embedding"}  # BM25 fills it
    client.upsert(first, [{**row, "text": "Employees receive thirty days of leave."}])
    reads: list[str] = []
    for name in ("query", "query_iterator", "search", "get"):
        real = getattr(MilvusClient, name)
        monkeypatch.setattr(
            MilvusClient,
            name,
            lambda self, *a, _n=name, _r=real, **k: reads.append(_n) or _r(self, *a, **k),
        )
    other = DeterministicEmbedding(dim=256, model_name="another-model")
    build_milvus_index(_small_docs(), other, uri)
    assert reads == []
    assert first not in client.list_collections() and len(client.list_collections()) == 1
    [second] = client.list_collections()
    row = client.query(second, filter=f'id == "{key_of("pto", "pto")}"', output_fields=["*"])[0]
    row = {k: v for k, v in row.items() if k != "sparse_embedding"}
    client.upsert(second, [{**row, "text": "Employees receive thirty days of leave."}])
    reads.clear()
    build_milvus_index(_small_docs(), other, uri)
    monkeypatch.undo()
    assert set(reads) == {"query_iterator"}
    assert second not in client.list_collections() and len(client.list_collections()) == 1
    [third] = client.list_collections()
    [pto] = client.query(third, filter=f'id == "{key_of("pto", "pto")}"', output_fields=["text"])
    assert pto["text"] == DOCS["pto"]  # embedded again from the document, not copied


_KILLED_BEFORE_SWITCH = """
import os, sys
from llama_index.core import Document
from llama_index_hyde_plus.stores import milvus_builds
from llama_index_hyde_plus.stores.milvus import build_milvus_index
from llama_index_hyde_plus.testing import DeterministicEmbedding

embed = DeterministicEmbedding(dim=256)
build_milvus_index([Document(text="Paid time off: 25 days.", id_="pto")], embed, sys.argv[1])
def killed(*args, **kwargs):  # every row written and recorded, the alias not moved
    os._exit(9)
milvus_builds.switch_alias = killed
docs = [Document(text="Laptops use full disk encryption.", id_="laptops")]
build_milvus_index(docs, embed, sys.argv[1])
"""


def test_a_build_killed_before_its_alias_switch_leaves_the_old_serving(tmp_path: Path) -> None:
    from pymilvus import MilvusClient

    uri = str(tmp_path / "m.db")
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_BEFORE_SWITCH, uri], capture_output=True, timeout=180
    )
    assert killed.returncode == 9, killed.stderr
    client = MilvusClient(uri)
    first = client.describe_alias("hyde_plus")["collection_name"]
    assert len(client.list_collections()) == 2
    index = load_milvus_index(uri, EMBED)
    assert hybrid_retriever(index, 1).retrieve("paid time off")[0].node.node_id == "pto"
    build_milvus_index(_small_docs(), EMBED, uri)  # drops both: the record lists them
    assert len(client.list_collections()) == 1
    assert first not in client.list_collections()


def test_an_alias_moved_to_the_users_collection_named_like_a_build_is_refused(
    tmp_path: Path,
) -> None:
    from pymilvus import MilvusClient

    from llama_index_hyde_plus.stores import MilvusStore

    uri = str(tmp_path / "m.db")
    build_milvus_index(_small_docs(), EMBED, uri)
    client = MilvusClient(uri)
    mine = "hyde_plus__0123456789ab"  # the user's, named like a build
    client.create_collection(mine, dimension=4)
    client.insert(mine, [{"id": 1, "vector": [0.5] * 4}])
    client.alter_alias(mine, "hyde_plus")
    unlisted = r"alias 'hyde_plus' .*did not make \(or its record does not list\)"
    with pytest.raises(ValueError, match=unlisted):
        MilvusStore(uri).check_target()
    with pytest.raises(ValueError, match=unlisted):
        build_milvus_index(_small_docs(), EMBED, uri)
    assert client.describe_alias("hyde_plus")["collection_name"] == mine
    assert len(client.list_collections()) == 2


def test_the_cli_refuses_a_users_alias_before_showing_any_progress(tmp_path: Path) -> None:
    from pymilvus import MilvusClient
    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app

    uri = str(tmp_path / "a.db")
    client = MilvusClient(uri)  # the user's collection and alias, in this process as the CLI
    client.create_collection("mycol", dimension=4)
    client.create_alias("mycol", "docs")
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("hello")
    args = ["index", str(folder), "--uri", uri, "--collection", "docs", "--embed", "local"]
    proc = CliRunner().invoke(app, args)
    assert proc.exit_code == 2 and isinstance(proc.exception, SystemExit), proc.exception
    assert "did not make" in proc.stderr and "Embedding" not in proc.stderr
    assert "Loading the embedding model" not in proc.stderr


_KILLED_MID_INSERT = """
import os, sys
from llama_index.core import Document
from llama_index_hyde_plus.stores.milvus import build_milvus_index
from llama_index_hyde_plus.stores.milvus_rows import KeyedMilvusVectorStore
from llama_index_hyde_plus.testing import DeterministicEmbedding

add = KeyedMilvusVectorStore.add
def killed(self, nodes, **kwargs):  # the first rows written, then kill -9
    add(self, nodes[:1], **kwargs)
    os._exit(9)
KeyedMilvusVectorStore.add = killed
docs = [Document(text=f"document number {i}", id_=str(i)) for i in range(3)]
build_milvus_index(docs, DeterministicEmbedding(dim=256), sys.argv[1])
"""


def test_a_build_killed_while_writing_rows_is_dropped_by_the_next_build(tmp_path: Path) -> None:
    from pymilvus import MilvusClient

    uri = str(tmp_path / "m.db")
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_MID_INSERT, uri], capture_output=True, timeout=180
    )
    assert killed.returncode == 9, killed.stderr
    record = json.loads(Path(f"{uri}.hyde_plus.hyde_plus.json").read_text())["collections"]
    [orphan] = record
    assert record[orphan]["writing"] is True
    build_milvus_index(_small_docs(), EMBED, uri)
    client = MilvusClient(uri)
    assert orphan not in client.list_collections() and len(client.list_collections()) == 1
    record = json.loads(Path(f"{uri}.hyde_plus.hyde_plus.json").read_text())["collections"]
    [(built, entry)] = record.items()
    assert built == client.describe_alias("hyde_plus")["collection_name"]
    assert "writing" not in entry and entry["chunks"] == 2


def test_a_record_that_cannot_be_written_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pymilvus import MilvusClient

    uri = str(tmp_path / "m.db")
    replace = os.replace

    def full_disk(src: str, dst: str) -> None:
        if str(dst).endswith(".hyde_plus.json"):
            raise OSError(28, "No space left on device")
        replace(src, dst)

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        build_milvus_index(_small_docs(), EMBED, uri)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    assert MilvusClient(uri).list_collections() == []  # nothing built without a record


@pytest.mark.local
def test_an_index_file_a_full_disk_left_empty_is_one_error_and_a_rebuild_keeps_the_build(
    tmp_path: Path,
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "pto.txt").write_text(MILVUS_DOCS["pto"])
    (docs / "lunch.txt").write_text(MILVUS_DOCS["lunch"])
    uri = str(tmp_path / "m.db")
    env = {**os.environ, "COLUMNS": "2000"}  # log lines unwrapped
    args = ["--uri", uri, "--embed", "local"]
    assert _cli("index", str(docs), *args, env=env).returncode == 0
    assert _fresh_query_ids(uri, "hyde_plus")  # loaded once: its index file is written
    [idx] = list(Path(uri).rglob("*.idx"))
    [first] = json.loads(Path(f"{uri}.hyde_plus.hyde_plus.json").read_text())["collections"]
    open(idx, "w").close()  # what a full disk leaves (no Milvus Lite running now)
    found = _cli("query", "paid time off", "--uri", uri, "-t", "none", env=env)
    assert found.returncode == 2 and "Traceback" not in found.stderr
    [line] = [x for x in found.stderr.splitlines() if x.strip()]
    assert line.startswith("error: Milvus cannot read collection 'hyde_plus'")
    assert "No data left in file" in line and str(idx) in line and "full disk" in line
    rebuilt = _cli("index", str(docs), *args, env=env)
    assert rebuilt.returncode == 0 and "Traceback" not in rebuilt.stderr
    assert sorted(_fresh_query_ids(uri, "hyde_plus")) == ["lunch.txt", "pto.txt"]
    from pymilvus import MilvusClient

    if first in MilvusClient(uri).list_collections():  # Milvus could not drop it: said so
        assert f"kept the replaced build {first}" in rebuilt.stderr


def test_a_damaged_or_missing_record_never_locks_the_collection_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from pymilvus import MilvusClient

    from llama_index_hyde_plus.stores import MilvusStore

    uri = str(tmp_path / "m.db")
    build_milvus_index(_small_docs(), EMBED, uri)
    record = Path(f"{uri}.hyde_plus.hyde_plus.json")
    [first] = json.loads(record.read_text())["collections"]
    record.write_text(record.read_text()[:60])  # truncated
    with pytest.raises(ValueError, match=r"is corrupt .*: move it aside"):
        read_milvus_meta(uri)  # what `query` reads
    with pytest.raises(ValueError, match="move it aside"):
        MilvusStore(uri).check_target()  # what `index` checks
    record.rename(tmp_path / "record.bad")
    MilvusStore(uri).check_target()
    with caplog.at_level(logging.WARNING):
        build_milvus_index(_small_docs(), EMBED, uri)
    client = MilvusClient(uri)
    assert first in client.list_collections()  # no record proves it ours: kept
    assert client.describe_alias("hyde_plus")["collection_name"] != first
    assert "the alias 'hyde_plus' pointed at" in caplog.text and first in caplog.text
    assert f'.drop_collection("{first}")' in caplog.text
    assert first not in json.loads(record.read_text())["collections"]


def test_a_rebuild_keeps_the_keys_the_user_added_to_the_record(tmp_path: Path) -> None:
    uri = str(tmp_path / "m.db")
    build_milvus_index(_small_docs(), EMBED, uri)
    record = Path(f"{uri}.hyde_plus.hyde_plus.json")
    record.write_text(json.dumps({**json.loads(record.read_text()), "owner": "data team"}))
    build_milvus_index(_small_docs(), EMBED, uri)
    assert json.loads(record.read_text())["owner"] == "data team"


def test_a_uri_that_is_a_users_file_is_one_error_before_milvus_lite_starts(
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app

    users = tmp_path / "app.db"
    users.write_bytes(b"SQLite format 3\x00")
    # in this process: the check comes before any model or Milvus Lite loads
    proc = CliRunner().invoke(app, ["query", "q", "--uri", str(users), "-t", "none"])
    assert proc.exit_code == 2 and isinstance(proc.exception, SystemExit), proc.exception
    assert proc.stderr.strip().startswith(f"error: --uri {users} is a file")
    assert "Traceback" not in proc.stderr and "FileExistsError" not in proc.stderr
    assert users.read_bytes() == b"SQLite format 3\x00"


def test_a_query_never_turns_a_users_folder_into_a_database(tmp_path: Path) -> None:
    from llama_index_hyde_plus.stores import MilvusStore

    folder = tmp_path / "notes.db"
    folder.mkdir()
    (folder / "aliases.json").write_text('{"mine": 1}')
    with pytest.raises(ValueError, match="not a Milvus Lite database"):
        load_milvus_index(str(folder), EMBED)
    with pytest.raises(ValueError, match="not a Milvus Lite database"):
        MilvusStore(str(folder))
    empty = tmp_path / "empty.db"
    empty.mkdir()
    with pytest.raises(ValueError, match="no Milvus Lite database"):
        load_milvus_index(str(empty), EMBED)
    assert sorted(p.name for p in folder.iterdir()) == ["aliases.json"]
    assert (folder / "aliases.json").read_text() == '{"mine": 1}'
    assert list(empty.iterdir()) == []


def test_every_spelling_of_one_database_shares_one_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llama_index_hyde_plus.stores import MilvusStore

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    build_milvus_index(_small_docs(), EMBED, "~/real.db")  # expanded, record beside it
    (tmp_path / "link.db").symlink_to("real.db")
    build_milvus_index(_small_docs(), EMBED, str(tmp_path / "link.db"))
    build_milvus_index(_small_docs(), EMBED, "real.db/")
    records = sorted(p.name for p in tmp_path.rglob("*.hyde_plus.json"))
    assert records == ["real.db.hyde_plus.hyde_plus.json"]
    assert not (tmp_path / "~").exists()
    assert MilvusStore("link.db").meta() == MilvusStore("~/real.db").meta() is not None


def test_a_missing_parent_folder_of_the_database_is_created(tmp_path: Path) -> None:
    uri = tmp_path / "new" / "deeper" / "m.db"
    build_milvus_index(_small_docs(), EMBED, str(uri))
    assert (uri / "databases").is_dir()
    hits = hybrid_retriever(load_milvus_index(str(uri), EMBED), 1).retrieve("Lisbon office")
    assert hits[0].node.node_id == "office"
