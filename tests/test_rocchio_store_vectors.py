"""Rocchio reads its feedback documents' vectors from the index it searches: a FAISS
folder built by hyde-plus (whose store is a checked `FaissVectorStore` subclass) must
not have its documents embedded again on every query (eval latency was 2.7 s, not 60 ms)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from llama_index.core import Document

from llama_index_hyde_plus import Rocchio, TransformRetriever
from llama_index_hyde_plus.stores import FaissStore
from llama_index_hyde_plus.testing import DeterministicEmbedding

from .conftest import DOCS


def test_rocchio_on_a_built_faiss_index_embeds_no_document(tmp_path: Path) -> None:
    embed = DeterministicEmbedding(dim=64)
    store = FaissStore(tmp_path / "index")
    documents = [Document(text=text, id_=doc_id) for doc_id, text in DOCS.items()]
    store.build(documents, embed, embed_spec="deterministic", max_length=256)
    built = len(embed.embedded_texts)
    assert built == len(DOCS)

    index = store.load(embed)
    retriever = TransformRetriever(
        store.retriever(index, 5), Rocchio(k=3, beta=0.5), embed_model=embed
    )
    found = retriever.search("Why did enterprise renewals slip?")
    again = asyncio.run(retriever.asearch("How many days of paid time off?"))
    assert found.nodes and again.nodes and not found.transform.fallback
    assert len(embed.embedded_texts) == built  # the feedback vectors came from FAISS
    assert retriever.doc_vectors.source == "faiss"
