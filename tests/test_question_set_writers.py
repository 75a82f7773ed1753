"""Processes writing and reading one question-set folder at once: what is there is
checked and the set written under the folder's lock, so no run replaces another's set
or mixes its files with another's, and no reader sees a set half written."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.schema import TextNode

from .conftest import team_docs

SPAWN = multiprocessing.get_context("spawn")
"""Fresh interpreters (no fork of the test process's threads)."""


def _tagged(tag: str, size: int = 3000) -> tuple[Any, list[TextNode]]:
    """A one-question set and ``size`` chunks, every text and id naming ``tag``."""
    from llama_index_hyde_plus.evaluation.questions import GeneratedQuestion, QuestionSet

    nodes = [
        TextNode(text=f"{tag} chunk {i} says team {i} owns service {i * 7}.", id_=f"{tag}-{i}")
        for i in range(size)
    ]
    question = GeneratedQuestion("g1", f"Which team owns the {tag} service?", f"{tag}-1")
    return QuestionSet([question], [], 1, 0), nodes


def _whole(folder: Path) -> str:
    """The tag of the set at ``folder``, after checking that every file is the one its
    manifest records and that all name that tag (an assertion error otherwise)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    for name, digest in manifest["written"].items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
    tag = str(manifest["docs"])
    assert f"the {tag} service" in (folder / "queries.jsonl").read_text()
    assert f"\t{tag}-1\t" in (folder / "qrels" / "test.tsv").read_text()
    assert (folder / "corpus.jsonl").read_text().count(f'"{tag}-') == 3000
    return tag


def _write_sets(folder: str, tags: list[str], start: Any, errors: Any) -> None:
    """Write the set of each of ``tags`` in turn at ``folder`` once ``start`` is
    passed; each error's message goes to ``errors``."""
    from llama_index_hyde_plus.evaluation.questions import write_question_set

    made = {tag: _tagged(tag) for tag in set(tags)}
    start.wait()
    for tag in tags:
        try:
            qset, nodes = made[tag]
            write_question_set(qset, nodes, Path(folder), {"docs": tag})
        except Exception as exc:
            errors.put(f"{type(exc).__name__}: {exc}")


def test_two_processes_writing_sets_into_one_folder_never_mix_their_files(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "my set"
    start, errors = SPAWN.Barrier(2), SPAWN.Queue()
    writers = [
        SPAWN.Process(target=_write_sets, args=(str(folder), [tag] * 15, start, errors))
        for tag in ("alpha", "beta")
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(180)
        assert writer.exitcode == 0
    said = []
    while not errors.empty():
        said.append(errors.get())
    assert not said, said[:3]  # never "edited since hyde-plus wrote it": no run edited it
    assert _whole(folder) in ("alpha", "beta")


def _read_sets(folder: str, until: float, seen: Any) -> None:
    """Load the set at ``folder`` until ``until`` (a wall-clock time); for each load,
    the tags its corpus, queries and judgments name (one when whole), or the error."""
    from llama_index_hyde_plus.evaluation.beir import load_beir

    while time.time() < until:
        try:
            ds = load_beir(folder)
        except Exception as exc:
            seen.put(f"{type(exc).__name__}: {exc}")
            continue
        tags = {doc_id.split("-")[0] for doc_id in ds.corpus}
        tags |= {doc_id.split("-")[0] for judged in ds.qrels.values() for doc_id in judged}
        tags |= {text.split()[-2] for text in ds.queries.values()}
        seen.put(",".join(sorted(tags)))
        time.sleep(0.01)  # as runs read a set: now and then, never back to back


def test_a_reader_never_sees_a_set_half_written(tmp_path: Path) -> None:
    from llama_index_hyde_plus.evaluation.questions import write_question_set

    folder = tmp_path / "set"
    write_question_set(*_tagged("alpha"), folder, {"docs": "alpha"})
    start, errors, seen = SPAWN.Barrier(1), SPAWN.Queue(), SPAWN.Queue()
    tags = ["beta", "alpha"] * 6
    writer = SPAWN.Process(target=_write_sets, args=(str(folder), tags, start, errors))
    reader = SPAWN.Process(target=_read_sets, args=(str(folder), time.time() + 600, seen))
    reader.start()
    writer.start()
    writer.join(300)
    reader.kill()
    reader.join()
    assert writer.exitcode == 0 and errors.empty()
    loads = []
    while not seen.empty():
        loads.append(seen.get())
    assert loads and all(load in ("alpha", "beta") for load in loads), sorted(set(loads))[:3]


def _one_run(folder: str, docs: str, questions: int, slow: bool, start: Any, said: Any) -> None:
    """`question_set` of ``eval --docs`` as one run does it, with a scripted model
    whose first call waits at ``start`` (so both runs found no set before either
    writes); a ``slow`` run's model takes a second a reply. Puts the questions its
    folder holds when it returns, or its error."""
    from llama_index_hyde_plus.cli._questions import DocsChoice, question_set
    from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM

    waited: list[bool] = []

    def ask(prompt: str) -> str:
        if not waited:
            waited.append(True)
            start.wait()
        if slow:
            time.sleep(1.0)
        team = prompt.split("Team ")[1].split()[0]
        return f"{'Who is the team that' if slow else 'Which team'} owns service {int(team) * 7}?"

    choice = DocsChoice(Path(docs), questions, None, Path(folder), 40, 10, 0)
    try:
        done = question_set(choice, DeterministicEmbedding(dim=16), ScriptedLLM(respond=ask), 256)
    except ValueError as exc:
        said.put(f"error: {exc}")
        return
    said.put((done / "queries.jsonl").read_text())


def _two_runs(tmp_path: Path, questions: tuple[int, int]) -> list[str]:
    docs, folder = team_docs(tmp_path), tmp_path / "questions 'dir' é"
    start, said = SPAWN.Barrier(2), SPAWN.Queue()
    runs = [
        SPAWN.Process(target=_one_run, args=(str(folder), str(docs), n, slow, start, said))
        for n, slow in zip(questions, (False, True), strict=True)
    ]
    for run in runs:
        run.start()
    for run in runs:
        run.join(180)
        assert run.exitcode == 0
    return [said.get(timeout=5), said.get(timeout=5)]


def test_a_second_run_writing_the_same_set_reuses_the_one_written_first(tmp_path: Path) -> None:
    first, second = _two_runs(tmp_path, (3, 3))
    assert "Which team owns service" in first
    assert second == first  # the slower run scores the set written first, never replaces it
    assert (tmp_path / "questions 'dir' é" / "queries.jsonl").read_text() == first


def test_a_second_run_writing_another_set_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    first, second = _two_runs(tmp_path, (3, 2))
    folder = tmp_path / "questions 'dir' é"
    assert second.startswith(f"error: --questions-dir {folder} holds another question set")
    assert "with --questions 3; this run has --questions 2" in second
    assert "Nothing was written" in second
    assert (folder / "queries.jsonl").read_text() == first


def _hold_lock(folder: str, held: Any, seconds: float) -> None:
    from llama_index_hyde_plus._owned import locked_folder

    with locked_folder(Path(folder)):
        held.set()
        time.sleep(seconds)


def test_a_writer_kept_waiting_past_its_bound_is_refused_naming_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llama_index_hyde_plus.evaluation import questions

    folder = tmp_path / "set"
    questions.write_question_set(*_tagged("alpha", 10), folder, {})
    before = {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    monkeypatch.setattr(questions, "SET_LOCK_WAIT", 0.5, raising=False)
    held = SPAWN.Event()
    holder = SPAWN.Process(target=_hold_lock, args=(str(folder), held, 20.0))
    holder.start()
    try:
        assert held.wait(60)
        started = time.monotonic()
        with pytest.raises(ValueError) as refused:
            questions.write_question_set(*_tagged("beta", 10), folder, {"docs": "beta"})
        assert time.monotonic() - started < 10
    finally:
        holder.kill()
        holder.join()
    said = str(refused.value)
    assert said.startswith(f"--questions-dir {folder} is in use by another hyde-plus run")
    assert "Nothing was written" in said
    assert {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
