"""Questions written from a user's own chunks, for `eval --docs` and `tune --docs`.

Without labels, a fair test of "does this transform find what I need" is: sample chunks,
have the LLM write one question each chunk answers, and check whether that chunk comes
back. `sample_chunks` picks the chunks (seeded), `clean_question` takes the question out
of a reply, `check_question` rejects what would make the test unfair or meaningless (no
question, too short or long, or a question that copies a long span of its chunk: plain
keyword and embedding search would find it by its words, which favours no transform),
`generate_questions` runs it, and `write_question_set` saves a BEIR folder
(``corpus.jsonl``, ``queries.jsonl``, ``qrels/test.tsv``, plus ``rejected.jsonl`` and
``manifest.json``) that can be reviewed, edited and reused with ``--dataset``.

What such a set can tell: the questions come from the text, so plain search is favoured;
a transform that wins here is likely to win on real questions, one that loses may not.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import random
import re
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llama_index.core.llms import LLM
from llama_index.core.schema import TextNode

from .._files import read_regular_bytes
from .._owned import (
    FolderBusyError,
    check_folder,
    check_outputs,
    claim,
    locked_folder,
    marker_kind,
    say_replacing,
    write_all_atomic,
)
from .._plural import counted
from ..calls import llm as _llm

QUESTION_PROMPT = (
    "Read the passage and write one question that a user of this document collection "
    "might ask and that the passage answers. Use your own words: do not copy a phrase "
    "from the passage. Reply with the question only.\n\nPassage:\n{passage}\n\nQuestion:"
)
"""The default prompt; ``{passage}`` is the chunk's text."""

MIN_WORDS = 3
MAX_CHARACTERS = 300
COPY_WORDS = 6
"""A question sharing a run of this many consecutive words with its chunk is a copy."""
COPY_SHARE = 0.6
"""...or a run of at least 4 words that is this share of the question's words."""
SET_FORMAT = 1
CAVEAT = (
    "These questions were written by an LLM from the chunks themselves, so they tend to "
    "use the chunk's own words and plain search is favoured: a transform that wins here "
    "is likely to win on real questions; one that loses may still help on real ones."
)

_META = re.compile(
    r"\b(?:the|this|that|above|following|given)\s+(?:(?:above|following|given)\s+)?"
    r"(?:passage|text|excerpt|paragraph|chunk)\b",
    re.I,
)
_PROMPT_ECHO = re.compile(
    r"\b(?:above|following|aforementioned|previous)\b|\b(?:a|the)\s+user\s+asks?\b|"
    r"\bthe\s+(?:answer|question|reply)\b",
    re.I,
)
"""Words that point at the prompt rather than the documents: "the above response",
"if a user asks", "what would the answer be"."""
_STOPWORD_TEXT = (
    "a an the and or but if of to in on at by for with from as is are was were be been "
    "being do does did done have has had can could should would will shall may might must "
    "what which who whom whose when where why how this that these those it its it's there "
    "their they them i you your we our my me he she his her not no yes so than then also "
    "about into over under between any all some each such more most other same only very "
    "use used using one two get make"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
NAMED_WORDS = 2
"""A question must name at least this many of its chunk's words (not stopwords)..."""
NAMED_SHARE = 0.5
"""...and at least this share of its own such words: it asks about what the chunk says."""
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)?", re.UNICODE)
_PREFIX = re.compile(r"^\s*(?:[-*•]|\d+[.)]|q(?:uestion)?\s*\d*\s*[:.)-])\s*", re.IGNORECASE)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GeneratedQuestion:
    """A kept question and the chunk it was written from (the one relevant item)."""

    qid: str
    question: str
    chunk_id: str


@dataclass(frozen=True)
class RejectedQuestion:
    """A generated question that was not kept: the chunk it was written for, the
    model's reply, and why."""

    chunk_id: str
    """The id of the chunk the question was asked for."""
    reply: str
    """The model's reply; for a failed call, the error (empty when it was not retried
    for want of budget)."""
    reason: str
    """Why: ``"the LLM call failed"``, ``"no question in the reply"``, ``"too
    short"``, ``"copies a span of its chunk"``, ``"the same question as another
    chunk's"``..."""


@dataclass
class QuestionSet:
    """What `generate_questions` produced from ``sampled`` chunks."""

    questions: list[GeneratedQuestion]
    rejected: list[RejectedQuestion]
    sampled: int
    seed: int
    tokens: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """ "87 of 100 kept; rejected: 9 copy a span of the chunk, 4 no question"."""
        rejected = ", ".join(f"{n} {reason}" for reason, n in sorted(self.reasons.items()))
        kept = f"{len(self.questions)} of {self.sampled} questions kept"
        return f"{kept}; rejected: {rejected}" if rejected else kept


def words(text: str) -> list[str]:
    """Lower-cased words (letters and digits; an apostrophe inside a word is kept)."""
    return [w.lower().replace("’", "'") for w in _WORD.findall(text)]


