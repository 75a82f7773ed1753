"""``eval --docs`` / ``tune --docs``: a question set from the user's own documents.

The folder is read and chunked as ``hyde-plus index`` does; then either the user's
labels (``--qrels``) or questions the LLM writes from sampled chunks become a BEIR
folder (``--questions-dir``) that the ordinary ``--dataset`` path scores. A set made
from the same chunks, seed, size and model is reused instead of written again (by
``eval`` and ``tune`` alike); a folder holding a set made from anything else is
refused, never written over (`evaluation.questions.refuse_other_set`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, TypeAlias

import typer

from .._checks import check_folder
from . import _console as ui
from ._console import progress_bar, task

Outputs: TypeAlias = tuple[tuple[str, Path | None], ...]
"""What a command writes, as (flag, path): checked against ``--docs``."""

Docs = Annotated[
    Path | None,
    typer.Option(help="Your documents folder (instead of --dataset): questions are written."),
]
Questions = Annotated[int, typer.Option(help="--docs: chunks to write one question each for.")]
Qrels = Annotated[
    Path | None,
    typer.Option(help="--docs: your labels (query<TAB>chunk id or file<TAB>grade) instead."),
]
QuestionsDir = Annotated[
    Path,
    typer.Option(help="--docs: where the question set is saved (BEIR form) and reused."),
]
ReuseIndex = Annotated[
    Path | None,
    typer.Option(
        "--index",
        help="--docs: search this `hyde-plus index` of the documents (no embedding again).",
    ),
]
ChunkSize = Annotated[int, typer.Option(help="--docs: most tokens per chunk, as in index.")]
ChunkOverlap = Annotated[int, typer.Option(help="--docs: tokens shared by consecutive chunks.")]


@dataclass(frozen=True)
class DocsChoice:
    """How ``--docs`` turns a folder into a question set."""

    docs: Path
    questions: int
    qrels: Path | None
    folder: Path
    chunk_size: int
    chunk_overlap: int
    seed: int
    read: list[Any] = field(default_factory=list, compare=False, repr=False)
    """The folder's chunks, once `chunks` has read them."""

    def chunks(self, embed_model: Any, max_length: int) -> list[Any]:
        """The folder's chunks, read and chunked as ``hyde-plus index`` does (once: a
        second call returns the same)."""
        if not self.read:
            self.read.append(_chunks(self, embed_model, max_length))
        return list(self.read[0])

    def check(self, max_length: int, outputs: Outputs = ()) -> None:
        """Flag errors before anything loads. ``outputs`` (flag, path): what the command
        writes, which must not be (or be inside) the documents folder: it would
        overwrite a document or be read back as one."""
        from ..chunking import Chunking
        from ..evaluation.questions import check_set_folder

        check_folder(self.docs, "--docs")
        docs = self.docs.expanduser().resolve()
        questions = self.folder.expanduser().resolve()
        for flag, path in (("--questions-dir", self.folder), *outputs):
            if path is None:
                continue
            target = path.expanduser().resolve()
            if target == docs or docs in target.parents:
                raise ValueError(
                    f"{flag} {path} is inside --docs {self.docs}: it would overwrite or be "
                    "read as documents; put it outside"
                )
            if flag != "--questions-dir" and (
                target == questions or questions in target.parents or target in questions.parents
            ):
                raise ValueError(
                    f"{flag} {path} overlaps --questions-dir {self.folder}: the question set "
                    "must hold only its own files; give each its own folder"
                )
        if self.questions < 1:
            raise ValueError(f"--questions must be >= 1, not {self.questions}")
        if self.qrels is not None and not self.qrels.is_file():
            raise ValueError(f"--qrels must be a file: {self.qrels}")
        check_set_folder(self.folder)
        Chunking(self.chunk_size, self.chunk_overlap).check(max_length)


def docs_choice(
    docs: Path | None,
    questions: int,
    qrels: Path | None,
    folder: Path,
    chunk_size: int,
    chunk_overlap: int,
    seed: int,
) -> DocsChoice | None:
    """The ``--docs`` settings, or None without ``--docs``."""
    if docs is None:
        return None
    return DocsChoice(docs, questions, qrels, folder, chunk_size, chunk_overlap, seed)


def split_of(docs: Path | None, qrels: Path | None, split: str) -> str:
    """What an ``eval`` or ``tune`` scores, as its results record it: ``split`` of a
    ``--dataset``; with ``--docs``, questions written now (``"generated"``) or the
    user's ``--qrels`` (``"labelled"``)."""
    if docs is None:
        return split
    return "generated" if qrels is None else "labelled"


