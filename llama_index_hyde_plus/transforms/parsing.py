"""Pure helpers that turn an LLM's reply into search text: trimming, list parsing and
picking the one query of a single-query reply.

Nothing here calls a model or raises on odd input; the worst reply parses to ``[]``.
Lines that echo the prompt's instructions ("Reply with one query per line...", "Here
are 3 queries", "Sure!") or a template's placeholders ("[Insert Query 1]") are never
taken for queries, and a chat template's special tokens and invisible characters never
reach a search (`clean_reply`).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from .._shown import UNPRINTABLE

if TYPE_CHECKING:
    from typing_extensions import Unpack

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
# Instruction echoes and chatter, recognised without the prompt (kept narrow: a real
# query may start with "write" or "list", so only phrasings no search query uses).
_ECHO = re.compile(
    r"\b(?:one|each|a)\s+(?:search\s+)?(?:query|question|sub-?question)\s+per\s+line\b"
    r"|\bnumbered\s+(?:from\s+)?\d+\s*(?:to|through|-|–)\s*\d+\b"
    r"|^(?:reply|respond|answer)\s+with\b.*\b(?:quer(?:y|ies)|questions?|lines?|only)\b"
    r"|^(?:here|below)\s+(?:are|is)\b.*\b(?:quer(?:y|ies)|(?:sub-?)?questions?|paraphrases?"
    r"|rewrites?|variants?|versions?)\b"
    r"|^(?:sure|certainly|of\s+course|okay|ok)\s*(?:[!,.:]|$)"
    r"|^(?:sure\s+thing|i\s+hope|let\s+me\s+know|i\s+can\s+help)\b",
    re.IGNORECASE,
)
_WORD = re.compile(r"[^\W\d_]+")
_STOPWORDS = frozenset(
    re.findall(
        r"\w+",
        "a an and are as at be by each for from how in is it its of on or per than that the "
        "their them then these this those to was what when where which who why with",
    )
)
ECHO_SHARE = 0.8
"""An item at least this share of whose words come from the prompt's instructions (and
none from the question) is an echo of the prompt, not a query."""
_SENTENCE_BREAK = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'”’)\]]))\s+")
SHORT_WORDS = 30
"""A single-query reply's line of at most this many words counts as the query."""


# Chat-template tokens of common model families, and the role name a turn's start
# token is followed by: ChatML (<|im_start|>assistant ... <|im_end|>), Llama 2
# (<s>[INST] ... [/INST] ... </s>, <<SYS>>), Llama 3 (<|start_header_id|>assistant
# <|end_header_id|> ... <|eot_id|>), Phi (<|assistant|> ... <|end|>), Gemma
# (<start_of_turn>model ... <end_of_turn>), GPT (<|endoftext|>), DeepSeek (<｜...｜>).
_SPECIAL_TOKEN = re.compile(
    r"<\|im_start\|>[ \t]*(?:system|user|assistant)?"
    r"|<\|start_header_id\|>[^<\n]{0,20}<\|end_header_id\|>"
    r"|<start_of_turn>[ \t]*(?:user|model)?"
    r"|<\|[A-Za-z][A-Za-z0-9_]{0,39}\|>"
    r"|<｜[^｜<>\n]{1,40}｜>"
    r"|</?s>|\[/?INST\]|<</?SYS>>|<(?:eos|bos|pad|unk|end_of_turn)>"
)
# The tokens that end a turn: what follows one is another turn, not the reply.
_END_OF_TURN = re.compile(
    r"</s>|<end_of_turn>|<eos>|<｜end▁of▁sentence｜>"
    r"|<\|(?:im_end|endoftext|eot_id|eom_id|end|end_of_text|END_OF_TURN_TOKEN)\|>"
)
_JOINERS = "\u200c\u200d"
# A zero-width (non-)joiner that does not join two visible characters.
_LOOSE_JOINER = re.compile(rf"(?:^|(?<=\s))[{_JOINERS}]+|[{_JOINERS}]+(?=\s|$)")


