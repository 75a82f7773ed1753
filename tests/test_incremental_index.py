"""Incremental rebuilds: a rebuild over a folder indexed before embeds only
new or changed documents' chunks and drops removed ones (LlamaIndex's IngestionPipeline
with a docstore), on FAISS and Milvus Lite, and gives what a build from scratch gives.
A counting embedder (`DeterministicEmbedding.embedded_texts`) proves what was embedded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from llama_index.core import Document
from typer.testing import CliRunner

from llama_index_hyde_plus.chunking import Chunking
from llama_index_hyde_plus.cli import app
from llama_index_hyde_plus.readers import read_documents
from llama_index_hyde_plus.stores.faiss import build_faiss_index, load_faiss_index
from llama_index_hyde_plus.stores.faiss_folder import CACHE_FILE
from llama_index_hyde_plus.stores.nodes import IndexInfo
from llama_index_hyde_plus.testing import DeterministicEmbedding

CHUNKING = Chunking(40, 5)
N_FILES = 30
TOPICS = ["glaciers", "volcanoes", "coral reefs", "deserts", "rainforests", "tundra"]
QUESTIONS = ["Where do glaciers form?", "What makes volcanoes erupt?", "tundra winter"]
DET: dict[str, Any] = {"embed_spec": "det", "max_length": 256}


def text(i: int, version: int = 0) -> str:
    topic = TOPICS[i % len(TOPICS)]
    body = " ".join(
        f"Note {i}.{k} on {topic}: observation {k * (i + 1)} of field season {version}."
        for k in range(12)
    )
    return f"# File {i}\n\n{body}\n"


def write_corpus(folder: Path, n: int = N_FILES) -> None:
    folder.mkdir(exist_ok=True)
    for i in range(n):
        (folder / f"doc{i:02d}.md").write_text(text(i))


def build(docs: Path, out: Path, embed: DeterministicEmbedding, **kw: Any) -> IndexInfo:
    chunking = kw.pop("chunking", CHUNKING)
    return build_faiss_index(
        read_documents(docs), embed, out, embed_spec="det", max_length=256, chunking=chunking
    )


def hits(out: Path, question: str, k: int = 8) -> list[tuple[str, float]]:
    index = load_faiss_index(out, DeterministicEmbedding(dim=64))
    found = index.as_retriever(similarity_top_k=k).retrieve(question)
    return [(h.node.node_id, float(h.score or 0.0)) for h in found]


def sources(embed: DeterministicEmbedding, docs: Path) -> set[str]:
    """The files whose chunks ``embed`` embedded (each chunk's text is in one file)."""
    files = {p.name: p.read_text() for p in docs.iterdir()}
    return {name for t in embed.embedded_texts for name, body in files.items() if t in body}


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, Path, IndexInfo]:
    docs, out = tmp_path / "docs", tmp_path / "index"
    write_corpus(docs)
    first = DeterministicEmbedding(dim=64)
    info = build(docs, out, first)
    assert info.embedded == info.chunks == len(first.embedded_texts) > N_FILES
    return docs, out, info


def test_an_unchanged_rebuild_embeds_nothing(corpus: tuple[Path, Path, IndexInfo]) -> None:
    docs, out, first = corpus
    embed = DeterministicEmbedding(dim=64)
    info = build(docs, out, embed)
    assert embed.embedded_texts == []
    assert (info.embedded, info.reused, info.chunks) == (0, first.chunks, first.chunks)
    assert hits(out, QUESTIONS[0])  # the rebuilt index answers
    assert not (out / CACHE_FILE).exists()  # nothing left to resume


def test_editing_ten_files_embeds_only_their_chunks(corpus: tuple[Path, Path, IndexInfo]) -> None:
    docs, out, _ = corpus
    edited = {f"doc{i:02d}.md" for i in range(0, N_FILES, 3)}
    assert len(edited) == 10
    for name in edited:
        (docs / name).write_text(text(int(name[3:5]), version=1))
    embed = DeterministicEmbedding(dim=64)
    info = build(docs, out, embed)
    assert sources(embed, docs) == edited
    their_chunks = [n for n in read_all_chunks(out) if n["source"] in edited]
    assert info.embedded == len(embed.embedded_texts) == len(their_chunks)
    assert info.reused == info.chunks - info.embedded > 0


