"""A conversational search set: follow-up messages, the chat before each, a human
rewrite of each and the documents that answer it.

On disk, a folder holding:

- ``corpus.jsonl``: the documents, as in BEIR (``_id``, ``text``, optional ``title``);
- ``turns/<split>.jsonl``: one turn a line, ``conversation`` (its id), ``turn`` (its
  number in the conversation, from 1), ``message`` (as the user wrote it),
  ``history`` (the chat before it: ``{"role": "user"|"assistant", "content": ...}``
  objects, oldest first), ``rewrite`` (a person's standalone rewrite of the message)
  and ``relevant`` (the ids of the corpus documents that answer it).

A folder with a ``turns`` folder is read as this format (`is_conversational`);
`load_conversations` checks every line, naming the file, the line and the field, and
loads all or nothing. `from_qrecc` builds such a set from QReCC's JSON.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._checks import is_int
from .._files import sha256_file
from ..transforms.condense import read_messages
from .beir import BeirDataset, BeirFormatError, dataset_folder, read_corpus, read_jsonl

TURNS_FOLDER = "turns"


class ConversationalFormatError(BeirFormatError):
    """A conversational set's file is missing or malformed (the message names the
    file, the line and the field)."""


@dataclass(frozen=True)
class Turn:
    """One judged turn of a conversation."""

    conversation: str
    turn: int
    message: str
    history: tuple[dict[str, str], ...]
    rewrite: str
    relevant: tuple[str, ...]

    @property
    def qid(self) -> str:
        """The turn's id in reports: ``<conversation>#<turn>``."""
        return f"{self.conversation}#{self.turn}"

    @property
    def follow_up(self) -> bool:
        """Whether the turn has a chat before it (the first message of a chat has none)."""
        return bool(self.history)


@dataclass(frozen=True)
class ConversationalSet:
    """A loaded conversational set: its corpus and the turns of one split."""

    name: str
    corpus: dict[str, tuple[str, str]]
    turns: tuple[Turn, ...]
    corpus_sha256: str

    unit: str = "documents"

    @property
    def queries(self) -> dict[str, str]:
        """The follow-up turns' messages, by turn id (what a run scores)."""
        return {t.qid: t.message for t in self.turns if t.follow_up}

    def as_beir(self, text: str = "message", *, follow_ups: bool = True) -> BeirDataset:
        """The turns as a BEIR dataset over the same corpus: each turn's ``message`` (or
        its ``rewrite``) as the query, its ``relevant`` documents judged 1; only turns
        with a chat before them when ``follow_ups``."""
        if text not in ("message", "rewrite"):
            raise ValueError(f"text must be 'message' or 'rewrite', not {text!r}")
        turns = [t for t in self.turns if t.follow_up or not follow_ups]
        return BeirDataset(
            name=self.name,
            corpus=self.corpus,
            queries={t.qid: getattr(t, text) for t in turns},
            qrels={t.qid: dict.fromkeys(t.relevant, 1) for t in turns},
            corpus_sha256=self.corpus_sha256,
        )

    def histories(self) -> dict[str, tuple[dict[str, str], ...]]:
        """Each turn's chat before it, by turn id."""
        return {t.qid: t.history for t in self.turns}

    def conversations(self) -> dict[str, str]:
        """Each turn's conversation, by turn id (what the intervals resample)."""
        return {t.qid: t.conversation for t in self.turns}


def is_conversational(folder: str | Path) -> bool:
    """Whether ``folder`` holds a conversational set (a ``turns`` folder)."""
    return (Path(folder).expanduser() / TURNS_FOLDER).is_dir()


def _string(row: Mapping[str, Any], key: str, where: str) -> str:
    value = row[key]
    if is_int(value) and key == "conversation":
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise ConversationalFormatError(f"{where}: '{key}' must be a non-empty string")
    _unicode(value, f"{where}: '{key}'")
    return value


