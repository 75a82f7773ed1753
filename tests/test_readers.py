"""Reading a folder: SimpleDirectoryReader for text, PDF, Word and HTML; JSON lines;
what is skipped is listed with its reason; hidden files are left out."""

from __future__ import annotations

import io
import json
import sys
import zipfile
from pathlib import Path

import pytest

from llama_index_hyde_plus.models import MissingExtraError
from llama_index_hyde_plus.readers import read_folder


def pdf_bytes(text: str) -> bytes:
    """A one-page PDF showing ``text`` in Helvetica (written by hand: no PDF library
    writes text)."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = io.BytesIO(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.write(b"".join(b"%010d 00000 n \n" % o for o in offsets))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\n" % (len(objects) + 1))
    out.write(b"startxref\n%d\n%%%%EOF\n" % xref)
    return out.getvalue()


def encrypted_pdf_bytes(text: str) -> bytes:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf_bytes(text))))
    writer.encrypt("secret")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def docx_bytes(text: str) -> bytes:
    ns = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
    xml = f'<w:document xmlns:w="{ns}"><w:body><w:p><w:r><w:t>{text}</w:t></w:r></w:p></w:body></w:document>'
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("word/document.xml", xml)
    return out.getvalue()


def _folder(tmp_path: Path, files: dict[str, str | bytes]) -> Path:
    folder = tmp_path / "docs"
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return folder


def test_pdf_word_html_and_rst_are_read_one_document_per_file(tmp_path: Path) -> None:
    folder = _folder(
        tmp_path,
        {
            "report.pdf": pdf_bytes("Quarterly revenue rose by nine percent."),
            "memo.docx": docx_bytes("The Lisbon office moved in March."),
            "web/page.html": "<html><head><script>var x=1;</script></head>"
            "<body><h1>Pricing</h1><p>The add-on costs ten euros.</p></body></html>",
            "guide.rst": "Setup\n=====\n\nRun the installer.",
        },
    )
    contents = read_folder(folder)
    texts = {d.doc_id: d.text for d in contents.documents}
    assert set(texts) == {"guide.rst", "memo.docx", "report.pdf", "web/page.html"}
    assert "Quarterly revenue rose by nine percent." in texts["report.pdf"]
    assert "The Lisbon office moved in March." in texts["memo.docx"]
    assert "ten euros" in texts["web/page.html"] and "<p>" not in texts["web/page.html"]
    assert all(d.metadata == {"source": d.doc_id} for d in contents.documents)
    assert contents.skipped == []


def test_what_is_not_read_is_listed_with_the_reason(tmp_path: Path) -> None:
    folder = _folder(
        tmp_path,
        {
            "notes.txt": "A note.",
            "logo.png": b"\x89PNG\r\n",
            "locked.pdf": encrypted_pdf_bytes("Secret plans."),
            "blank.md": "   \n",
            "Makefile": "all:",
        },
    )
    contents = read_folder(folder)
    assert [d.doc_id for d in contents.documents] == ["notes.txt"]
    reasons = {s.path: s.reason for s in contents.skipped}
    assert reasons["logo.png"] == "unsupported file type (.png)"
    assert reasons["Makefile"] == "unsupported file type (none)"
    assert reasons["blank.md"] == "no text"
    assert reasons["locked.pdf"].startswith("unreadable") and "decrypt" in reasons["locked.pdf"]


def test_hidden_files_and_folders_are_left_out_silently(tmp_path: Path) -> None:
    folder = _folder(
        tmp_path,
        {"a.md": "Shown.", ".git/HEAD": "ref", ".git/notes.txt": "x", ".draft.md": "Hidden."},
    )
    contents = read_folder(folder)
    assert [d.doc_id for d in contents.documents] == ["a.md"] and contents.skipped == []


def test_a_pdf_without_the_docs_extra_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "llama_index.readers.file", None)  # not installed
    folder = _folder(tmp_path, {"a.txt": "Text.", "r.pdf": pdf_bytes("A report.")})
    with pytest.raises(MissingExtraError, match=r"'docs' extra") as info:
        read_folder(folder)
    assert "llama-index-hyde-plus[docs]" in str(info.value) and ".pdf" in str(info.value)


def test_text_files_need_no_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_index.readers.file", None)
    folder = _folder(tmp_path, {"a.txt": "Text.", "b.md": "# B\n\nMore."})
    assert [d.doc_id for d in read_folder(folder).documents] == ["a.txt", "b.md"]


def test_a_folder_with_nothing_readable_says_what_it_skipped(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"photo.jpg": b"\xff\xd8"})
    with pytest.raises(ValueError, match=r"no \.txt.*documents found") as info:
        read_folder(folder)
    assert "photo.jpg: unsupported file type (.jpg)" in str(info.value)


def test_links_to_nothing_link_loops_and_fifos_are_listed_as_skipped(tmp_path: Path) -> None:
    """Never silently left out, and a FIFO named *.txt is never opened (it would block)."""
    import os

    folder = _folder(tmp_path, {"a.txt": "Paid time off is twenty five days."})
    (folder / "gone.txt").symlink_to(folder / "missing.txt")
    (folder / "loop.txt").symlink_to(folder / "loop.txt")
    os.mkfifo(folder / "pipe.txt")
    contents = read_folder(folder)
    assert [d.doc_id for d in contents.documents] == ["a.txt"]
    reasons = {s.path: s.reason for s in contents.skipped}
    assert "link to nothing" in reasons["gone.txt"]
    assert "link loop" in reasons["loop.txt"]
    assert "FIFO" in reasons["pipe.txt"]


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    from llama_index_hyde_plus._files import read_regular_bytes

    os.mkfifo(tmp_path / "pipe.txt")  # no writer: a blocking open would never return
    with pytest.raises(ValueError, match="not a regular file"):
        read_regular_bytes(tmp_path / "pipe.txt")


def test_a_jsonl_line_nested_too_deeply_names_file_and_line(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    folder = _folder(
        tmp_path, {"d.jsonl": '{"text": "fine"}\n{"text": "x", "extra": ' + deep + "}\n"}
    )
    with pytest.raises(ValueError, match=r"d\.jsonl:2: JSON nested too deeply"):
        read_folder(folder)


@pytest.mark.parametrize("key", ["_id", "id"])
def test_an_empty_id_is_refused_with_file_and_line(tmp_path: Path, key: str) -> None:
    line = json.dumps({key: " ", "text": "two"})
    folder = _folder(tmp_path, {"d.jsonl": '{"text": "one"}\n' + line + "\n"})
    with pytest.raises(ValueError, match=rf"d\.jsonl:2: '{key}' is empty"):
        read_folder(folder)