def sample_chunks(chunks: Sequence[TextNode], n: int, seed: int) -> list[TextNode]:
    """``n`` chunks (all when there are fewer), the same for the same ``seed`` and the
    same chunks in any order; chunks without text are never picked."""
    if n < 1:
        raise ValueError(f"questions must be >= 1, not {n}")
    usable = sorted((c for c in chunks if c.get_content().strip()), key=lambda c: c.node_id)
    if not usable:
        raise ValueError("there are no chunks with text to write questions from")
    return random.Random(seed).sample(usable, min(n, len(usable)))


def clean_question(reply: str) -> str | None:
    """The question in ``reply``: its first line that ends with ``?`` (else its first
    non-empty line), without numbering, a "Question:" label or quotes."""
    lines = [_PREFIX.sub("", line).strip().strip("\"'“”").strip() for line in reply.splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return None
    asked = [line for line in lines if line.endswith("?")]
    return (asked or lines)[0]


def longest_shared_run(question: str, passage: str) -> int:
    """The length, in words, of the longest run of consecutive question words that
    also appears, in order, in ``passage``."""
    q, p = words(question), words(passage)
    best = 0
    previous = [0] * (len(p) + 1)
    for qw in q:
        current = [0] * (len(p) + 1)
        for j, pw in enumerate(p, 1):
            if qw == pw:
                current[j] = previous[j - 1] + 1
                best = max(best, current[j])
        previous = current
    return best


def check_question(question: str | None, passage: str) -> str | None:
    """Why ``question`` is not a fair test of ``passage`` (None when it is): it must be
    a question (ending with ``?``) of `MIN_WORDS` words or more, about the documents
    rather than the passage or the prompt ("the above response", "if a user asks"),
    not a copy of a span, and name what the chunk says (`NAMED_WORDS`, `NAMED_SHARE`:
    "What does my-app stand for?" names one of its chunk's words of two)."""
    if not question:
        return "no question in the reply"
    count = len(words(question))
    if count < MIN_WORDS:
        return "too short"
    if len(question) > MAX_CHARACTERS:
        return "too long"
    if not question.rstrip().endswith("?"):
        return "not a question (no question mark)"
    if _META.search(question) or _PROMPT_ECHO.search(question):
        return "asks about the passage or the prompt, not its content"
    run = longest_shared_run(question, passage)
    if run >= COPY_WORDS or (run >= 4 and run >= COPY_SHARE * count):
        return "copies a span of its chunk"
    own = {w for w in words(question) if w not in _STOPWORDS and not w.isdigit()}
    named = own & set(words(passage))
    if len(named) < min(NAMED_WORDS, len(own)) or len(named) < NAMED_SHARE * len(own):
        return "names too little of its chunk"
    return None


def _prompt(template: str, passage: str) -> str:
    if "{passage}" not in template:
        raise ValueError("the question prompt must contain {passage}")
    return template.replace("{passage}", passage)


MIN_TRUSTED = 10
"""Fewer kept questions than this and an evaluation's verdict cannot be trusted."""
CALLS_PER_QUESTION = 3
"""LLM calls `generate_questions` may spend per wanted question (retries, top-ups)."""
CALL_FAILED = "the LLM call failed"
"""The reason of a question lost to its LLM call failing twice (a timeout, an error)."""


async def generate_questions(
    chunks: Sequence[TextNode],
    llm: LLM,
    *,
    n: int = 100,
    seed: int = 0,
    concurrency: int = 4,
    prompt: str = QUESTION_PROMPT,
    timeout: float | None = 120.0,
    progress: Callable[[int], None] | None = None,
    budget: int | None = None,
) -> QuestionSet:
    """Write one question for each of ``n`` sampled chunks, ``concurrency`` at a time
    (native async calls), until ``n`` are kept or ``budget`` LLM calls (default
    `CALLS_PER_QUESTION` per question) are spent: a failed call (a timeout, a provider
    error) is tried once more on its chunk, and a rejected question is replaced by the
    next chunk of the seeded order. A call that failed twice is a rejection ("the LLM
    call failed"), never a crash. Question ids are ``g<index>`` in the order kept."""
    order = sample_chunks(chunks, len(chunks), seed)
    calls = CALLS_PER_QUESTION * n if budget is None else budget
    if calls < 1:
        raise ValueError(f"budget must be >= 1 LLM call, not {calls}")
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(chunk: TextNode) -> tuple[str, int]:
        async with gate:
            try:
                options = _llm.CallOptions(timeout=timeout)
                reply = await _llm.acomplete(llm, _prompt(prompt, chunk.get_content()), options)
            except Exception as exc:
                return f"\x00{type(exc).__name__}: {exc}", 0
            return reply.text, reply.usage.total_tokens

    kept, tried = await _rounds(order, one, n, calls, progress)
    return kept.result(seed, tried)


async def _rounds(
    order: list[TextNode],
    ask: Callable[[TextNode], Awaitable[tuple[str, int]]],
    n: int,
    calls: int,
    progress: Callable[[int], None] | None = None,
) -> tuple[_Kept, int]:
    """Ask for questions in rounds (each as many calls as questions still wanted):
    failed calls once more first, then fresh chunks of ``order``, until ``n`` are
    kept, ``calls`` are spent or the chunks run out; the kept set and how many
    chunks were tried. ``progress(1)`` is called for each question kept, so a bar of
    ``n`` never counts past its total."""
    kept = _Kept()
    fresh, again = deque(order), deque[TextNode]()
    while len(kept.questions) < n and calls > 0 and (fresh or again):
        size = min(n - len(kept.questions), calls)
        batch: list[tuple[TextNode, bool]] = []
        while len(batch) < size and (again or fresh):
            batch.append((again.popleft(), True) if again else (fresh.popleft(), False))
        calls -= len(batch)
        replies = await asyncio.gather(*(ask(chunk) for chunk, _ in batch))
        for (chunk, retried), reply in zip(batch, replies):
            if reply[0].startswith("\x00") and not retried:
                again.append(chunk)  # tried once more, first in the next round
                continue
            if kept.judge(chunk, reply) and progress is not None:
                progress(1)
    for chunk in again:  # the budget ran out before their second try
        kept.rejected.append(RejectedQuestion(chunk.node_id, "", CALL_FAILED))
    return kept, len(order) - len(fresh)


def too_few(kept: int, more: str) -> str | None:
    """What to say when ``kept`` questions are too few for a verdict (None when
    enough), ending with ``more``: why the set is small and how to score more
    (`more_generated` for questions written from ``--docs``). Every set under
    `MIN_TRUSTED` is told so, generated, reused or a ``--dataset``."""
    if kept >= MIN_TRUSTED:
        return None
    return (
        f"ONLY {kept} QUESTION{'S' if kept != 1 else ''}: the verdict cannot be trusted "
        f"(at least {MIN_TRUSTED} are needed; one question more or less flips it). {more}"
    )


def more_generated(manifest: dict[str, Any], chunks: int, folder: Path) -> str:
    """Why the set written from ``--docs`` at ``folder`` (its ``manifest``) holds few
    questions, and what writes more: how many of those written were kept, rejected or
    lost to failed LLM calls; then, when failed calls lost the most, a working or
    faster ``--llm``; when every one of the ``chunks`` was tried, more documents; else
    the ``--questions`` that keeps about `MIN_TRUSTED` at this set's keep rate (each
    question asked may try `CALLS_PER_QUESTION` chunks). Each writes a new set, so
    each says to give it a new ``--questions-dir`` (``folder`` keeps this one)."""
    kept, written = manifest.get("kept"), manifest.get("sampled")
    if not (type(kept) is int and type(written) is int and 0 < kept <= written):
        return "Ask for more with --questions."  # a manifest edited by hand
    reasons = manifest.get("rejected")
    failed = reasons.get(CALL_FAILED) if isinstance(reasons, dict) else None
    failed = failed if type(failed) is int and 0 <= failed <= written - kept else 0
    rejected = written - kept - failed
    lost = [f"{rejected} rejected"] if rejected else []
    lost += [counted(failed, "failed LLM call")] if failed else []
    said = f"{kept} of the {written} questions written were kept"
    said += f" ({', '.join(lost)})" if lost else ""
    new = "with a new --questions-dir"
    if failed > rejected:
        errors = folder / "rejected.jsonl"
        return (
            f"{said}: check that --llm answers, or use a faster one, {new} ({errors} has "
            "the errors)."
        )
    if written >= chunks:
        return f"{said}; all {chunks} chunks were tried: add documents, {new}."
    asked = math.ceil(MIN_TRUSTED / min(1.0, CALLS_PER_QUESTION * kept / written) - 1e-9)
    return f"{said}: to keep about {MIN_TRUSTED}, ask for --questions {asked} {new}."


@dataclass
class _Kept:
    """The questions kept so far, the rejections and the tokens spent."""

    questions: list[GeneratedQuestion] = field(default_factory=list)
    rejected: list[RejectedQuestion] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    tokens: int = 0

    def judge(self, chunk: TextNode, reply: tuple[str, int]) -> bool:
        """Keep the question of ``reply`` or record why not; whether it was kept."""
        text, tokens = reply
        self.tokens += tokens
        if text.startswith("\x00"):
            self.rejected.append(RejectedQuestion(chunk.node_id, text[1:], CALL_FAILED))
            return False
        question = clean_question(text)
        reason = check_question(question, chunk.get_content())
        if reason is None and question is not None and question.lower() in self.seen:
            reason = "the same question as another chunk's"
        if reason is not None or question is None:
            self.rejected.append(RejectedQuestion(chunk.node_id, text, reason or "no question"))
            return False
        self.seen.add(question.lower())
        qid = f"g{len(self.questions) + 1}"
        self.questions.append(GeneratedQuestion(qid, question, chunk.node_id))
        return True

    def result(self, seed: int, sampled: int) -> QuestionSet:
        reasons = dict(Counter(r.reason for r in self.rejected))
        return QuestionSet(self.questions, self.rejected, sampled, seed, self.tokens, reasons)


def _source(chunk: TextNode) -> str:
    """The file a chunk was cut from, relative to the documents folder."""
    return str(chunk.metadata.get("source") or chunk.metadata.get("file_path") or "")


def check_chunk_ids(chunks: Sequence[TextNode]) -> None:
    """A `ValueError` naming the first document whose chunk ids a question set cannot
    hold: a tab or a line break in its name (``qrels/test.tsv`` is tab-separated
    lines), so the set is never written broken."""
    for chunk in chunks:
        if "\t" in chunk.node_id or "\n" in chunk.node_id:
            raise ValueError(
                f"the document {_source(chunk)!r} has a tab or a line break in its name, "
                "which a question set's qrels file cannot hold; rename it to score "
                "questions written from it"
            )


MAX_GRADE = 1000
_GRADE = re.compile(r"^-?[0-9]{1,9}$", re.ASCII)

Judgment = tuple[str, str, int]
"""(query id, chunk id, grade)."""


def write_question_set(
    qset: QuestionSet, chunks: Sequence[TextNode], folder: Path, manifest: dict[str, Any]
) -> Path:
    """Save ``qset`` as a BEIR folder at ``folder``: every chunk in ``corpus.jsonl``
    (``_id``, ``title`` = its source file, ``text``), the kept questions in
    ``queries.jsonl``, ``qrels/test.tsv`` (question, its chunk, 1), the rejections in
    ``rejected.jsonl`` and how it was made in ``manifest.json``."""
    if not qset.questions:
        raise ValueError(
            f"no usable question was written ({qset.summary()}); try another --llm or seed"
        )
    record = {
        **manifest,
        "seed": qset.seed,
        "sampled": qset.sampled,
        "kept": len(qset.questions),
        "rejected": qset.reasons,
        "generation_tokens": qset.tokens,
        "caveat": CAVEAT,
    }
    rejected = [{"chunk": r.chunk_id, "reply": r.reply, "reason": r.reason} for r in qset.rejected]
    queries = [(q.qid, q.question) for q in qset.questions]
    judgments = [(q.qid, q.chunk_id, 1) for q in qset.questions]
    return write_beir_folder(folder, chunks, queries, judgments, record, rejected)


def read_labels(
    path: Path, chunks: Sequence[TextNode]
) -> tuple[list[tuple[str, str]], list[Judgment]]:
    """A user's labels: a TSV of ``query text, chunk id or source file, grade`` (an
    optional header; UTF-8, a BOM is fine). A file stands for every chunk cut from it;
    a later line for the same query and chunk replaces an earlier one. Queries with no
    grade above 0 are dropped (nothing to find: every transform would score 0). Returns
    the queries (``l<n>`` ids) and the judgments; a `ValueError` names the line of
    anything it cannot use."""
    by_file: dict[str, list[str]] = {}
    for c in chunks:
        by_file.setdefault(_source(c), []).append(c.node_id)
    ids = {c.node_id for c in chunks}
    queries: dict[str, str] = {}
    grades: dict[tuple[str, str], int] = {}
    for lineno, line in enumerate(_label_lines(path), 1):
        parts = line.split("\t")
        if not line.strip() or (lineno == 1 and parts[-1].strip().lower() in ("grade", "score")):
            continue
        where = f"{path.name}:{lineno}"
        if len(parts) != 3:
            raise ValueError(f"{where}: expected query<TAB>chunk id or file<TAB>grade")
        text, target, grade = (p.strip() for p in parts)
        if not _GRADE.match(grade) or not -MAX_GRADE <= int(grade) <= MAX_GRADE:
            raise ValueError(
                f"{where}: grade {grade!r} is not a whole number from 0 to {MAX_GRADE}"
            )
        if int(grade) < 0:
            raise ValueError(f"{where}: grade {grade} is negative; use 0 for not relevant")
        targets = [target] if target in ids else by_file.get(target, []) if target else []
        if not text or not targets:
            raise ValueError(f"{where}: {target!r} is no chunk id or indexed file")
        qid = queries.setdefault(text, f"l{len(queries) + 1}")
        grades.update({(qid, t): int(grade) for t in targets})
    useful = {q for (q, _), g in grades.items() if g > 0}
    if not useful:
        raise ValueError(f"{path.name} has no label with a grade above 0")
    kept = [(qid, text) for text, qid in queries.items() if qid in useful]
    return kept, [(q, d, g) for (q, d), g in grades.items() if q in useful]


def _label_lines(path: Path) -> list[str]:
    try:
        return path.expanduser().read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text; save the labels as UTF-8") from None


def write_beir_folder(
    folder: Path,
    chunks: Sequence[TextNode],
    queries: Sequence[tuple[str, str]],
    judgments: Sequence[Judgment],
    manifest: dict[str, Any],
    rejected: Sequence[dict[str, Any]] = (),
) -> Path:
    """Write a BEIR folder of ``chunks`` with ``queries`` and ``judgments`` at
    ``folder`` (new, empty, or a question set hyde-plus wrote: `check_set_folder`),
    every file beside its target then renamed, the manifest last, saying which files
    of an earlier set it replaces. A file that already holds what would be written is
    left as it is; one edited since hyde-plus wrote it (`_as_written`) is never
    replaced: a `ValueError` says so, and nothing is written. What is there is read
    and the set written under the folder's lock (`writing_set`): writers in other
    processes take turns, each replacing a whole set, and no reader sees one half
    written. Keys a user added to the manifest are kept (`_written_record`)."""
    folder = folder.expanduser()
    check_set_folder(folder)
    check_chunk_ids(chunks)
    corpus = [{"_id": c.node_id, "title": _source(c), "text": c.get_content()} for c in chunks]
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{g}" for q, d, g in judgments]
    data = [
        _jsonl(corpus),
        _jsonl([{"_id": qid, "text": text} for qid, text in queries]),
        "\n".join(lines) + "\n",
        _jsonl(rejected),
    ]
    written = {name: _sha256(text) for name, text in zip(SET_FILES, data, strict=False)}
    record = {"format": SET_FORMAT, **manifest, WRITTEN: written}
    with writing_set(folder):
        _write_set(folder, data, record)
    return folder


def _write_set(folder: Path, data: list[str], record: dict[str, Any]) -> None:
    """`write_beir_folder`'s check of what is at ``folder`` and its write of ``data``
    and the manifest ``record``, under the folder's lock."""
    check_set_folder(folder)  # as it is now that no other writer is at work
    paths = [folder / name for name in SET_FILES]
    check_outputs(paths, "--questions-dir")
    found, added = _written_record(folder)
    manifest = _manifest_text(record, {k: v for k, v in added.items() if k not in record})
    changed = [
        (path, text)
        for path, text in zip(paths, [*data, manifest], strict=True)
        if not _holds(path, text)
    ]
    if not changed:
        return
    edited = [p for p, _ in changed if p.exists() and not _as_written(folder, p, found, record)]
    if edited:
        names = ", ".join(str(p.relative_to(folder)) for p in edited)
        untold = found is None and len(edited) > 1 and folder / "manifest.json" in edited
        if untold:  # its record of the other files is the manifest's, edited
            names = "manifest.json): which of its other files are yours cannot be told ("
            names += ", ".join(str(p.relative_to(folder)) for p in edited[:-1])
        raise ValueError(
            f"--questions-dir {folder} holds a question set edited since hyde-plus wrote it "
            f"({names}); it is never written over. Nothing was written: score it as it is "
            f"with `hyde-plus eval --dataset {folder}`, or give this run its own "
            "--questions-dir, or remove that folder to write the set again"
        )
    say_replacing([p for p, _ in changed if p.exists()])
    claim(folder, SET_KIND)
    (folder / "qrels").mkdir(exist_ok=True)
    write_all_atomic(changed)


def _holds(path: Path, text: str) -> bool:
    """Whether ``path`` holds ``text`` already: the same bytes, or for the manifest
    the same keys and values (laid out otherwise, or its keys in another order)."""
    if not path.is_file():
        return False
    held = path.read_bytes()
    if held == text.encode("utf-8"):
        return True
    if path.name != "manifest.json":
        return False
    try:
        return bool(json.loads(held) == json.loads(text))
    except (ValueError, RecursionError):
        return False


SET_LOCK_WAIT = 60.0
"""Seconds a run waits for another one to finish writing or reading a question set
(a few seconds' work) before it is refused."""


@contextmanager
def locked_set(folder: Path, flag: str | None = "--questions-dir") -> Iterator[None]:
    """Read the question set at ``folder`` under its lock, shared with other readers
    (none while a writer is at work: a set is never read half written); nothing to
    hold when there is no folder. After `SET_LOCK_WAIT` seconds, a `ValueError`
    naming ``flag`` and the folder."""
    with _lock(folder, flag, shared=True):
        yield


@contextmanager
def writing_set(folder: Path, flag: str = "--questions-dir") -> Iterator[None]:
    """Hold the lock of the question set at ``folder`` (made if absent; removed again
    when left empty by an error) to check what is there and write it, one writer at
    a time; after `SET_LOCK_WAIT` seconds, a `ValueError` naming ``flag``, the
    folder, and that nothing was written."""
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with _lock(folder, flag, shared=False):
            yield
    except BaseException:
        if made:
            try:
                folder.rmdir()  # only ever an empty folder: never a file of anyone's
            except OSError:
                pass
        raise


@contextmanager
def _lock(folder: Path, flag: str | None, *, shared: bool) -> Iterator[None]:
    """`locked_folder` on ``folder`` for `SET_LOCK_WAIT` seconds at most; a
    `FolderBusyError` of its own is told as a `ValueError` naming ``flag``."""
    stack = ExitStack()
    try:
        stack.enter_context(
            locked_folder(
                folder, shared=shared, wait=SET_LOCK_WAIT, what="run using the question set"
            )
        )
    except FolderBusyError:
        named = f"{flag} {folder}" if flag else f"the question set {folder}"
        advice = f", or give this run its own {flag}" if flag else ""
        raise ValueError(
            f"{named} is in use by another hyde-plus run (waited {SET_LOCK_WAIT:g} s). "
            f"Nothing was written: run again once it is done{advice}"
        ) from None
    with stack:
        yield


WRITTEN = "written"
"""The manifest's record of what hyde-plus wrote: each data file's SHA-256."""
MANIFEST_SHA256 = "manifest_sha256"
"""The manifest's SHA-256 of itself without this field: an edited manifest is told."""


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _manifest_text(record: dict[str, Any], added: dict[str, Any] | None = None) -> str:
    """``record`` as ``manifest.json`` holds it, with its own `MANIFEST_SHA256`, then
    the keys a user ``added`` to the manifest it replaces (outside the hash)."""
    digest = _sha256(json.dumps(record, indent=2))
    return json.dumps({**record, MANIFEST_SHA256: digest, **(added or {})}, indent=2) + "\n"


def _written_record(folder: Path) -> tuple[dict[str, str] | None, dict[str, Any]]:
    """``(what hyde-plus wrote, added keys)``: what the manifest at ``folder`` says
    hyde-plus wrote (file -> SHA-256), when the manifest itself is as hyde-plus wrote
    it, or is so once the keys a user added that hyde-plus never reads
    (`MANIFEST_KEYS`) are left out, with those keys; else ``(None, {})`` (edited,
    unreadable, or written before hyde-plus kept the record)."""
    manifest = read_manifest(folder)
    if manifest is None:
        return None, {}
    claimed = manifest.pop(MANIFEST_SHA256, None)
    unread = {k: v for k, v in manifest.items() if k not in MANIFEST_KEYS}
    for added in ({}, unread) if unread else ({},):
        kept = {k: v for k, v in manifest.items() if k not in added}
        written = kept.get(WRITTEN)
        if claimed == _sha256(json.dumps(kept, indent=2)) and isinstance(written, dict):
            return {str(k): str(v) for k, v in written.items()}, added
    return None, {}


def _as_written(
    folder: Path, path: Path, found: dict[str, str] | None, record: dict[str, Any]
) -> bool:
    """Whether ``path`` in the set at ``folder`` still holds what hyde-plus wrote: its
    hash is the one the manifest recorded (``found``, `_written_record`; the manifest:
    its own hash holds). A set written before that record counts only a manifest that
    says no more than ``record`` (this run's) without it: nothing else tells its files
    from a user's."""
    name = str(path.relative_to(folder))
    if name == "manifest.json":
        if found is not None:
            return True
        old = read_manifest(folder)
        return old is not None and old == {k: v for k, v in record.items() if k != WRITTEN}
    if found is None or name not in found:
        return False
    try:
        return hashlib.sha256(read_regular_bytes(path)).hexdigest() == found[name]
    except OSError:
        return False


def edited_files(folder: Path) -> list[str]:
    """The files of the question set at ``folder`` edited since hyde-plus wrote them
    (by the record its manifest keeps): ``manifest.json`` alone when the manifest
    itself was (its own hash fails: what it says of the others cannot be trusted);
    none when there is no record to tell."""
    found = _written_record(folder)[0]
    if found is None:
        manifest = read_manifest(folder)
        return ["manifest.json"] if manifest is not None and MANIFEST_SHA256 in manifest else []
    return [
        name
        for name in found
        if (folder / name).exists() and not _as_written(folder, folder / name, found, {})
    ]


SET_FILES = ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "rejected.jsonl", "manifest.json")
"""Every file a question set holds (relative to its folder), the manifest last."""
SET_KIND = "question-set"
"""What the marker of a question-set folder names (`_owned`)."""


