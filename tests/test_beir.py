from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llama_index_hyde_plus.evaluation import BeirFormatError, load_beir

TINY = Path(__file__).parent / "data" / "tiny-beir"


def copy_tiny(tmp_path: Path) -> Path:
    target = tmp_path / "tiny"
    shutil.copytree(TINY, target)
    return target


def test_loads_corpus_judged_queries_and_graded_qrels() -> None:
    ds = load_beir(TINY)
    assert ds.name == "tiny-beir" and len(ds.corpus) == 6
    assert list(ds.queries) == ["q1", "q2", "q3"]  # q4 has no judgments
    assert ds.qrels["q2"] == {"d2": 2, "d5": 1}
    assert ds.document_text("d1").startswith("Renewals\nEnterprise renewals")
    assert len(ds.corpus_sha256) == 64


def test_limit_keeps_the_first_judged_queries() -> None:
    ds = load_beir(TINY, limit=2)
    assert list(ds.queries) == ["q1", "q2"] and set(ds.qrels) == {"q1", "q2"}


@pytest.mark.parametrize(
    ("file", "content", "message"),
    [
        (
            "corpus.jsonl",
            '{"_id": "d1", "text": "x"}\nnot json\n',
            r"corpus.jsonl:2: not valid JSON",
        ),
        ("corpus.jsonl", '{"_id": "d1"}\n', r"corpus.jsonl:1: missing field"),
        ("queries.jsonl", "[1, 2]\n", r"queries.jsonl:1: expected a JSON object"),
        ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\n", r"test.tsv:2: expected 3"),
        ("qrels/test.tsv", "q1\td1\thigh\n", r"score 'high' is not a number"),
        ("qrels/test.tsv", "q9\td1\t1\n", r"unknown query id 'q9'"),
        ("qrels/test.tsv", "q1\td9\t1\n", r"unknown corpus id 'd9'"),
        ("qrels/test.tsv", "query-id\tcorpus-id\tscore\n", r"no judgments"),
    ],
)
def test_malformed_files_name_the_file_and_line(
    tmp_path: Path, file: str, content: str, message: str
) -> None:
    root = copy_tiny(tmp_path)
    (root / file).write_text(content)
    with pytest.raises(BeirFormatError, match=message):
        load_beir(root)


def test_missing_files_and_folders(tmp_path: Path) -> None:
    with pytest.raises(BeirFormatError, match="not found"):
        load_beir(tmp_path / "nope")
    root = copy_tiny(tmp_path)
    with pytest.raises(BeirFormatError, match=r"missing file: .*dev\.tsv"):
        load_beir(root, split="dev")
    (root / "corpus.jsonl").unlink()
    with pytest.raises(BeirFormatError, match="missing file"):
        load_beir(root)


@pytest.mark.parametrize("score", ["inf", "-inf", "nan", "1e999"])
def test_a_non_finite_qrels_score_names_file_and_line(tmp_path: Path, score: str) -> None:
    root = copy_tiny(tmp_path)
    qrels = root / "qrels" / "test.tsv"
    lines = qrels.read_text().splitlines()
    parts = lines[1].split("\t")
    lines[1] = "\t".join([parts[0], parts[1], score])
    qrels.write_text("\n".join(lines) + "\n")
    with pytest.raises(BeirFormatError, match=r"test\.tsv:2: score .* not (finite|a number)"):
        load_beir(root)


def test_a_duplicate_corpus_id_names_both_lines(tmp_path: Path) -> None:
    root = copy_tiny(tmp_path)
    corpus = root / "corpus.jsonl"
    first = corpus.read_text().splitlines()[0]
    corpus.write_text(corpus.read_text() + first + "\n")
    with pytest.raises(
        BeirFormatError, match=r"corpus\.jsonl:7: duplicate _id 'd1' \(first at line 1\)"
    ):
        load_beir(root)


