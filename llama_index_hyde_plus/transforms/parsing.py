"""Pure helpers that turn an LLM's reply into search text: trimming and list parsing.

Nothing here calls a model or raises on odd input; the worst reply parses to ``[]``.
"""

from __future__ import annotations

import json
import re

_SENTENCE_END = ".!?"
_CLOSERS = "\"'”’)]"

_FENCE = re.compile(r"^```[\w-]*\s*$")
# A list marker at the start of a line: "1.", "2)", "(3)", "-", "*", "•", "Q1:", "Query 2 -"
_MARKER = re.compile(
    r"^\s*(?:"
    r"\(?\d{1,2}[.):\]]"  # 1.  1)  (1)  1:  1]
    r"|[-*•‣▪◦–—+]"  # bullets
    r"|#{1,6}"  # markdown headings
    r"|(?:q|query|question|sub-?question|paraphrase|variant)\s*#?\d{1,2}\s*[:.)\-–]"
    r")\s+",
    re.IGNORECASE,
)
_LABEL = re.compile(
    r"^\s*(?:[\w\s-]{0,30}?(?:question|queries|query|rewrite|rewritten|paraphrase|claim|search))"
    r"(?:\s*#?\d{1,2})?\s*:\s+",
    re.IGNORECASE,
)
_PREAMBLE = re.compile(
    r"^\s*(?:sure|certainly|of course|okay|ok|here\s+(?:are|is)|below\s+(?:are|is)|"
    r"i\s+hope|these\s+(?:queries|questions)|let me know)\b",
    re.IGNORECASE,
)
_BOLD = re.compile(r"\*\*(.+?)\*\*")


def trim_passage(text: str, max_characters: int) -> str:
    """Trim ``text`` to at most ``max_characters``, ending at a boundary.

    Cuts at the last sentence end (``.``, ``!`` or ``?``, with any closing quote or
    bracket after it) that lies inside the limit; failing that at the last whitespace;
    failing that, hard at the limit. Text within the limit is only stripped.
    """
    if max_characters < 1:
        raise ValueError("max_characters must be >= 1")
    text = text.strip()
    if len(text) <= max_characters:
        return text
    window = text[:max_characters]
    for i in range(len(window) - 1, -1, -1):
        if window[i] not in _SENTENCE_END:
            continue
        end = i + 1
        while end < len(window) and window[end] in _CLOSERS:
            end += 1
        after = text[end] if end < len(text) else " "
        if after.isspace():
            return window[:end].rstrip()
    if text[max_characters].isspace():
        return window.rstrip()
    for i in range(len(window) - 1, 0, -1):
        if window[i].isspace():
            return window[:i].rstrip()
    return window


def _unquote(item: str) -> str:
    item = item.strip()
    pairs = {'"': '"', "'": "'", "“": "”", "‘": "’", "`": "`", "«": "»"}
    while len(item) >= 2 and item[0] in pairs and item[-1] == pairs[item[0]]:
        item = item[1:-1].strip()
    return item


_LETTERS = re.compile(r"[^\W\d_]")


def _clean_item(line: str) -> str:
    item = _BOLD.sub(r"\1", line.strip())
    for _ in range(3):  # "1. 1. query" and "- 2) query" happen
        stripped = _MARKER.sub("", item, count=1)
        if stripped == item:
            break
        item = stripped
    item = _LABEL.sub("", item, count=1)
    item = _unquote(item).strip().rstrip(",").strip()
    if item.endswith(":") or not _LETTERS.search(item):
        return ""  # a heading or a bare number, not a query
    return item


def _json_items(text: str) -> list[str] | None:
    start, end = text.find("["), text.rfind("]")
    candidates = []
    if start != -1 and end > start:
        candidates.append(text[start : end + 1])
    brace, close = text.find("{"), text.rfind("}")
    if brace != -1 and close > brace:
        candidates.append(text[brace : close + 1])
    for candidate in candidates:
        try:
            data = json.loads(candidate)
        except (ValueError, RecursionError):
            continue
        if isinstance(data, dict):
            lists = [v for v in data.values() if isinstance(v, list)]
            data = lists[0] if lists else None
        if isinstance(data, list) and data and all(isinstance(x, str) for x in data):
            return [str(x) for x in data]
    return None


def _key(item: str) -> str:
    return " ".join(item.casefold().split())


def dedupe(items: list[str], *, exclude: tuple[str, ...] = ()) -> list[str]:
    """Items without repeats (case- and space-insensitive), first seen wins, in order."""
    seen = {_key(x) for x in exclude}
    out = []
    for item in items:
        key = _key(item)
        if key and key not in seen:
            seen.add(key)
            out.append(item)
    return out


#: Default cap on one generated query (characters): a runaway reply must not become a
#: megabyte-long search query and cache entry.
MAX_QUERY_CHARACTERS = 500


def parse_queries(
    text: str,
    n: int,
    *,
    exclude: tuple[str, ...] = (),
    max_characters: int = MAX_QUERY_CHARACTERS,
) -> list[str]:
    """Parse an LLM's list of queries into at most ``n`` distinct strings.

    Accepts JSON arrays (or an object holding one), numbered and bulleted lists, plain
    lines, quotes and markdown bold, code fences, and ignores preambles and sign-offs
    ("Here are 3 queries:", "I hope this helps"). Items equal to one in ``exclude``
    (the original query, say) are dropped. Each query is trimmed to ``max_characters``
    like a HyDE passage (at a sentence end, else a word break). Never raises on odd
    input; returns ``[]`` for nothing.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    if max_characters < 1:
        raise ValueError("max_characters must be >= 1")
    if not text or not text.strip():
        return []
    items = _json_items(text)
    if items is None:
        lines = [ln for ln in text.splitlines() if ln.strip() and not _FENCE.match(ln.strip())]
        marked = [ln for ln in lines if _MARKER.match(ln)]
        if marked:
            lines = marked
        else:
            lines = [
                ln for ln in lines if not (_PREAMBLE.match(ln) or ln.rstrip().endswith(":"))
            ] or lines
        items = lines
    cleaned = [_clean_item(x) for x in items]
    trimmed = [trim_passage(x, max_characters) for x in cleaned if x]
    return dedupe([x for x in trimmed if x], exclude=exclude)[:n]
