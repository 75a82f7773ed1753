"""RCP L2 from the spec (§7.6 rerank, §7.7 retrieve modes, §7.10-7.11 index writes):
modes on Milvus Lite and FAISS, a bi-encoder rerank, and a writable Milvus index (opt-in,
token-gated over HTTP) that upserts by id, deletes idempotently and loses nothing when
a write dies half-way. Driven by the official `rcp` client on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rcp
from llama_index.core import Document, VectorStoreIndex
from typer.testing import CliRunner

from llama_index_hyde_plus.chunking import Chunking
from llama_index_hyde_plus.cli import app
from llama_index_hyde_plus.server.http import RcpHttpServer
from llama_index_hyde_plus.server.index_writes import MilvusWriter
from llama_index_hyde_plus.server.rcp import TransformService, build_server
from llama_index_hyde_plus.testing import DeterministicEmbedding, echo_llm

from .conftest import DOCS

pytest.importorskip("pymilvus")

from llama_index_hyde_plus.stores.milvus import (
    MilvusHybridRetriever,
    MilvusStore,
    build_milvus_index,
    check_uri,
)

EMBED = DeterministicEmbedding(dim=64)
TOKEN = "l2-secret-token"


def milvus_service(index: VectorStoreIndex, writer: Any = None) -> TransformService:
    return TransformService(
        echo_llm(),
        MilvusHybridRetriever(index, 100, "hybrid"),
        modes=("hybrid", "dense", "sparse"),
        mode_retrievers={m: MilvusHybridRetriever(index, 100, m) for m in ("dense", "sparse")},
        embed_model=EMBED,
        writer=writer,
    )


def build(uri: str, docs: dict[str, str], chunking: Chunking | None = None) -> VectorStoreIndex:
    documents = [Document(text=t, id_=i) for i, t in docs.items()]
    return build_milvus_index(
        documents, EMBED, uri, collection="docs", embed_spec="det", chunking=chunking
    )


def serve(service: TransformService, token: str | None = None) -> RcpHttpServer:
    return RcpHttpServer(build_server(service, http=True), token=token).start()


def code_of(call: Any) -> tuple[int, Any]:
    with pytest.raises(rcp.RcpError) as info:
        call()
    return int(info.value.code), info.value.data


@pytest.fixture(scope="module")
def milvus_reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[rcp.Client]:
    index = build(str(tmp_path_factory.mktemp("read") / "read.db"), DOCS)
    server = serve(milvus_service(index))
    yield rcp.connect_http(server.url)
    server.stop()


def serve_writable(folder: Path) -> Iterator[tuple[rcp.Client, Any]]:
    """A client of a writable Milvus Lite index of DOCS in ``folder``, and the
    collection's client."""
    uri = str(folder / "w.db")
    index = build(uri, DOCS)
    writer = MilvusStore(uri, collection="docs").writer(index, EMBED)
    server = serve(milvus_service(index, writer))
    yield rcp.connect_http(server.url), writer
    server.stop()


@pytest.fixture
def writable(tmp_path: Path) -> Iterator[tuple[rcp.Client, Any]]:
    """A client of a writable Milvus Lite index of DOCS, and the collection's client."""
    yield from serve_writable(tmp_path)


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[rcp.Client, Any]]:
    """`writable`, shared by the tests of writes that are refused: each checks that
    its own refusal wrote nothing."""
    yield from serve_writable(tmp_path_factory.mktemp("refusing"))


def rows(writer: MilvusWriter) -> dict[str, str]:
    """Every row of the written collection: its node id (what a reader sees) -> text."""
    return node_rows(writer.store.client, writer.collection)


def node_rows(client: Any, collection: str) -> dict[str, str]:
    """Every row of ``collection``: its node id -> text."""
    found = client.query(
        collection, filter="", output_fields=["_node_content", "text"], limit=10_000
    )
    return {str(json.loads(r["_node_content"])["id_"]): str(r["text"]) for r in found}


def row_count(writer: MilvusWriter) -> int:
    """How many rows the collection holds (a duplicated id counts twice)."""
    found = writer.store.client.query(writer.collection, filter="", output_fields=["count(*)"])
    return int(found[0]["count(*)"])


# ── retrieve modes (§7.7) ────────────────────────────────────────────────────


