from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.schema import TextNode

from llama_index_hyde_plus.evaluation.beir import load_beir
from llama_index_hyde_plus.evaluation.questions import (
    MIN_TRUSTED,
    QuestionSet,
    check_question,
    clean_question,
    generate_questions,
    longest_shared_run,
    read_labels,
    read_manifest,
    sample_chunks,
    write_question_set,
)
from llama_index_hyde_plus.testing import ScriptedLLM

from .conftest import says, team_docs


def _team_question(prompt: str) -> str:
    """What the scripted model writes for a team's chunk: who owns its service."""
    team = int(re.findall(r"Team (\d+)", prompt)[0])
    return f"Which team owns service {team * 7}?"


def _model_writes(monkeypatch: pytest.MonkeyPatch, respond: Any) -> None:
    """`eval --docs` and `tune --docs` write their questions with ``respond``."""
    from llama_index_hyde_plus.cli._evaluation import ModelChoice

    monkeypatch.setattr(ModelChoice, "make_llm", lambda self: ScriptedLLM(respond=respond))


PASSAGE = (
    "The Kestrel backup window closes at 03:40 UTC on Sundays, after the weekly "
    "snapshot of the billing database has been copied to the Frankfurt region."
)


def chunks(n: int = 10) -> list[TextNode]:
    return [
        TextNode(
            text=f"Chunk {i} says that team {i} owns service number {i * 7}.",
            id_=f"doc{i % 3}.md#{i}",
            metadata={"source": f"doc{i % 3}.md"},
        )
        for i in range(n)
    ]


def test_sampling_is_seeded_and_ignores_order_and_empty_chunks() -> None:
    nodes = [*chunks(), TextNode(text="   ", id_="blank")]
    first = [c.node_id for c in sample_chunks(nodes, 4, seed=1)]
    again = [c.node_id for c in sample_chunks(list(reversed(nodes)), 4, seed=1)]
    assert first == again and "blank" not in first and len(set(first)) == 4
    assert [c.node_id for c in sample_chunks(nodes, 4, seed=2)] != first
    assert len(sample_chunks(nodes, 100, seed=0)) == 10  # all there are
    with pytest.raises(ValueError, match="questions must be >= 1"):
        sample_chunks(nodes, 0, seed=0)


HTTPX_CHUNK = (
    "Set the my-app environment variable MY_APP_TOKEN before you create an httpx.Client: "
    "the client reads the token and sends it with every request to my-app."
)


@pytest.mark.parametrize(
    ("question", "reason"),
    [
        ("What would the answer be if a user asks:", "not a question (no question mark)"),
        (
            "What is the output of the above response?",
            "asks about the passage or the prompt, not its content",
        ),
        (
            "What would the answer be to this for a user?",
            "asks about the passage or the prompt, not its content",
        ),
        ('What does "my-app" stand for?', "names too little of its chunk"),
        ("Which environment variable holds the token the client sends?", None),
        ("How does httpx.Client send the token with requests?", None),
    ],
)
def test_questions_that_echo_the_prompt_or_name_too_little_of_the_chunk_are_rejected(
    question: str, reason: str | None
) -> None:
    # what the bundled model wrote for httpx's documentation
    assert check_question(question, HTTPX_CHUNK) == reason


@pytest.mark.parametrize(
    ("reply", "question"),
    [
        ("When does the backup window close?", "When does the backup window close?"),
        ('Question: "Who owns billing?"\nIt is the finance team.', "Who owns billing?"),
        (
            "Sure! Here is a question:\n1. Where are snapshots copied?",
            "Where are snapshots copied?",
        ),
        ("Backup timing on Sundays", "Backup timing on Sundays"),
        ("  \n ", None),
    ],
)
def test_clean_question_takes_the_question_out_of_the_reply(
    reply: str, question: str | None
) -> None:
    assert clean_question(reply) == question


def test_a_question_copying_a_long_span_of_its_chunk_is_rejected() -> None:
    copied = "When does the Kestrel backup window close at 03:40 UTC on Sundays?"
    assert longest_shared_run(copied, PASSAGE) >= 6
    assert check_question(copied, PASSAGE) == "copies a span of its chunk"
    own_words = "At what time does the weekly Kestrel backup stop?"
    assert check_question(own_words, PASSAGE) is None  # shares names, not a span
    assert check_question("Kestrel backup window closes?", PASSAGE) == "copies a span of its chunk"
    assert check_question("Why?", PASSAGE) == "too short"
    meta = "Why does the passage mention Frankfurt?"
    assert check_question(meta, PASSAGE) == "asks about the passage or the prompt, not its content"
    above = "How can I improve the above passage for readability?"
    assert check_question(above, PASSAGE) == "asks about the passage or the prompt, not its content"
    assert check_question(None, PASSAGE) == "no question in the reply"
    assert check_question("Why " + "really " * 80 + "?", PASSAGE) == "too long"


async def test_generation_keeps_fair_questions_and_says_why_others_were_rejected() -> None:
    def respond(prompt: str) -> str:
        if "team 3 " in prompt:
            return "Is it true that team 3 owns service number 21?"  # a copy
        if "team 5 " in prompt:
            raise RuntimeError("provider down")
        if "team 7 " in prompt:
            return ""
        return "Which team owns this service?"  # the same for every chunk

    llm = ScriptedLLM(respond=respond, forbid_sync=True)
    seen: list[int] = []
    qset = await generate_questions(chunks(), llm, n=10, seed=0, progress=seen.append)
    assert qset.sampled == 10 and llm.async_calls == 11  # the failed call was tried again
    assert len(qset.questions) == 1  # the others are duplicates of it
    assert seen == [1]  # the bar counts questions kept, never the 11 calls (past n=10)
    reasons = qset.reasons
    assert reasons["copies a span of its chunk"] == 1
    assert reasons["the LLM call failed"] == 1
    assert reasons["no question in the reply"] == 1
    assert reasons["the same question as another chunk's"] == 6
    assert "1 of 10 questions kept; rejected:" in qset.summary()


def service_question(prompt: str) -> str:
    return f"Which team runs the service in chunk {prompt.split('Chunk ')[1].split()[0]}?"


