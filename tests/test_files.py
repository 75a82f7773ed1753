from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from llama_index_hyde_plus._files import json_lines, sha256_file


def test_sha256_file_matches_hashlib_across_chunks(tmp_path: Path) -> None:
    data = b"x" * (3 * (1 << 20) + 17)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_json_lines_skips_blank_lines_and_numbers_the_rest() -> None:
    rows = list(json_lines(['{"a": 1}', "  ", '{"b": 2}'], "f.jsonl"))
    assert rows == [(1, {"a": 1}), (3, {"b": 2})]


class CustomError(ValueError):
    pass


@pytest.mark.parametrize(
    ("line", "message"),
    [("{oops", "f.jsonl:2: not valid JSON"), ("[1, 2]", "f.jsonl:2: expected a JSON object")],
)
def test_json_lines_names_the_file_and_line_of_a_bad_row(line: str, message: str) -> None:
    with pytest.raises(CustomError, match=message):
        list(json_lines(['{"ok": true}', line], "f.jsonl", CustomError))


def test_a_folder_is_written_only_when_new_empty_or_marked_as_its_kind(tmp_path: Path) -> None:
    from llama_index_hyde_plus._owned import check_folder, claim

    new, empty, ours, theirs = (tmp_path / n for n in ("new", "empty", "ours", "theirs"))
    empty.mkdir()
    for folder in (new, empty, ours):
        assert check_folder(folder, "eval-results", "--out") == folder
    claim(ours, "eval-results")
    (ours / "results.json").write_text("{}")
    assert check_folder(ours, "eval-results", "--out") == ours
    with pytest.raises(ValueError, match=rf"--out {ours} .* marker says eval-results"):
        check_folder(ours, "index", "--out")  # another kind of hyde-plus folder
    theirs.mkdir()
    (theirs / "thesis.tex").write_text("mine")
    with pytest.raises(ValueError, match=rf"--out {theirs} is neither empty .*no \.hyde-plus"):
        check_folder(theirs, "eval-results", "--out")
    (theirs / ".hyde-plus").write_text("my own notes\n")  # a file named so is not a marker
    with pytest.raises(ValueError, match=r"no \.hyde-plus marker"):
        check_folder(theirs, "eval-results", "--out")
    assert sorted(p.name for p in theirs.iterdir()) == [".hyde-plus", "thesis.tex"]
    assert not new.exists()  # checking makes nothing


def test_a_kill_or_full_disk_while_writing_files_leaves_every_old_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from llama_index_hyde_plus._owned import write_all_atomic

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_all_atomic([(a, b"old a"), (b, b"old b")])
    real = os.replace

    def killed(src: str, dst: str) -> None:  # dies before the first rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_all_atomic([(a, b"new a"), (b, b"new b")])
    monkeypatch.setattr(os, "replace", real)
    assert (a.read_bytes(), b.read_bytes()) == (b"old a", b"old b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]


def test_an_output_that_is_a_fifo_is_refused_as_a_special_file_and_left_alone(
    tmp_path: Path,
) -> None:
    import os

    from llama_index_hyde_plus._owned import check_outputs

    fifo = tmp_path / "manifest.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"manifest.json is a special file hyde-plus did not"):
        check_outputs([fifo], "--questions-dir")
    assert fifo.is_fifo()
