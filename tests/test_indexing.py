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

from llama_index_hyde_plus._owned import MARKER
from llama_index_hyde_plus.cli import app
from llama_index_hyde_plus.stores.faiss import build_faiss_index, load_faiss_index, read_meta
from llama_index_hyde_plus.stores.faiss_folder import CURRENT_LINK
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


BEFORE_SWITCH = "after:llama_index_hyde_plus.stores.faiss_folder._persist"
"""New data written, not switched in: where a kill would hurt most."""
AFTER_SWITCH = "before:llama_index_hyde_plus.stores.faiss_folder.point_current"
"""Switched in, the link and the old data not yet updated."""


def start_paused_index(
    tmp_path: Path, argv: list[str], where: str = BEFORE_SWITCH
) -> tuple[subprocess.Popen[bytes], Path]:
    """`hyde-plus index ...` in a fresh process, paused for good at ``where``
    (`tests._paused`: the hook lives in the tests, not in the package)."""
    flag = tmp_path / "paused"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests._paused", str(flag), where, "index", *argv],
        cwd=Path(__file__).parents[1],
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
    # what the killed build embedded stays cached beside the old index
    assert entries(out)[-2:] == ["hyde_plus.json", "ingestion_cache.json"]
    # the next build cleans what the killed one left and switches to the new documents,
    # embedding nothing again
    rebuilt = runner.invoke(app, ["index", str(new_docs), "--out", str(out), "--embed", "local"])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert "embedded 0 of 1 chunks" in rebuilt.output
    assert query_ids(["--index", str(out)]) == ["laptops.txt"]
    assert entries(out) == one_index(out)


def entries(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir())


def one_index(out: Path) -> list[str]:
    """What an index folder holds after a build: nothing a build left behind."""
    return sorted([MARKER, CURRENT_LINK, read_meta(out)["data"], "hyde_plus.json"])


def test_a_build_killed_after_the_switch_serves_the_new_index_and_the_next_cleans_up(
    tmp_path: Path,
) -> None:
    old_docs, new_docs = tmp_path / "old", tmp_path / "new"
    for folder, (name, text) in (
        (old_docs, ("pto", OLD["pto"])),
        (new_docs, ("l", NEW["laptops"])),
    ):
        folder.mkdir()
        (folder / f"{name}.txt").write_text(text)
    out = tmp_path / "index"
    argv = ["--out", str(out), "--embed", "local"]
    assert runner.invoke(app, ["index", str(old_docs), *argv]).exit_code == 0
    proc, _ = start_paused_index(tmp_path, [str(new_docs), *argv], AFTER_SWITCH)
    kill(proc)
    assert query_ids(["--index", str(out)]) == ["l.txt"]
    assert len([n for n in entries(out) if n.startswith("data-")]) == 2
    assert runner.invoke(app, ["index", str(new_docs), *argv]).exit_code == 0
    assert entries(out) == one_index(out)


def test_a_first_build_killed_before_the_switch_is_no_index_and_the_next_build_cleans_it(
    tmp_path: Path,
) -> None:
    docs_dir = tmp_path / "docs"
    docs_dir.mkdir()
    (docs_dir / "a.txt").write_text(OLD["pto"])
    out = tmp_path / "index"
    proc, _ = start_paused_index(tmp_path, [str(docs_dir), "--out", str(out), "--embed", "local"])
    kill(proc)
    result = runner.invoke(app, ["query", "q", "--index", str(out), "-t", "none"])
    assert result.exit_code == 2 and "incomplete" in result.output
    build(out)
    assert top_id(out, "paid time off") == "pto" and entries(out) == one_index(out)