async def test_failed_generations_are_retried_and_topped_up_until_n_are_kept() -> None:
    """12 of the first 20 calls time out (as on a busy machine): each is tried once
    more, and chunks whose question is rejected are replaced by further chunks."""
    failures = iter([True] * 12)
    calls: list[str] = []

    def respond(prompt: str) -> str:
        calls.append(prompt)
        if next(failures, False):
            raise TimeoutError("generation timed out")
        if "team 4 " in prompt or "team 9 " in prompt:
            return "Chunk 4 says that team 4 owns service number 28."  # a copy: rejected
        return service_question(prompt)

    llm = ScriptedLLM(respond=respond, forbid_sync=True)
    qset = await generate_questions(chunks(60), llm, n=20, seed=0)
    assert len(qset.questions) == 20
    assert len({q.chunk_id for q in qset.questions}) == 20
    assert qset.reasons.get("the LLM call failed", 0) == 0
    assert len(calls) <= 3 * 20  # the stated budget


async def test_generation_stops_at_its_budget_and_says_what_failed() -> None:
    llm = ScriptedLLM(respond=lambda p: (_ for _ in ()).throw(TimeoutError("slow")))
    qset = await generate_questions(chunks(60), llm, n=20, seed=0, budget=30)
    assert qset.questions == [] and len(llm.prompts) == 30
    assert qset.reasons == {"the LLM call failed": 20}  # 10 tried twice, 10 once


def test_too_few_questions_say_the_verdict_cannot_be_trusted() -> None:
    from llama_index_hyde_plus.evaluation.questions import too_few

    assert MIN_TRUSTED == 10 and too_few(10, "Label more.") is None
    warning = too_few(7, "Label more.")
    assert warning is not None and "ONLY 7 QUESTIONS" in warning
    assert "cannot be trusted" in warning and warning.endswith(" Label more.")


@pytest.mark.parametrize(
    ("kept", "written", "reasons", "chunks", "said"),
    [
        (
            7, 30, {"names too little of its chunk": 15, "too long": 8}, 573,
            "7 of the 30 questions written were kept (23 rejected): to keep about 10, ask "
            "for --questions 15 with a new --questions-dir.",
        ),
        (
            5, 5, {}, 573,
            "5 of the 5 questions written were kept: to keep about 10, ask for --questions "
            "10 with a new --questions-dir.",
        ),
        (
            2, 30, {"the LLM call failed": 20, "too long": 8}, 573,
            "2 of the 30 questions written were kept (8 rejected, 20 failed LLM calls): check "
            "that --llm answers, or use a faster one, with a new --questions-dir "
            "(set/rejected.jsonl has the errors).",
        ),
        (
            8, 30, {"the LLM call failed": 1, "too long": 21}, 573,
            "8 of the 30 questions written were kept (21 rejected, 1 failed LLM call): to keep "
            "about 10, ask for --questions 13 with a new --questions-dir.",
        ),
        (
            4, 12, {"too long": 8}, 12,
            "4 of the 12 questions written were kept (8 rejected); all 12 chunks were tried: "
            "add documents, with a new --questions-dir.",
        ),
    ],
)  # fmt: skip
def test_a_small_generated_set_says_how_many_were_lost_to_what_and_what_writes_more(
    kept: int, written: int, reasons: dict[str, int], chunks: int, said: str
) -> None:
    from llama_index_hyde_plus.evaluation.questions import more_generated

    manifest = {"kept": kept, "sampled": written, "rejected": reasons, "questions": 10}
    assert more_generated(manifest, chunks, Path("set")) == said


async def test_a_saved_set_is_a_beir_folder_that_eval_can_load(tmp_path: Path) -> None:
    nodes = chunks()
    llm = ScriptedLLM(
        respond=lambda p: f"Which team runs the service in {p.split('Chunk ')[1][:2]}?"
    )
    qset = await generate_questions(nodes, llm, n=5, seed=3)
    folder = write_question_set(qset, nodes, tmp_path / "set", {"docs": "x", "llm": "scripted"})
    ds = load_beir(folder, "test")
    assert len(ds.corpus) == 10 and len(ds.queries) == len(qset.questions) == 5
    for q in qset.questions:
        assert ds.qrels[q.qid] == {q.chunk_id: 1}
    manifest = read_manifest(folder)
    assert manifest is not None and manifest["seed"] == 3 and manifest["kept"] == 5
    assert "plain search is favoured" in manifest["caveat"]
    assert (folder / "rejected.jsonl").read_text() == ""
    again = write_question_set(qset, nodes, folder, {"docs": "y"})  # replaces a set
    assert read_manifest(again)["docs"] == "y"  # type: ignore[index]


def test_a_set_is_never_written_over_a_folder_that_is_not_one(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    qset = QuestionSet([], [], 1, 0)
    with pytest.raises(ValueError, match="no usable question"):
        write_question_set(qset, chunks(), mine, {})
    from llama_index_hyde_plus.evaluation.questions import GeneratedQuestion

    qset.questions.append(GeneratedQuestion("g1", "Who owns service 7?", "doc1.md#1"))
    with pytest.raises(ValueError, match="neither empty nor a hyde-plus question-set folder"):
        write_question_set(qset, chunks(), mine, {})
    assert (mine / "notes.txt").read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]  # no temp folder left


def test_labels_name_chunks_or_whole_files(tmp_path: Path) -> None:
    labels = tmp_path / "labels.tsv"
    labels.write_text(
        "query\ttarget\tgrade\nWho owns service 7?\tdoc1.md#1\t2\nWhat does doc 0 say?\tdoc0.md\t1\n"
    )
    queries, judgments = read_labels(labels, chunks())
    assert queries == [("l1", "Who owns service 7?"), ("l2", "What does doc 0 say?")]
    assert ("l1", "doc1.md#1", 2) in judgments
    assert {d for q, d, g in judgments if q == "l2"} == {
        "doc0.md#0",
        "doc0.md#3",
        "doc0.md#6",
        "doc0.md#9",
    }
    labels.write_text("Who?\tnowhere.md\t1\n")
    with pytest.raises(ValueError, match=r"labels\.tsv:1: 'nowhere\.md' is no chunk id"):
        read_labels(labels, chunks())
    labels.write_text("Who?\tdoc0.md\thigh\n")
    with pytest.raises(ValueError, match="grade 'high' is not a whole number"):
        read_labels(labels, chunks())
    json.dumps(judgments)  # plain data


