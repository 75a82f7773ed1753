"""Read a folder of documents: one `Document` per file, or per line of a ``.jsonl``.

Files are read by LlamaIndex's `SimpleDirectoryReader`: plain text (``.txt``, ``.md``,
``.markdown``, ``.rst``) with the core package, and PDF, Word (``.docx``), HTML and CSV
through ``llama-index-readers-file`` (the ``docs`` extra). ``.jsonl`` files hold one
document per line (``text``, optional ``title`` and ``_id``/``id``). The folder is
walked recursively; hidden files and folders (``.git``...) are left out, and every
other file that is not read is listed in `FolderContents.skipped` with the reason.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llama_index.core import Document
from llama_index.core.readers.base import BaseReader

from ._checks import check_folder, is_int
from ._extras import install_hint
from ._files import json_lines, not_regular_reason, read_regular_bytes

TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".rst")
DOCS_SUFFIXES = (".pdf", ".docx", ".html", ".htm", ".csv")
"""Suffixes read through ``llama-index-readers-file`` (the ``docs`` extra)."""
JSONL_SUFFIX = ".jsonl"


@dataclass(frozen=True)
class Skipped:
    """A file that was not indexed (``path`` relative to the folder) and why."""

    path: str
    reason: str


@dataclass
class FolderContents:
    """The documents read from a folder, and the files left out."""

    documents: list[Document] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def _decode(path: Path, rel: str) -> str:
    data = read_regular_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValueError(
            f"{rel}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); "
            "convert the file to UTF-8"
        ) from exc


def _field(row: dict[str, Any], name: str, where: str, *, required: bool) -> str | None:
    value = row.get(name)
    if value is None:
        if required:
            raise ValueError(f"{where}: '{name}' is missing or null; give every line a text")
        return None
    if not isinstance(value, str):
        raise ValueError(
            f"{where}: '{name}' must be a string, not {type(value).__name__} ({value!r:.60})"
        )
    return value


def _doc_id(row: dict[str, Any], where: str) -> str:
    for key in ("_id", "id"):
        value = row.get(key)
        if value is None:
            continue
        if not (isinstance(value, str) or is_int(value)):
            raise ValueError(f"{where}: '{key}' must be a string or an integer")
        if not str(value).strip():
            raise ValueError(f"{where}: '{key}' is empty; give a non-empty id or leave it out")
        return str(value)
    return where


def _jsonl_documents(path: Path, rel: str) -> Iterator[tuple[str, str, Document]]:
    """``(id, where, document)`` for each line of a ``.jsonl`` file."""
    for lineno, row in json_lines(_decode(path, rel).splitlines(), rel):
        where = f"{rel}:{lineno}"
        text = (_field(row, "text", where, required=True) or "").strip()
        title = (_field(row, "title", where, required=False) or "").strip()
        body = f"{title}\n{text}" if title else text
        meta = {"source": rel, "title": title} if title else {"source": rel}
        doc_id = _doc_id(row, where)
        yield doc_id, where, Document(text=body, id_=doc_id, metadata=meta)


class _Utf8Reader(BaseReader):
    """Plain text, strictly UTF-8 (`SimpleDirectoryReader` would drop bad bytes)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def load_data(self, file: Path, extra_info: dict[str, Any] | None = None) -> list[Document]:
        text = _decode(Path(file), str(Path(file).relative_to(self.folder)))
        return [Document(text=text, metadata=dict(extra_info or {}))]


class _Guarded(BaseReader):
    """``inner``, recording instead of raising: a file it cannot read goes to
    ``skipped`` with the error; errors the user must fix (not UTF-8, a missing extra)
    go to ``fatal``, raised once `SimpleDirectoryReader` is done."""

    def __init__(self, inner: BaseReader, contents: FolderContents, fatal: list[Exception]):
        self.inner, self.contents, self.fatal = inner, contents, fatal

    def load_data(self, file: Path, extra_info: dict[str, Any] | None = None) -> list[Document]:
        from .models import MissingExtraError

        rel = str((extra_info or {}).get("source") or file)
        try:
            return list(self.inner.load_data(file, extra_info=extra_info))
        except ValueError as exc:
            if isinstance(self.inner, _Utf8Reader):
                self.fatal.append(exc)
            else:
                self.contents.skipped.append(Skipped(rel, f"unreadable ({exc})"))
        except ImportError as exc:
            self.fatal.append(
                MissingExtraError(
                    f"reading {rel} needs the 'docs' extra ({exc}): {install_hint('docs')}"
                )
            )
        except Exception as exc:  # a damaged or encrypted file: skip it, say why
            exc = _cause(exc)
            self.contents.skipped.append(Skipped(rel, f"unreadable ({type(exc).__name__}: {exc})"))
        return []


def _cause(exc: Exception) -> Exception:
    """The error under tenacity's ``RetryError`` (`PDFReader` retries its reads)."""
    last = getattr(exc, "last_attempt", None)
    inner = last.exception() if last is not None else None
    return inner if isinstance(inner, Exception) else exc


