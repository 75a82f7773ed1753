"""Chunking: documents split by LlamaIndex's parsers to the model's window, with stable
ids, positions and relationships; and the reason for it (a fact at the end of a long
file is found)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from llama_index.core import Document
from llama_index.core.schema import NodeRelationship
from typer.testing import CliRunner

from llama_index_hyde_plus.chunking import Chunking, split_documents, tokenizer_for
from llama_index_hyde_plus.cli import app
from llama_index_hyde_plus.readers import read_documents
from llama_index_hyde_plus.stores.faiss import build_faiss_index, load_faiss_index

runner = CliRunner()
SENTENCE = "The harbour crane lifts containers onto the night train. "


def _doc(text: str, source: str = "guide.md", doc_id: str | None = None) -> Document:
    return Document(text=text, id_=doc_id or source, metadata={"source": source})


def test_a_short_document_is_one_chunk_keeping_its_id() -> None:
    nodes = split_documents([_doc("One short note.", "note.txt")], Chunking(50, 5))
    assert [n.node_id for n in nodes] == ["note.txt"]
    assert nodes[0].metadata["chunk"] == 1 and nodes[0].metadata["chunks"] == 1


def test_a_long_document_is_split_into_numbered_chunks_with_their_place() -> None:
    doc = _doc(SENTENCE * 60, "long.txt")
    nodes = split_documents([doc], Chunking(50, 5))
    assert len(nodes) > 3
    assert [n.node_id for n in nodes] == [f"long.txt#{i}" for i in range(1, len(nodes) + 1)]
    for node in nodes:
        meta = node.metadata
        assert meta["source"] == "long.txt" and meta["chunks"] == len(nodes)
        assert doc.text[meta["start_char"] : meta["end_char"]] == node.text
    assert nodes[1].relationships[NodeRelationship.SOURCE].node_id == "long.txt"
    assert nodes[1].relationships[NodeRelationship.PREVIOUS].node_id == "long.txt#1"
    assert nodes[1].relationships[NodeRelationship.NEXT].node_id == "long.txt#3"


def test_chunk_ids_are_the_same_on_every_run() -> None:
    def ids() -> list[str]:
        return [n.node_id for n in split_documents([_doc(SENTENCE * 40)], Chunking(40, 4))]

    assert ids() == ids()


def test_markdown_headings_bound_chunks_but_plain_text_ignores_them() -> None:
    text = "# Alpha\n\nCranes and trains.\n\n# Beta\n\nOrchards and bees."
    md = split_documents([_doc(text, "a.md")], Chunking(100, 10))
    txt = split_documents([_doc(text, "a.txt")], Chunking(100, 10))
    assert [n.text for n in md] == ["# Alpha\n\nCranes and trains.", "# Beta\n\nOrchards and bees."]
    assert len(txt) == 1


def test_chunks_fit_the_embedding_models_own_tokens(real_embedding) -> None:  # type: ignore[no-untyped-def]
    name, tokenizer = tokenizer_for(real_embedding)
    assert tokenizer is not None and "tokenizer.json" in name
    nodes = split_documents([_doc(SENTENCE * 80)], Chunking(60, 6), tokenizer)
    sizes = [len(tokenizer(n.text)) for n in nodes]
    assert max(sizes) <= 60 and min(sizes[:-1]) > 30


@pytest.mark.parametrize(
    ("chunking", "message"),
    [
        (Chunking(300, 20), "--chunk-size 300 is more than --max-length 256"),
        (Chunking(100, 100), "--chunk-overlap must be"),
        (Chunking(100, -1), "--chunk-overlap must be"),
        (Chunking(0, 0), "--chunk-size must be at least 1"),
    ],
)
def test_chunk_settings_that_cannot_work_are_errors_naming_the_option(
    chunking: Chunking, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        chunking.check(max_length=256)


# -- a fact at the end of a long file is found -----------------

FACT = "The Kestrel backup window closes at 03:40 UTC on Sundays."
QUESTION = "When does the Kestrel backup window close?"
TOPICS = [
    "orchard", "glacier", "violin", "bakery", "lighthouse", "tram", "meadow", "pottery",
    "comet", "harbour", "vineyard", "chess", "canyon", "loom", "falcon", "marsh",
]  # fmt: skip
FILLER = [
    "the", "annual", "survey", "records", "quiet", "growth", "along", "northern", "paths",
    "while", "visitors", "describe", "patient", "craft", "and", "seasonal", "colour",
]  # fmt: skip


def long_markdown() -> str:
    """A handbook of some 5,000 words in 80 sections of distinct filler, with `FACT`
    in the third-to-last section."""
    rng = random.Random(14)
    sections = []
    for i in range(80):
        topic = "Kestrel operations" if i == 77 else TOPICS[i % len(TOPICS)]
        words = " ".join(rng.choice(FILLER) for _ in range(55))
        body = f"Notes on the {topic} ({i}): {words}."
        if i == 77:
            body += f"\n\n{FACT}"
        sections.append(f"## {topic.title()} {i}\n\n{body}")
    return "# Field notes\n\n" + "\n\n".join(sections)


SHORT = {
    "garden.txt": "The garden is watered by an automatic sprinkler.",
    "office.md": "# Office\n\nThe Lisbon office moved to a larger building.",
    "pto.txt": "Employees receive twenty five days of paid time off.",
    "laptops.txt": "Laptops use full disk encryption and a hardware key.",
}


@pytest.mark.local
def test_a_fact_near_the_end_of_a_long_file_ranks_first_only_with_chunking(
    tmp_path: Path,
    real_embedding,  # type: ignore[no-untyped-def]
) -> None:
    """With chunking (`hyde-plus index`, the real local model) the chunk holding the
    fact ranks first. Without it the long file is one node that the model reads only
    to its 256th token, long before the fact: the file does not rank first, nor
    second (measured: the fact's chunk scores 0.37, the short notes -0.01 to 0.14, the
    whole file -0.03, last)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "handbook.md").write_text(long_markdown())
    assert len(long_markdown().split()) > 4000
    for name, text in SHORT.items():
        (docs / name).write_text(text)

    out = tmp_path / "chunked"
    built = runner.invoke(app, ["index", str(docs), "--out", str(out), "--embed", "local"])
    assert built.exit_code == 0, built.output
    assert "Indexed 5 documents as" in built.output
    asked = runner.invoke(app, ["query", QUESTION, "--index", str(out), "-t", "none", "--json"])
    assert asked.exit_code == 0, asked.output
    top = json.loads(asked.stdout)["results"][0]
    assert top["id"].startswith("handbook.md#") and FACT in top["text"]
    assert top["metadata"]["source"] == "handbook.md"

    whole = tmp_path / "whole"
    build_faiss_index(
        read_documents(docs), real_embedding, whole, embed_spec="local", max_length=256
    )
    retriever = load_faiss_index(whole, real_embedding).as_retriever(similarity_top_k=5)
    ranked = [x.node.node_id for x in retriever.retrieve(QUESTION)]
    assert ranked[0] != "handbook.md" and ranked.index("handbook.md") > 1
