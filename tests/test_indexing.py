"""The FAISS index on disk: atomic replacement (a killed build leaves the old index
serving), clear errors for damaged indexes, and the embedding-model check."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from llama_index.core import Document
from typer.testing import CliRunner

from llama_index_hyde_plus._files import STAGING_MARKER, write_our_file
from llama_index_hyde_plus.cli import app
from llama_index_hyde_plus.stores.faiss import build_faiss_index, load_faiss_index
from llama_index_hyde_plus.stores.faiss_folder import CURRENT_LINK, DATA_MARKER, read_meta
from llama_index_hyde_plus.stores.nodes import EmbeddingMismatchError
from llama_index_hyde_plus.testing import DeterministicEmbedding

runner = CliRunner()
EMBED = DeterministicEmbedding(dim=64)
OLD = {"pto": "Employees receive twenty five days of paid time off.", "lunch": "Friday lunch."}
NEW = {"laptops": "Laptops use full disk encryption.", "office": "The Lisbon office moved."}


def docs(texts: dict[str, str]) -> list[Document]:
    return [Document(text=t, id_=i) for i, t in texts.items()]


def build(out: Path, texts: dict[str, str] = OLD) -> None:
    build_faiss_index(docs(texts), EMBED, out, embed_spec="det", max_length=256)


def top_id(out: Path, question: str) -> str:
    index = load_faiss_index(out, EMBED)
    return index.as_retriever(similarity_top_k=1).retrieve(question)[0].node.node_id


def start_paused_index(tmp_path: Path, argv: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
    """`hyde-plus index ...` in a fresh process, paused by the test hook just before it
    switches the new index in."""
    flag = tmp_path / "paused"
    env = {**os.environ, "HYDE_PLUS_TEST_PAUSE_BEFORE_SWITCH": str(flag)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_index_hyde_plus.cli", "index", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not flag.exists():
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read().decode() if proc.stderr else "exited")
        assert time.monotonic() < deadline, "index never reached the switch"
        time.sleep(0.05)
    return proc, flag


def kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def query_ids(argv: list[str]) -> list[str]:
    result = runner.invoke(app, ["query", "paid time off", "-t", "none", "--json", *argv])
    assert result.exit_code == 0, result.output
    return [r["id"] for r in json.loads(result.stdout)["results"]]


def test_a_build_killed_before_the_switch_leaves_the_old_index_answering(
    tmp_path: Path,
) -> None:
    old_docs, new_docs = tmp_path / "old", tmp_path / "new"
    old_docs.mkdir()
    new_docs.mkdir()
    (old_docs / "pto.txt").write_text(OLD["pto"])
    (new_docs / "laptops.txt").write_text(NEW["laptops"])
    out = tmp_path / "index"
    built = runner.invoke(app, ["index", str(old_docs), "--out", str(out), "--embed", "local"])
    assert built.exit_code == 0, built.output

    proc, _ = start_paused_index(tmp_path, [str(new_docs), "--out", str(out), "--embed", "local"])
    kill(proc)

    assert query_ids(["--index", str(out)]) == ["pto.txt"]
    assert sorted(p.name for p in out.iterdir())[-1] == "hyde_plus.json"
    # the next build cleans what the killed one left and switches to the new documents
    rebuilt = runner.invoke(app, ["index", str(new_docs), "--out", str(out), "--embed", "local"])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert query_ids(["--index", str(out)]) == ["laptops.txt"]
    entries = sorted(p.name for p in out.iterdir())
    assert entries == sorted([CURRENT_LINK, read_meta(out)["data"], "hyde_plus.json"])


def test_a_first_build_killed_before_the_switch_leaves_nothing_behind(tmp_path: Path) -> None:
    docs_dir = tmp_path / "docs"
    docs_dir.mkdir()
    (docs_dir / "a.txt").write_text(OLD["pto"])
    out = tmp_path / "index"
    proc, _ = start_paused_index(tmp_path, [str(docs_dir), "--out", str(out), "--embed", "local"])
    kill(proc)
    assert not out.exists()
    assert [p.name for p in tmp_path.glob(".index.*")]  # the hidden build folder
    build(out)
    assert not list(tmp_path.glob(".index.*")) and top_id(out, "paid time off") == "pto"


def test_replacing_an_index_keeps_one_data_folder(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build(out)
    first = read_meta(out)["data"]
    stale = out / "data-00000000beef"  # what a build killed while writing leaves
    stale.mkdir()
    index_id = read_meta(out)["index_id"]
    write_our_file(stale / DATA_MARKER, f"{stale.name} of index {index_id}, being written")
    build(out, NEW)
    meta = read_meta(out)
    assert meta["data"] != first and meta["documents"] == 2
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [CURRENT_LINK, meta["data"], "hyde_plus.json"]
    )
    assert top_id(out, "disk encryption") == "laptops"


def test_a_format_1_index_still_loads_and_is_replaced_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build(out)
    meta = read_meta(out)
    data = out / meta.pop("data")
    for f in data.iterdir():  # the old layout: storage files at the top level
        f.rename(out / f.name)
    data.rmdir()
    (out / "hyde_plus.json").write_text(json.dumps({**meta, "format": 1}))
    assert top_id(out, "paid time off") == "pto"
    legacy = {p.name: p.read_bytes() for p in out.glob("*.json") if p.name != "hyde_plus.json"}
    build(out, NEW)
    assert top_id(out, "Lisbon office") == "office"
    # the old top-level files are indistinguishable from a user's: they are left as they were
    assert {n: (out / n).read_bytes() for n in legacy} == legacy


def test_a_failed_build_leaves_the_old_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llama_index.core import StorageContext

    out = tmp_path / "idx"
    build(out)

    def boom(self, *a, **k):  # type: ignore[no-untyped-def]
        raise OSError("disk full")

    monkeypatch.setattr(StorageContext, "persist", boom)
    with pytest.raises(OSError, match="disk full"):
        build(out, NEW)
    monkeypatch.undo()
    assert top_id(out, "paid time off") == "pto"


@pytest.fixture(scope="module")
def cli_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    docs_dir = tmp_path_factory.mktemp("docs")
    (docs_dir / "pto.txt").write_text(OLD["pto"])
    out = tmp_path_factory.mktemp("built") / "index"
    built = runner.invoke(app, ["index", str(docs_dir), "--out", str(out), "--embed", "local"])
    assert built.exit_code == 0, built.output
    return out


@pytest.mark.parametrize("damage", ["no-docstore", "truncated-vectors", "corrupt-meta"])
def test_a_damaged_index_is_one_clear_error(tmp_path: Path, cli_index: Path, damage: str) -> None:
    out = tmp_path / "idx"
    shutil.copytree(cli_index, out)
    data = out / read_meta(out)["data"]
    if damage == "no-docstore":
        (data / "docstore.json").unlink()
        expected = "docstore.json"
    elif damage == "truncated-vectors":
        vectors = data / "default__vector_store.json"
        vectors.write_bytes(vectors.read_bytes()[:100])
        expected = "default__vector_store.json"
    else:
        (out / "hyde_plus.json").write_text('{"documents": 2, "dim"')
        expected = "hyde_plus.json"
    result = runner.invoke(app, ["query", "q", "--index", str(out), "-t", "none"])
    assert result.exit_code == 2 and "error:" in result.output and expected in result.output
    hint = "delete the folder and rebuild" if damage == "corrupt-meta" else "rebuild"
    assert "Traceback" not in result.output and hint in result.output


def test_another_embedding_model_is_a_clear_error(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build(out)
    with pytest.raises(EmbeddingMismatchError, match="deterministic-bow"):
        load_faiss_index(out, DeterministicEmbedding(dim=64, model_name="other"))
    with pytest.raises(EmbeddingMismatchError, match="64-d"):
        load_faiss_index(out, DeterministicEmbedding(dim=32))


def test_a_query_embedding_of_another_dimension_is_a_clear_error(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build(out)
    meta = read_meta(out)
    meta.pop("embed_model")  # nothing recorded to compare with: the store still checks
    meta.pop("dim")
    (out / "hyde_plus.json").write_text(json.dumps(meta))
    index = load_faiss_index(out, DeterministicEmbedding(dim=32))
    with pytest.raises(EmbeddingMismatchError, match=r"64-d vectors .* 32 dimensions"):
        index.as_retriever().retrieve("paid time off")


def _folder(tmp_path: Path, files: dict[str, str | bytes]) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, content in files.items():
        path = folder / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return folder


def _line(**row: object) -> str:
    return json.dumps(row) + "\n"


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {"a.jsonl": _line(_id="x", text="one") + _line(_id="x", text="two")},
            "a.jsonl:1 and a.jsonl:2",
        ),
        (
            {"a.jsonl": _line(_id="x", text="one"), "b.jsonl": _line(id="x", text="two")},
            "a.jsonl:1 and b.jsonl:1",
        ),
        (
            {"a.jsonl": _line(_id=7, text="one") + _line(_id="7", text="two")},
            "a.jsonl:1 and a.jsonl:2",
        ),
        ({"n.txt": "a text", "a.jsonl": _line(_id="n.txt", text="two")}, "a.jsonl:1 and n.txt"),
    ],
)
def test_a_duplicate_document_id_is_an_error_naming_both_places(
    tmp_path: Path, files: dict[str, str | bytes], expected: str
) -> None:
    from llama_index_hyde_plus.readers import read_documents

    with pytest.raises(ValueError, match="duplicate document id") as info:
        read_documents(_folder(tmp_path, files))
    assert expected in str(info.value)


def test_null_ids_do_not_collide_with_the_string_none(tmp_path: Path) -> None:
    from llama_index_hyde_plus.readers import read_documents

    folder = _folder(
        tmp_path, {"a.jsonl": _line(_id=None, text="one") + _line(_id="None", text="two")}
    )
    assert [d.doc_id for d in read_documents(folder)] == ["a.jsonl:1", "None"]


@pytest.mark.parametrize("text", [None, {"body": "x"}, ["x"]])
def test_a_null_or_structured_text_is_an_error_naming_file_and_line(
    tmp_path: Path, text: object
) -> None:
    folder = _folder(tmp_path, {"a.jsonl": _line(text="fine") + _line(_id="b", text=text)})
    result = runner.invoke(app, ["index", str(folder), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "a.jsonl:2" in result.output and "'text'" in result.output
    assert "None" not in result.output.replace("NoneType", "") and not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["notes.txt", "rows.jsonl"])
def test_a_non_utf8_file_is_an_error_naming_file_and_line(tmp_path: Path, name: str) -> None:
    good = '{"text": "fine"}\n' if name.endswith("jsonl") else "fine\n"
    folder = _folder(tmp_path, {name: good.encode() + b'{"text": "caf\xe9"}\n'})
    result = runner.invoke(app, ["index", str(folder), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and f"{name}:2: not UTF-8" in result.output


def test_the_cli_refuses_duplicate_ids_before_embedding(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"a.jsonl": _line(_id="x", text="one") + _line(_id="x", text="two")})
    result = runner.invoke(app, ["index", str(folder), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "duplicate document id 'x'" in result.output


README = Path(__file__).parent.parent / "docs" / "stores.md"


def _readme_block(marker: str) -> str:
    """The first ```python block after ``marker`` in the docs' stores page."""
    text = README.read_text()
    rest = text[text.index(marker) :]
    start = rest.index("```python\n") + len("```python\n")
    return rest[start : rest.index("```", start)]