def test_replacing_an_index_keeps_one_data_folder(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build(out)
    first = read_meta(out)["data"]
    stale = out / "data-00000000beef"  # what a build killed while writing leaves
    (stale / "docstore.json").parent.mkdir()
    (stale / "docstore.json").write_text("{")
    meta = read_meta(out)
    (out / "hyde_plus.json").write_text(json.dumps({**meta, "pending": stale.name}))
    build(out, NEW)
    meta = read_meta(out)
    assert meta["data"] != first and meta["documents"] == 2
    assert entries(out) == one_index(out)
    assert top_id(out, "disk encryption") == "laptops"


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
    assert "Traceback" not in result.output and "rebuild" in result.output


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
    assert ((out / MARKER).stat().st_mode & 0o777) == 0o644


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


# What a build may replace or delete is recognised by more
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
    assert f"--out {out}" in result.output and "Traceback" not in result.output
    assert "neither empty nor a hyde-plus index folder" in result.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with pytest.raises(ValueError, match="neither empty nor a hyde-plus index folder"):
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
    assert entries(out) == one_index(out)
    ids = set(load_faiss_index(out, EMBED).docstore.docs)
    assert ids in (set(OLD), set(NEW))


def test_a_build_waiting_for_another_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A build beside one that holds the write lock waits, and says why, instead of
    hanging silently."""
    from llama_index_hyde_plus._owned import locked_folder

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
    with pytest.raises(ValueError, match="neither empty nor a hyde-plus index folder"):
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
    assert entries(copy) == one_index(copy)
    assert os.readlink(copy / CURRENT_LINK) == read_meta(copy)["data"]


def test_current_follows_rebuilds_and_a_rebuild_says_it_replaced_the_index(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    out = tmp_path / "idx"
    build(out)
    assert not caplog.records  # a first build replaces nothing
    old = os.readlink(out / CURRENT_LINK)
    build(out, NEW)
    assert os.readlink(out / CURRENT_LINK) == read_meta(out)["data"] != old
    [line] = [r.getMessage() for r in caplog.records]
    assert line == f"replaced the index in {out.resolve()} (its previous build {old})"


def test_a_rebuild_of_unchanged_documents_warns_of_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    out = tmp_path / "idx"
    build(out)
    build(out)  # the same chunks and vectors: nothing a user would miss is replaced
    assert not caplog.records
    assert os.readlink(out / CURRENT_LINK) == read_meta(out)["data"]
    build(out, {"pto": OLD["pto"]})  # a document dropped: its chunks are gone
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"replaced the index in {out.resolve()}")


def test_a_current_folder_left_by_copytree_is_refused_naming_it(tmp_path: Path) -> None:
    base = tmp_path / "base"
    build(base)
    copy = tmp_path / "copy"
    shutil.copytree(base, copy)  # follows links: current becomes a real folder
    before = sorted(str(p.relative_to(copy)) for p in copy.rglob("*"))
    with pytest.raises(ValueError, match=rf"--out {copy}: .*current is not the link"):
        build(copy, NEW)
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*")) == before


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
        assert entries(out) == one_index(out)


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
    assert any(n.startswith("data-") for n in entries(out))
    build(out)  # what the killed build left is its own: removed, not refused
    assert top_id(out, "paid time off") == "pto"
    assert entries(out) == one_index(out)


def test_keys_added_by_hand_to_the_metadata_survive_a_rebuild(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build(out)
    meta = read_meta(out)
    (out / "hyde_plus.json").write_text(json.dumps({**meta, "owner_notes": "ask Ana"}))
    build(out, NEW)
    rebuilt = read_meta(out)
    assert rebuilt["owner_notes"] == "ask Ana" and rebuilt["data"] != meta["data"]


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
    tmp_path: Path, odd: str
) -> None:
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
    assert not old.exists() and top_id(out, "disk encryption") == "laptops"


def test_a_first_build_that_fails_before_its_switch_leaves_the_empty_folder_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llama_index.core import StorageContext

    out, new = tmp_path / "idx", tmp_path / "new"
    out.mkdir()

    def full(self: Any, *a: Any, **k: Any) -> None:
        raise RuntimeError("Error in faiss::write_index: No space left on device")

    monkeypatch.setattr(StorageContext, "persist", full)
    for target in (out, new):
        with pytest.raises(OSError, match="No space left"):
            build(target)
    monkeypatch.undo()
    assert list(out.iterdir()) == [] and not new.exists()
    build(out)
    assert top_id(out, "paid time off") == "pto"


@pytest.mark.parametrize("rollback", [False, True])
def test_an_old_data_folder_put_back_into_the_index_is_kept_on_rebuild(
    tmp_path: Path, rollback: bool
) -> None:
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
    build(out)  # the metadata never named it since: it is not this build's to delete
    assert (out / old / "docstore.json").is_file()
    build(out, NEW)  # and again
    assert (out / old / "docstore.json").is_file()