def read_all_chunks(out: Path) -> list[dict[str, Any]]:
    index = load_faiss_index(out, DeterministicEmbedding(dim=64))
    nodes = index.docstore.get_nodes(list(index.index_struct.nodes_dict.values()))
    return [dict(n.metadata) for n in nodes]


def test_a_deleted_file_is_gone_from_the_results_and_an_added_one_is_found(
    corpus: tuple[Path, Path, IndexInfo],
) -> None:
    docs, out, _ = corpus
    assert any(i.startswith("doc01.md") for i, _ in hits(out, "volcanoes erupt note 1.3"))
    (docs / "doc01.md").unlink()
    (docs / "new.md").write_text("# Auroras\n\nAuroras glow when solar wind meets the sky.\n")
    embed = DeterministicEmbedding(dim=64)
    info = build(docs, out, embed)
    assert sources(embed, docs) == {"new.md"}
    assert info.documents == N_FILES
    found = [i for i, _ in hits(out, "volcanoes erupt note 1.3", k=50)]
    assert found and not any(i.startswith("doc01.md") for i in found)
    assert hits(out, "Why do auroras glow?")[0][0] == "new.md"
    assert "doc01.md" not in {m["source"] for m in read_all_chunks(out)}


@pytest.mark.parametrize(
    "change",
    [
        {"embed": DeterministicEmbedding(dim=64, model_name="another-bow")},
        {"embed": DeterministicEmbedding(dim=32)},  # same name, other vectors
        {"chunking": Chunking(60, 5)},
    ],
    ids=["other-model", "other-dimension", "other-chunking"],
)
def test_another_model_or_chunking_embeds_everything_again(
    corpus: tuple[Path, Path, IndexInfo], change: dict[str, Any]
) -> None:
    docs, out, _ = corpus
    embed = change.get("embed", DeterministicEmbedding(dim=64)).model_copy()
    info = build(docs, out, embed, chunking=change.get("chunking", CHUNKING))
    assert info.reused == 0 and info.embedded == info.chunks == len(embed.embedded_texts)
    assert sources(embed, docs) == {p.name for p in docs.iterdir()}


def test_an_incremental_rebuild_answers_as_a_build_from_scratch(
    corpus: tuple[Path, Path, IndexInfo], tmp_path: Path
) -> None:
    docs, out, _ = corpus
    for i in (2, 7, 11):
        (docs / f"doc{i:02d}.md").write_text(text(i, version=2))
    (docs / "doc05.md").unlink()
    (docs / "extra.md").write_text("# Glaciers again\n\nGlaciers form where snow outlasts summer.")
    build(docs, out, DeterministicEmbedding(dim=64))
    scratch = tmp_path / "scratch"
    build(docs, scratch, DeterministicEmbedding(dim=64))
    for question in [*QUESTIONS, "field season 2 observation"]:
        ours, theirs = hits(out, question, k=10), hits(scratch, question, k=10)
        assert [i for i, _ in ours] == [i for i, _ in theirs]
        assert all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(ours, theirs, strict=True))
    assert read_all_chunks(out) == read_all_chunks(scratch)