def _visible(text: str) -> str:
    """``text`` without format characters (Unicode category Cf: zero-width space,
    BOM, word joiner, soft hyphen, direction marks...), keeping the zero-width joiner
    and non-joiner where they join two characters (emoji sequences, Persian words)."""
    if text.isascii():
        return text
    kept = "".join(ch for ch in text if ch in _JOINERS or unicodedata.category(ch) != "Cf")
    return _LOOSE_JOINER.sub("", kept)


def clean_reply(text: str) -> str:
    """An LLM's reply without what is not content: format characters (see
    `_visible`), a chat template's special tokens (`_SPECIAL_TOKEN`) and whatever
    follows the first end-of-turn token after some content (another turn). Stripped;
    ``""`` for a reply with no content, which no transform can use. Cleaning again
    changes nothing (a token spelled around another, ``<|im_<|x|>end|>``, goes too)."""
    cleaned = _clean_once(_visible(_printable(text)))
    while True:
        again = _clean_once(cleaned)
        if again == cleaned:
            return cleaned
        cleaned = again


_LINE_BREAKS = re.compile(r"\r\n?|[\u2028\u2029\x85]")


def _printable(text: str) -> str:
    """``text`` with every line break as ``\\n`` and without control characters
    (escape sequences lose their ESC) or lone surrogates: nothing a query, a cache
    entry or a terminal cannot hold."""
    return UNPRINTABLE.sub("", _LINE_BREAKS.sub("\n", text))


def _clean_once(text: str) -> str:
    """The first turn of ``text`` with content, without special tokens, stripped."""
    for turn in _END_OF_TURN.split(text):
        content = _SPECIAL_TOKEN.sub("", turn).strip()
        if content:
            return content
    return ""


# A template's placeholder left in a reply: a bracketed run of placeholder words
# ("[Insert Query 1]", "<query 2>", "{query}", "[your sub-question here]"), or a
# whole item that is one ("Query 1", "Question 2...").
_SLOT_WORDS = (
    r"(?:insert|enter|add|write|your|the|a|an|new|another|alternative|generated|search|"
    r"sub-?questions?|sub-?quer(?:y|ies)|quer(?:y|ies)|questions?|paraphrases?|rewrites?|"
    r"variants?|versions?|keywords?|here|text|number|item|n|\d{1,2}|first|second|third|"
    r"fourth|fifth|#|\.{3}|…)"
)
_PLACEHOLDER = re.compile(
    rf"\[\s*{_SLOT_WORDS}(?:[\s_-]+{_SLOT_WORDS})*\s*\]"
    rf"|<\s*{_SLOT_WORDS}(?:[\s_-]+{_SLOT_WORDS})*\s*>"
    rf"|\{{\s*{_SLOT_WORDS}(?:[\s_-]+{_SLOT_WORDS})*\s*\}}",
    re.IGNORECASE,
)
_BARE_PLACEHOLDER = re.compile(
    r"^(?:insert\s+)?(?:your\s+)?(?:sub-?)?(?:query|question|paraphrase|rewrite|variant)"
    r"\s*#?\s*(?:\d{1,2}|n)?(?:\s+here)?\s*(?:\.{3}|…)?$",
    re.IGNORECASE,
)


def _without_placeholders(item: str) -> str:
    """``item`` with a template's placeholders removed; ``""`` when it is one."""
    if _BARE_PLACEHOLDER.match(item):
        return ""
    if not _PLACEHOLDER.search(item):
        return item
    return " ".join(_PLACEHOLDER.sub(" ", item).split())


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
    item = _without_placeholders(_unquote(item).strip().rstrip(",").strip())
    item = _MARKER.sub("", item, count=1) if _MARKER.match(item) else item
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


_SPACE_BEFORE_MARK = re.compile(r"\s+(?=[?.!,;:])")
_END_MARKS = " \t?.!\u2026"


def _key(item: str) -> str:
    """What two items must share to be the same query: compatibility-normalised
    (full-width letters and marks as ASCII), case-folded, one space between words,
    none before a punctuation mark, without closing marks ("Why X ?." is "why x")."""
    text = unicodedata.normalize("NFKC", _visible(item)).casefold()
    return " ".join(_SPACE_BEFORE_MARK.sub("", text).rstrip(_END_MARKS).split())


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


