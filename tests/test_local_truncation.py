"""The local embedder says when it cuts a document at its token limit, the splitter
`splitter_for` makes chunks it never cuts, and a generated passage is fitted to its
window without a warning."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.schema import MetadataMode

pytestmark = pytest.mark.local


def test_the_local_embedder_warns_once_when_it_cuts_a_text(
    real_embedding: object, caplog: pytest.LogCaptureFixture
) -> None:
    from llama_index_hyde_plus.local import local_embedding

    embedder = local_embedding()  # a fresh instance: it has warned nobody yet
    with caplog.at_level(logging.WARNING, logger="llama_index_hyde_plus.local.embedding"):
        embedder.get_text_embedding_batch(["short text", "a short question?"])
        assert not caplog.records  # nothing was cut
        embedder.get_text_embedding_batch(["word " * 600, "short text"])
        embedder.get_text_embedding_batch(["word " * 600])
    (record,) = caplog.records  # once
    message = record.getMessage()
    assert "cut 1 of 2 texts at its 256-token limit" in message
    assert "splitter_for(embed_model)" in message  # the advice that fits this model


def test_a_question_cut_at_the_limit_is_called_a_question_not_a_document(
    real_embedding: object, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio

    from llama_index_hyde_plus.local import local_embedding

    embedder = local_embedding()  # a fresh instance: it has warned nobody yet
    question = "Why did " + "the quarterly enterprise renewals slip " * 50 + "?"
    with caplog.at_level(logging.WARNING, logger="llama_index_hyde_plus.local.embedding"):
        embedder.get_query_embedding("Why did revenue drop?")
        assert not caplog.records  # nothing was cut
        embedder.get_query_embedding(question)
        asyncio.run(embedder.aget_query_embedding(question))
        (record,) = caplog.records  # once
        message = record.getMessage()
        assert "cut a question at its 256-token limit" in message
        assert "Ask a shorter question" in message
        assert "node_parser" not in message and "Split documents" not in message
        embedder.get_text_embedding_batch(["word " * 600])  # a document: its own warning
    assert len(caplog.records) == 2 and "splitter_for" in caplog.records[1].getMessage()


DOCS = Path(__file__).parent.parent / "docs"


def _cut(chunks: list[Any], tokenizer: Any) -> int:
    """How many ``chunks`` the model would cut (their embedded text, metadata included)."""
    texts = [c.get_content(metadata_mode=MetadataMode.EMBED) for c in chunks]
    return sum(1 for enc in tokenizer.encode_batch(texts) if enc.overflowing)


def test_splitter_for_the_local_model_cuts_no_chunk_of_real_markdown(real_embedding: Any) -> None:
    from llama_index.core import SimpleDirectoryReader
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.core.node_parser.text.utils import split_by_regex

    from llama_index_hyde_plus import splitter_for

    docs = SimpleDirectoryReader(str(DOCS), required_exts=[".md"]).load_data()
    tokenizer = real_embedding._get_model().model.tokenizer
    ours = splitter_for(real_embedding).get_nodes_from_documents(docs)
    assert len(docs) >= 15 and len(ours) > 300
    assert _cut(ours, tokenizer) == 0
    # the same size counted in OpenAI's tokens (a plain SentenceSplitter) does cut some
    sentences = split_by_regex(r"[^.!?]*[.!?]+\s*|[^.!?]+$")
    plain = SentenceSplitter(chunk_size=200, chunk_overlap=20, chunking_tokenizer_fn=sentences)
    assert _cut(plain.get_nodes_from_documents(docs), tokenizer) > 0


def test_a_long_generated_passage_is_fitted_to_the_window_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from llama_index_hyde_plus import HyDE, TransformRetriever
    from llama_index_hyde_plus.local import local_embedding
    from llama_index_hyde_plus.testing import ScriptedLLM, StaticRetriever

    embedder = local_embedding()  # a fresh instance: it has warned nobody yet
    passage = "Revenue fell as renewals slipped and large accounts delayed. " * 60
    retriever = TransformRetriever(
        StaticRetriever({"a": "alpha"}, default=["a"]),
        HyDE(ScriptedLLM(replies=[passage]), max_characters=5000),
        embed_model=embedder,
    )
    with caplog.at_level(logging.WARNING, logger="llama_index_hyde_plus.local.embedding"):
        found = retriever.search("Why did revenue drop?")
    assert not found.transform.fallback and found.transform.hypothetical == (passage.strip(),)
    assert not caplog.records
    fitted = embedder.fit_to_window(passage)
    assert passage.startswith(fitted) and len(fitted) < len(passage) // 2
    assert embedder.fit_to_window("short text") == "short text"
    assert embedder.get_text_embedding(fitted) == embedder.get_text_embedding(passage)