def test_a_rebuild_that_failed_after_embedding_is_run_again_without_embedding(
    corpus: tuple[Path, Path, IndexInfo], monkeypatch: pytest.MonkeyPatch
) -> None:
    from llama_index.core import StorageContext

    docs, out, _ = corpus
    for i in (1, 4):
        (docs / f"doc{i:02d}.md").write_text(text(i, version=3))

    def full(self: Any, *a: Any, **k: Any) -> None:
        raise RuntimeError("Error in faiss::write_index: No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(StorageContext, "persist", full)
        failed = DeterministicEmbedding(dim=64)
        with pytest.raises(OSError, match="No space left"):
            build(docs, out, failed)
    assert sources(failed, docs) == {"doc01.md", "doc04.md"}
    assert (out / CACHE_FILE).is_file()
    again = DeterministicEmbedding(dim=64)
    info = build(docs, out, again)
    assert again.embedded_texts == [] and info.embedded == 0
    assert info.reused == info.chunks - len(failed.embedded_texts)
    assert not (out / CACHE_FILE).exists()
    # the cache is this model's: another one embeds what the failed build embedded
    for i in (1, 4):
        (docs / f"doc{i:02d}.md").write_text(text(i, version=4))
    with monkeypatch.context() as patched:
        patched.setattr(StorageContext, "persist", full)
        with pytest.raises(OSError):
            build(docs, out, DeterministicEmbedding(dim=64))
    other = DeterministicEmbedding(dim=64, model_name="another-bow")
    info = build(docs, out, other)
    assert info.embedded == info.chunks == len(other.embedded_texts)


def test_the_cli_says_how_many_chunks_it_embedded_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llama_index_hyde_plus import models

    docs, out = tmp_path / "docs", tmp_path / "index"
    write_corpus(docs, 6)
    embeds: list[DeterministicEmbedding] = []

    def counting(spec: str = "auto", *, max_length: int = 256) -> DeterministicEmbedding:
        embeds.append(DeterministicEmbedding(dim=64))
        return embeds[-1]

    monkeypatch.setattr(models, "resolve_embedding", counting)
    runner = CliRunner()
    argv = ["index", str(docs), "--out", str(out), "--chunk-size", "40", "--chunk-overlap", "5"]
    first = runner.invoke(app, argv)
    assert first.exit_code == 0, first.output
    chunks = json.loads((out / "hyde_plus.json").read_text())["chunks"]
    assert f"embedded {chunks:,} of {chunks:,} chunks (0 unchanged)" in first.output
    (docs / "doc03.md").write_text(text(3, version=5))
    again = runner.invoke(app, argv)
    assert again.exit_code == 0, again.output
    n = len(embeds[-1].embedded_texts)
    assert 0 < n < chunks
    assert f"embedded {n:,} of {chunks:,} chunks ({chunks - n:,} unchanged)" in again.output


def test_indexing_an_unchanged_folder_again_says_it_is_up_to_date_and_warns_of_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llama_index_hyde_plus import models

    docs, out = tmp_path / "docs", tmp_path / "index"
    write_corpus(docs, 6)
    monkeypatch.setattr(models, "resolve_embedding", lambda *a, **k: DeterministicEmbedding(dim=64))
    runner = CliRunner()
    argv = ["index", str(docs), "--out", str(out), "--chunk-size", "40", "--chunk-overlap", "5"]
    assert runner.invoke(app, argv).exit_code == 0
    chunks = json.loads((out / "hyde_plus.json").read_text())["chunks"]
    again = runner.invoke(app, argv, env={"COLUMNS": "200"})
    assert again.exit_code == 0, again.output
    said = f"is up to date: 6 documents, {chunks} chunks, nothing re-embedded"
    assert said in again.output and again.output.startswith("The index in ")
    assert "replaced" not in again.output and "0/0" not in again.output
    assert "Embedding" not in again.output  # no bar for nothing to embed
    (docs / "doc03.md").write_text(text(3, version=5))
    changed = runner.invoke(app, argv, env={"COLUMNS": "200"})
    assert changed.exit_code == 0, changed.output
    assert "replaced the index in" in changed.output and "up to date" not in changed.output


def test_two_documents_with_the_same_text_are_told_apart(tmp_path: Path) -> None:
    """The docstore maps a hash to one id: identical texts must still hash apart, or a
    removed twin would stay in the index."""
    out = tmp_path / "index"
    twins = [Document(text="Same words.", id_=i) for i in ("a", "b")]
    build_faiss_index(twins, DeterministicEmbedding(dim=64), out, embed_spec="d", max_length=256)
    info = build_faiss_index(
        twins[1:], DeterministicEmbedding(dim=64), out, embed_spec="d", max_length=256
    )
    assert (info.chunks, info.embedded) == (1, 0)
    assert [i for i, _ in hits(out, "same words")] == ["b"]


# --- Milvus Lite -------------------------------------------------------------------


def milvus_hits(uri: str, question: str, k: int = 8) -> list[tuple[str, float]]:
    from llama_index_hyde_plus.stores.milvus import hybrid_retriever, load_milvus_index

    index = load_milvus_index(uri, DeterministicEmbedding(dim=64), collection="docs")
    found = hybrid_retriever(index, k).retrieve(question)
    return [(h.node.node_id, float(h.score or 0.0)) for h in found]


def milvus_build(docs: Path, uri: str, embed: DeterministicEmbedding) -> int:
    from llama_index_hyde_plus.stores.milvus import build_milvus_index, read_milvus_meta

    build_milvus_index(
        read_documents(docs), embed, uri, collection="docs", embed_spec="det", chunking=CHUNKING
    )
    meta = read_milvus_meta(uri, "docs") or {}
    assert meta["embedded"] == len(embed.embedded_texts)
    return int(meta["chunks"])


@pytest.mark.slow
def test_milvus_rebuilds_embed_only_what_changed_and_answer_as_from_scratch(
    tmp_path: Path,
) -> None:
    pytest.importorskip("pymilvus")
    from pymilvus import MilvusClient

    docs, uri = tmp_path / "docs", str(tmp_path / "m.db")
    write_corpus(docs, 12)
    first = DeterministicEmbedding(dim=64)
    chunks = milvus_build(docs, uri, first)
    assert len(first.embedded_texts) == chunks
    unchanged = DeterministicEmbedding(dim=64)
    milvus_build(docs, uri, unchanged)
    assert unchanged.embedded_texts == []

    (docs / "doc02.md").write_text(text(2, version=1))
    (docs / "doc07.md").unlink()
    (docs / "new.md").write_text("# Auroras\n\nAuroras glow when solar wind meets the sky.\n")
    edit = DeterministicEmbedding(dim=64)
    milvus_build(docs, uri, edit)
    assert sources(edit, docs) == {"doc02.md", "new.md"}
    assert milvus_hits(uri, "Why do auroras glow?")[0][0] == "new.md"
    assert not any(i.startswith("doc07.md") for i, _ in milvus_hits(uri, "note 7.2", k=40))
    assert len(MilvusClient(uri).list_collections()) == 1  # the replaced builds dropped

    scratch = str(tmp_path / "scratch.db")
    milvus_build(docs, scratch, DeterministicEmbedding(dim=64))
    for question in QUESTIONS:
        ours, theirs = milvus_hits(uri, question), milvus_hits(scratch, question)
        assert [i for i, _ in ours] == [i for i, _ in theirs]
        assert all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(ours, theirs, strict=True))

    other = DeterministicEmbedding(dim=64, model_name="another-bow")
    assert milvus_build(docs, uri, other) == len(other.embedded_texts)