def test_load_index_opens_a_cli_index_with_its_recorded_model(cli_index: Path) -> None:
    from llama_index_hyde_plus import load_index

    index = load_index(str(cli_index))
    assert index._embed_model.model_name == read_meta(cli_index)["embed_model"]  # type: ignore[attr-defined]
    hits = index.as_retriever(similarity_top_k=1).retrieve("How many days of paid time off?")
    assert hits[0].node.node_id == "pto.txt" and "paid time off" in hits[0].node.get_content()


def test_plain_llama_index_opens_a_cli_index_as_the_docs_say(
    tmp_path: Path, cli_index: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(cli_index, tmp_path / "my-index")
    monkeypatch.chdir(tmp_path)
    code = _readme_block("<!-- plain-llamaindex -->")
    assert "FaissVectorStore.from_persist_dir" in code and "load_index_from_storage" in code
    scope: dict[str, object] = {}
    exec(compile(code, str(README), "exec"), scope)
    nodes = scope["nodes"]
    assert isinstance(nodes, list) and nodes[0].node.node_id == "pto.txt"


def test_the_default_storage_context_cannot_read_a_cli_index(cli_index: Path) -> None:
    """Why the README passes the FAISS store: LlamaIndex's default reads the binary
    vector file as JSON."""
    from llama_index.core import StorageContext

    data = cli_index / read_meta(cli_index)["data"]
    with pytest.raises(UnicodeDecodeError):
        StorageContext.from_defaults(persist_dir=str(data))


def test_a_chunk_id_that_is_another_documents_id_is_an_error() -> None:
    from llama_index_hyde_plus.chunking import Chunking
    from llama_index_hyde_plus.stores.nodes import nodes_from_documents

    long = Document(text="A sentence about ferries. " * 40, id_="guide")
    clash = Document(text="A short one.", id_="guide#2")
    with pytest.raises(ValueError, match="chunk id 'guide#2' is also another document's id"):
        nodes_from_documents([long, clash], Chunking(30, 3))
    assert len(nodes_from_documents([long, clash])) == 2  # unchunked: no clash


def test_a_build_keeps_sibling_folders_that_only_look_like_its_staging(tmp_path: Path) -> None:
    """Only a staging folder holding this tool's marker is cleaned up, never a user's
    folder whose name happens to match (``.idx.backup``, ``.idx.build-mine``)."""
    out = tmp_path / "idx"
    backup, lookalike = tmp_path / ".idx.backup", tmp_path / ".idx.build-mine"
    for folder in (backup, lookalike):
        folder.mkdir()
        (folder / "keep.txt").write_text("mine")
    stale = tmp_path / ".idx.build-0123456789ab"  # what a killed build leaves
    stale.mkdir()
    write_our_file(stale / STAGING_MARKER, stale.name)
    build(out)
    build(out, NEW)  # both paths: a first build and a replacement
    assert (backup / "keep.txt").read_text() == "mine"
    assert (lookalike / "keep.txt").read_text() == "mine"
    assert not stale.exists()
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [CURRENT_LINK, read_meta(out)["data"], "hyde_plus.json"]
    )


