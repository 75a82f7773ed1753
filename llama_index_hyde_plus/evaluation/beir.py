"""Load a dataset in BEIR format: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``.

Every malformed line is reported with its file and line number, and nothing is
half-loaded: a dataset either loads whole or raises `BeirFormatError`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from llama_index.core import Document

from .._checks import is_int
from .._files import json_lines, sha256_file
from .._owned import marker_kind
from .questions import SET_KIND, locked_set


class BeirFormatError(ValueError):
    """A BEIR file is missing or malformed (the message names the file and line)."""


@dataclass(frozen=True)
class BeirDataset:
    """A loaded BEIR dataset, restricted to the queries that have judgments."""

    name: str
    corpus: dict[str, tuple[str, str]]  # doc id -> (title, text)
    queries: dict[str, str]  # query id -> text, in file order
    qrels: dict[str, dict[str, int]]  # query id -> doc id -> relevance
    corpus_sha256: str
    unit: str = "documents"
    """What the corpus holds, as titles say it: ``documents``, or ``chunks`` for a
    question set written from a user's chunks (``eval --docs``)."""
    titled: bool = True
    """Whether a document is embedded with its title (BEIR's convention). False for a
    question set hyde-plus wrote from a user's chunks (`load_beir`): its titles are
    the chunks' files, and ``hyde-plus index`` embeds a chunk's text alone."""

    def document_text(self, doc_id: str) -> str:
        """What is embedded of the document: its title and text, one line apart (its
        text alone when the dataset is not `titled`)."""
        title, text = self.corpus[doc_id]
        return f"{title}\n{text}" if title and self.titled else text

    def documents(self) -> list[Document]:
        """The corpus as LlamaIndex documents (title and text), ids kept."""
        return [Document(text=self.document_text(did), id_=did) for did in self.corpus]


def _text(row: dict[str, object], key: str, path: Path, lineno: int) -> str:
    """A string field (an integer id is taken as its digits); null, lists and objects
    are errors rather than their Python repr."""
    value = row[key]
    if not (isinstance(value, str) or is_int(value)):
        raise BeirFormatError(
            f"{path.name}:{lineno}: '{key}' must be a string, not {type(value).__name__}"
        )
    return str(value)


def _id(row: dict[str, object], path: Path, lineno: int) -> str:
    """The row's ``_id``: a string (or an integer's digits) that is not empty."""
    value = _text(row, "_id", path, lineno)
    if not value.strip():
        raise BeirFormatError(f"{path.name}:{lineno}: '_id' is empty; give every line an id")
    return value


def _decode_line(
    raw: bytes, path: Path, lineno: int, error: type[ValueError] = BeirFormatError
) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path.name}:{lineno}: not UTF-8 text; convert the file to UTF-8") from exc


def read_jsonl(
    path: Path, required: tuple[str, ...], error: type[ValueError] = BeirFormatError
) -> list[tuple[int, dict[str, object]]]:
    """The ``(line number, object)`` of each line of the JSON Lines file ``path``, every
    one holding the ``required`` keys; ``error`` naming the file and the line for a
    missing or empty file, a line that is not UTF-8 or not a JSON object, or a missing key."""
    if not path.is_file():
        raise error(f"missing file: {path}")
    rows = []
    with path.open("rb") as f:
        lines = (_decode_line(raw, path, lineno, error) for lineno, raw in enumerate(f, 1))
        for lineno, row in json_lines(lines, path.name, error):
            missing = [k for k in required if k not in row]
            if missing:
                raise error(f"{path.name}:{lineno}: missing field(s) {missing}")
            rows.append((lineno, row))
    if not rows:
        raise error(f"{path.name} is empty")
    return rows