REPEATED_QUESTION = "duplicate_of_question"
REPEATED_QUERY = "duplicate_of_another"
ECHOED_PROMPT = "echo_of_prompt"
NOT_A_QUERY = "not_a_query"
BEYOND_N = "beyond_n"
DROP_REASONS = (REPEATED_QUESTION, REPEATED_QUERY, ECHOED_PROMPT, NOT_A_QUERY, BEYOND_N)
"""Why an item of a reply is not one of its queries, in the order `QueryCount` lists
them: the question itself, a repeat of an earlier query, an echo of the prompt, a line
that holds no query (a preamble or sign-off such as "Here are 3 queries:", a heading, a
placeholder such as "[Insert query 2]", a bare number, a line without the list marker
the other lines have), a query past the ``n`` asked for. Fences and blank lines are not
counted."""

_SAID = {
    REPEATED_QUESTION: "repeating the question",
    REPEATED_QUERY: "repeating another query",
    ECHOED_PROMPT: "echoing the prompt",
    NOT_A_QUERY: "holding no query",
    BEYOND_N: "past the number asked for",
}
"""Each of `DROP_REASONS` in words, after a count ("2 repeating the question")."""

Tally = dict[str, int]

MAX_COUNT = 1_000_000
"""The most items of one reply a `QueryCount` may count (a cache entry beyond it is
not one this package wrote)."""


def _count(tally: Tally, reason: str, count: int) -> None:
    if count:
        tally[reason] = tally.get(reason, 0) + count


@dataclass(frozen=True)
class QueryCount:
    """What a reply to a list transform (`MultiQuery`, `Decompose`) gave: how many
    queries were ``asked`` for, how many were ``kept``, and why the other items of the
    reply were left out (``dropped``: ``(reason, count)`` pairs, reasons from
    `DROP_REASONS`); ``trimmed`` of the kept ones were cut to the length limit.
    ``TransformResult.parsed`` holds it, what ``query`` shows and ``--json`` writes."""

    asked: int
    kept: int
    dropped: tuple[tuple[str, int], ...] = ()
    trimmed: int = 0

    @property
    def short(self) -> bool:
        """Fewer queries kept than asked for."""
        return self.kept < self.asked

    def reasons(self) -> str:
        """The reply's items left out, in words (they are lines of the reply, not
        queries asked for): ``"left out of the reply: 2 repeating the question, 1
        holding no query"``; ``"the reply held no more"`` when none was."""
        if not self.dropped:
            return "the reply held no more" if self.kept else "the reply held none"
        said = (f"{count} {_SAID.get(reason, reason)}" for reason, count in self.dropped)
        return "left out of the reply: " + ", ".join(said)

    def summary(self) -> str:
        """One line for a person: ``"kept 1 of the 3 queries asked for; left out of the
        reply: 2 repeating the question"``, and how many were cut to the length limit."""
        line = f"kept {self.kept} of the {self.asked} queries asked for; {self.reasons()}"
        if self.trimmed:
            line += f"; {self.trimmed} cut to the length limit"
        return line

    def to_dict(self) -> dict[str, Any]:
        """``{"asked": 3, "kept": 1, "dropped": {"duplicate_of_question": 2},
        "trimmed": 0}``: what ``query --json`` shows and a cache stores."""
        return {
            "asked": self.asked,
            "kept": self.kept,
            "dropped": dict(self.dropped),
            "trimmed": self.trimmed,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QueryCount:
        """Inverse of `to_dict` (the record is checked by ``check_record`` first)."""
        return cls(
            asked=data["asked"],
            kept=data["kept"],
            dropped=tuple((str(k), int(v)) for k, v in data["dropped"].items()),
            trimmed=data["trimmed"],
        )

    @staticmethod
    def valid(data: object) -> bool:
        """Whether ``data`` has the shape `to_dict` writes."""
        if not isinstance(data, dict) or set(data) != {"asked", "kept", "dropped", "trimmed"}:
            return False
        asked, kept, trimmed = data["asked"], data["kept"], data["trimmed"]
        dropped = data["dropped"]
        return (
            all(type(c) is int and 0 <= c <= MAX_COUNT for c in (asked, kept, trimmed))
            and trimmed <= kept <= asked
            and isinstance(dropped, dict)
            and all(
                k in DROP_REASONS and type(v) is int and 0 < v <= MAX_COUNT
                for k, v in dropped.items()
            )
        )


@dataclass(frozen=True)
class ReadQueries:
    """`read_queries`' answer: the queries kept, and the `QueryCount` of the reply."""

    queries: tuple[str, ...]
    count: QueryCount


MAX_QUERY_CHARACTERS = 500
"""Default cap on one generated query (characters): a runaway reply must not become a
megabyte-long search query and cache entry."""


class ReadOptions(TypedDict, total=False):
    """The keyword options of `read_queries` (and so of `parse_queries`) and of
    `parse_single`: how a reply is read."""

    exclude: tuple[str, ...]
    max_characters: int
    instruction: str
    question: str


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.casefold()) if w not in _STOPWORDS}