@contextlib.contextmanager
def _root_logger_kept() -> Iterator[None]:
    """The root logger's level and handlers as they were before the block, whatever
    an import in it configured (the application's logging is not ours to change)."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        root.setLevel(level)
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)


def _extractors(folder: Path, suffixes: set[str]) -> dict[str, BaseReader]:
    """The reader of each suffix present (the ``docs`` extra only when needed)."""
    readers: dict[str, BaseReader] = {s: _Utf8Reader(folder) for s in TEXT_SUFFIXES}
    needed = sorted(suffixes & set(DOCS_SUFFIXES))
    if needed:
        from .models import require_extra

        with _root_logger_kept():  # a reader module calls logging.basicConfig(INFO)
            require_extra(
                "docs", ("llama_index.readers.file",), f"reading {', '.join(needed)} files"
            )
            from llama_index.readers.file import CSVReader, DocxReader, HTMLTagReader, PDFReader

        html = HTMLTagReader(tag="body")
        readers.update(
            {".pdf": PDFReader(return_full_document=True), ".docx": DocxReader()}
            | {".html": html, ".htm": html, ".csv": CSVReader(concat_rows=True)}
        )
    return readers


def _visible_files(folder: Path, contents: FolderContents) -> list[Path]:
    """Regular files under ``folder``, sorted, without hidden files or anything in a
    hidden folder (relative to ``folder``); a link to nothing, a link loop, a FIFO or a
    device is listed in ``contents.skipped`` with the reason, and never opened."""
    files = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):
            continue
        reason = not_regular_reason(path)
        if reason is None:
            files.append(path)
        elif reason:
            contents.skipped.append(Skipped(str(rel), reason))
    return files


def _read_files(folder: Path, files: list[Path], contents: FolderContents) -> dict[str, Document]:
    """One document per file of ``files`` read by `SimpleDirectoryReader`, by path
    relative to ``folder`` (a file a reader returns in parts, such as pages, is joined)."""
    from llama_index.core import SimpleDirectoryReader

    if not files:
        return {}
    fatal: list[Exception] = []
    readers = _extractors(folder, {p.suffix.lower() for p in files})
    guarded: dict[str, BaseReader] = {s: _Guarded(r, contents, fatal) for s, r in readers.items()}
    reader = SimpleDirectoryReader(
        input_files=files,
        file_extractor=guarded,
        file_metadata=lambda p: {"source": str(Path(p).relative_to(folder))},
        raise_on_error=True,
    )
    parts: dict[str, list[str]] = {}
    for doc in reader.load_data():
        parts.setdefault(str(doc.metadata["source"]), []).append(doc.text)
    if fatal:
        raise fatal[0]
    return {
        rel: Document(text="\n\n".join(texts).strip(), id_=rel, metadata={"source": rel})
        for rel, texts in parts.items()
    }


def read_folder(folder: Path) -> FolderContents:
    """Every document under ``folder`` (see the module's docstring), in path order.

    A `ValueError` names the file and line of anything it cannot take as it is: a text
    file that is not UTF-8, a line that is not a JSON object, a ``text`` that is null
    or not a string, and a document id used twice (with both places). Files of other
    types, unreadable files (an encrypted PDF) and empty ones are listed as skipped."""
    check_folder(folder, "DIR")
    contents = FolderContents()
    files = _visible_files(folder, contents)
    readable = [p for p in files if p.suffix.lower() in TEXT_SUFFIXES + DOCS_SUFFIXES]
    read = _read_files(folder, readable, contents)
    unread = set(readable) - {folder / rel for rel in read}
    seen: dict[str, str] = {}
    for path in files:
        rel, suffix = str(path.relative_to(folder)), path.suffix.lower()
        if suffix == JSONL_SUFFIX:
            found = list(_jsonl_documents(path, rel))
        elif rel in read:
            found = [(rel, rel, read[rel])]
        elif path in unread:
            found = []  # unreadable (the reader said why) or no text at all
        else:
            contents.skipped.append(Skipped(rel, f"unsupported file type ({suffix or 'none'})"))
            continue
        _add(contents, seen, found)
        if path in unread and rel not in {s.path for s in contents.skipped}:
            contents.skipped.append(Skipped(rel, "no text"))
    if not contents.documents:
        raise ValueError(f"no {_supported()} documents found in {folder}{_listing(contents)}")
    return contents


def _add(
    contents: FolderContents, seen: dict[str, str], found: list[tuple[str, str, Document]]
) -> None:
    for doc_id, where, doc in found:
        if not doc.text.strip():
            contents.skipped.append(Skipped(where, "no text"))
            continue
        if doc_id in seen:
            raise ValueError(
                f"duplicate document id {doc_id!r} in {seen[doc_id]} and {where}; "
                "give every document a unique _id"
            )
        seen[doc_id] = where
        contents.documents.append(doc)


def _supported() -> str:
    return ", ".join((*TEXT_SUFFIXES, *DOCS_SUFFIXES)) + f" or {JSONL_SUFFIX}"


def _listing(contents: FolderContents) -> str:
    if not contents.skipped:
        return ""
    first = "; ".join(f"{s.path}: {s.reason}" for s in contents.skipped[:5])
    more = len(contents.skipped) - 5
    return f"; skipped {first}" + (f" and {more} more" if more > 0 else "")


def read_documents(folder: Path) -> list[Document]:
    """The documents of `read_folder` (what it skipped is not reported)."""
    return read_folder(folder).documents
