"""An index folder has a stable path, ``current``, that plain LlamaIndex opens after
any number of atomic rebuilds (the data folder itself is renamed on every build)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from llama_index.core import Document, StorageContext, load_index_from_storage
from llama_index.vector_stores.faiss import FaissVectorStore

from llama_index_hyde_plus._owned import MARKER
from llama_index_hyde_plus.stores import FaissStore
from llama_index_hyde_plus.stores.faiss import read_meta
from llama_index_hyde_plus.stores.faiss_folder import CURRENT_LINK
from llama_index_hyde_plus.testing import DeterministicEmbedding

VERSIONS = [
    {"backup": "The nightly backup window closes at 04:00 UTC."},
    {"pto": "Employees receive twenty five days of paid time off each year."},
    {"lisbon": "The Lisbon office moved to a larger building near the river."},
]


def _open_with_plain_llama_index(path: Path, embed: DeterministicEmbedding) -> list[str]:
    """What an app that hard-codes ``path`` finds for a question about the office."""
    vector_store = FaissVectorStore.from_persist_dir(str(path))
    storage = StorageContext.from_defaults(persist_dir=str(path), vector_store=vector_store)
    index = load_index_from_storage(storage, embed_model=embed)
    nodes = index.as_retriever(similarity_top_k=3).retrieve("Where did the Lisbon office move?")
    return [n.node.node_id for n in nodes]


def test_plain_llama_index_opens_the_stable_path_after_two_rebuilds(tmp_path: Path) -> None:
    embed = DeterministicEmbedding(dim=64)
    out = tmp_path / "my-index"
    store = FaissStore(out)
    data_folders = []
    for version in VERSIONS:  # one build, then two rebuilds
        docs = [Document(text=text, id_=doc_id) for doc_id, text in version.items()]
        store.build(docs, embed, embed_spec="deterministic", max_length=256)
        data_folders.append(read_meta(out)["data"])
        link = out / CURRENT_LINK
        assert link.is_symlink() and os.readlink(link) == data_folders[-1]  # relative
    assert len(set(data_folders)) == 3  # the data folder moved each time
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [MARKER, CURRENT_LINK, data_folders[-1], "hyde_plus.json"]
    )  # the old data and every temporary link are gone
    assert _open_with_plain_llama_index(out / CURRENT_LINK, embed) == ["lisbon"]

    moved = tmp_path / "elsewhere"
    out.rename(moved)  # the link is relative: the folder can be moved or copied
    assert _open_with_plain_llama_index(moved / CURRENT_LINK, embed) == ["lisbon"]


def test_a_current_that_is_not_a_link_is_refused_and_left_alone(tmp_path: Path) -> None:
    embed = DeterministicEmbedding(dim=64)
    out = tmp_path / "idx"
    store = FaissStore(out)
    store.build([Document(text="First.", id_="a")], embed, embed_spec="d", max_length=256)
    (out / CURRENT_LINK).unlink()
    (out / CURRENT_LINK).mkdir()
    (out / CURRENT_LINK / "mine.txt").write_text("keep me")
    with pytest.raises(ValueError, match=r"current is not the link hyde-plus makes"):
        store.build([Document(text="Second.", id_="b")], embed, embed_spec="d", max_length=256)
    assert (out / CURRENT_LINK / "mine.txt").read_text() == "keep me"
    assert store.load(embed).docstore.get_document("a") is not None