def test_milvus_serves_every_mode_it_advertises(milvus_reader: rcp.Client) -> None:
    caps = milvus_reader.capabilities["retrieve"]
    assert caps["modes"] == ["hybrid", "dense", "sparse"] and caps["defaultMode"] == "hybrid"
    for mode in ("hybrid", "dense", "sparse"):
        found = milvus_reader.search("enterprise renewals slipped", 3, {"mode": mode})
        assert found["hits"][0]["id"] == "renewals", mode
        assert found["usage"]["mode"] == mode and len(found["hits"]) <= 3
        scores = [h["score"] for h in found["hits"]]
        assert scores == sorted(scores, reverse=True), mode


def test_sparse_is_bm25_alone(milvus_reader: rcp.Client) -> None:
    hits = milvus_reader.search("Berlin", 5, {"mode": "sparse"})["hits"]
    assert [h["id"] for h in hits] == ["hiring"]  # no other document has the word
    assert hits[0]["score"] > 0


def test_a_mode_that_is_not_advertised_is_option_unsupported(milvus_reader: rcp.Client) -> None:
    code, data = code_of(lambda: milvus_reader.search("renewals", 3, {"mode": "colbert"}))
    assert code == rcp.Errc.OPTION_UNSUPPORTED and data["option"] == "mode"
    assert data["supported"] == ["hybrid", "dense", "sparse"]
    code, _ = code_of(lambda: milvus_reader.search("renewals", 3, {"mode": 3}))
    assert code == rcp.Errc.INVALID_PARAMS


def test_strict_false_falls_back_to_the_default_mode_and_says_so(
    milvus_reader: rcp.Client,
) -> None:
    found = milvus_reader.search("renewals", 3, {"mode": "colbert", "strict": False})
    assert found["hits"] and found["usage"]["mode"] == "hybrid"
    assert "colbert" in found["usage"]["notes"][0]


def test_faiss_serves_dense_and_refuses_hybrid(faiss_index: VectorStoreIndex) -> None:
    service = TransformService(
        echo_llm(), faiss_index.as_retriever(similarity_top_k=10), embed_model=EMBED
    )
    server = serve(service)
    try:
        client = rcp.connect_http(server.url)
        assert client.capabilities["retrieve"]["modes"] == ["dense"]
        assert "index" not in client.capabilities  # read-only: not writable
        assert client.search("renewals slipped", 2, {"mode": "dense"})["hits"]
        code, _ = code_of(lambda: client.search("renewals", 2, {"mode": "hybrid"}))
        assert code == rcp.Errc.OPTION_UNSUPPORTED
    finally:
        server.stop()


# ── rerank (§7.6) ────────────────────────────────────────────────────────────

PASSAGES = [
    "The Lisbon office moved near the river.",
    "Enterprise renewals slipped last quarter.",
    "Renewals slipped.",
    "Paid time off is twenty five days.",
]


def test_rerank_scores_passages_by_cosine_to_the_query(milvus_reader: rcp.Client) -> None:
    result = milvus_reader.call("rerank", {"query": "renewals slipped", "passages": PASSAGES})
    scores = result["scores"]
    assert len(scores) == len(PASSAGES)  # scores[i] is passages[i]
    expected = [EMBED.vector("renewals slipped") @ _v(p) for p in PASSAGES]
    assert scores == pytest.approx(expected, abs=1e-6)
    assert result["order"][:2] == [2, 1] and set(result["order"]) == {0, 1, 2, 3}
    ranked = [r["score"] for r in result["results"]]
    assert ranked == sorted(ranked, reverse=True)


def _v(text: str) -> Any:
    import numpy as np

    return np.asarray(EMBED.vector(text))


def test_rerank_honours_top_n_and_the_documents_synonym(milvus_reader: rcp.Client) -> None:
    result = milvus_reader.call(
        "rerank", {"query": "renewals slipped", "documents": PASSAGES, "topN": 2}
    )
    assert result["order"] == [2, 1] and [r["index"] for r in result["results"]] == [2, 1]
    assert len(result["scores"]) == len(PASSAGES)