def dataset_folder(folder: str | Path, limit: int | None, error: type[ValueError]) -> Path:
    """``folder`` as a path, once it is a folder (else ``error``) and ``limit`` is None
    or at least 1 (else `ValueError`)."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise error(f"dataset folder not found: {root}")
    if limit is not None and limit < 1:
        raise ValueError("limit must be >= 1")
    return root


def read_corpus(corpus_path: Path) -> dict[str, tuple[str, str]]:
    """``{_id: (title, text)}`` from a BEIR ``corpus.jsonl``; a `BeirFormatError`
    names the line of a duplicate id or a field of the wrong type."""
    corpus: dict[str, tuple[str, str]] = {}
    first_line: dict[str, int] = {}
    for lineno, row in read_jsonl(corpus_path, ("_id", "text")):
        doc_id = _id(row, corpus_path, lineno)
        if doc_id in first_line:
            raise BeirFormatError(
                f"{corpus_path.name}:{lineno}: duplicate _id {doc_id!r} "
                f"(first at line {first_line[doc_id]}); give every document a unique _id"
            )
        first_line[doc_id] = lineno
        title = row.get("title")
        if title is not None and not isinstance(title, str):
            raise BeirFormatError(f"{corpus_path.name}:{lineno}: 'title' must be a string")
        corpus[doc_id] = ((title or "").strip(), _text(row, "text", corpus_path, lineno))
    return corpus


_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def _grade(score: str, where: str) -> int:
    """The relevance grade ``score`` (ASCII digits only: ``float`` would also read
    Arabic-Indic or other Unicode digits, and ``1_0``)."""
    if not _NUMBER.fullmatch(score.strip()):
        raise BeirFormatError(f"{where}: score {score!r} is not a number (ASCII digits)")
    value = float(score)
    if not math.isfinite(value):
        raise BeirFormatError(
            f"{where}: score {score!r} is not finite; use an integer relevance grade (0, 1, 2...)"
        )
    return int(value)


def read_qrels(
    qrels_path: Path, queries: Mapping[str, str], corpus: Mapping[str, object]
) -> dict[str, dict[str, int]]:
    """``{query id: {corpus id: grade}}`` from a BEIR qrels TSV (an optional header,
    then query-id, corpus-id, score); every id must be in ``queries`` / ``corpus``."""
    if not qrels_path.is_file():
        raise BeirFormatError(f"missing file: {qrels_path}")
    qrels: dict[str, dict[str, int]] = {}
    with qrels_path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            line = _decode_line(raw, qrels_path, lineno)
            parts = line.rstrip("\n").split("\t")
            if not line.strip() or (lineno == 1 and parts[0] in ("query-id", "query_id", "qid")):
                continue
            where = f"{qrels_path.name}:{lineno}"
            if len(parts) != 3:
                raise BeirFormatError(
                    f"{where}: expected 3 tab-separated columns (query-id, corpus-id, score)"
                )
            qid, did, score = parts
            if qid not in queries:
                raise BeirFormatError(f"{where}: unknown query id {qid!r}")
            if did not in corpus:
                raise BeirFormatError(f"{where}: unknown corpus id {did!r}")
            qrels.setdefault(qid, {})[did] = _grade(score, where)
    if not qrels:
        raise BeirFormatError(f"{qrels_path.name} has no judgments")
    return qrels


def load_beir(folder: str | Path, split: str = "test", *, limit: int | None = None) -> BeirDataset:
    """Load the BEIR dataset in ``folder``; keep the judged queries of ``split``.

    ``limit`` keeps the first N judged queries (in ``queries.jsonl`` order). A question
    set hyde-plus wrote from a user's documents (its folder's marker says so) is not
    `titled`: its chunks are embedded as ``hyde-plus index`` embeds them.
    """
    root = dataset_folder(folder, limit, BeirFormatError)
    if marker_kind(root) != SET_KIND:
        return _load(root, split, limit, titled=True)
    with locked_set(root, None):  # a set being written is read once it is whole
        return _load(root, split, limit, titled=False)


def _load(root: Path, split: str, limit: int | None, *, titled: bool) -> BeirDataset:
    corpus_path = root / "corpus.jsonl"
    corpus = read_corpus(corpus_path)
    queries_path = root / "queries.jsonl"
    all_queries = {
        _id(r, queries_path, n): _text(r, "text", queries_path, n)
        for n, r in read_jsonl(queries_path, ("_id", "text"))
    }
    qrels = read_qrels(root / "qrels" / f"{split}.tsv", all_queries, corpus)
    queries = {qid: text for qid, text in all_queries.items() if qid in qrels}
    if limit is not None:
        queries = dict(list(queries.items())[:limit])
        qrels = {qid: qrels[qid] for qid in queries}
    return BeirDataset(root.name, corpus, queries, qrels, sha256_file(corpus_path), titled=titled)