def test_labels_refuse_empty_targets_bad_grades_and_drop_queries_with_nothing_to_find(
    tmp_path: Path,
) -> None:
    labels = tmp_path / "labels.tsv"
    for row, message in [
        ("Who?\t\t1\n", "'' is no chunk id"),
        ("Who?\tdoc0.md\t--1\n", "is not a whole number"),
        ("Who?\tdoc0.md\t99999999999999999999\n", "is not a whole number"),
        ("Who?\tdoc0.md\t-1\n", "is negative"),
        ("Who?\tdoc0.md\t0\n", "no label with a grade above 0"),
    ]:
        labels.write_text(row)
        with pytest.raises(ValueError, match=message):
            read_labels(labels, chunks())
    labels.write_text("\ufeffWho owns 7?\tdoc1.md#1\t1\nNothing here?\tdoc0.md\t0\n")
    queries, judgments = read_labels(labels, chunks())
    assert queries == [("l1", "Who owns 7?")] and judgments == [("l1", "doc1.md#1", 1)]
    labels.write_bytes("Who?\tdoc0.md\t1\n".encode("utf-16"))
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        read_labels(labels, chunks())


async def test_a_set_is_replaced_by_the_next_run_which_says_so_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A set in a folder hyde-plus owns, as hyde-plus wrote it, is its own output:
    regenerating it (another seed, say) replaces the files that change, and says so;
    the files the new set holds as they are stay untouched. (A set edited since is
    never written over: `test_a_set_edited_since_it_was_written_is_never_written_over`.)"""
    import logging

    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    nodes = chunks()
    llm = ScriptedLLM(respond=lambda p: f"Which team runs service {p.split('Chunk ')[1][:2]}?")
    qset = await generate_questions(nodes, llm, n=3, seed=1)
    folder = write_question_set(qset, nodes, tmp_path / "set", {})
    assert not caplog.records
    other = await generate_questions(nodes[:9], llm, n=3, seed=2)
    write_question_set(other, nodes[:9], folder, {"docs": "y"})
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("replacing corpus.jsonl, queries.jsonl, test.tsv, manifest.json")
    caplog.clear()
    write_question_set(other, nodes[:9], folder, {"docs": "y"})  # the same set again
    assert not caplog.records
    corpus = [json.loads(line) for line in (folder / "corpus.jsonl").read_text().splitlines()]
    assert corpus[0]["title"].startswith("doc")  # the chunk's source file


def _one_question_set() -> QuestionSet:
    from llama_index_hyde_plus.evaluation.questions import GeneratedQuestion

    return QuestionSet([GeneratedQuestion("g1", "Who owns service 7?", "doc1.md#1")], [], 1, 0)


@pytest.mark.parametrize(
    "manifest",
    [
        {"name": "my web app", "start_url": "/"},
        {"format": 1, "name": "a web app that happens to say format 1"},
    ],
)
def test_a_folder_holding_some_manifest_json_is_not_a_set(
    tmp_path: Path, manifest: dict[str, object]
) -> None:
    """A manifest.json is not enough (the folder has no marker): nothing in it is touched."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "manifest.json").write_text(json.dumps(manifest))
    (app / "index.html").write_text("<html>keep</html>")
    with pytest.raises(ValueError, match="is neither empty nor a hyde-plus question-set folder"):
        write_question_set(_one_question_set(), chunks(), app, {"docs": "x"})
    assert sorted(p.name for p in app.iterdir()) == ["index.html", "manifest.json"]
    assert json.loads((app / "manifest.json").read_text()) == manifest
    assert [p.name for p in tmp_path.iterdir()] == ["app"]


def test_a_fifo_named_manifest_json_never_blocks_and_is_not_a_set(tmp_path: Path) -> None:
    import os
    import threading

    folder = tmp_path / "qf"
    folder.mkdir()
    os.mkfifo(folder / "manifest.json")
    outcome: list[BaseException | None] = []

    def write() -> None:
        try:
            write_question_set(_one_question_set(), chunks(), folder, {"docs": "x"})
            outcome.append(None)
        except BaseException as exc:  # the refusal, reported below
            outcome.append(exc)

    worker = threading.Thread(target=write, daemon=True)
    worker.start()
    worker.join(timeout=300)  # a hang guard, not a timing: the refusal is immediate
    assert outcome and isinstance(outcome[0], ValueError), "blocked on the FIFO"
    assert "neither empty nor a hyde-plus question-set folder" in str(outcome[0])
    assert [p.name for p in folder.iterdir()] == ["manifest.json"]


def test_a_users_file_in_a_set_is_kept_and_a_folder_in_the_way_refused(tmp_path: Path) -> None:
    folder = write_question_set(_one_question_set(), chunks(), tmp_path / "set", {"docs": "x"})
    (folder / "notes.txt").write_text("mine")
    write_question_set(_one_question_set(), chunks(), folder, {"docs": "y"})
    assert (folder / "notes.txt").read_text() == "mine"
    (folder / "rejected.jsonl").unlink()
    (folder / "rejected.jsonl").mkdir()
    with pytest.raises(ValueError, match=r"--questions-dir: .*rejected.jsonl is a folder"):
        write_question_set(_one_question_set(), chunks(), folder, {"docs": "z"})
    assert read_manifest(folder)["docs"] == "y"  # type: ignore[index]


def test_replacing_a_set_leaves_only_the_new_set(tmp_path: Path) -> None:
    folder = write_question_set(_one_question_set(), chunks(), tmp_path / "set", {"docs": "x"})
    write_question_set(_one_question_set(), chunks(), folder, {"docs": "y"})
    assert read_manifest(folder)["docs"] == "y"  # type: ignore[index]
    assert [p.name for p in tmp_path.iterdir()] == ["set"]  # nothing left beside it


def test_a_new_set_follows_the_umask(tmp_path: Path) -> None:
    import os

    previous = os.umask(0o022)
    try:
        folder = write_question_set(_one_question_set(), chunks(), tmp_path / "set", {})
    finally:
        os.umask(previous)
    assert (folder.stat().st_mode & 0o777) == 0o755
    assert ((folder / "queries.jsonl").stat().st_mode & 0o777) == 0o644