def test_rerank_says_it_is_a_bi_encoder_and_refuses_a_method(milvus_reader: rcp.Client) -> None:
    caps = milvus_reader.capabilities["rerank"]
    assert caps["methods"] == [] and caps["x-hyde-plus"]["scoring"] == "bi-encoder"
    code, data = code_of(
        lambda: milvus_reader.call(
            "rerank", {"query": "q", "passages": ["a"], "method": "cross-encoder"}
        )
    )
    assert code == rcp.Errc.OPTION_UNSUPPORTED and data["option"] == "method"
    for bad in ({"query": "q"}, {"query": "q", "passages": "a"}, {"query": "q", "passages": [1]}):
        assert code_of(lambda b=bad: milvus_reader.call("rerank", b))[0] == rcp.Errc.INVALID_PARAMS


def test_a_transform_only_server_with_an_embedding_model_offers_rerank() -> None:
    server = serve(TransformService(echo_llm(), embed_model=EMBED))
    try:
        client = rcp.connect_http(server.url)
        assert "rerank" in client.capabilities and "retrieve" not in client.capabilities
        assert client.rerank("renewals slipped", PASSAGES)[2] > 0.99
    finally:
        server.stop()
    bare = serve(TransformService(echo_llm()))
    try:
        assert "rerank" not in rcp.connect_http(bare.url).capabilities
    finally:
        bare.stop()


def test_the_declared_level_follows_what_is_offered(faiss_index: VectorStoreIndex) -> None:
    retriever = faiss_index.as_retriever()
    for service, level in (
        (TransformService(echo_llm(), embed_model=EMBED), "L0"),
        (TransformService(echo_llm(), retriever), "L1"),
        (TransformService(echo_llm(), retriever, embed_model=EMBED), "L2"),
    ):
        reply = build_server(service).handle(
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
        )
        assert reply["result"]["_meta"]["conformance"] == level


# ── writable index (§7.10, §7.11) ────────────────────────────────────────────


def test_index_is_absent_unless_writable(milvus_reader: rcp.Client) -> None:
    assert "index" not in milvus_reader.capabilities
    code, _ = code_of(lambda: milvus_reader.index_add({"documents": []}))
    assert code == rcp.Errc.CAPABILITY_MISSING


def test_add_returns_positional_ids_and_the_documents_are_found(
    writable: tuple[rcp.Client, MilvusWriter],
) -> None:
    client, _ = writable
    assert client.capabilities["index"] == {
        "writable": True,
        "chunking": False,
        "contextual": False,
    }
    docs = [
        {"id": "zebra", "text": "Zebras graze on the savanna grass.", "meta": {"src": "z"}},
        {"text": "Quokkas smile on Rottnest island."},
        {"id": "otter", "text": "Otters hold hands while sleeping."},
    ]
    result = client.index_add({"documents": docs})
    assert result["ids"][0] == "zebra" and result["ids"][2] == "otter"
    assert len(result["ids"]) == 3 and result["ids"][1] not in ("zebra", "otter")
    assert result["chunks"] == 3
    hit = client.search("zebras graze savanna", 1, {"mode": "dense"})["hits"][0]
    assert hit["id"] == "zebra" and "savanna" in hit["text"]
    assert client.search("quokkas smile", 1)["hits"][0]["id"] == result["ids"][1]


