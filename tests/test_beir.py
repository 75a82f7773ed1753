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