def test_a_rebuild_with_the_documents_in_another_order_is_not_called_up_to_date(
    tmp_path: Path,
) -> None:
    """Tied hits rank by position: the same chunks written in another order are another
    index, so the build is not unchanged, and it ranks as a build from scratch does."""
    out, scratch = tmp_path / "index", tmp_path / "scratch"
    twins = [Document(text="alpha beta gamma revenue", id_=i) for i in ("x", "y")]
    other = Document(text="unrelated words here", id_="z")
    build_faiss_index([*twins, other], DeterministicEmbedding(dim=64), out, **DET)
    reordered = [twins[1], twins[0], other]
    info = build_faiss_index(reordered, DeterministicEmbedding(dim=64), out, **DET)
    assert (info.embedded, info.reused, info.unchanged) == (0, 3, False)
    build_faiss_index(reordered, DeterministicEmbedding(dim=64), scratch, **DET)
    assert hits(out, "alpha", k=2) == hits(scratch, "alpha", k=2)
    again = build_faiss_index(reordered, DeterministicEmbedding(dim=64), out, **DET)
    assert again.unchanged


def test_a_chunk_edited_in_the_stored_index_is_embedded_again_from_its_document(
    corpus: tuple[Path, Path, IndexInfo],
) -> None:
    """A stored chunk whose text no longer hashes as recorded is not reused: its
    document is chunked and embedded again, and the build is not up to date."""
    docs, out, _ = corpus
    store = out / "current" / "docstore.json"
    data = json.loads(store.read_text())
    entries = data["docstore/data"]
    victim = next(k for k in entries if k.startswith("doc05.md"))
    entries[victim]["__data__"]["text"] = "tampered words"
    store.write_text(json.dumps(data))
    embed = DeterministicEmbedding(dim=64)
    info = build(docs, out, embed)
    assert not info.unchanged and sources(embed, docs) == {"doc05.md"}
    assert not any("tampered" in t for t in embed.embedded_texts)
    assert "tampered" not in (out / "current" / "docstore.json").read_text()
    assert build(docs, out, DeterministicEmbedding(dim=64)).unchanged