def test_re_adding_an_id_replaces_the_document(
    writable: tuple[rcp.Client, MilvusWriter], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pymilvus import MilvusClient

    def insert(*args: Any, **kwargs: Any) -> None:
        # Milvus Lite keeps the last row of an id either way; a cluster keeps both
        raise AssertionError("an insert would duplicate the id on a Milvus cluster")

    monkeypatch.setattr(MilvusClient, "insert", insert)
    client, writer = writable
    before = row_count(writer)
    client.index_add({"documents": [{"id": "pto", "text": "Holidays: thirty days a year."}]})
    again = {"documents": [{"id": "pto", "text": "Holidays: thirty days a year."}]}
    assert client.index_add(again)["ids"] == ["pto"]  # the same write twice: one document
    assert row_count(writer) == before == len(DOCS)
    assert rows(writer)["pto"] == "Holidays: thirty days a year."
    hits = client.search("holidays thirty days", 7, {"mode": "dense"})["hits"]
    assert [h["text"] for h in hits if h["id"] == "pto"] == ["Holidays: thirty days a year."]


def test_delete_is_idempotent_and_counts_documents_removed(
    writable: tuple[rcp.Client, MilvusWriter],
) -> None:
    client, writer = writable
    assert client.index_delete({"ids": ["pto", "lunch", "never-there"]}) == {"deleted": 2}
    assert client.index_delete({"ids": ["pto", "lunch"]}) == {"deleted": 0}
    assert client.index_delete({"ids": []}) == {"deleted": 0}
    assert "pto" not in rows(writer) and "lunch" not in rows(writer)
    hits = client.search("paid time off each year", 10, {"mode": "dense"})["hits"]
    assert "pto" not in {h["id"] for h in hits}


def test_a_rebuild_after_writes_still_replaces_the_build(
    writable: tuple[rcp.Client, MilvusWriter], tmp_path: Path
) -> None:
    """The build is hyde-plus's whatever was written into it since: a rebuild drops it
    (it reads no rows back to decide)."""
    client, writer = writable
    client.index_add({"documents": [{"id": "new", "text": "Fresh words about owls."}]})
    client.index_delete({"ids": ["office"]})
    uri = check_uri(str(tmp_path / "w.db"))  # the fixture's database
    written = writer.collection
    build(uri, DOCS)
    assert written not in writer.store.client.list_collections()


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"documents": [{"id": "a"}]}, rcp.Errc.INVALID_PARAMS),
        ({"documents": [{"id": "a", "text": "  "}]}, rcp.Errc.INVALID_PARAMS),
        ({"documents": [{"id": 5, "text": "t"}]}, rcp.Errc.INVALID_PARAMS),
        ({"documents": [{"id": "a#2", "text": "t"}]}, rcp.Errc.INVALID_PARAMS),
        ({"documents": [{"id": "a", "text": "t"}, {"id": "a", "text": "u"}]}, -32602),
        ({"documents": [{"id": "a", "text": "t", "meta": {"doc_id": "x"}}]}, -32602),
        ({"documents": "a"}, rcp.Errc.INVALID_PARAMS),
        ({}, rcp.Errc.INVALID_PARAMS),
        ({"documents": [{"id": "a", "text": "t"}] * 257}, rcp.Errc.PAYLOAD_TOO_LARGE),
        ({"documents": [{"id": "a", "text": "x" * 100_000}]}, -32602),
        ({"documents": [{"id": "a", "text": "t", "meta": {"$meta": 1}}]}, -32602),
        ({"documents": [{"id": "a", "text": "t", "meta": {"n": -(2**63) - 1}}]}, -32602),
        ({"documents": [{"id": "a", "text": "t", "meta": {"n": [2**64]}}]}, -32602),
        ({"documents": [{"id": "a\ud800", "text": "t"}]}, -32602),
        ({"documents": [], "chunk": True}, rcp.Errc.OPTION_UNSUPPORTED),
        ({"documents": [], "contextual": True}, rcp.Errc.OPTION_UNSUPPORTED),
        ({"documents": [], "upsert": True}, rcp.Errc.OPTION_UNSUPPORTED),
    ],
)
def test_malformed_adds_are_refused_and_write_nothing(
    refusing: tuple[rcp.Client, MilvusWriter], params: dict[str, Any], code: int
) -> None:
    client, writer = refusing
    before = rows(writer)
    assert code_of(lambda: client.index_add(params))[0] == code
    assert rows(writer) == before


def test_a_chunked_index_chunks_added_documents_and_upserts_all_their_chunks(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "c.db")
    index = build(uri, DOCS, Chunking(20, 2))
    writer = MilvusStore(uri, collection="docs").writer(index, EMBED)
    assert writer.chunking == Chunking(20, 2)  # as the build recorded it
    server = serve(milvus_service(index, writer))
    try:
        client = rcp.connect_http(server.url)
        assert client.capabilities["index"]["chunking"] is True
        long_text = " ".join(f"Sentence {n} speaks of the tide and the harbour." for n in range(12))
        result = client.index_add({"documents": [{"id": "long", "text": long_text}]})
        chunks = sorted(i for i in rows(writer) if i.startswith("long#"))
        assert result == {"ids": ["long"], "chunks": len(chunks)} and len(chunks) > 2
        client.index_add({"documents": [{"id": "long", "text": "Now short."}]})
        assert [i for i in rows(writer) if i.startswith("long")] == ["long"]  # stale chunks gone
        client.index_add({"documents": [{"id": "long", "text": long_text}]})
        assert client.index_delete({"ids": ["long"]}) == {"deleted": 1}
        assert not [i for i in rows(writer) if i.startswith("long")]
    finally:
        server.stop()