def check_set_folder(folder: Path, flag: str = "--questions-dir") -> None:
    """A `ValueError` naming ``flag`` unless a question set may be written at
    ``folder``: absent, empty, or a set hyde-plus wrote (not a link to one, nor one
    whose ``qrels`` is a link or a file: a write never goes through a link)."""
    folder = folder.expanduser()
    if folder.is_symlink():
        raise ValueError(
            f"{flag} {folder} is a symbolic link; give the folder itself (its real path)"
        )
    check_folder(folder, SET_KIND, flag)
    qrels = folder / "qrels"
    if qrels.is_symlink() or (qrels.exists() and not qrels.is_dir()):
        raise ValueError(
            f"{flag} {folder} holds a qrels that is not the folder hyde-plus made (a link "
            "or a file); it is never written through. Nothing was written: remove it, or "
            f"give this run its own {flag}"
        )


def _jsonl(rows: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


SET_IDENTITY = (
    "docs",
    "chunks_sha256",
    "chunk_size",
    "chunk_overlap",
    "tokenizer",
    "labels",
    "questions",
    "llm",
    "seed",
)
"""What a question set is made from, as its manifest records it: the documents (and
their chunks), the chunking (sizes, and the tokenizer of the embedding model that
counted them), and either the user's labels file or the generation's options
(questions asked for, model, seed). Two sets that agree on all are the same."""

CHUNKED_BY = ("docs", "chunk_size", "chunk_overlap", "tokenizer")
"""What, besides the documents' text, decides their chunks (``chunks_sha256``)."""

MANIFEST_KEYS = frozenset(
    {"format", *SET_IDENTITY, "sampled", "kept", "rejected", "generation_tokens", "caveat"}
    | {"written", "manifest_sha256"}
)
"""The keys hyde-plus writes in the manifest of a set it generates or labels, and the
only ones it reads: another key is a user's note, which tells nothing about the set."""


def made_from(folder: Path) -> dict[str, Any] | None:
    """What the question set at ``folder`` is made from (`SET_IDENTITY`, as its
    manifest records it); None when ``folder`` holds no set hyde-plus wrote. `tune`
    records it in the config it writes, and `eval` scoring the same set with that
    config warns that its scores are optimistic."""
    manifest = read_manifest(folder)
    if manifest is None:
        return None
    return {k: manifest[k] for k in SET_IDENTITY if k in manifest}


def describe_set(manifest: dict[str, Any]) -> str:
    """``"8 questions generated by SmolLM2-135M-Instruct-Q4_1 from /docs"`` or
    ``"3 labelled questions from /labels.tsv"``: what a set's manifest says it is."""
    kept = manifest.get("kept")
    if manifest.get("labels"):
        return f"{questions_count(kept, 'labelled question')} from {manifest['labels']}"
    made = f"generated by {manifest.get('llm')} from {manifest.get('docs')}"
    return f"{questions_count(kept)} {made}"


def questions_count(kept: Any, noun: str = "question") -> str:
    """``"1 question"``, ``"3 questions"``: a manifest's count with its noun (a count
    edited into something else than a number is shown as it is, the noun plural)."""
    return counted(kept, noun) if type(kept) is int else f"{kept} {noun}s"


SET_FLAGS = {
    "questions": "--questions",
    "seed": "--seed",
    "chunk_size": "--chunk-size",
    "chunk_overlap": "--chunk-overlap",
}
"""The identity fields a command-line flag sets: a run differing only in these reuses
the set when passed the set's values."""


def refuse_other_set(
    folder: Path,
    wanted: dict[str, Any],
    unknown: Sequence[str] = (),
    chunks: Sequence[TextNode] | None = None,
) -> None:
    """A `ValueError` naming ``--questions-dir`` when ``folder`` holds a question set
    made from anything else than ``wanted`` (`SET_IDENTITY`, but for the ``unknown``
    fields not known yet): it is never replaced silently, so a later run never scores
    other questions than the user believes. Only what makes each kind of set is
    compared (a labelled set: its labels file; a generated one: its size, model and
    seed), and the message says in words what differs (`_differences`; ``chunks``,
    this run's, name a document that changed) and the fix (`_set_fix`)."""
    found = read_manifest(folder)
    if found is None:
        _refuse_unreadable_set(folder)
        return
    labelled, labels_run = bool(found.get("labels")), bool(wanted.get("labels"))
    fields = ["docs", "chunks_sha256", "chunk_size", "chunk_overlap"]
    fields += ["tokenizer"] if "tokenizer" in found and "tokenizer" in wanted else []
    if labelled == labels_run:
        fields += ["labels"] if labelled else ["questions", "llm", "seed"]
    differ = [k for k in fields if k not in unknown and found.get(k) != wanted.get(k)]
    if not differ and labelled == labels_run:
        return
    said = _differences(folder, found, wanted, differ, chunks)
    raise ValueError(
        f"--questions-dir {folder} holds another question set ({describe_set(found)}): "
        f"{'; '.join(said)}. Nothing was written: {_set_fix(folder, found, wanted, differ)}"
    )


def _refuse_unreadable_set(folder: Path) -> None:
    """A `ValueError` when ``folder`` holds a question set hyde-plus wrote (its marker
    and a file of the set) whose manifest cannot be read (edited, removed, or of
    another version): what it was made from, and which of its files are the user's,
    cannot be told, so it is neither reused nor written over."""
    folder = folder.expanduser()
    if marker_kind(folder) != SET_KIND or not any((folder / n).exists() for n in SET_FILES):
        return
    manifest = folder / "manifest.json"
    why = (
        f"cannot be read ({_unreadable(manifest)})"
        if manifest.exists() or manifest.is_symlink()
        else "is missing (a run stopped before writing it, or it was removed)"
    )
    raise ValueError(
        f"--questions-dir {folder} holds a question set whose manifest.json {why}; it is "
        "neither reused nor written over. Nothing was written: give this run its own "
        "--questions-dir, or remove that folder to write the set again"
    )


def _unreadable(manifest: Path) -> str:
    """Why `read_manifest` could not read ``manifest``, in words."""
    try:
        raw = read_regular_bytes(manifest)
    except OSError as exc:
        return exc.strerror or "it cannot be opened"
    except ValueError:
        return "it is not a regular file"
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return "edited since hyde-plus wrote it: it is not JSON"
    if not isinstance(data, dict):
        return "edited since hyde-plus wrote it: it is not a JSON object"
    return (
        f"its format is {data.get('format')!r}, not {SET_FORMAT}: another version of "
        "hyde-plus wrote it, or it was edited"
    )


def _differences(
    folder: Path,
    found: dict[str, Any],
    wanted: dict[str, Any],
    differ: list[str],
    chunks: Sequence[TextNode] | None,
) -> list[str]:
    """What differs between the set ``found`` at ``folder`` and this run's
    (``wanted``), in words: the kind of set, then each field of ``differ``."""
    said = []
    if found.get("labels") and not wanted.get("labels"):
        said.append("this run has an LLM write questions instead")
    elif wanted.get("labels") and not found.get("labels"):
        said.append(f"this run scores your labels in {wanted['labels']} instead")
    recut = any(k in differ for k in CHUNKED_BY)
    for key in differ:
        was, now = found.get(key), wanted.get(key)
        if key == "chunks_sha256" and not recut:  # else the chunks differ for what is said
            which = _changed_file(folder, chunks) if chunks is not None else None
            named = f" ({which})" if which else ""
            if ("tokenizer" in found) == ("tokenizer" in wanted):
                said.append(f"the documents changed since it was written{named}")
            else:
                said.append(
                    f"its chunks differ from this run's{named}: the documents changed since "
                    "it was written, or another --embed cut them (the set does not record "
                    "its tokenizer)"
                )
        elif key == "tokenizer":
            said.append(
                f"its chunks were cut by the tokenizer {was}; this run's --embed cuts them by {now}"
            )
        elif key == "chunks_sha256":
            continue
        elif key == "docs":
            said.append(f"it was written from the documents in {was}")
        elif key == "labels":
            said.append(f"it holds the labels of {was}")
        elif key == "llm":
            said.append(f"its questions were written by {was}; this run's model is {now}")
        else:
            flag = SET_FLAGS.get(key, key)
            said.append(f"it was written with {flag} {was}; this run has {flag} {now}")
    return said


def _changed_file(folder: Path, chunks: Sequence[TextNode]) -> str | None:
    """A document whose chunks differ between the set at ``folder`` (its
    ``corpus.jsonl``) and ``chunks``, in words ("'a.md' changed", "is new", "was
    removed"); None when the corpus cannot be read or holds no difference."""
    try:
        text = read_regular_bytes(folder / "corpus.jsonl").decode("utf-8")
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, ValueError, RecursionError):
        return None
    old = {
        str(r.get("_id")): (str(r.get("title") or ""), r.get("text"))
        for r in rows
        if isinstance(r, dict)
    }
    new = {c.node_id: (_source(c), c.get_content()) for c in chunks}
    old_files = {source for source, _ in old.values()}
    new_files = {source for source, _ in new.values()}
    for chunk_id, (source, content) in new.items():
        if old.get(chunk_id, ("", None))[1] != content:
            return f"{source!r} {'changed' if source in old_files else 'is new'}"
    for chunk_id, (source, _) in old.items():
        if chunk_id not in new:
            return f"{source!r} {'changed' if source in new_files else 'was removed'}"
    return None