def _chunks(choice: DocsChoice, embed_model: Any, max_length: int) -> list[Any]:
    from ..chunking import Chunking
    from ..readers import read_folder
    from ..stores.nodes import prepare_nodes
    from .index import print_skipped

    contents = read_folder(choice.docs)
    print_skipped(contents.skipped)
    chunking = Chunking(choice.chunk_size, choice.chunk_overlap)
    nodes, _ = prepare_nodes(contents.documents, embed_model, chunking, max_length)
    if not nodes:
        raise ValueError(f"{choice.docs} has no text to write questions from")
    from ..evaluation.questions import check_chunk_ids

    check_chunk_ids(nodes)  # before any question is written
    ui.err.print(
        f"{ui.literal(str(choice.docs))}: {len(contents.documents)} documents, {len(nodes)} chunks"
    )
    return nodes


def _fingerprint(nodes: list[Any]) -> str:
    import hashlib

    digest = hashlib.sha256()
    for node in nodes:
        digest.update(f"{node.node_id}\x00{node.get_content()}\x00".encode())
    return digest.hexdigest()


def set_identity(choice: DocsChoice, llm: Any, embed_model: Any) -> dict[str, Any]:
    """What the question set of ``choice`` is made from (`SET_IDENTITY`) but its
    chunks' fingerprint, known only once the documents are chunked: the documents, the
    chunking (the tokenizer of ``embed_model`` counts its tokens), and the labels file
    or the generation's options and model."""
    from ..chunking import tokenizer_for
    from ..models import describe_llm

    made_from: dict[str, Any] = {
        "docs": str(choice.docs.resolve()),
        "chunk_size": choice.chunk_size,
        "chunk_overlap": choice.chunk_overlap,
        "tokenizer": tokenizer_for(embed_model)[0],
    }
    if choice.qrels is not None:
        return {**made_from, "labels": str(choice.qrels.resolve())}
    return {
        **made_from,
        "questions": choice.questions,
        "llm": describe_llm(llm),
        "seed": choice.seed,
    }


def question_set(choice: DocsChoice, embed_model: Any, llm: Any, max_length: int) -> Path:
    """The BEIR folder to score: from ``--qrels``, reused, or written now. What is in
    ``--questions-dir`` is checked under its lock and again, under the lock, right
    before the set is written (`writing_set`): a set another run wrote meanwhile is
    reused when it is made from the same (and refused otherwise), never replaced."""
    from ..evaluation.questions import (
        generate_questions,
        locked_set,
        questions_count,
        read_labels,
        refuse_other_set,
        write_beir_folder,
        write_question_set,
        writing_set,
    )

    nodes = choice.chunks(embed_model, max_length)
    made_from = {**set_identity(choice, llm, embed_model), "chunks_sha256": _fingerprint(nodes)}
    if choice.qrels is not None:
        queries, judgments = read_labels(choice.qrels, nodes)
        labelled = questions_count(len(queries), "labelled question")
        ui.err.print(f"{labelled} from {ui.literal(str(choice.qrels))}")
        manifest = {**made_from, "kept": len(queries)}
        with writing_set(choice.folder):
            refuse_other_set(choice.folder, made_from, chunks=nodes)
            return write_beir_folder(choice.folder, nodes, queries, judgments, manifest)
    with locked_set(choice.folder):
        refuse_other_set(choice.folder, made_from, chunks=nodes)
        if _reused(choice.folder):
            return choice.folder
    import asyncio

    with progress_bar() as progress:
        advance = task(progress, "Writing questions", min(choice.questions, len(nodes)), "q/s")
        qset = asyncio.run(
            generate_questions(nodes, llm, n=choice.questions, seed=choice.seed, progress=advance)
        )
    ui.console.print(f"Questions: {ui.literal(qset.summary())}")
    with writing_set(choice.folder):
        refuse_other_set(choice.folder, made_from, chunks=nodes)  # written meanwhile?
        if _reused(choice.folder, meanwhile=True):
            return choice.folder
        wanted = {k: v for k, v in made_from.items() if k != "seed"}
        return write_question_set(qset, nodes, choice.folder, wanted)


def _reused(folder: Path, *, meanwhile: bool = False) -> bool:
    """Whether ``folder`` holds a question set (one made from what this run's would
    be: `refuse_other_set` refused any other), saying that it is reused and which of
    its files as the user edited them; ``meanwhile``: another run wrote it while this
    run's questions were being written, which are not kept."""
    from ..evaluation.questions import edited_files, questions_count, read_manifest

    found = read_manifest(folder)
    if found is None:
        return False
    edited = edited_files(folder)
    yours = f"; {', '.join(edited)} as you edited it" if edited else ""
    where, count = ui.literal(str(folder)), questions_count(found.get("kept"))
    if meanwhile:
        ui.err.print(
            f"Another run wrote the same question set in {where} ({count}) while these "
            "questions were written: this run scores that set, and the questions it "
            "wrote are not kept"
        )
        return True
    ui.err.print(
        f"Reusing the question set in {where} ({count}{ui.literal(yours)}): "
        "eval and tune on these documents with these options score this same set"
    )
    return True