#: Ids a hostile client writes: a filter injection, a Windows path, a control
#: character, an apostrophe, double quotes and a character outside the BMP.
HOSTILE_IDS = [
    "x'] or id not in ['",
    'x"] or id not in ["',
    "C:\\new\\notes.txt",
    "ctl\x01id",
    "notes/O'Brien.txt",
    'say "hi" \U0001f600',
]


def test_ids_of_any_characters_are_added_and_deleted_touching_nothing_else(
    writable: tuple[rcp.Client, MilvusWriter],
) -> None:
    client, writer = writable
    built = rows(writer)
    assert client.index_delete({"ids": HOSTILE_IDS}) == {"deleted": 0}
    assert rows(writer) == built  # deleting what is not there deletes nothing
    docs = [
        {"id": i, "text": f"Walruses number {n} bask on the ice."}
        for n, i in enumerate(HOSTILE_IDS)
    ]
    assert client.index_add({"documents": docs})["ids"] == HOSTILE_IDS
    assert rows(writer) == {**built, **{d["id"]: d["text"] for d in docs}}
    hits = client.search("walruses bask on the ice", 20, {"mode": "dense"})["hits"]
    assert set(HOSTILE_IDS) <= {h["id"] for h in hits}
    for n, doc_id in enumerate(HOSTILE_IDS):
        assert client.index_delete({"ids": [doc_id]}) == {"deleted": 1}, doc_id
        left = {d["id"]: d["text"] for d in docs[n + 1 :]}
        assert rows(writer) == {**built, **left}, doc_id
    hits = client.search("walruses bask on the ice", 20, {"mode": "dense"})["hits"]
    assert not set(HOSTILE_IDS) & {h["id"] for h in hits}


def test_a_chunked_write_never_replaces_another_documents_rows(tmp_path: Path) -> None:
    """A chunk of ``guide`` is ``guide#1``: a build may hold a document of that id
    (from ``.jsonl``), which the write must neither replace nor shadow; and a quote in
    an id whose shorter version drops stale chunks touches no other row."""
    uri = str(tmp_path / "g.db")
    built_docs = {**DOCS, "guide#1": "The first guide page.", "guide#2": "The second page."}
    index = build(uri, built_docs, Chunking(20, 2))
    writer = MilvusStore(uri, collection="docs").writer(index, EMBED)
    server = serve(milvus_service(index, writer))
    try:
        client = rcp.connect_http(server.url)
        before = rows(writer)
        long_text = " ".join(f"Sentence {n} speaks of the tide and the harbour." for n in range(12))
        code, data = code_of(
            lambda: client.index_add({"documents": [{"id": "guide", "text": long_text}]})
        )
        assert (code, data["field"]) == (rcp.Errc.INVALID_PARAMS, "documents[0].id")
        assert rows(writer) == before
        quoted = "x'] or id not in ['"
        client.index_add({"documents": [{"id": quoted, "text": long_text}]})
        client.index_add({"documents": [{"id": quoted, "text": "Now short."}]})
        assert rows(writer) == {**before, quoted: "Now short."}
        assert client.index_delete({"ids": ["guide#1"]}) == {"deleted": 1}
        del before["guide#1"]
        assert rows(writer) == {**before, quoted: "Now short."}
    finally:
        server.stop()


def test_a_reader_never_sees_two_versions_of_a_replaced_document(tmp_path: Path) -> None:
    import threading

    uri = str(tmp_path / "v.db")
    versions = [  # of different lengths: a replacement upserts some chunks, deletes others
        " ".join(f"Sentence {n} of the {word} version tells of the harbour." for n in range(size))
        for word, size in (("alpha", 16), ("omega", 6))
    ]
    index = build(uri, {**DOCS, "doc": versions[0]}, Chunking(20, 2))
    writer = MilvusStore(uri, collection="docs").writer(index, EMBED)
    retriever = MilvusHybridRetriever(index, 100, "sparse")
    done = threading.Event()
    mixed: list[set[str]] = []
    reads = 0

    def read() -> None:
        nonlocal reads
        while not done.is_set():
            hits = retriever.retrieve("harbour version sentence")
            seen = {w for h in hits for w in ("alpha", "omega") if w in h.node.get_content()}
            reads += 1
            if len(seen) > 1:
                mixed.append(seen)

    from llama_index_hyde_plus.server.index_writes import NewDocument

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    try:
        for n in range(30):
            writer.add([NewDocument("doc", versions[(n + 1) % 2])])
    finally:
        done.set()
        for t in readers:
            t.join(30)
    assert reads > 30 and not mixed


