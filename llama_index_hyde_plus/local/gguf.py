"""The control tokens of a GGUF model, read from its header, and the text escape that
keeps them from being written by users: llama.cpp's chat endpoint tokenizes the whole
formatted prompt with special tokens on, so ``<|im_start|>`` inside a question or a
document would otherwise become a real chat-role marker."""

from __future__ import annotations

import functools
import struct
from typing import BinaryIO

ESCAPE = "\u2060"
"""Inserted after the first character of a control token's text: the word joiner is
invisible and byte-level tokenizers read it as ordinary text."""
#: llama.cpp token types a prompt may name by their text only with special tokens on.
_CONTROL_TYPES = frozenset({2, 3})  # UNKNOWN, CONTROL
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
_MAX_STRING = 1 << 24


class GGUFError(ValueError):
    """The file is not a GGUF model this reader understands."""


def _read(f: BinaryIO, fmt: str) -> object:
    size = struct.calcsize("<" + fmt)
    data = f.read(size)
    if len(data) != size:
        raise GGUFError("truncated GGUF header")
    return struct.unpack("<" + fmt, data)[0]


def _string(f: BinaryIO) -> str:
    length = _read(f, "Q")
    assert isinstance(length, int)
    if length > _MAX_STRING:
        raise GGUFError(f"GGUF header string of {length} bytes: not a model header")
    data = f.read(length)
    if len(data) != length:
        raise GGUFError("truncated GGUF header")
    return data.decode("utf-8", "replace")


def _value(f: BinaryIO, kind: int) -> object:
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        item, count = _read(f, "I"), _read(f, "Q")
        assert isinstance(item, int) and isinstance(count, int)
        return [_value(f, item) for _ in range(count)]
    if kind not in _SCALARS:
        raise GGUFError(f"unknown GGUF value type {kind}")
    return _read(f, _SCALARS[kind])


@functools.lru_cache(maxsize=8)
def control_tokens(path: str) -> tuple[str, ...]:
    """The text of every control (and unknown) token in the GGUF model at ``path``,
    longest first; empty when the header has no token types."""
    tokens: object = None
    types: object = None
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file")
        _read(f, "I")  # version
        _read(f, "Q")  # tensor count
        entries = _read(f, "Q")
        assert isinstance(entries, int)
        for _ in range(entries):
            key = _string(f)
            kind = _read(f, "I")
            assert isinstance(kind, int)
            value = _value(f, kind)
            if key == "tokenizer.ggml.tokens":
                tokens = value
            elif key == "tokenizer.ggml.token_type":
                types = value
            if tokens is not None and types is not None:
                break
    if not isinstance(tokens, list) or not isinstance(types, list):
        return ()
    found = {t for t, k in zip(tokens, types) if k in _CONTROL_TYPES and len(t) > 1}
    return tuple(sorted(found, key=len, reverse=True))


def escape_controls(text: str, controls: tuple[str, ...]) -> str:
    """``text`` with every control token's text broken by `ESCAPE` after its first
    character, so the tokenizer reads it as ordinary text (several tokens), never as
    the control token itself."""
    for token in controls:
        if token in text:
            text = text.replace(token, token[0] + ESCAPE + token[1:])
    return text