def _unicode(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConversationalFormatError(
            f"{what} must be valid Unicode text: it holds a lone surrogate"
        ) from None


def _history(row: Mapping[str, Any], where: str) -> tuple[dict[str, str], ...]:
    try:
        messages = read_messages(row["history"], "history")
    except (TypeError, ValueError) as exc:
        raise ConversationalFormatError(f"{where}: {exc}") from None
    out = tuple({"role": str(m.role.value), "content": m.content or ""} for m in messages)
    for i, message in enumerate(out):
        _unicode(message["content"], f"{where}: history[{i}].content")
    return out


def _relevant(row: Mapping[str, Any], where: str, corpus: Mapping[str, object]) -> tuple[str, ...]:
    ids = row["relevant"]
    if isinstance(ids, (str, bytes)) or not isinstance(ids, list) or not ids:
        raise ConversationalFormatError(f"{where}: 'relevant' must be a non-empty list of ids")
    for doc_id in ids:
        if not isinstance(doc_id, str) or doc_id not in corpus:
            raise ConversationalFormatError(f"{where}: 'relevant' names {doc_id!r}, not in corpus")
    return tuple(dict.fromkeys(ids))


_FIELDS = ("conversation", "turn", "message", "history", "rewrite", "relevant")


def _turn(row: Mapping[str, Any], where: str, corpus: Mapping[str, object]) -> Turn:
    number = row["turn"]
    if not is_int(number) or isinstance(number, bool) or not 1 <= number <= 10_000:
        raise ConversationalFormatError(f"{where}: 'turn' must be an integer from 1 to 10000")
    return Turn(
        conversation=_string(row, "conversation", where),
        turn=int(number),
        message=_string(row, "message", where),
        history=_history(row, where),
        rewrite=_string(row, "rewrite", where),
        relevant=_relevant(row, where, corpus),
    )


def read_turns(path: Path, corpus: Mapping[str, object]) -> tuple[Turn, ...]:
    """The turns of one ``turns/<split>.jsonl``, every line checked; a turn listed
    twice (same conversation and number) is an error naming both lines."""
    turns: list[Turn] = []
    first: dict[str, int] = {}
    for lineno, row in read_jsonl(path, _FIELDS, ConversationalFormatError):
        turn = _turn(row, f"{path.name}:{lineno}", corpus)
        if turn.qid in first:
            raise ConversationalFormatError(
                f"{path.name}:{lineno}: turn {turn.turn} of conversation "
                f"{turn.conversation!r} is listed twice (first at line {first[turn.qid]})"
            )
        first[turn.qid] = lineno
        turns.append(turn)
    return tuple(turns)


def load_conversations(
    folder: str | Path, split: str = "test", *, limit: int | None = None
) -> ConversationalSet:
    """Load the conversational set in ``folder`` (see the module) with the turns of
    ``split``. ``limit`` keeps whole conversations, in file order, until it holds at
    least ``limit`` turns."""
    root = dataset_folder(folder, limit, ConversationalFormatError)
    corpus_path = root / "corpus.jsonl"
    corpus = read_corpus(corpus_path)
    turns = read_turns(root / TURNS_FOLDER / f"{split}.jsonl", corpus)
    if limit is not None:
        sizes: dict[str, int] = {}
        for turn in turns:
            sizes[turn.conversation] = sizes.get(turn.conversation, 0) + 1
        kept: set[str] = set()
        for conversation in sizes:
            if sum(sizes[c] for c in kept) >= limit:
                break
            kept.add(conversation)
        turns = tuple(t for t in turns if t.conversation in kept)
    return ConversationalSet(root.name, corpus, turns, sha256_file(corpus_path))


# -- QReCC ---------------------------------------------------------------------------


def _doc_id(text: str) -> str:
    return "qrecc-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _conversations(records: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """QReCC's records grouped by conversation (source and number), by turn number."""
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for i, r in enumerate(records):
        for key in ("Conversation_no", "Turn_no", "Question", "Rewrite", "Answer"):
            if key not in r:
                raise ConversationalFormatError(f"QReCC record {i}: missing field {key!r}")
        source = str(r.get("Conversation_source") or "qrecc")
        grouped.setdefault(f"{source}-{r['Conversation_no']}", []).append(r)
    return {c: sorted(rs, key=lambda r: int(r["Turn_no"])) for c, rs in grouped.items()}


def _qrecc_turns(conversation: str, records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One conversation's judged turns in this module's format: the history is the
    earlier messages as the user wrote them, with the answers given to them."""
    history: list[dict[str, str]] = []
    out = []
    for r in records:
        question, answer = " ".join(str(r["Question"]).split()), str(r["Answer"]).strip()
        rewrite = " ".join(str(r["Rewrite"]).split())
        if question and rewrite and answer:
            out.append(
                {
                    "conversation": conversation,
                    "turn": int(r["Turn_no"]),
                    "message": question,
                    "history": list(history),
                    "rewrite": rewrite,
                    "relevant": [_doc_id(answer)],
                }
            )
        history.append({"role": "user", "content": question})
        if answer:
            history.append({"role": "assistant", "content": answer})
    return out


def split_of(conversation: str, seed: int = 0) -> str:
    """``train`` or ``test`` for ``conversation``: a seeded hash of its id alone, so a
    conversation keeps its split when more conversations are added."""
    digest = hashlib.sha256(f"hyde-plus-split|{seed}|{conversation}".encode()).digest()
    return "train" if digest[0] % 2 == 0 else "test"


def from_qrecc(
    records: Iterable[Mapping[str, Any]], out: str | Path, *, seed: int = 0
) -> dict[str, int]:
    """Write a conversational set to ``out`` (a new or empty folder) from QReCC
    records (its JSON: ``Conversation_no``, ``Turn_no``, ``Question``, ``Rewrite``,
    ``Answer``): each answered turn is judged against its own answer passage, the
    corpus holds every answer of the records (the other turns' answers are the
    distractors), and whole conversations go to ``train`` or ``test`` (`split_of`).
    Returns the turns written per split."""
    root = Path(out).expanduser()
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty: give a new folder")
    conversations = _conversations(records)
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    corpus: dict[str, str] = {}
    for conversation in sorted(conversations):
        for r in conversations[conversation]:
            if str(r["Answer"]).strip():
                corpus.setdefault(_doc_id(str(r["Answer"]).strip()), str(r["Answer"]).strip())
        split = split_of(conversation, seed)
        splits[split].extend(_qrecc_turns(conversation, conversations[conversation]))
    (root / TURNS_FOLDER).mkdir(parents=True, exist_ok=True)
    _write_jsonl(root / "corpus.jsonl", [{"_id": d, "text": t} for d, t in corpus.items()])
    for split, turns in splits.items():
        _write_jsonl(root / TURNS_FOLDER / f"{split}.jsonl", turns)
    return {split: len(turns) for split, turns in splits.items()}


def _write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