def test_an_index_without_row_keys_is_refused_writes_and_keeps_serving(tmp_path: Path) -> None:
    """A collection built before derived row keys can only be written by pasting ids:
    ``--writable`` is refused with the rebuild to run; it still serves reads."""
    from llama_index.core import StorageContext
    from llama_index.vector_stores.milvus import MilvusVectorStore

    uri = str(tmp_path / "old.db")
    store = MilvusVectorStore(uri=uri, collection_name="docs", dim=64, overwrite=True)
    storage = StorageContext.from_defaults(vector_store=store)
    old = VectorStoreIndex(
        [Document(text=t, id_=i) for i, t in DOCS.items()],
        storage_context=storage,
        embed_model=EMBED,
    )
    with pytest.raises(ValueError, match=r"older hyde-plus.*Rebuild it with `hyde-plus index"):
        MilvusWriter(old, EMBED, None)
    assert len(old.as_retriever(similarity_top_k=3).retrieve("renewals slipped")) == 3


# ── nothing lost when a write dies half-way ──────────────────────────────────


def test_a_write_that_dies_before_writing_leaves_the_old_document_whole(
    writable: tuple[rcp.Client, MilvusWriter], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, writer = writable
    before = rows(writer)

    def broken(*args: Any, **kwargs: Any) -> list[list[float]]:
        raise RuntimeError("embedding backend died")

    monkeypatch.setattr(DeterministicEmbedding, "get_text_embedding_batch", broken)
    code, _ = code_of(
        lambda: client.index_add({"documents": [{"id": "pto", "text": "Replaced text."}]})
    )
    assert code == rcp.Errc.INTERNAL_ERROR
    assert rows(writer) == before


def test_a_write_that_dies_after_the_upsert_loses_nothing_and_a_retry_heals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "k.db")
    long_text = " ".join(f"Line {n} is about the lighthouse keeper." for n in range(12))
    index = build(uri, {**DOCS, "long": long_text}, Chunking(20, 2))
    writer = MilvusStore(uri, collection="docs").writer(index, EMBED)
    others = {i: t for i, t in rows(writer).items() if not i.startswith("long")}

    def dies(self: MilvusWriter, *args: Any) -> None:
        raise KeyboardInterrupt  # the process stopped between the two steps

    from llama_index_hyde_plus.server.index_writes import NewDocument

    monkeypatch.setattr(MilvusWriter, "_drop_stale", dies)
    with pytest.raises(KeyboardInterrupt):
        writer.add([NewDocument("long", "The keeper retired.")])
    after = rows(writer)
    assert after["long"] == "The keeper retired."  # the new version is in
    assert {i: t for i, t in after.items() if not i.startswith("long")} == others
    monkeypatch.undo()
    writer.add([NewDocument("long", "The keeper retired.")])  # the client's retry
    assert [i for i in rows(writer) if i.startswith("long")] == ["long"]


