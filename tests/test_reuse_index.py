"""`eval`/`tune --docs --index DIR` search the index the user built with `hyde-plus index`
instead of embedding the documents again, and refuse one built otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llama_index_hyde_plus.chunking import Chunking
from llama_index_hyde_plus.cli import app
from llama_index_hyde_plus.cli._questions import DocsChoice, question_set
from llama_index_hyde_plus.evaluation import load_beir, run_eval
from llama_index_hyde_plus.readers import read_folder
from llama_index_hyde_plus.stores import FaissStore
from llama_index_hyde_plus.testing import DeterministicEmbedding

runner = CliRunner()

HANDBOOK = {
    "backup.md": "# Backups\n\nThe nightly backup window closes at 04:00 UTC, after the full "
    "backup.\n\n## Restores\n\nA restore from tape takes two working days.",
    "pto.txt": "Employees receive twenty five days of paid time off each year.",
    "office.txt": "The Lisbon office moved to a larger building near the river in March.",
}
LABELS = (
    "When does the backup window close?\tbackup.md\t1\n"
    "How many days of paid time off are there?\tpto.txt\t1\n"
    "Where did the Lisbon office move?\toffice.txt\t1\n"
)


def _handbook(tmp_path: Path) -> tuple[Path, Path]:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in HANDBOOK.items():
        (docs / name).write_text(text)
    labels = tmp_path / "labels.tsv"
    labels.write_text(LABELS)
    return docs, labels


def _question_set(tmp_path: Path, docs: Path, labels: Path, embed: DeterministicEmbedding):  # type: ignore[no-untyped-def]
    choice = DocsChoice(docs, 10, labels, tmp_path / "set", 40, 10, 0)
    return load_beir(question_set(choice, embed, None, 256), "test")


def test_an_index_of_the_documents_is_searched_without_embedding_them_again(
    tmp_path: Path,
) -> None:
    docs, labels = _handbook(tmp_path)
    embed = DeterministicEmbedding(dim=64)
    store = FaissStore(tmp_path / "my-index")
    info = store.build(
        read_folder(docs).documents,
        embed,
        embed_spec="det",
        max_length=256,
        chunking=Chunking(40, 10),
    )
    ds = _question_set(tmp_path, docs, labels, embed)
    assert len(ds.corpus) == info.chunks > len(HANDBOOK)  # the set's chunks are the index's
    built = len(embed.embedded_texts)

    options = {"embed_model": embed, "embed_label": "det", "cache_root": tmp_path / "cache"}
    reused = run_eval(ds, ["none", "rocchio"], llm=None, index_store=store, **options)
    assert len(embed.embedded_texts) == built  # not one document embedded again
    assert reused.index_cached and not (tmp_path / "cache" / "indexes").exists()
    assert reused.reports[0].scores["nDCG@10"] > 0.5

    rebuilt = run_eval(ds, ["none"], llm=None, **options)  # without the index: all again
    assert len(embed.embedded_texts) == built + len(ds.corpus)
    assert rebuilt.reports[0].scores == reused.reports[0].scores


def test_an_index_of_other_chunks_is_refused(tmp_path: Path) -> None:
    docs, labels = _handbook(tmp_path)
    embed = DeterministicEmbedding(dim=64)
    store = FaissStore(tmp_path / "my-index")
    (docs / "pto.txt").write_text("Employees receive thirty days of paid time off each year.")
    store.build(
        read_folder(docs).documents,
        embed,
        embed_spec="det",
        max_length=256,
        chunking=Chunking(40, 10),
    )
    (docs / "pto.txt").write_text(HANDBOOK["pto.txt"])  # edited after the index was built
    ds = _question_set(tmp_path, docs, labels, embed)
    options = {"embed_model": embed, "embed_label": "det", "cache_root": tmp_path / "cache"}
    with pytest.raises(ValueError, match=r"does not hold the same chunks.*'pto\.txt'"):
        run_eval(ds, ["none"], llm=None, index_store=store, **options)


@pytest.fixture(scope="module")
def cli_index(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("reuse")
    docs, labels = _handbook(tmp)
    out = tmp / "my-index"
    built = runner.invoke(
        app, ["index", str(docs), "--out", str(out), "--embed", "local", "--chunk-size", "60"]
    )
    assert built.exit_code == 0, built.output
    return docs, labels, out


def _eval(tmp_path: Path, docs: Path, labels: Path, *more: str):  # type: ignore[no-untyped-def]
    return runner.invoke(
        app,
        [
            *("eval", "--docs", str(docs), "--qrels", str(labels), "--transforms", "none"),
            *("--questions-dir", str(tmp_path / "set"), "--embed", "local"),
            *("--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), *more),
        ],
    )


def test_eval_docs_reuses_the_index_built_by_the_index_command(
    tmp_path: Path, cli_index: tuple[Path, Path, Path]
) -> None:
    docs, labels, out = cli_index
    result = _eval(tmp_path, docs, labels, "--index", str(out), "--chunk-size", "60")
    assert result.exit_code == 0, result.output
    assert "Embedding corpus" not in result.output
    assert not (tmp_path / "cache" / "indexes").exists()  # no index of its own was built
    scored = json.loads((tmp_path / "out" / "results.json").read_text())
    assert scored["index_cached"] and scored["results"][0]["nDCG@10"] > 0.5


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([], "was built with --chunk-size 60; this run asks for --chunk-size 200"),
        (["--chunk-size", "60", "--max-length", "128"], "--max-length 256"),
        (["--chunk-size", "60", "--uri", "x.db"], "leave out --store/--uri"),
    ],
)
def test_an_index_built_otherwise_is_refused_before_any_work(
    tmp_path: Path, cli_index: tuple[Path, Path, Path], args: list[str], said: str
) -> None:
    docs, labels, out = cli_index
    result = _eval(tmp_path, docs, labels, "--index", str(out), *args)
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error:") and said in line, result.output
    assert not (tmp_path / "set").exists()  # nothing was written


def test_an_index_out_of_date_with_the_documents_is_refused_before_the_set_is_written(
    tmp_path: Path,
) -> None:
    docs, labels = _handbook(tmp_path)
    out = tmp_path / "my-index"
    built = runner.invoke(
        app, ["index", str(docs), "--out", str(out), "--embed", "local", "--chunk-size", "60"]
    )
    assert built.exit_code == 0, built.output
    (docs / "pto.txt").write_text("Employees receive thirty days of paid time off each year.")
    result = _eval(tmp_path, docs, labels, "--index", str(out), "--chunk-size", "60")
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "error: --index" in said and "does not hold the same chunks" in said
    assert "'pto.txt'" in said and "replacing" not in said
    assert not (tmp_path / "set").exists() and not (tmp_path / "out").exists()


def test_an_index_holding_a_document_since_removed_is_refused(tmp_path: Path) -> None:
    docs, labels = _handbook(tmp_path)
    out = tmp_path / "my-index"
    built = runner.invoke(
        app, ["index", str(docs), "--out", str(out), "--embed", "local", "--chunk-size", "60"]
    )
    assert built.exit_code == 0, built.output
    (docs / "office.txt").unlink()
    labels.write_text(LABELS.splitlines()[0] + "\n")
    result = _eval(tmp_path, docs, labels, "--index", str(out), "--chunk-size", "60")
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "does not hold the same chunks" in said
    assert "(1 no longer in the documents, e.g. 'office.txt')" in said
    assert not (tmp_path / "set").exists() and not (tmp_path / "out").exists()


def test_index_with_a_beir_dataset_is_refused(tmp_path: Path) -> None:
    tiny = Path(__file__).parent / "data" / "tiny-beir"
    result = runner.invoke(app, ["eval", "--dataset", str(tiny), "--index", str(tmp_path)])
    assert result.exit_code == 2 and "--index reuses a `hyde-plus index` of --docs" in (
        result.output
    )


def test_tune_docs_reuses_the_index_too(tmp_path: Path, cli_index: tuple[Path, Path, Path]) -> None:
    docs, labels, out = cli_index
    result = runner.invoke(
        app,
        [
            *("tune", "--docs", str(docs), "--qrels", str(labels), "-t", "rocchio"),
            "--write-anyway",
            *("--index", str(out), "--chunk-size", "60", "--embed", "local"),
            *("--questions-dir", str(tmp_path / "set"), "--out", str(tmp_path / "rocchio.json")),
            *("--cache-dir", str(tmp_path / "cache")),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "rocchio.json").is_file()
    assert not (tmp_path / "cache" / "indexes").exists()


def test_eval_docs_loads_the_given_index_once(
    tmp_path: Path, cli_index: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    docs, labels, out = cli_index
    loads: list[str] = []
    load = FaissStore.load

    def counted(self: FaissStore, *args: object, **kwargs: object) -> object:
        loads.append(str(self.location))
        return load(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(FaissStore, "load", counted)
    result = _eval(tmp_path, docs, labels, "--index", str(out), "--chunk-size", "60")
    assert result.exit_code == 0, result.output
    assert loads == [str(out)]  # checked against the documents, then searched: one load