def caveat(folder: Path, warning: str | None = None) -> str | None:
    """What the set can and cannot tell, for the report: how many questions were
    kept and why the others were rejected, or the ``warning`` that the set is too
    small (`DataChoice.too_few`, which counts them) and the reasons; None for the
    user's labels."""
    from ..evaluation.questions import read_manifest

    manifest = read_manifest(folder) or {}
    if "labels" in manifest:
        return None
    rejected = manifest.get("rejected")
    counts = sorted(rejected.items()) if isinstance(rejected, dict) else []  # a hand edit
    why = ", ".join(f"{n} {reason}" for reason, n in counts) or "none"
    if warning is not None:
        return f"{warning} Rejected: {why}. {manifest.get('caveat', '')}"
    kept = manifest.get("kept")
    return (
        f"{kept} of {manifest.get('sampled')} generated questions kept (rejected: {why}). "
        f"{manifest.get('caveat', '')}"
    )


@dataclass(frozen=True)
class DataChoice:
    """What an evaluation scores: a BEIR ``--dataset`` or ``--docs`` (exactly one)."""

    dataset: Path | None
    docs: DocsChoice | None

    def check(self, max_length: int, outputs: Outputs = (), *, conversations: bool = False) -> None:
        """Exactly one source, its flags checked; a conversational ``--dataset`` only
        where ``conversations`` says it is read (``eval``)."""
        if (self.dataset is None) == (self.docs is None):
            raise ValueError("give exactly one of --dataset (BEIR) and --docs (your documents)")
        if self.conversational and not conversations:
            raise ValueError(
                f"{self.dataset} is a conversational set (it has turns/): "
                "score it with `hyde-plus eval --dataset`"
            )
        if self.docs is not None:
            self.docs.check(max_length, outputs)

    def planned_work(self, llm_transforms: int, queries: int | None) -> tuple[int, str]:
        """``(generations, option)``: at most how many LLM calls a run makes and the
        one option that shortens it. A loaded set of ``queries`` (a ``--dataset``,
        ``--qrels``, a set reused from ``--questions-dir``): one call per question
        per transform that calls the LLM (``--limit``). Before questions are
        written from ``--docs`` (``queries`` None, `writes_questions`): as many
        questions as can be written, ``--questions`` but one per chunk with text at
        most (the chunks once read); up to `CALLS_PER_QUESTION` calls a question to
        write them, but no chunk tried more than twice (a failed call once more);
        then one per question per transform (``--questions`` shortens it)."""
        if queries is not None:
            return llm_transforms * queries, f"--limit {max(1, queries // 4)}"
        from ..evaluation.questions import CALLS_PER_QUESTION

        assert self.docs is not None
        asked = self.docs.questions
        writing = CALLS_PER_QUESTION * asked
        if self.docs.read:
            usable = sum(1 for c in self.docs.read[0] if c.get_content().strip())
            asked, writing = min(asked, usable), min(writing, 2 * usable)
        return writing + llm_transforms * asked, f"--questions {max(1, asked // 4)}"

    def read(self, embed_model: Any, max_length: int, where: Any = None) -> None:
        """Read and chunk ``--docs`` (nothing for a ``--dataset``) before the LLM loads
        or anything is written; with an ``--index`` in ``where`` (a `SearchChoice`,
        which loads it once for the search too), a `ValueError` unless that index
        holds exactly these chunks (it is out of date with the folder)."""
        if self.docs is None:
            return
        nodes = self.docs.chunks(embed_model, max_length)
        if where is not None and where.index is not None:
            from ..evaluation.index_cache import check_holds

            _, held = where.open_index(embed_model)
            texts = {n.node_id: n.get_content() for n in nodes}
            check_holds(held, texts, str(where.index))

    def refuse_other_set(self, llm: Any, embed_model: Any) -> None:
        """Refuse before any work (the model's speed told, questions written) when
        ``--questions-dir`` holds another set than this run's (`refuse_other_set`),
        its documents' chunks included once `read`."""
        from ..evaluation.questions import locked_set, refuse_other_set

        if self.docs is None:
            return
        wanted = set_identity(self.docs, llm, embed_model)
        with locked_set(self.docs.folder):  # never a set half written by another run
            if self.docs.read:
                nodes = self.docs.read[0]
                wanted["chunks_sha256"] = _fingerprint(nodes)
                refuse_other_set(self.docs.folder, wanted, chunks=nodes)
            else:
                refuse_other_set(self.docs.folder, wanted, unknown=("chunks_sha256",))

    def scored_set(self) -> dict[str, Any] | None:
        """What the question set this run scores is made from (`made_from`: the
        ``--questions-dir`` of ``--docs``, or a ``--dataset`` that is such a set), once
        loaded; None for a dataset that is no question set."""
        from ..evaluation.questions import made_from

        folder = self.docs.folder if self.docs is not None else self.dataset
        return None if folder is None else made_from(folder)

    def warn_tuned_here(self, configs: list[Path]) -> None:
        """Warn for each of the ``--config`` files `tune` wrote from the very question
        set this run scores (its ``tuned_on`` names the set): its scores here are
        optimistic. No config tuned on this set, no warning."""
        from ..transforms.config import load_config

        scored = self.scored_set()
        for path in configs if scored is not None else []:
            if load_config(path).tuned_on.get("question_set") == scored:
                ui.err.print(
                    f"[yellow]warning:[/] {ui.literal(str(path))} was tuned on this very "
                    "question set: its scores here are optimistic (score it on questions "
                    "it was not tuned on: another --seed, with its own --questions-dir)"
                )

    @property
    def conversational(self) -> bool:
        """Whether ``--dataset`` is a conversational set (a ``turns`` folder)."""
        from ..evaluation.conversational import is_conversational

        return self.dataset is not None and is_conversational(self.dataset)

    @property
    def writes_questions(self) -> bool:
        """Whether this run writes its questions: ``--docs`` without ``--qrels``, and
        no set in ``--questions-dir`` yet (a set there is this run's, to reuse:
        `refuse_other_set` refuses any other before)."""
        from ..evaluation.questions import read_manifest

        return self.docs is not None and self.needs_llm and read_manifest(self.docs.folder) is None

    @property
    def needs_llm(self) -> bool:
        """Whether an LLM must write questions (``--docs`` without ``--qrels``)."""
        return self.docs is not None and self.docs.qrels is None

    def load(
        self, split: str, limit: int | None, embed_model: Any, llm: Any, max_length: int
    ) -> tuple[Any, str | None]:
        """``(dataset, caveat)``: the BEIR dataset (or conversational set, a folder
        with ``turns/``) to score and, for generated questions, what they can and
        cannot tell."""
        from ..evaluation import load_beir
        from ..evaluation.conversational import load_conversations

        if self.docs is None:
            assert self.dataset is not None
            ds: Any
            if self.conversational:
                ds = load_conversations(self.dataset, split, limit=limit)
            else:
                ds = load_beir(self.dataset, split, limit=limit)
            _warn(self.too_few(ds, limit, split))
            return ds, None
        folder = question_set(self.docs, embed_model, llm, max_length)
        ds = load_beir(folder, "test", limit=limit)  # named for the documents, not the set
        warning = self.too_few(ds, limit, folder=folder)
        _warn(warning)
        named = replace(ds, name=self.docs.docs.resolve().name, unit="chunks")
        return named, caveat(folder, warning)

    def too_few(
        self, ds: Any, limit: int | None, split: str = "test", folder: Path | None = None
    ) -> str | None:
        """`too_few` for the questions of ``ds``, the same rule for a set just
        written, one reused and a ``--dataset``, with what cut it short and how to
        score more: the ``--limit`` when it kept no more; else for ``--qrels``, more
        labels; for generated questions (the set at ``folder``), `more_generated`;
        for a ``--dataset``, a larger set."""
        from ..evaluation.questions import MIN_TRUSTED, more_generated, read_manifest, too_few

        count = len(ds.queries)
        if count >= MIN_TRUSTED:
            return None
        if limit is not None and count >= limit:
            more = f"--limit {limit} kept {count}: a larger --limit scores more."
        elif self.docs is None or folder is None:
            more = f"The {split} split has no more: score a larger set."
        elif self.docs.qrels is not None:
            more = (
                f"Label at least {MIN_TRUSTED} questions in {self.docs.qrels} (each with "
                "a chunk or file graded above 0)."
            )
        else:
            more = more_generated(read_manifest(folder) or {}, len(ds.corpus), folder)
        return too_few(count, more)


def _warn(warning: str | None) -> None:
    """Print ``warning`` (`DataChoice.too_few`), if there is one."""
    if warning is not None:
        ui.err.print(f"[bold yellow]warning:[/] {ui.literal(warning)}", soft_wrap=False)