def _set_fix(folder: Path, found: dict[str, Any], wanted: dict[str, Any], differ: list[str]) -> str:
    """What to do about a set that differs in ``differ``: the flags that reuse it, or
    `eval --dataset` on it to compare another model on the same questions (two
    generated sets), then the other ways out (another --questions-dir, or remove the
    folder)."""
    fixes = []
    generated = not found.get("labels") and not wanted.get("labels")
    settable = all(
        k in SET_FLAGS and type(found.get(k)) is int and 0 <= found[k] < 10**9 for k in differ
    )  # a manifest edited by hand suggests no flag from its garbage
    if generated and differ and settable:
        flags = " ".join(f"{SET_FLAGS[k]} {found.get(k)}" for k in differ)
        fixes.append(f"pass {flags} to use it")
    elif generated and "llm" in differ:
        fixes.append(
            f"to compare another model on the same questions, run `hyde-plus eval --dataset "
            f"{folder}`"
        )
    fixes.append("give this run its own --questions-dir, or remove that folder to replace the set")
    return "; or ".join(fixes)


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of the question set hyde-plus wrote at ``folder``: None when the
    folder is no set of ours (no marker), or the manifest is missing or unreadable."""
    folder = folder.expanduser()
    if marker_kind(folder) != SET_KIND:
        return None
    try:
        data = json.loads(read_regular_bytes(folder / "manifest.json").decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) and data.get("format") == SET_FORMAT else None
