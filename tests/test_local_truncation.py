"""The local embedder says when it cuts texts at its token limit."""

from __future__ import annotations

import logging

import pytest

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
    assert "SentenceSplitter(chunk_size=200" in message