@pytest.mark.parametrize("text", [None, {"a": 1}, ["x"]])
def test_a_null_or_structured_text_is_an_error_not_its_repr(tmp_path: Path, text: object) -> None:
    import json

    root = copy_tiny(tmp_path)
    corpus = root / "corpus.jsonl"
    corpus.write_text(corpus.read_text() + json.dumps({"_id": "bad", "text": text}) + "\n")
    with pytest.raises(BeirFormatError, match=r"corpus\.jsonl:7: 'text' must be a string"):
        load_beir(root)


def test_a_non_utf8_file_names_file_and_line(tmp_path: Path) -> None:
    root = copy_tiny(tmp_path)
    queries = root / "queries.jsonl"
    queries.write_bytes(queries.read_bytes() + b'{"_id": "q9", "text": "caf\xe9"}\n')
    with pytest.raises(BeirFormatError, match=r"queries\.jsonl:\d+: not UTF-8"):
        load_beir(root)


@pytest.mark.parametrize("score", ["\u0663", "\u06f3", "\uff13", "1_0", "\u0661.0"])
def test_a_grade_in_non_ascii_digits_is_refused(tmp_path: Path, score: str) -> None:
    """``float`` reads Arabic-Indic (and full-width) digits as 3: a grade must be ASCII."""
    root = copy_tiny(tmp_path)
    (root / "qrels" / "test.tsv").write_text(f"q1\td1\t{score}\n")
    with pytest.raises(BeirFormatError, match=r"test\.tsv:1: score .* not a number"):
        load_beir(root)


@pytest.mark.parametrize("file", ["corpus.jsonl", "queries.jsonl"])
def test_an_empty_id_is_refused_with_file_and_line(tmp_path: Path, file: str) -> None:
    root = copy_tiny(tmp_path)
    path = root / file
    path.write_text(path.read_text() + '{"_id": "  ", "text": "no id"}\n')
    line = len(path.read_text().splitlines())
    with pytest.raises(BeirFormatError, match=rf"{file}:{line}: '_id' is empty"):
        load_beir(root)


def test_a_jsonl_line_nested_too_deeply_is_a_format_error(tmp_path: Path) -> None:
    root = copy_tiny(tmp_path)
    deep = "[" * 100_000 + "]" * 100_000
    (root / "queries.jsonl").write_text('{"_id": "q1", "text": ' + deep + "}\n")
    with pytest.raises(BeirFormatError, match=r"queries\.jsonl:1: JSON nested too deeply"):
        load_beir(root)


def test_a_question_set_embeds_its_chunks_as_hyde_plus_index_does(tmp_path: Path) -> None:
    from llama_index.core.schema import MetadataMode

    from llama_index_hyde_plus.chunking import Chunking
    from llama_index_hyde_plus.evaluation.index_cache import index_cache_dir
    from llama_index_hyde_plus.evaluation.questions import write_beir_folder
    from llama_index_hyde_plus.readers import read_folder
    from llama_index_hyde_plus.stores.nodes import nodes_from_documents, prepare_nodes
    from llama_index_hyde_plus.testing import DeterministicEmbedding

    from .conftest import team_docs

    documents = read_folder(team_docs(tmp_path)).documents
    chunks, _ = prepare_nodes(documents, DeterministicEmbedding(dim=8), Chunking(200, 20), 256)
    indexed = {c.node_id: c.get_content(metadata_mode=MetadataMode.EMBED) for c in chunks}
    first = chunks[0].node_id
    folder = write_beir_folder(
        tmp_path / "set", chunks, [("l1", "Who owns service 7?")], [("l1", first, 1)], {}
    )
    qset = load_beir(folder)
    evaluated = nodes_from_documents(qset.documents())
    assert {n.node_id: n.get_content(metadata_mode=MetadataMode.EMBED) for n in evaluated} == (
        indexed
    )
    (folder / ".hyde-plus").unlink()  # the same files as any BEIR data set: title and text
    beir = load_beir(folder)
    assert beir.document_text(first) == f"{chunks[0].metadata['source']}\n{indexed[first]}"
    assert beir.corpus_sha256 == qset.corpus_sha256  # one content, embedded two ways:
    assert index_cache_dir(beir, "e", tmp_path) != index_cache_dir(qset, "e", tmp_path)