def test_a_killed_server_keeps_every_acknowledged_write(tmp_path: Path) -> None:
    """Writes are flushed before they are answered: a server killed right after
    (SIGKILL, no shutdown) loses none of them."""
    uri = str(tmp_path / "kill.db")  # Milvus Lite: one process per database at a time
    code = f"""
import sys
from llama_index.core import Document
from llama_index_hyde_plus.stores.milvus import MilvusStore, build_milvus_index
from llama_index_hyde_plus.server.index_writes import NewDocument
from llama_index_hyde_plus.testing import DeterministicEmbedding
e = DeterministicEmbedding(dim=64)
docs = [Document(text="Alpha text.", id_="a"), Document(text="Beta text.", id_="b")]
index = build_milvus_index(docs, e, {uri!r}, collection="docs", embed_spec="det")
w = MilvusStore({uri!r}, collection="docs").writer(index, e)
w.add([NewDocument("c", "Gamma text."), NewDocument("a", "Alpha replaced.")])
w.delete(["b"])
print("acknowledged", flush=True)
sys.stdin.readline()
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "acknowledged"
    finally:
        proc.kill()
        proc.wait(30)
    store = MilvusStore(uri, collection="docs")
    index = store.load(EMBED)
    found = node_rows(index.vector_store.client, index.vector_store.collection_name)
    assert found == {"a": "Alpha replaced.", "c": "Gamma text."}


# ── gating: opt-in, and a token over HTTP ────────────────────────────────────


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["serve", *args], env={"COLUMNS": "200"})
    return result.exit_code, result.output


def test_writable_over_http_needs_a_token(tmp_path: Path) -> None:
    code, out = cli("--http", "0", "--uri", str(tmp_path / "x.db"), "--writable")
    assert code == 2 and "--writable" in out and "--token" in out


def test_writable_needs_an_index() -> None:
    code, out = cli("--stdio", "--writable")
    assert code == 2 and "--writable needs an index" in out


def test_a_faiss_index_cannot_be_served_writable(tmp_path: Path) -> None:
    from llama_index_hyde_plus.stores.faiss import FaissStore

    with pytest.raises(ValueError, match="read-only"):
        FaissStore(tmp_path).writer(None, EMBED)  # type: ignore[arg-type]


def post(url: str, body: dict[str, Any], token: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_over_http_with_a_token_only_its_holder_writes(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.db")
    index = build(uri, DOCS)
    writer = MilvusStore(uri, collection="docs").writer(index, EMBED)
    server = serve(milvus_service(index, writer), token=TOKEN)
    try:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
        add = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "index/add",
            "params": {"documents": [{"id": "intruder", "text": "Spam."}]},
        }
        assert post(server.url, init, TOKEN)[0] == 200
        status, body = post(server.url, add, None)
        assert status == 401 and body["error"]["code"] == rcp.Errc.UNAUTHORIZED
        assert "intruder" not in rows(writer)
        status, body = post(server.url, add, TOKEN)
        assert status == 200 and body["result"]["ids"] == ["intruder"]
    finally:
        server.stop()


# ── the real `hyde-plus serve --stdio --writable`, over the official client ─────


def hyde_plus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llama_index_hyde_plus.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    for name, text in DOCS.items():
        (folder / f"{name}.txt").write_text(text)
    return folder


def test_serve_stdio_writable_milvus_upserts_and_deletes(corpus: Path, tmp_path: Path) -> None:
    uri = str(tmp_path / "served.db")
    built = hyde_plus("index", str(corpus), "--store", "milvus", "--uri", uri)
    assert built.returncode == 0, built.stderr
    serve_argv = ["serve", "--stdio", "--uri", uri, "--writable", "--llm", "scripted"]
    client = rcp.connect_stdio([sys.executable, "-m", "llama_index_hyde_plus.cli", *serve_argv])
    try:
        caps = client.capabilities
        assert caps["index"]["writable"] is True and caps["index"]["chunking"] is True
        assert caps["retrieve"]["modes"] == ["hybrid", "dense", "sparse"] and "rerank" in caps
        doc = {"id": "kb://tides", "text": "Spring tides follow the new and full moon."}
        assert client.index_add({"documents": [doc]}) == {"ids": ["kb://tides"], "chunks": 1}
        doc2 = {**doc, "text": "Neap tides follow the quarter moons."}
        assert client.index_add({"documents": [doc2]})["ids"] == ["kb://tides"]
        hits = client.search("neap tides quarter moons", 3, {"mode": "hybrid"})["hits"]
        assert [h["text"] for h in hits if h["id"] == "kb://tides"] == [doc2["text"]]
        assert client.index_delete({"ids": ["kb://tides"]}) == {"deleted": 1}
        assert client.index_delete({"ids": ["kb://tides"]}) == {"deleted": 0}
        scores = client.rerank("neap tides", ["moon tides neap", "office lunch"])
        assert scores[0] > scores[1]
    finally:
        client.shutdown()


def test_serve_refuses_to_serve_a_faiss_index_writable(corpus: Path, tmp_path: Path) -> None:
    folder = tmp_path / "faiss"
    built = CliRunner().invoke(app, ["index", str(corpus), "--out", str(folder)])  # in-process
    assert built.exit_code == 0, built.output
    served = hyde_plus(
        "serve", "--stdio", "--index", str(folder), "--writable", "--llm", "scripted"
    )
    assert served.returncode == 2 and "read-only" in served.stderr and "--writable" in served.stderr