@pytest.mark.parametrize("grade", ["\u0663", "\u06f3", "\uff11"])
def test_a_label_grade_in_non_ascii_digits_is_refused(tmp_path: Path, grade: str) -> None:
    labels = tmp_path / "labels.tsv"
    labels.write_text(f"Who owns 7?\tdoc1.md#1\t{grade}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"labels\.tsv:1: grade .* is not a whole number"):
        read_labels(labels, chunks())


def test_a_link_or_a_file_as_the_set_folder_is_refused_and_kept(tmp_path: Path) -> None:
    real = write_question_set(_one_question_set(), chunks(), tmp_path / "set", {"docs": "x"})
    link, file = tmp_path / "link", tmp_path / "file"
    link.symlink_to(real)
    file.write_text("mine")
    with pytest.raises(ValueError, match="is a symbolic link"):
        write_question_set(_one_question_set(), chunks(), link, {"docs": "y"})
    with pytest.raises(ValueError, match="is a file, not a folder"):
        write_question_set(_one_question_set(), chunks(), file, {"docs": "y"})
    assert read_manifest(real)["docs"] == "x" and file.read_text() == "mine"  # type: ignore[index]


@pytest.mark.parametrize("kind", ["link", "file"])
def test_a_set_whose_qrels_is_a_link_or_a_file_is_never_written_through(
    tmp_path: Path, kind: str
) -> None:
    real = write_question_set(_one_question_set(), chunks(), tmp_path / "set", {"docs": "x"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "test.tsv").write_text("mine")
    for item in (real / "qrels").iterdir():
        item.unlink()
    (real / "qrels").rmdir()
    if kind == "link":
        (real / "qrels").symlink_to(elsewhere)
    else:
        (real / "qrels").write_text("mine")
    with pytest.raises(ValueError, match="holds a qrels that is not the folder"):
        write_question_set(_one_question_set(), chunks(), real, {"docs": "y"})
    assert (elsewhere / "test.tsv").read_text() == "mine" and sorted(elsewhere.iterdir()) == [
        elsewhere / "test.tsv"
    ]
    assert read_manifest(real)["docs"] == "x"  # type: ignore[index]


@pytest.mark.parametrize("name", ["a\tb.md", "a\nb.md"])
def test_a_document_named_with_a_tab_or_a_line_break_is_refused_before_a_set_is_written(
    tmp_path: Path, name: str
) -> None:
    from llama_index_hyde_plus.evaluation.questions import check_chunk_ids

    odd = [*chunks(3), TextNode(text="Text.", id_=f"{name}#1", metadata={"source": name})]
    with pytest.raises(ValueError, match="has a tab or a line break in its name"):
        check_chunk_ids(odd)
    with pytest.raises(ValueError, match="has a tab or a line break in its name"):
        write_question_set(_one_question_set(), odd, tmp_path / "set", {"docs": "x"})
    assert not (tmp_path / "set").exists()
    check_chunk_ids(chunks())  # ordinary names pass


def test_an_empty_folder_for_a_set_is_filled_in_place(tmp_path: Path) -> None:
    private = tmp_path / "qpriv"
    private.mkdir()
    private.chmod(0o700)
    inode = private.stat().st_ino
    folder = write_question_set(_one_question_set(), chunks(), private, {"docs": "x"})
    assert private.stat().st_mode & 0o777 == 0o700 and private.stat().st_ino == inode
    assert read_manifest(folder)["docs"] == "x"  # type: ignore[index]
    assert [p.name for p in tmp_path.iterdir()] == ["qpriv"]


def test_a_set_made_from_something_else_is_refused_and_the_same_one_passes(
    tmp_path: Path,
) -> None:
    from llama_index_hyde_plus.evaluation.questions import refuse_other_set

    made = {"docs": "/d", "chunks_sha256": "ab", "chunk_size": 200, "chunk_overlap": 20}
    generated = {**made, "questions": 10, "llm": "SmolLM2-135M-Instruct-Q4_1", "seed": 0}
    folder = write_question_set(_one_question_set(), chunks(), tmp_path / "set", generated)
    before = {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    refuse_other_set(folder, generated)  # the same set: reused, never refused
    refuse_other_set(tmp_path / "new", generated)  # no set there yet
    for other, named in (
        (
            {**made, "labels": "/labels.tsv"},
            ": this run scores your labels in /labels.tsv instead.",
        ),
        ({**generated, "questions": 20}, "with --questions 10; this run has --questions 20."),
        ({**generated, "chunks_sha256": "cd"}, ": the documents changed since it was written."),
    ):
        with pytest.raises(ValueError) as refused:
            refuse_other_set(folder, other)
        message = str(refused.value)
        assert f"--questions-dir {folder} holds another question set" in message
        assert "(1 question generated by SmolLM2-135M-Instruct-Q4_1 from /d):" in message
        assert named in message and "Nothing was written" in message
        assert "chunks_sha256" not in message and "differs in" not in message
    assert {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


def test_a_refused_set_says_what_differs_only_of_what_makes_each_kind_of_set(
    tmp_path: Path,
) -> None:
    from llama_index_hyde_plus.evaluation.questions import refuse_other_set, write_beir_folder

    made = {"docs": "/d", "chunks_sha256": "ab", "chunk_size": 200, "chunk_overlap": 20}
    generated = {**made, "questions": 10, "llm": "SmolLM2-135M-Instruct-Q4_1", "seed": 0}
    folder = write_question_set(_one_question_set(), chunks(), tmp_path / "set", generated)
    labelled = {**made, "labels": "/labels.tsv"}  # no model writes: llm and seed not compared
    with pytest.raises(ValueError) as refused:
        refuse_other_set(folder, labelled)
    said = str(refused.value)
    assert "this run scores your labels in /labels.tsv instead" in said
    assert "seed" not in said and "compare another model" not in said and "model is" not in said
    edited = [TextNode(text=c.text, id_=c.node_id, metadata=c.metadata) for c in chunks()]
    edited[4].text = "Chunk 4 says that team 4 moved to service 29."  # a document changed
    for now, why in ((edited, "'doc1.md' changed"), (chunks()[:9], "'doc0.md' changed")):
        with pytest.raises(ValueError) as refused:
            refuse_other_set(folder, {**labelled, "chunks_sha256": "cd"}, chunks=now)
        assert f"the documents changed since it was written ({why})" in str(refused.value)
    new = [*chunks(), TextNode(text="New.", id_="new.md", metadata={"source": "new.md"})]
    with pytest.raises(ValueError, match=r"\('new.md' is new\)"):
        refuse_other_set(folder, {**generated, "chunks_sha256": "cd"}, chunks=new)
    gone = [c for c in chunks() if c.metadata["source"] != "doc2.md"]
    with pytest.raises(ValueError, match=r"\('doc2.md' was removed\)"):
        refuse_other_set(folder, {**generated, "chunks_sha256": "cd"}, chunks=gone)
    one = {**labelled, "kept": 1}
    relabelled = write_beir_folder(tmp_path / "l", chunks(), [("l1", "Q?")], [], one)
    with pytest.raises(ValueError) as refused:
        refuse_other_set(relabelled, generated)
    said = str(refused.value)
    assert "(1 labelled question from /labels.tsv): this run has an LLM write questions" in said
    assert "pass --" not in said and "compare another model" not in said


def test_a_refused_set_names_the_flags_or_the_command_that_uses_it(tmp_path: Path) -> None:
    from llama_index_hyde_plus.evaluation.questions import refuse_other_set

    made = {"docs": "/d", "chunks_sha256": "ab", "chunk_size": 200, "chunk_overlap": 20}
    generated = {**made, "questions": 10, "llm": "SmolLM2-135M-Instruct-Q4_1", "seed": 0}
    folder = write_question_set(_one_question_set(), chunks(), tmp_path / "set", generated)
    for other, fix in (
        ({**generated, "questions": 100}, "pass --questions 10 to use it"),
        ({**generated, "questions": 7, "seed": 3}, "pass --questions 10 --seed 0 to use it"),
        ({**generated, "chunk_size": 300}, "pass --chunk-size 200 to use it"),
        ({**generated, "llm": "gpt-4o-mini"}, f"`hyde-plus eval --dataset {folder}`"),
        ({**made, "labels": "/l.tsv"}, "give this run its own --questions-dir"),
    ):
        with pytest.raises(ValueError) as refused:
            refuse_other_set(folder, other)
        message = " ".join(str(refused.value).split())
        assert fix in message, message
        assert message.endswith("or remove that folder to replace the set")
    with pytest.raises(ValueError, match="compare another model on the same questions"):
        refuse_other_set(folder, {**generated, "llm": "gpt-4o-mini", "questions": 5})
    refuse_other_set(folder, {**generated, "chunks_sha256": "cd"}, unknown=("chunks_sha256",))
    manifest = json.loads((folder / "manifest.json").read_text())
    for garbage in ("10; rm -rf ~", True, None, -1, 1.5, [10]):  # a manifest edited by hand
        (folder / "manifest.json").write_text(json.dumps({**manifest, "questions": garbage}))
        with pytest.raises(ValueError) as refused:
            refuse_other_set(folder, generated)
        assert "pass --questions" not in str(refused.value)


@pytest.mark.parametrize("command", ["eval", "tune"])
def test_a_refused_set_is_refused_before_the_models_speed_is_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app
    from llama_index_hyde_plus.cli._evaluation import ModelChoice
    from llama_index_hyde_plus.models import describe_llm

    llm = ScriptedLLM(respond=lambda prompt: "Who owns service 7?")
    monkeypatch.setattr(ModelChoice, "make_llm", lambda self: llm)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Team 1 owns service 7.")
    folder = tmp_path / "set"
    args = ["--docs", str(docs), "--questions-dir", str(folder), "--embed", "local"]
    args += ["--cache-dir", str(tmp_path / "cache")]
    first = ["--questions", "10", "--transforms", "none", "--out", str(tmp_path / "o")]
    written = CliRunner().invoke(app, ["eval", *args, *first])
    assert written.exit_code == 0, written.output
    assert read_manifest(folder)["llm"] == describe_llm(llm)  # type: ignore[index]

    def measured(*args: object) -> None:
        raise AssertionError("the speed was measured before the refusal")

    monkeypatch.setattr(ModelChoice, "speed_line", measured)
    args += ["--questions", "25"]
    args += ["--out", str(tmp_path / ("out" if command == "eval" else "t.json"))]
    if command == "eval":
        args += ["--transforms", "none,hyde"]
    result = CliRunner().invoke(app, [command, *args, "--llm", "local"])
    said = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "pass --questions 10 to use it" in said and "shortens it" not in said
    assert not (tmp_path / "out").exists() and not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("command", ["eval", "tune"])
def test_every_set_under_ten_questions_is_warned_about_a_dataset_as_a_generated_one(
    tmp_path: Path, command: str
) -> None:
    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app

    tiny = Path(__file__).parent / "data" / "tiny-beir"  # 3 test questions
    args = [command, "--dataset", str(tiny), "--split", "test", "--embed", "local"]
    args += ["--cache-dir", str(tmp_path / "cache")]
    if command == "eval":
        args += ["--transforms", "none", "--out", str(tmp_path / "out")]
    else:
        args += ["-t", "rocchio", "--grid", "k=3", "--out", str(tmp_path / "t.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "warning: ONLY 3 QUESTIONS: the verdict cannot be trusted" in said
    assert "The test split has no more: score a larger set." in said
    assert "--questions" not in said and "--timeout" not in said
    many = CliRunner().invoke(app, [*args[:-2], "--out", str(tmp_path / "2"), "--limit", "2"])
    cut = " ".join(many.output.split())
    assert "ONLY 2 QUESTIONS" in cut and "--limit 2 kept 2: a larger --limit scores more." in cut


@pytest.mark.parametrize("command", ["eval", "tune"])
def test_a_labelled_run_plans_its_labelled_questions_and_the_option_that_shortens_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app
    from llama_index_hyde_plus.cli._evaluation import ModelChoice
    from llama_index_hyde_plus.local.speed import SpeedPlan

    def slow_model(self: ModelChoice) -> ScriptedLLM:  # 1 token/s: any run is long
        self.planned.append(SpeedPlan(1, 1.0, {1: 1.0, 2: 0.5}))
        return ScriptedLLM(respond=lambda p: "Team 1 owns service 7.")

    monkeypatch.setattr(ModelChoice, "make_llm", slow_model)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Team 1 owns service 7.")
    (docs / "b.txt").write_text("Team 2 owns service 14.")
    labels = tmp_path / "labels.tsv"
    labels.write_text("".join(f"Who owns service {7 * i}?\ta.txt\t1\n" for i in range(1, 6)))
    args = ["--docs", str(docs), "--qrels", str(labels), "--embed", "local"]
    args += ["--questions-dir", str(tmp_path / "set"), "--cache-dir", str(tmp_path / "c")]
    if command == "eval":
        args += ["--transforms", "none,hyde", "--out", str(tmp_path / "out")]
    else:
        args += ["-t", "hyde", "--grid", "query_weight=0.8", "--out", str(tmp_path / "t.json")]
    result = CliRunner().invoke(app, [command, *args])
    said = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "(5 generations of up to 160 tokens); --limit 1 shortens it." in said
    assert "--questions" not in said and said.count("Local model:") == 1
    assert "ONLY 5 QUESTIONS: the verdict cannot be trusted (at least 10 are needed; one " in said
    assert says(said, f"Label at least 10 questions in {labels} (each with a chunk or file graded")
    assert "--timeout" not in said


def test_a_small_generated_set_is_told_why_in_the_warning_and_in_results_md(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app

    def ask(prompt: str) -> str:  # a fair question for an even team's chunk only
        fair = int(re.findall(r"Team (\d+)", prompt)[0]) % 2 == 0
        return _team_question(prompt) if fair else "Tell me."

    _model_writes(monkeypatch, ask)
    docs = team_docs(tmp_path)
    args = ["eval", "--docs", str(docs), "--questions", "4", "--transforms", "none"]
    args += ["--questions-dir", str(tmp_path / "set"), "--embed", "local"]
    args += ["--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    why = re.search(r"(\d+) of the (\d+) questions written were kept \((\d+) rejected\): ", said)
    assert why is not None, said
    kept, written, rejected = (int(n) for n in why.groups())
    assert kept == 4 and written == kept + rejected and rejected > 0
    assert "warning: ONLY 4 QUESTIONS" in said and "--timeout" not in said
    assert "to keep about 10, ask for --questions 10 with a new --questions-dir." in said
    md = " ".join((tmp_path / "out" / "results.md").read_text().split())
    assert "About these questions: ONLY 4 QUESTIONS" in md and why.group(0) in md
    assert f"Rejected: {rejected} too short. These questions were written" in md


def _slow_question_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run's LLM: a fair question for a team's chunk ("Nothing." for a HyDE
    prompt), measured at 1 token/s, so any run is long enough to be planned aloud."""
    from llama_index_hyde_plus.cli._evaluation import ModelChoice
    from llama_index_hyde_plus.local.speed import SpeedPlan

    def ask(prompt: str) -> str:
        teams = re.findall(r"Team (\d+) owns", prompt)
        return f"Which team owns service {int(teams[0]) * 7}?" if teams else "Nothing."

    def slow_model(self: ModelChoice) -> ScriptedLLM:
        self.planned.append(SpeedPlan(1, 1.0, {1: 1.0, 2: 0.5}))
        return ScriptedLLM(respond=ask)

    monkeypatch.setattr(ModelChoice, "make_llm", slow_model)


def test_the_plan_counts_the_questions_the_chunks_can_give_not_those_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app

    _slow_question_writer(monkeypatch)
    docs = team_docs(tmp_path)  # 12 chunks: at most 12 questions, however many are asked
    args = ["eval", "--docs", str(docs), "--questions", "100", "--transforms", "none,hyde"]
    args += ["--questions-dir", str(tmp_path / "set"), "--embed", "local"]
    args += ["--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    # up to 2 calls a chunk to write (a failed call once more), then 1 a question for hyde
    assert "(36 generations of up to 160 tokens); --questions 3 shortens it." in said, said
    assert "400 generations" not in said


def test_a_reused_set_plans_its_questions_not_writing_them_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app

    _slow_question_writer(monkeypatch)
    docs = team_docs(tmp_path)
    args = ["eval", "--docs", str(docs), "--questions", "4", "--transforms", "none,hyde"]
    args += ["--questions-dir", str(tmp_path / "set"), "--embed", "local"]
    args += ["--cache-dir", str(tmp_path / "c")]
    first = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "o1")])
    assert first.exit_code == 0, first.output
    said = " ".join(first.output.split())
    assert "(16 generations of up to 160 tokens); --questions 1 shortens it." in said
    again = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "o2")])
    assert again.exit_code == 0, again.output
    said = " ".join(again.output.split())
    assert "Reusing the question set" in said and said.count("Local model:") == 1
    assert "(4 generations of up to 160 tokens); --limit 1 shortens it." in said
    assert "--questions 1 shortens it" not in said


def test_a_set_edited_since_it_was_written_is_never_written_over(tmp_path: Path) -> None:
    from llama_index_hyde_plus.evaluation.questions import write_beir_folder

    queries, judgments = [("l1", "Who owns service 7?")], [("l1", "doc1.md#1", 1)]
    folder = write_beir_folder(tmp_path / "set", chunks(), queries, judgments, {"labels": "/l"})
    files = lambda: {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}  # noqa: E731
    first = files()
    write_beir_folder(folder, chunks(), queries, judgments, {"labels": "/l"})  # the same set
    assert files() == first
    relabelled = [("l1", "doc2.md#2", 1)]  # the labels changed, the set was not edited
    write_beir_folder(folder, chunks(), queries, relabelled, {"labels": "/l"})
    assert "doc2.md#2" in (folder / "qrels" / "test.tsv").read_text()
    for name, edit in (
        ("queries.jsonl", '{"_id": "l1", "text": "Which team runs service 7?"}\n'),
        ("queries.jsonl", ""),
        ("queries.jsonl", "{not json"),
        ("manifest.json", json.dumps({**read_manifest(folder), "kept": 5})),  # type: ignore[dict-item]
    ):
        before = {**files(), name: edit.encode()}
        (folder / name).write_text(edit)
        with pytest.raises(ValueError) as refused:
            write_beir_folder(folder, chunks(), queries, judgments, {"labels": "/l"})
        said = str(refused.value)
        assert f"edited since hyde-plus wrote it ({name})" in said, said
        assert f"`hyde-plus eval --dataset {folder}`" in said and "Nothing was written" in said
        assert files() == before
        shutil.rmtree(folder)  # removed by the user: written again
        write_beir_folder(folder, chunks(), queries, judgments, {"labels": "/l"})


def test_a_set_written_before_the_record_is_replaced_only_where_nothing_was_edited(
    tmp_path: Path,
) -> None:
    from llama_index_hyde_plus.evaluation.questions import write_beir_folder

    queries, judgments = [("l1", "Who owns service 7?")], [("l1", "doc1.md#1", 1)]
    folder = write_beir_folder(tmp_path / "set", chunks(), queries, judgments, {"labels": "/l"})
    manifest = read_manifest(folder) or {}
    old = {k: v for k, v in manifest.items() if k not in ("written", "manifest_sha256")}
    (folder / "manifest.json").write_text(json.dumps(old, indent=2) + "\n")  # no record
    write_beir_folder(folder, chunks(), queries, judgments, {"labels": "/l"})  # nothing edited
    assert "written" in (read_manifest(folder) or {})
    (folder / "manifest.json").write_text(json.dumps(old, indent=2) + "\n")
    (folder / "queries.jsonl").write_text('{"_id": "l1", "text": "Mine?"}\n')
    with pytest.raises(ValueError, match=r"edited since hyde-plus wrote it \(queries.jsonl\)"):
        write_beir_folder(folder, chunks(), queries, judgments, {"labels": "/l"})
    assert "Mine?" in (folder / "queries.jsonl").read_text()


def test_a_labelled_set_edited_by_the_user_is_refused_and_scored_with_dataset(
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app

    docs = team_docs(tmp_path)
    labels = tmp_path / "labels.tsv"
    labels.write_text("Who owns service 7?\tt1.txt\t1\nWho owns service 14?\tt2.txt\t1\n")
    folder = tmp_path / "set"
    common = ["--transforms", "none", "--embed", "local", "--cache-dir", str(tmp_path / "c")]
    args = ["eval", "--docs", str(docs), "--qrels", str(labels), "--questions-dir", str(folder)]
    first = CliRunner().invoke(app, [*args, *common, "--out", str(tmp_path / "o1")])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(app, [*args, *common, "--out", str(tmp_path / "o2")])
    assert again.exit_code == 0 and "replacing" not in again.output, again.output
    mine = '{"_id": "l1", "text": "Which team looks after service 7?"}\n'
    (folder / "queries.jsonl").write_text(mine + '{"_id": "l2", "text": "Who owns 14?"}\n')
    refused = CliRunner().invoke(app, [*args, *common, "--out", str(tmp_path / "o3")])
    said = " ".join(refused.output.split())
    assert refused.exit_code == 2, refused.output
    assert "edited since hyde-plus wrote it (queries.jsonl)" in said and "replacing" not in said
    assert says(said, f"`hyde-plus eval --dataset {folder}`")
    assert (folder / "queries.jsonl").read_text().startswith(mine)
    assert not (tmp_path / "o3").exists()
    scored = CliRunner().invoke(
        app, ["eval", "--dataset", str(folder), *common, "--out", str(tmp_path / "o4")]
    )
    assert scored.exit_code == 0, scored.output
    assert "Which team looks after service 7?" in (tmp_path / "o4" / "results.json").read_text()


def test_a_generated_set_edited_by_the_user_is_reused_as_edited_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app

    _model_writes(monkeypatch, _team_question)
    folder = tmp_path / "set"
    args = ["eval", "--docs", str(team_docs(tmp_path)), "--questions", "3", "--embed", "local"]
    args += ["--questions-dir", str(folder), "--transforms", "none"]
    args += ["--cache-dir", str(tmp_path / "c")]
    first = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "o1")])
    assert first.exit_code == 0, first.output
    queries = (folder / "queries.jsonl").read_text().splitlines()
    mine = '{"_id": "g1", "text": "Who looks after that service, then?"}'
    (folder / "queries.jsonl").write_text("\n".join([mine, *queries[1:]]) + "\n")
    again = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "o2")])
    said = " ".join(again.output.split())
    assert again.exit_code == 0, again.output
    assert "(3 questions; queries.jsonl as you edited it)" in said, said
    assert (folder / "queries.jsonl").read_text().startswith(mine)
    assert "Who looks after that service, then?" in (tmp_path / "o2" / "results.json").read_text()


@pytest.mark.parametrize("manifest", ["{broken", None])
def test_a_set_whose_manifest_cannot_be_read_is_refused_before_questions_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, manifest: str | None
) -> None:
    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app

    asked: list[str] = []

    def ask(prompt: str) -> str:
        asked.append(prompt)
        return _team_question(prompt)

    _model_writes(monkeypatch, ask)
    folder = tmp_path / "set"
    args = ["eval", "--docs", str(team_docs(tmp_path)), "--questions", "3", "--embed", "local"]
    args += ["--questions-dir", str(folder), "--transforms", "none"]
    args += ["--cache-dir", str(tmp_path / "c")]
    first = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "o1")])
    assert first.exit_code == 0, first.output
    if manifest is None:
        (folder / "manifest.json").unlink()
    else:
        (folder / "manifest.json").write_text(manifest)
    kept = {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    asked.clear()
    again = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "o2")])
    said = " ".join(again.output.split())
    assert again.exit_code == 2, again.output
    why = "is missing (a run stopped" if manifest is None else "cannot be read (edited"
    assert f"holds a question set whose manifest.json {why}" in said
    assert not asked and "Writing questions" not in said  # no question written for nothing
    assert {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == kept


@pytest.mark.parametrize("rejected", [[1, 2], "lots", None, 7, {"echoing": 2}])
def test_a_hand_edited_manifest_never_breaks_the_report_caveat(
    tmp_path: Path, rejected: object
) -> None:
    from llama_index_hyde_plus.cli._questions import caveat

    folder = write_question_set(_one_question_set(), chunks(), tmp_path / "set", {"docs": "x"})
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "rejected": rejected}))
    said = caveat(folder)
    assert said is not None and "generated questions kept (rejected: " in said


def test_a_key_added_to_the_manifest_leaves_the_set_as_written_and_is_kept(
    tmp_path: Path,
) -> None:
    from llama_index_hyde_plus.evaluation.questions import edited_files, write_beir_folder

    queries, judgments = [("l1", "Who owns service 7?")], [("l1", "doc1.md#1", 1)]
    folder = write_beir_folder(tmp_path / "set", chunks(), queries, judgments, {"labels": "/l"})
    manifest = json.loads((folder / "manifest.json").read_text())
    noted = {"my note": "checked by Ana", **manifest}
    (folder / "manifest.json").write_text(json.dumps(noted, indent=2) + "\n")
    assert edited_files(folder) == []
    before = (folder / "manifest.json").read_bytes()
    write_beir_folder(folder, chunks(), queries, judgments, {"labels": "/l"})  # the same set
    assert (folder / "manifest.json").read_bytes() == before
    relabelled = [("l1", "doc2.md#2", 1)]  # the labels changed: the set is written again
    write_beir_folder(folder, chunks(), queries, relabelled, {"labels": "/l"})
    assert "doc2.md#2" in (folder / "qrels" / "test.tsv").read_text()
    assert (read_manifest(folder) or {})["my note"] == "checked by Ana"  # the user's, kept
    assert edited_files(folder) == []
    (folder / "queries.jsonl").write_text('{"_id": "l1", "text": "Mine?"}\n')
    with pytest.raises(ValueError, match=r"edited since hyde-plus wrote it \(queries.jsonl\);"):
        write_beir_folder(folder, chunks(), queries, judgments, {"labels": "/l"})


def test_a_set_refused_for_its_chunking_never_says_the_documents_changed(
    tmp_path: Path,
) -> None:
    from llama_index_hyde_plus.evaluation.questions import refuse_other_set

    made = {"docs": "/d", "chunks_sha256": "ab", "chunk_size": 200, "chunk_overlap": 20}
    generated = {**made, "questions": 10, "llm": "m", "seed": 0, "tokenizer": "bge-small"}
    folder = write_question_set(_one_question_set(), chunks(), tmp_path / "set", generated)
    recut = [TextNode(text=f"{c.text} More.", id_=c.node_id, metadata=c.metadata) for c in chunks()]
    for other, named in (
        (
            {"chunk_size": 300},
            "it was written with --chunk-size 200; this run has --chunk-size 300",
        ),
        ({"chunk_overlap": 0}, "it was written with --chunk-overlap 20; this run has"),
        ({"docs": "/e"}, "it was written from the documents in /d"),
        ({"tokenizer": "cl100k_base"}, "its chunks were cut by the tokenizer bge-small"),
    ):
        with pytest.raises(ValueError) as refused:
            refuse_other_set(folder, {**generated, **other, "chunks_sha256": "cd"}, chunks=recut)
        said = str(refused.value)
        assert named in said and "the documents changed" not in said, said
    with pytest.raises(ValueError, match=r"the documents changed since it was written \('doc0"):
        refuse_other_set(folder, {**generated, "chunks_sha256": "cd"}, chunks=recut)
    unrecorded = {k: v for k, v in generated.items() if k != "tokenizer"}
    old = write_question_set(_one_question_set(), chunks(), tmp_path / "old", unrecorded)
    refuse_other_set(old, generated)  # a set that does not record its tokenizer is reused
    with pytest.raises(ValueError) as refused:
        refuse_other_set(old, {**generated, "chunks_sha256": "cd"}, chunks=recut)
    said = str(refused.value)
    assert "its chunks differ from this run's ('doc0.md' changed): the documents changed" in said
    assert "or another --embed cut them (the set does not record its tokenizer)" in said


def test_a_set_whose_manifest_cannot_be_read_is_told_why_in_words_that_are_true(
    tmp_path: Path,
) -> None:
    from llama_index_hyde_plus.evaluation.questions import refuse_other_set

    generated = {"docs": "/d", "chunks_sha256": "ab", "questions": 10, "llm": "m", "seed": 0}
    folder = write_question_set(_one_question_set(), chunks(), tmp_path / "set", generated)
    manifest = json.loads((folder / "manifest.json").read_text())
    for written, why in (
        (json.dumps({**manifest, "format": 2}), "cannot be read (its format is 2, not 1: "),
        ("{broken", "cannot be read (edited since hyde-plus wrote it: it is not JSON)"),
        ("[1, 2]", "cannot be read (edited since hyde-plus wrote it: it is not a JSON object)"),
        (None, "cannot be read (Is a directory)"),  # the system's words
    ):
        (folder / "manifest.json").unlink(missing_ok=True)
        if (folder / "manifest.json").is_dir():
            (folder / "manifest.json").rmdir()
        if written is None:
            (folder / "manifest.json").mkdir()
        else:
            (folder / "manifest.json").write_text(written)
        with pytest.raises(ValueError) as refused:
            refuse_other_set(folder, generated)
        said = str(refused.value)
        assert f"holds a question set whose manifest.json {why}" in said, said
        if written is not None and "format" in written:
            assert "another version of hyde-plus wrote it, or it was edited" in said


def test_eval_docs_records_its_questions_as_generated_or_labelled_as_tune_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app

    _model_writes(monkeypatch, _team_question)
    docs, labels = team_docs(tmp_path), tmp_path / "labels.tsv"
    labels.write_text("Who owns service 7?\tt1.txt\t1\n")
    common = ["eval", "--docs", str(docs), "--transforms", "none", "--embed", "local"]
    common += ["--cache-dir", str(tmp_path / "c")]
    for more, split in (
        (["--qrels", str(labels), "--questions-dir", str(tmp_path / "l")], "labelled"),
        (["--questions", "2", "--questions-dir", str(tmp_path / "g")], "generated"),
    ):
        out = tmp_path / split
        ran = CliRunner().invoke(app, [*common, *more, "--out", str(out)])
        assert ran.exit_code == 0, ran.output
        assert json.loads((out / "results.json").read_text())["config"]["split"] == split
        assert re.search(rf"Config: .*\bsplit={split}[,.]", (out / "results.md").read_text())


def test_a_set_whose_manifest_was_edited_names_it_and_claims_no_other_file_edited(
    tmp_path: Path,
) -> None:
    from llama_index_hyde_plus.evaluation.questions import write_beir_folder

    queries, judgments = [("l1", "Who owns service 7?")], [("l1", "doc1.md#1", 1)]
    folder = write_beir_folder(tmp_path / "set", chunks(), queries, judgments, {"labels": "/l"})
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "kept": 5}))
    with pytest.raises(ValueError) as refused:
        write_beir_folder(folder, chunks(), queries, [("l1", "doc2.md#2", 1)], {"labels": "/l"})
    said = str(refused.value)
    assert "edited since hyde-plus wrote it (manifest.json): which of its other files" in said
    assert "are yours cannot be told (qrels/test.tsv); it is never written over" in said


def test_a_reused_set_whose_manifest_was_edited_is_said_to_be_edited(tmp_path: Path) -> None:
    from llama_index_hyde_plus.evaluation.questions import edited_files, write_beir_folder

    queries, judgments = [("l1", "Who owns service 7?")], [("l1", "doc1.md#1", 1)]
    folder = write_beir_folder(tmp_path / "set", chunks(), queries, judgments, {"labels": "/l"})
    manifest = json.loads((folder / "manifest.json").read_text())
    for edit in ({"kept": 99}, {"caveat": "Trust me"}, {"seed": 5}, {"written": "x"}):
        (folder / "manifest.json").write_text(json.dumps({**manifest, **edit}))
        assert edited_files(folder) == ["manifest.json"], edit  # its claims are not trusted
    legacy = {k: v for k, v in manifest.items() if k not in ("written", "manifest_sha256")}
    (folder / "manifest.json").write_text(json.dumps(legacy))
    assert edited_files(folder) == []  # written before the record: nothing tells


def test_a_reader_kept_waiting_by_a_writer_is_refused_without_advice_it_cannot_follow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from llama_index_hyde_plus._owned import locked_folder
    from llama_index_hyde_plus.evaluation import questions

    folder = tmp_path / "set"
    folder.mkdir()
    monkeypatch.setattr(questions, "SET_LOCK_WAIT", 0.2)
    said: list[str] = []

    def read(flag: str | None) -> None:
        try:
            with questions.locked_set(folder, flag):
                said.append("read")
        except ValueError as exc:
            said.append(str(exc))

    with locked_folder(folder):  # a writer at work
        for flag in (None, "--questions-dir"):
            reader = threading.Thread(target=read, args=(flag,))
            reader.start()
            reader.join(10)
    assert said[0].startswith(f"the question set {folder} is in use by another hyde-plus run")
    assert "--questions-dir" not in said[0]  # eval --dataset has no such option
    assert said[1].endswith("or give this run its own --questions-dir")