def _chunk_record(out: Path) -> tuple[Path, dict[str, Any]]:
    path = out / "current" / "ingestion" / "chunks.json"
    return path, json.loads(path.read_text())


@pytest.mark.parametrize(
    "damage",
    [
        lambda entry: 5,
        lambda entry: [*entry, "x"],
        lambda entry: [[entry[0]], entry[1]],
        lambda entry: None,
    ],
    ids=["a number", "three parts", "a list as document id", "null"],
)
def test_a_damaged_chunk_record_never_stops_a_build_which_embeds_everything_again(
    corpus: tuple[Path, Path, IndexInfo], damage: Any
) -> None:
    docs, out, first = corpus
    path, record = _chunk_record(out)
    chunk = next(iter(record))
    record[chunk] = damage(record[chunk])
    path.write_text(json.dumps(record))
    embed = DeterministicEmbedding(dim=64)
    info = build(docs, out, embed)  # no TypeError: the record is not trusted
    assert (info.embedded, info.chunks) == (first.chunks, first.chunks)
    assert build(docs, out, DeterministicEmbedding(dim=64)).unchanged


def test_a_document_missing_from_the_chunk_record_is_embedded_again_never_dropped(
    corpus: tuple[Path, Path, IndexInfo],
) -> None:
    docs, out, first = corpus
    path, record = _chunk_record(out)
    victims = [c for c, (doc, _) in record.items() if doc.startswith("doc03.md")]
    for chunk in victims:
        del record[chunk]
    path.write_text(json.dumps(record))
    embed = DeterministicEmbedding(dim=64)
    info = build(docs, out, embed)
    assert sources(embed, docs) == {"doc03.md"} and not info.unchanged
    assert info.chunks == first.chunks  # the document is still in the index
    assert build(docs, out, DeterministicEmbedding(dim=64)).unchanged


@pytest.mark.slow
def test_a_milvus_rebuild_of_a_released_collection_embeds_nothing_and_is_up_to_date(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new process (each `hyde-plus index`) finds the collection released; the
    rebuild still reads its rows back, as the CLI runs it."""
    pytest.importorskip("pymilvus")
    from pymilvus import MilvusClient

    from llama_index_hyde_plus import models
    from llama_index_hyde_plus.stores.milvus_builds import resolve

    docs, uri = tmp_path / "docs", str(tmp_path / "m.db")
    write_corpus(docs, 4)
    embeds: list[DeterministicEmbedding] = []

    def counting(spec: str = "auto", *, max_length: int = 256) -> DeterministicEmbedding:
        embeds.append(DeterministicEmbedding(dim=64))
        return embeds[-1]

    monkeypatch.setattr(models, "resolve_embedding", counting)
    runner = CliRunner()
    argv = ["index", str(docs), "--uri", uri, "--collection", "docs"]
    argv += ["--chunk-size", "40", "--chunk-overlap", "5"]
    assert runner.invoke(app, argv).exit_code == 0
    client = MilvusClient(uri)
    client.release_collection(resolve(client, "docs"))  # as a new process finds it
    again = runner.invoke(app, argv, env={"COLUMNS": "200"})
    assert again.exit_code == 0, again.output
    assert embeds[-1].embedded_texts == []
    assert "unreadable" not in again.output and "is up to date: 4 documents" in again.output
    assert milvus_hits(uri, QUESTIONS[0])  # the rebuilt collection answers