def test_a_replacement_keeps_a_users_folder_inside_the_index_named_like_data(
    tmp_path: Path,
) -> None:
    out = tmp_path / "idx"
    build(out)
    mine = out / "data-00000000cafe"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    build(out, NEW)
    assert (mine / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("name", ["../outside", "ABSOLUTE", "data/../../outside", ".", ""])
def test_the_data_folder_must_be_a_plain_child_of_the_index(tmp_path: Path, name: str) -> None:
    """``data`` in hyde_plus.json is never followed outside the index folder (an index
    elsewhere would otherwise be served as this one)."""
    elsewhere = tmp_path / "elsewhere"
    build(elsewhere, NEW)
    outside = tmp_path / "outside"
    shutil.copytree(elsewhere / read_meta(elsewhere)["data"], outside)
    out = tmp_path / "idx"
    build(out)
    meta = read_meta(out)
    meta["data"] = str(outside) if name == "ABSOLUTE" else name
    (out / "hyde_plus.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="'data' must name a folder inside the index"):
        load_faiss_index(out, EMBED)


def test_the_cli_refuses_a_data_folder_outside_the_index(tmp_path: Path, cli_index: Path) -> None:
    out, outside = tmp_path / "idx", tmp_path / "outside"
    shutil.copytree(cli_index, out)
    shutil.copytree(out / read_meta(out)["data"], outside)
    meta = read_meta(out)
    (out / "hyde_plus.json").write_text(json.dumps({**meta, "data": "../outside"}))
    result = runner.invoke(app, ["query", "q", "--index", str(out), "-t", "none"])
    assert result.exit_code == 2 and "'data' must name a folder inside the index" in result.output
    assert "Traceback" not in result.output and result.output.count("error:") == 1


def test_a_data_link_leading_out_of_the_index_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    build(elsewhere, NEW)
    out = tmp_path / "idx"
    build(out)
    meta = read_meta(out)
    (out / "data-0000000000aa").symlink_to(elsewhere / read_meta(elsewhere)["data"])
    (out / "hyde_plus.json").write_text(json.dumps({**meta, "data": "data-0000000000aa"}))
    with pytest.raises(ValueError, match="'data' must name a folder inside the index"):
        load_faiss_index(out, EMBED)


def test_a_new_index_follows_the_umask(tmp_path: Path) -> None:
    """A service under another account can read an index built with umask 022."""
    previous = os.umask(0o022)
    try:
        out = tmp_path / "idx"
        build(out)
    finally:
        os.umask(previous)
    data = out / read_meta(out)["data"]
    assert (out.stat().st_mode & 0o777) == 0o755
    assert (data.stat().st_mode & 0o777) == 0o755
    assert ((out / "hyde_plus.json").stat().st_mode & 0o777) == 0o644
    assert not (out / ".hyde-plus-staging").exists()


@pytest.mark.parametrize(
    "damage", ["max-length-1e999", "meta-nested", "docstore-{}", "docstore-[]"]
)
def test_more_damage_is_one_clear_error(tmp_path: Path, cli_index: Path, damage: str) -> None:
    out = tmp_path / "idx"
    shutil.copytree(cli_index, out)
    meta_text = (out / "hyde_plus.json").read_text()
    data = out / read_meta(out)["data"]
    if damage == "max-length-1e999":
        (out / "hyde_plus.json").write_text(
            meta_text.rstrip().rstrip("}") + ', "max_length": 1e999}'
        )
    elif damage == "meta-nested":
        (out / "hyde_plus.json").write_text("[" * 100_000 + "]" * 100_000)
    else:
        (data / "docstore.json").write_text(damage.partition("-")[2])
    result = runner.invoke(app, ["query", "q", "--index", str(out), "-t", "none"])
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.output.count("error:") == 1 and "rebuild" in result.output


@pytest.mark.parametrize("size", ["-1", "0"])
def test_a_batch_size_below_one_is_refused_before_work(tmp_path: Path, size: str) -> None:
    docs_dir = tmp_path / "docs"
    docs_dir.mkdir()
    (docs_dir / "a.txt").write_text(OLD["pto"])
    out = tmp_path / "idx"
    result = runner.invoke(
        app, ["index", str(docs_dir), "--out", str(out), "--embed", "local", "--batch-size", size]
    )
    assert result.exit_code == 2 and "--batch-size must be" in result.output, result.output
    assert not out.exists()
    with pytest.raises(ValueError, match="--batch-size must be"):
        build_faiss_index(docs(OLD), EMBED, out, embed_spec="det", max_length=256, batch_size=0)


def test_index_lists_links_to_nothing_and_fifos_under_skipped(tmp_path: Path) -> None:
    docs_dir = tmp_path / "docs"
    docs_dir.mkdir()
    (docs_dir / "a.txt").write_text(OLD["pto"])
    (docs_dir / "gone.txt").symlink_to(docs_dir / "missing.txt")
    os.mkfifo(docs_dir / "pipe.txt")
    result = runner.invoke(
        app, ["index", str(docs_dir), "--out", str(tmp_path / "idx"), "--embed", "local"]
    )
    assert result.exit_code == 0, result.output
    assert "Skipped 2 file(s)" in result.output
    assert "gone.txt: a symbolic link to nothing" in result.output and "pipe.txt" in result.output


# Round 3 of the hostile tests: what a build may replace or delete is recognised by more
# than its name (the folder's metadata, a marker naming the folder, the index's format).


def index_cli(docs_dir: Path, out: Path) -> Any:
    return runner.invoke(app, ["index", str(docs_dir), "--out", str(out), "--embed", "local"])


def a_docs_folder(tmp_path: Path) -> Path:
    docs_dir = tmp_path / "docs"
    docs_dir.mkdir(exist_ok=True)
    (docs_dir / "pto.txt").write_text(OLD["pto"])
    return docs_dir


@pytest.mark.parametrize(
    "meta",
    ["{not json", '{"theme": "dark"}', "[1, 2]", '{"format": 2, "dim": 8}', "LINK"],
)
def test_a_folder_whose_hyde_plus_json_is_not_ours_is_left_untouched(
    tmp_path: Path, meta: str
) -> None:
    out = tmp_path / "app"
    out.mkdir()
    if meta == "LINK":  # a link to a real index's metadata is not this folder's own
        real = tmp_path / "real"
        build(real)
        (out / "hyde_plus.json").symlink_to(real / "hyde_plus.json")
    else:
        (out / "hyde_plus.json").write_text(meta)
    for name in ("index_store.json", "docstore.json", "notes.txt"):
        (out / name).write_text(f"user's {name}")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    result = index_cli(a_docs_folder(tmp_path), out)
    assert result.exit_code == 2, result.output
    assert "not one hyde-plus wrote" in result.output and "Traceback" not in result.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with pytest.raises(ValueError, match="not one hyde-plus wrote"):
        build(out)


def test_rebuilding_keeps_user_files_named_like_storage_files_at_the_top(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build(out)
    for name in ("index_store.json", "docstore.json", "default__vector_store.json"):
        (out / name).write_text(f"user's {name}")
    build(out, NEW)
    assert (out / "docstore.json").read_text() == "user's docstore.json"
    assert (out / "index_store.json").read_text() == "user's index_store.json"
    assert top_id(out, "disk encryption") == "laptops"


def test_rebuilding_keeps_a_users_data_named_folder_of_storage_files(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build(out)
    mine = out / "data-0123456789ab"
    mine.mkdir()
    (mine / "docstore.json").write_text("user's docstore")
    build(out, NEW)
    build(out)  # and again: neither the replacement nor the stale clean-up takes it
    assert (mine / "docstore.json").read_text() == "user's docstore"


def test_a_marker_copied_into_a_users_data_named_folder_does_not_make_it_ours(
    tmp_path: Path,
) -> None:
    out = tmp_path / "idx"
    build(out)
    mine = out / "data-0123456789ab"
    mine.mkdir()
    (mine / "docstore.json").write_text("user's docstore")
    write_our_file(mine / DATA_MARKER, "data-ba9876543210")  # names another folder
    build(out, NEW)
    assert (mine / "docstore.json").read_text() == "user's docstore"


def test_rebuilding_leaves_a_users_current_link_alone(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build(out)
    elsewhere = tmp_path / "my-docs"
    elsewhere.mkdir()
    (out / CURRENT_LINK).unlink()
    (out / CURRENT_LINK).symlink_to(elsewhere)
    build(out, NEW)
    assert os.readlink(out / CURRENT_LINK) == str(elsewhere)
    assert top_id(out, "disk encryption") == "laptops"


def test_rebuilding_keeps_a_users_file_named_like_the_staging_marker(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build(out)
    (out / STAGING_MARKER).write_text("my own notes")
    build(out, NEW)
    assert (out / STAGING_MARKER).read_text() == "my own notes"


@pytest.mark.parametrize("imitation", ["other-name", "user-file"])
def test_a_folder_imitating_a_staging_folder_is_kept(tmp_path: Path, imitation: str) -> None:
    out = tmp_path / "idx"
    folder = tmp_path / ".idx.build-0123456789ab"
    folder.mkdir()
    named = folder.name if imitation == "user-file" else ".idx.build-ffffffffffff"
    write_our_file(folder / STAGING_MARKER, named)
    (folder / "thesis.tex").write_text("mine")
    build(out)
    build(out, NEW)
    assert (folder / "thesis.tex").read_text() == "mine"


def test_concurrent_builds_of_one_folder_all_succeed_and_leave_one_index(tmp_path: Path) -> None:
    """Builds of the same folder write one at a time: none removes another's files and
    the folder ends as one whole index (the last one written)."""
    out = tmp_path / "idx"
    build(out)
    errors: list[BaseException] = []

    def one(texts: dict[str, str]) -> None:
        try:
            build(out, texts)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=((OLD, NEW)[i % 2],)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    meta = read_meta(out)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [CURRENT_LINK, meta["data"], "hyde_plus.json"]
    )
    ids = set(load_faiss_index(out, EMBED).docstore.docs)
    assert ids in (set(OLD), set(NEW))


def test_a_hand_written_meta_naming_a_users_folder_does_not_get_it_deleted(
    tmp_path: Path,
) -> None:
    out = tmp_path / "idx"
    mine = out / "data-0123456789ab"
    mine.mkdir(parents=True)
    (mine / "docstore.json").write_text('{"my": 1}')
    meta = {"format": 2, "dim": 64, "embed": "det", "data": mine.name}
    (out / "hyde_plus.json").write_text(json.dumps(meta))
    build(out, NEW)
    assert (mine / "docstore.json").read_text() == '{"my": 1}'
    assert top_id(out, "disk encryption") == "laptops"


def test_a_format_1_lookalike_keeps_its_storage_files(tmp_path: Path) -> None:
    """A LlamaIndex save folder with a three-key ``hyde_plus.json`` (copied from an old
    index, say) is replaced as an index, but its top-level files are never deleted."""
    out = tmp_path / "app"
    out.mkdir()
    for name in ("docstore.json", "default__vector_store.json"):
        (out / name).write_text(f"user's {name}")
    (out / "hyde_plus.json").write_text('{"format": 1, "dim": 64, "embed": "det"}')
    build(out, NEW)
    assert (out / "docstore.json").read_text() == "user's docstore.json"
    assert (out / "default__vector_store.json").read_text() == "user's default__vector_store.json"


def test_a_users_current_link_to_a_data_named_folder_of_theirs_is_not_replaced(
    tmp_path: Path,
) -> None:
    out = tmp_path / "idx"
    build(out)
    mine = out / "data-0123456789ab"
    mine.mkdir()
    (mine / "docstore.json").write_text("mine")
    (out / CURRENT_LINK).unlink()
    (out / CURRENT_LINK).symlink_to(mine.name)
    build(out, NEW)
    assert os.readlink(out / CURRENT_LINK) == mine.name
    assert (mine / "docstore.json").read_text() == "mine"


def test_files_named_like_drafts_but_not_drafts_are_kept(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build(out)
    note = out / ".hyde_plus.json.deadbeef.tmp"
    note.write_text("my notes")
    link = out / ".current.cafebabe.tmp"
    link.symlink_to(tmp_path)
    real_draft = out / ".hyde_plus.json.0badf00d.tmp"  # what a killed build leaves
    real_draft.write_text((out / "hyde_plus.json").read_text())
    build(out, NEW)
    assert note.read_text() == "my notes" and os.readlink(link) == str(tmp_path)
    assert not real_draft.exists()


def test_a_build_waiting_for_another_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A build beside one that holds the write lock waits, and says why, instead of
    hanging silently."""
    from llama_index_hyde_plus._files import locked_folder

    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    released = threading.Event()

    def hold() -> None:
        with locked_folder(tmp_path):
            released.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    time.sleep(0.2)  # the holder takes the lock first (ordering only, not a timed check)
    builder = threading.Thread(target=build, args=(tmp_path / "idx",))
    builder.start()
    deadline = time.monotonic() + 60
    while not any("waiting for another" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, "no waiting message"
        time.sleep(0.05)
    assert builder.is_alive()  # still waiting: nothing written yet
    released.set()
    holder.join()
    builder.join(60)
    assert top_id(tmp_path / "idx", "paid time off") == "pto"


def test_an_empty_folder_given_as_out_is_filled_in_place(tmp_path: Path) -> None:
    """The folder itself stays: its permissions (a private 0700 folder stays private),
    its inode, and a link the user gave as --out keeps pointing at it."""
    private = tmp_path / "private"
    private.mkdir()
    private.chmod(0o700)
    inode = private.stat().st_ino
    link = tmp_path / "lnk"
    link.symlink_to(private)
    build(link)
    assert private.stat().st_mode & 0o777 == 0o700 and private.stat().st_ino == inode
    assert link.is_symlink() and top_id(link, "paid time off") == "pto"


def test_a_folder_of_data_folders_without_metadata_is_refused_not_emptied(
    tmp_path: Path,
) -> None:
    """Copies of data folders (or what a first build killed in an empty folder left):
    nothing proves whose they are, so the folder is refused and nothing is deleted."""
    source = tmp_path / "idx"
    build(source)
    backups = tmp_path / "backups"
    backups.mkdir()
    shutil.copytree(source / read_meta(source)["data"], backups / read_meta(source)["data"])
    before = sorted(str(p.relative_to(backups)) for p in backups.rglob("*"))
    with pytest.raises(ValueError, match="holds data folders only"):
        build(backups)
    assert sorted(str(p.relative_to(backups)) for p in backups.rglob("*")) == before


def test_a_data_folder_copied_in_from_another_index_is_kept(tmp_path: Path) -> None:
    other, out = tmp_path / "other", tmp_path / "idx"
    build(other)
    build(out)
    copied = out / read_meta(other)["data"]
    shutil.copytree(other / read_meta(other)["data"], copied)
    build(out, NEW)
    build(out)
    assert copied.is_dir() and (copied / "docstore.json").is_file()


def test_an_index_copied_with_cp_r_rebuilds_and_cleans_its_own_data(tmp_path: Path) -> None:
    base, copy = tmp_path / "base", tmp_path / "copy"
    build(base)
    shutil.copytree(base, copy, symlinks=True)  # what `cp -r` does with the link
    build(copy, NEW)
    assert sorted(p.name for p in copy.iterdir()) == sorted(
        [CURRENT_LINK, read_meta(copy)["data"], "hyde_plus.json"]
    )
    assert os.readlink(copy / CURRENT_LINK) == read_meta(copy)["data"]


def test_current_follows_rebuilds_even_with_notes_in_the_data_folder(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build(out)
    (out / CURRENT_LINK / "notes.txt").write_text("my notes")
    old = os.readlink(out / CURRENT_LINK)
    build(out, NEW)
    assert os.readlink(out / CURRENT_LINK) == read_meta(out)["data"] != old
    assert (out / old / "notes.txt").read_text() == "my notes"  # kept, with the old data


def test_a_current_folder_left_by_copytree_is_kept_and_the_warning_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    base = tmp_path / "base"
    build(base)
    copy = tmp_path / "copy"
    shutil.copytree(base, copy)  # follows links: current becomes a real folder
    build(copy, NEW)
    assert (copy / CURRENT_LINK).is_dir() and not (copy / CURRENT_LINK).is_symlink()
    assert any("cp -r" in r.getMessage() for r in caplog.records)


def test_a_folder_created_under_out_during_the_build_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llama_index_hyde_plus.stores import faiss_folder

    out = tmp_path / "racey"

    def someone_fills_it(stage: str) -> None:
        out.mkdir()
        (out / "user.txt").write_text("mine")

    monkeypatch.setattr(faiss_folder, "pause_for_tests", someone_fills_it)
    with pytest.raises(ValueError, match="was created by someone else while this build ran"):
        build(out)
    assert [p.name for p in out.iterdir()] == ["user.txt"]
    assert not list(tmp_path.glob(".racey.build-*"))


def test_a_full_disk_is_one_error_line_and_the_old_index_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from llama_index.core import StorageContext

    from llama_index_hyde_plus.cli import main

    out = tmp_path / "idx"
    build(out)
    before = read_meta(out)["data"]

    def full(self, *a, **k):  # type: ignore[no-untyped-def]
        raise RuntimeError("Error in faiss::write_index: No space left on device")

    monkeypatch.setattr(StorageContext, "persist", full)
    docs_dir = tmp_path / "docs"
    docs_dir.mkdir()
    (docs_dir / "a.txt").write_text(NEW["laptops"])
    argv = ["hyde-plus", "index", str(docs_dir), "--out", str(out), "--embed", "local"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "No space left on device" in err
    assert "Traceback" not in err
    monkeypatch.undo()
    assert read_meta(out)["data"] == before and top_id(out, "paid time off") == "pto"


def test_a_folder_name_with_a_semicolon_or_backslash_builds_and_cleans_up(tmp_path: Path) -> None:
    for name in ("a;b", "c\\d"):
        out = tmp_path / name
        build(out)
        build(out, NEW)
        assert sorted(p.name for p in out.iterdir()) == sorted(
            [CURRENT_LINK, read_meta(out)["data"], "hyde_plus.json"]
        )
        assert not list(tmp_path.glob(f".{name}.build-*"))


@pytest.mark.parametrize("change", ["edited", "removed"])
def test_a_data_folder_whose_files_the_user_changed_is_kept_on_rebuild(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, change: str
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    out = tmp_path / "idx"
    build(out)
    old = out / read_meta(out)["data"]
    docstore = old / "docstore.json"
    if change == "edited":
        docstore.write_text(docstore.read_text().replace("paid time off", "paid leave"))
    else:
        (old / "graph_store.json").unlink()
    build(out, NEW)
    build(out)  # and again: the stale clean-up keeps it too
    assert old.is_dir()
    if change == "edited":
        assert "paid leave" in docstore.read_text()
    assert any(old.name in r.getMessage() and "changed" in r.getMessage() for r in caplog.records)
    assert top_id(out, "paid time off") == "pto"  # the index itself moved on


def test_an_unchanged_data_folder_is_still_removed_on_rebuild(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build(out)
    old = out / read_meta(out)["data"]
    build(out, NEW)
    assert not old.exists()
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [CURRENT_LINK, read_meta(out)["data"], "hyde_plus.json"]
    )


def test_a_first_build_killed_in_an_existing_empty_folder_is_cleaned_by_the_next(
    tmp_path: Path,
) -> None:
    docs_dir = tmp_path / "docs"
    docs_dir.mkdir()
    (docs_dir / "a.txt").write_text(OLD["pto"])
    out = tmp_path / "index"
    out.mkdir()
    proc, _ = start_paused_index(tmp_path, [str(docs_dir), "--out", str(out), "--embed", "local"])
    kill(proc)
    left = sorted(p.name for p in out.iterdir())
    assert any(n.startswith("data-") for n in left) and any(n.endswith(".tmp") for n in left)
    build(out)  # what the killed build left is recognised and removed, not refused
    assert top_id(out, "paid time off") == "pto"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [CURRENT_LINK, read_meta(out)["data"], "hyde_plus.json"]
    )


def _being_written(folder: Path, index_id: str, files: dict[str, str]) -> None:
    """What a build killed while writing the storage files leaves (marker first)."""
    folder.mkdir()
    write_our_file(folder / DATA_MARKER, f"{folder.name} of index {index_id}, being written")
    for name, text in files.items():
        (folder / name).write_text(text)


def test_a_data_folder_left_being_written_is_removed_but_one_beside_other_files_is_kept(
    tmp_path: Path,
) -> None:
    out = tmp_path / "idx"
    build(out)
    index_id = read_meta(out)["index_id"]
    partial = out / "data-0123456789ab"
    _being_written(partial, index_id, {"docstore.json": "{"})
    build(out, NEW)
    assert not partial.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    _being_written(empty / "data-0123456789ab", "ba9876543210", {"docstore.json": "{"})
    (empty / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="neither empty nor a hyde-plus index"):
        build(empty)
    assert (empty / "notes.txt").read_text() == "mine"
    assert (empty / "data-0123456789ab" / "docstore.json").read_text() == "{"


def test_data_folders_an_older_hyde_plus_wrote_are_kept_since_edits_cannot_be_ruled_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    out = tmp_path / "idx"
    build(out)
    meta = read_meta(out)
    old = out / meta["data"]
    write_our_file(old / DATA_MARKER, f"{old.name} of index {meta['index_id']}", replace=True)
    docstore = old / "docstore.json"
    docstore.write_text(docstore.read_text().replace("paid time off", "paid leave"))
    build(out, NEW)
    build(out)
    assert "paid leave" in docstore.read_text()
    assert any("older hyde-plus" in r.getMessage() for r in caplog.records)


def test_keys_added_by_hand_to_the_metadata_survive_a_rebuild(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build(out)
    meta = read_meta(out)
    (out / "hyde_plus.json").write_text(json.dumps({**meta, "owner_notes": "ask Ana"}))
    build(out, NEW)
    rebuilt = read_meta(out)
    assert rebuilt["owner_notes"] == "ask Ana" and rebuilt["data"] != meta["data"]
    assert rebuilt["index_id"] == meta["index_id"]


def test_an_index_inside_the_documents_folder_is_refused(tmp_path: Path) -> None:
    docs_dir = tmp_path / "docs"
    docs_dir.mkdir()
    (docs_dir / "a.txt").write_text(OLD["pto"])
    result = runner.invoke(
        app, ["index", str(docs_dir), "--out", str(docs_dir / "idx"), "--embed", "local"]
    )
    assert result.exit_code != 0 and "inside the documents folder" in result.output
    assert sorted(p.name for p in docs_dir.iterdir()) == ["a.txt"]


@pytest.mark.parametrize("odd", ["fifo", "link to /dev/zero"])
def test_a_fifo_or_endless_link_in_the_old_data_folder_never_hangs_a_rebuild(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, odd: str
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    out = tmp_path / "idx"
    build(out)
    old = out / read_meta(out)["data"]
    if odd == "fifo":
        os.mkfifo(old / "notes")
    else:
        (old / "zero").symlink_to("/dev/zero")
    done = threading.Event()
    worker = threading.Thread(target=lambda: (build(out, NEW), done.set()), daemon=True)
    worker.start()
    worker.join(timeout=300)  # a hang guard, not a timing: a build takes ~1 s
    assert done.is_set(), "the rebuild hung on the FIFO or link"
    assert old.is_dir() and top_id(out, "disk encryption") == "laptops"
    assert any(old.name in r.getMessage() for r in caplog.records)


def test_a_first_build_that_fails_before_its_switch_leaves_the_empty_folder_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    out = tmp_path / "idx"
    out.mkdir()
    real = Path.write_text

    def full_disk_at_the_draft(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        if self.name.startswith(".hyde_plus.json.") and self.name.endswith(".tmp"):
            self.open("w").close()  # a full disk leaves the file it was writing empty
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk_at_the_draft)
    with pytest.raises(OSError, match="No space left"):
        build(out)
    monkeypatch.undo()
    assert list(out.iterdir()) == []
    build(out)
    assert top_id(out, "paid time off") == "pto"


def test_a_refused_folder_names_the_leftovers_of_an_interrupted_build(tmp_path: Path) -> None:
    folder = tmp_path / "mixed"
    folder.mkdir()
    _being_written(folder / "data-0123456789ab", "ba9876543210", {"docstore.json": "{"})
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"interrupted hyde-plus build left \(data-0123456789ab\)"):
        build(folder)


@pytest.mark.parametrize("rollback", [False, True])
def test_an_old_data_folder_put_back_into_the_index_is_kept_on_rebuild(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, rollback: bool
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    out, copy = tmp_path / "idx", tmp_path / "idx-v1"
    build(out)
    shutil.copytree(out, copy, symlinks=True)  # `cp -r`: the same index id
    build(out, NEW)
    old = os.readlink(copy / CURRENT_LINK)
    shutil.move(str(copy / old), str(out / old))  # the user puts v1 back
    shutil.rmtree(copy)
    if rollback:
        (out / "rollback").symlink_to(old)
        os.replace(out / "rollback", out / CURRENT_LINK)
    build(out)
    assert (out / old / "docstore.json").is_file()
    assert any(
        old in r.getMessage() and "did not replace" in r.getMessage() for r in caplog.records
    )
    build(out, NEW)  # and again
    assert (out / old / "docstore.json").is_file()


def test_an_unparsable_metadata_file_is_not_called_a_leftover(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build(out)
    meta = out / "hyde_plus.json"
    meta.write_text(meta.read_text().replace('"format": 2,', '"format": 2, // note'))
    with pytest.raises(ValueError, match="cannot be parsed") as refused:
        build(out, NEW)
    assert "interrupted" not in str(refused.value)
