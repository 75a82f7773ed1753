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