def is_echo(item: str, instruction: str = "", question: str = "") -> bool:
    """Whether ``item`` (one cleaned line of a reply) echoes the prompt instead of
    being a query: a known instruction or chatter phrasing, or, given the prompt's
    ``instruction`` text (rendered without the question), at least three words of
    which `ECHO_SHARE` are the instruction's own and none is one of the ``question``'s
    (a query that shares a word with the question is kept)."""
    return _echo_test(instruction, question)(item)


def _echo_test(instruction: str, question: str) -> Callable[[str], bool]:
    """`is_echo` for one prompt and question, their words read once (a reply has
    several items to test)."""
    asked = _words(question) if instruction else set()
    own = _words(instruction) - asked if instruction else set()

    def test(item: str) -> bool:
        if _ECHO.search(item):
            return True
        if not instruction:
            return False
        words = _words(item)
        if len(words) < 3 or words & asked:
            return False
        return len(words & own) >= ECHO_SHARE * len(words)

    return test


def _candidates(
    text: str, instruction: str, question: str, dropped: Tally | None = None
) -> list[str]:
    """The reply's items in order, cleaned, without fences, preambles and echoes;
    each item left out (a fence or a blank line excepted) is counted in ``dropped``
    under its reason (`NOT_A_QUERY`, `ECHOED_PROMPT`)."""
    dropped = {} if dropped is None else dropped
    text = clean_reply(text)
    if not text:
        return []
    items = _json_items(text)
    if items is None:
        lines = [ln for ln in text.splitlines() if ln.strip() and not _FENCE.match(ln.strip())]
        marked = [ln for ln in lines if _MARKER.match(ln)]
        if marked:
            kept = marked
        else:
            kept = [
                ln for ln in lines if not (_PREAMBLE.match(ln) or ln.rstrip().endswith(":"))
            ] or lines
        _count(dropped, NOT_A_QUERY, len(lines) - len(kept))
        items = kept
    cleaned = [_clean_item(x) for x in items]
    _count(dropped, NOT_A_QUERY, cleaned.count(""))
    echo = _echo_test(instruction, question)
    out = [x for x in cleaned if x and not echo(x)]
    _count(dropped, ECHOED_PROMPT, len(cleaned) - cleaned.count("") - len(out))
    return out


def _check_limits(n: int, max_characters: int) -> None:
    if n < 1:
        raise ValueError("n must be >= 1")
    if max_characters < 1:
        raise ValueError("max_characters must be >= 1")


def parse_queries(text: str, n: int, **options: Unpack[ReadOptions]) -> list[str]:
    """Parse an LLM's list of queries into at most ``n`` distinct strings.

    Accepts JSON arrays (or an object holding one), numbered and bulleted lists, plain
    lines, quotes and markdown bold, code fences, and ignores preambles and sign-offs
    ("Here are 3 queries:", "I hope this helps") and lines that echo the prompt (see
    `is_echo`; pass the prompt's ``instruction`` text and the ``question`` to catch
    echoes of any prompt). Items equal to one in ``exclude`` (the original query, say)
    are dropped. Each query is trimmed to ``max_characters`` like a HyDE passage (at a
    sentence end, else a word break). Never raises on odd input; returns ``[]`` for
    nothing. The ``options`` (`ReadOptions`) are those of `read_queries`, which says,
    besides, why the other items were left out.
    """
    return list(read_queries(text, n, **options).queries)


