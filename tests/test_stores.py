from __future__ import annotations

from pathlib import Path

import pytest
from llama_index.core import Document

from llama_index_hyde_plus.stores import FaissStore, MilvusStore, open_store, store_for
from llama_index_hyde_plus.testing import DeterministicEmbedding

from .conftest import DOCS

EMBED = DeterministicEmbedding(dim=64)
DOCUMENTS = [Document(text=text, id_=doc_id) for doc_id, text in DOCS.items()]


def test_a_faiss_store_builds_records_and_searches(tmp_path: Path) -> None:
    store = FaissStore(tmp_path / "index")
    assert store.meta() is None and store.modes == ("dense",)
    seen: list[int] = []
    info = store.build(
        DOCUMENTS, EMBED, embed_spec="deterministic", max_length=128, progress=seen.append
    )
    assert (info.documents, info.dim, info.location) == (len(DOCS), 64, str(store.path))
    assert sum(seen) == len(DOCS)
    meta = store.meta()
    assert meta is not None and meta["embed"] == "deterministic" and meta["max_length"] == 128
    retriever = store.retriever(store.load(EMBED), 2)
    hits = retriever.retrieve("Why did revenue drop?")
    assert len(hits) == 2 and hits[0].node.node_id in DOCS


def test_a_faiss_store_refuses_to_build_over_the_documents(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("a document")
    with pytest.raises(ValueError):
        FaissStore(docs).check_target(docs)


def test_opening_a_missing_faiss_index_names_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nothing does not exist; build one with"):
        FaissStore(tmp_path / "nothing").open(3)


def test_open_store_takes_exactly_one_of_index_and_uri(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        open_store()
    with pytest.raises(ValueError, match="exactly one"):
        open_store(index=tmp_path, uri=str(tmp_path / "m.db"))
    assert isinstance(open_store(index=tmp_path), FaissStore)
    milvus = open_store(uri=str(tmp_path / "m.db"), collection="docs")
    assert isinstance(milvus, MilvusStore) and milvus.collection == "docs"


def test_store_for_names_a_corpus_in_each_kind(tmp_path: Path) -> None:
    faiss = store_for("faiss", "scifact-1", root=tmp_path)
    assert isinstance(faiss, FaissStore) and faiss.path == tmp_path / "indexes" / "scifact-1"
    milvus = store_for("milvus", "scifact_1", root=tmp_path, uri=str(tmp_path / "m.db"))
    assert isinstance(milvus, MilvusStore) and milvus.modes == ("hybrid", "dense", "sparse")
    with pytest.raises(ValueError, match="needs --uri"):
        store_for("milvus", "x", root=tmp_path)
    with pytest.raises(ValueError, match="--store must be one of faiss, milvus"):
        store_for("qdrant", "x", root=tmp_path)


def test_a_milvus_store_builds_a_hybrid_collection_and_reports_it(tmp_path: Path) -> None:
    store = MilvusStore(str(tmp_path / "m.db"), collection="docs")
    info = store.build(DOCUMENTS, EMBED, embed_spec="deterministic", max_length=128)
    assert info.documents == len(DOCS) and info.dim == 64
    assert "collection 'docs'" in info.location
    meta = store.meta()
    assert meta is not None and meta["embed"] == "deterministic"
    hits = store.retriever(store.load(EMBED), 2).retrieve("paid time off")
    assert len(hits) == 2 and hits[0].node.node_id == "pto"


def test_a_store_reads_an_evaluation_label_as_spec_and_length(tmp_path: Path) -> None:
    store = FaissStore(tmp_path / "index")
    store.build(DOCUMENTS, EMBED, embed_spec="deterministic@64", max_length=0)
    with pytest.raises(ValueError, match="unknown model choice 'deterministic'"):
        store.embedding_model()  # the "@64" suffix is not part of the model name


LONG = Document(text=" ".join(f"Sentence {i} of the long report." for i in range(200)), id_="long")


def test_a_store_build_keeps_one_node_per_document_unless_asked_to_chunk(tmp_path: Path) -> None:
    """Evaluation (BEIR) scores by document id, so its builds are not chunked."""
    from llama_index_hyde_plus.chunking import Chunking

    whole = FaissStore(tmp_path / "whole")
    info = whole.build([LONG, *DOCUMENTS], EMBED, embed_spec="det", max_length=256)
    assert info.chunks == info.documents == len(DOCUMENTS) + 1
    assert whole.meta()["chunking"] is None  # type: ignore[index]
    ids = set(whole.load(EMBED).index_struct.nodes_dict.values())
    assert "long" in ids

    chunked = FaissStore(tmp_path / "chunked")
    info = chunked.build(
        [LONG, *DOCUMENTS], EMBED, embed_spec="det", max_length=256, chunking=Chunking(100, 10)
    )
    meta = chunked.meta() or {}
    assert info.documents == len(DOCUMENTS) + 1 and info.chunks > info.documents
    assert meta["chunks"] == info.chunks and meta["chunking"]["chunk_size"] == 100
    ids = set(chunked.load(EMBED).index_struct.nodes_dict.values())
    assert "long" not in ids and {"long#1", "long#2", "pto"} <= ids


# -- one place chooses a store ------------------------------------------------------
def test_every_store_kind_has_one_class_and_back() -> None:
    from llama_index_hyde_plus.stores import STORE_KINDS
    from llama_index_hyde_plus.stores.choice import store_classes

    classes = store_classes()
    assert tuple(classes) == STORE_KINDS
    assert all(cls.kind == kind for kind, cls in classes.items())


def test_vector_store_kind_knows_subclasses_and_nothing_else() -> None:
    from llama_index.vector_stores.faiss import FaissVectorStore

    from llama_index_hyde_plus.stores.choice import vector_store_kind

    class Mine(FaissVectorStore):
        pass

    assert vector_store_kind(Mine.__new__(Mine)) == "faiss"
    assert vector_store_kind(object()) is None and vector_store_kind(None) is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"store": None, "uri": None, "path": None}, "--out is needed"),
        ({"store": None, "uri": "m.db", "path": Path("x")}, "--out is for the FAISS"),
        ({"store": "faiss", "uri": "m.db", "path": Path("x")}, "--uri is for the Milvus"),
        ({"store": "milvus", "uri": None, "path": None}, "needs --uri"),
        ({"store": "chroma", "uri": None, "path": Path("x")}, "--store must be one of"),
    ],
)
def test_store_kind_names_the_flags_that_disagree(flags: dict, message: str) -> None:
    from llama_index_hyde_plus.stores import store_kind

    with pytest.raises(ValueError, match=message):
        store_kind(flags["store"], flags["uri"], path=flags["path"], path_flag="--out")


def test_make_store_builds_the_kind_store_kind_chose(tmp_path: Path) -> None:
    from llama_index_hyde_plus.stores import FaissStore, make_store, store_kind

    kind = store_kind(None, None, path=tmp_path, path_flag="--out")
    store = make_store(kind, path=tmp_path, uri=None)
    assert isinstance(store, FaissStore) and store.path == tmp_path


def test_kind_at_maps_a_folder_or_a_uri_to_its_store(tmp_path: Path) -> None:
    from llama_index_hyde_plus.stores import kind_at

    built = tmp_path / "idx"
    FaissStore(built).build(
        [Document(text=t, id_=i) for i, t in DOCS.items()],
        DeterministicEmbedding(dim=16),
        embed_spec="test",
        max_length=64,
    )
    assert kind_at(built) == "faiss" and FaissStore.recognises(built)
    assert kind_at(tmp_path / "not-yet") == "faiss"  # a new folder: the folder default
    assert kind_at(uri="hybrid.db") == "milvus"
    assert not FaissStore.recognises(tmp_path)