def read_queries(
    text: str,
    n: int,
    *,
    exclude: tuple[str, ...] = (),
    max_characters: int = MAX_QUERY_CHARACTERS,
    instruction: str = "",
    question: str = "",
) -> ReadQueries:
    """`parse_queries`, with what became of the rest of the reply: how many queries
    were asked for (``n``), how many were kept, how many were cut to
    ``max_characters``, and each item left out counted under its reason
    (`DROP_REASONS`: the question itself when it is in ``exclude``, a repeat of an
    earlier query, an echo of the prompt, a line that is no query, one past ``n``)."""
    _check_limits(n, max_characters)
    dropped: Tally = {}
    items = _candidates(text, instruction, question, dropped)
    asked = {_key(x) for x in exclude}
    seen: set[str] = set()
    kept: list[str] = []
    trimmed = 0
    for item in items:
        query = trim_passage(item, max_characters)
        key = _key(query)
        if key in asked:
            _count(dropped, REPEATED_QUESTION, 1)
        elif key in seen:
            _count(dropped, REPEATED_QUERY, 1)
        elif len(kept) == n:
            _count(dropped, BEYOND_N, 1)
        else:
            seen.add(key)
            kept.append(query)
            trimmed += len(query) < len(item.strip())
    report = QueryCount(
        asked=n,
        kept=len(kept),
        dropped=tuple((r, dropped[r]) for r in DROP_REASONS if dropped.get(r)),
        trimmed=trimmed,
    )
    return ReadQueries(tuple(kept), report)


def _question_like(item: str) -> bool:
    return item.rstrip(_CLOSERS).endswith("?") or len(item.split()) <= SHORT_WORDS


def _key_sentence(item: str) -> str:
    """The first question sentence of a long line, else its first sentence."""
    sentences = [x for x in _SENTENCE_BREAK.split(item.strip()) if x]
    for sentence in sentences:
        if sentence.rstrip(_CLOSERS).endswith("?"):
            return sentence
    return sentences[0] if sentences else ""


def parse_single(
    text: str,
    *,
    exclude: tuple[str, ...] = (),
    max_characters: int = MAX_QUERY_CHARACTERS,
    instruction: str = "",
    question: str = "",
) -> list[str]:
    """The one query of a single-query reply (step-back, rewrite), as a list of at
    most one string.

    Items are read as `parse_queries` reads them (labels, quotes and echoes removed,
    ``exclude`` dropped); the first that is question-like (ends in "?") or short (at
    most `SHORT_WORDS` words) is the query. When every item is a long paragraph, the
    first one's first question sentence is, else its first sentence. Trimmed to
    ``max_characters``.
    """
    _check_limits(1, max_characters)
    items = dedupe(_candidates(text, instruction, question), exclude=exclude)
    if not items:
        return []
    chosen = next((x for x in items if _question_like(x)), items[0])
    if len(chosen.split()) > SHORT_WORDS:
        chosen = _key_sentence(chosen)
    query = trim_passage(chosen, max_characters)
    return [query] if query else []


_SPECIAL_TAIL = 24
"""Characters at the end of a reply so far that may hold a special token half written
(``<|im_e``), which cleaning removes once it is whole."""


def reply_past(limit: int, text: str, label: re.Pattern[str] | None = None) -> bool:
    """Whether the reply ``text`` so far already decides what trimming it to ``limit``
    characters keeps (`trim_passage`: the last sentence end inside the limit, else a
    word break), so the rest need not be generated (`CallOptions.enough`): its content
    (`clean_reply`, less a ``label`` the model echoed at its start, less a tail that
    may be a special token half written) runs past the limit, the one character past
    it included."""
    if len(text) <= limit:
        return False
    body = clean_reply(text)
    if label is not None:
        body = label.sub("", body, count=1)
    tail = body.rfind("<", max(0, len(body) - _SPECIAL_TAIL))
    if tail >= 0:
        body = body[:tail]
    return len(body.rstrip()) > limit
