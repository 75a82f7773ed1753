"""What ``eval`` and ``tune`` share: the dataset, the models and the progress bars."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._plural import counted
from . import _console as ui
from . import _early as early
from ._console import fail, task

if TYPE_CHECKING:
    from rich.progress import Progress


LONG_RUN_S = 300.0
"""A run that may generate for longer than this says so up front."""


@dataclass(frozen=True)
class ModelChoice:
    """The models an evaluation uses, as given on the command line."""

    llm: str
    embed: str
    max_length: int
    temperature: float
    max_tokens: int
    seed: int
    concurrency: int
    llm_model: str | None = None
    """``--llm-model``: a server's model."""
    llm_key: str | None = field(default=None, repr=False)
    """``--llm-key``: a server's key (never shown)."""
    planned: list[Any] = field(default_factory=list, compare=False)
    """The local model's `local.speed.SpeedPlan`, once measured (`make_llm`)."""

    def standin(self) -> Any:
        """The strong-generator stand-in ``--llm oracle:P`` names, else None; a
        `ValueError` when P or the seed count is wrong."""
        from ..evaluation.standin import StandIn

        return StandIn.parse(self.llm, base_seed=self.seed)

    @property
    def embed_label(self) -> str:
        from ..models import concrete_embedding_spec

        return f"{concrete_embedding_spec(self.embed)}@{self.max_length}"

    def make_llm(self) -> Any:
        """A fresh LLM (a seeded local model samples the same for every transform). A
        model on llama.cpp runs with the threads the speed measured at the first call
        chose (`local.speed.plan_threads`), unless ``HYDE_PLUS_LLM_THREADS`` says, and
        its calls are budgeted by that speed."""
        from ..models import llm_threads
        from ._options import LlmFlags

        def made(threads: int | None = None) -> Any:
            llm: Any = LlmFlags(self.llm, self.llm_model, self.llm_key).resolve(
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                seed=self.seed,
                parallel=self.concurrency,
            )
            if threads is not None:
                llm.threads = threads
            return llm

        llm = made()
        if type(llm).__name__ != "LocalLLM" or llm_threads() is not None:
            return llm
        if not self.planned:
            from ..local.speed import plan_threads

            try:
                self.planned.append(plan_threads(made))
            except Exception as exc:  # the calls themselves fall back if the model fails
                said = ui.literal(str(exc))
                ui.err.print(f"[yellow]warning:[/] could not measure the local model: {said}")
                self.planned.append(None)
        plan = self.planned[0]
        if plan is None:
            return llm
        llm.threads, llm.tokens_per_s = plan.threads, plan.budget_rate
        return llm

    def speed_line(self, generations: int | None, shorten: str) -> str | None:
        """What the measured speed means for this run: the speed, and when the run may
        take over `LONG_RUN_S`, how long and the one option that shortens it."""
        plan = self.planned[0] if self.planned else None
        if plan is None:
            return None
        said = f"Local model: {plan.describe()}, measured now."
        if generations is None:
            return said
        seconds = generations * self.max_tokens / plan.tokens_per_s
        if seconds <= LONG_RUN_S:
            return said
        return (
            f"{said} Generating may take up to about {seconds / 60:.0f} min "
            f"({counted(generations, 'generation')} of up to {self.max_tokens} tokens); "
            f"{shorten} shortens it."
        )

    def load_embedding(self) -> Any:
        """The embedding model, with a status line while it loads."""
        from ..models import concrete_embedding_spec, resolve_embedding

        spec = concrete_embedding_spec(self.embed)
        with ui.err.status("Loading the embedding model..."):
            return resolve_embedding(spec, max_length=self.max_length)

    def load_llm(self, needs_llm: bool) -> Any:
        """The LLM (a local one's speed measured, `make_llm`), or None when the run
        needs none or scores with the stand-in; with a status line while it loads."""
        if self.standin() is not None or not needs_llm:
            return None  # the stand-in is made per draw, from the labels
        with ui.err.status("Loading the LLM..."):
            return self.make_llm()

    def load(self, source: Any, where: SearchChoice, needs_llm: bool) -> tuple[Any, Any]:
        """``(embedding model, LLM or None)`` for ``eval`` and ``tune``, in the order
        that refuses a run before its costly work: the embedding model; ``--docs``
        read and compared with the ``--index`` of ``where`` (`DataChoice.read`); the
        LLM; a question set made from anything else refused
        (`DataChoice.refuse_other_set`)."""
        embed_model = self.load_embedding()
        source.read(embed_model, self.max_length, where)
        model = self.load_llm(needs_llm)
        source.refuse_other_set(model, embed_model)
        return embed_model, model


@dataclass(frozen=True)
class SearchChoice:
    """Where and how an evaluation searches, as given on the command line. A ``--uri``
    means Milvus unless ``--store`` says otherwise (then it is an error)."""

    store: str | None
    uri: str | None
    milvus_token: str | None
    cache_dir: Path | None
    top_k: int
    hyde_prompt: str | None
    index: Path | None = None
    """``--index``: the user's FAISS index of ``--docs``, searched instead of one built."""
    opened: list[Any] = field(default_factory=list, compare=False, repr=False)
    """``(store, loaded index)`` of ``--index``, once `open_index` has loaded it."""

    def open_index(self, embed_model: Any) -> tuple[Any, Any]:
        """``(store, loaded index)`` of ``--index``, loaded once: the check against
        ``--docs`` (`DataChoice.read`) and the search (`runner_kwargs`) share it."""
        if not self.opened:
            from ..stores import open_store

            assert self.index is not None
            store = open_store(index=self.index)
            self.opened.append((store, store.load(embed_model)))
        store, held = self.opened[0]
        return store, held

    @property
    def kind(self) -> str:
        """The store kind; a `ValueError` naming the flags when they disagree."""
        from ..stores import store_kind

        return store_kind(self.store, self.uri)

    def check_index(self, docs: Any, models: ModelChoice) -> None:
        """A `ValueError` before anything loads when ``--cache-dir`` is not a folder;
        with ``--index``, unless it is a FAISS index of ``--docs`` (a `DocsChoice`)
        chunked and embedded as this run asks."""
        root = cache_root(self.cache_dir)
        if root.exists() and not root.is_dir():
            raise ValueError(f"--cache-dir {root} is a file, not a folder; give a folder")
        if self.index is None:
            return
        if docs is None:
            raise ValueError(
                "--index reuses a `hyde-plus index` of --docs; with --dataset, eval indexes "
                "the corpus itself (one vector per document)"
            )
        if self.uri is not None or self.kind != "faiss":
            raise ValueError("--index is a FAISS index folder; leave out --store/--uri with it")
        from ..models import concrete_embedding_spec
        from ..stores.faiss import read_meta

        wanted = {
            "--chunk-size": docs.chunk_size,
            "--chunk-overlap": docs.chunk_overlap,
            "--embed": concrete_embedding_spec(models.embed),
            "--max-length": models.max_length,
        }
        differ = index_mismatches(read_meta(self.index), wanted)
        if differ:
            raise ValueError(
                f"--index {self.index} was built with {', '.join(differ)}; this run asks "
                f"for {', '.join(f'{k} {wanted[k]}' for k in differ_flags(differ))}. Run with "
                "the index's settings, or rebuild the index with these"
            )

    def runner_kwargs(self, models: ModelChoice, embed_model: Any) -> dict[str, Any]:
        """The keyword arguments `run_eval` and `run_tune` share."""
        store, held = self.open_index(embed_model) if self.index is not None else (None, None)
        return {
            "embed_model": embed_model,
            "embed_label": models.embed_label,
            "cache_root": cache_root(self.cache_dir),
            "top_k": self.top_k,
            "concurrency": models.concurrency,
            "hyde_prompt": self.hyde_prompt,
            "store": self.kind,
            "milvus_uri": self.uri,
            "milvus_token": self.milvus_token or "",
            "index_store": store,
            "index": held,
            "standin": models.standin(),
        }


def standin_for(models: ModelChoice, source: Any) -> Any:
    """The stand-in ``--llm oracle:P`` asks for (None for a real model), checked before
    any work: it needs judged questions, so not questions written from ``--docs``."""
    standin = models.standin()
    if standin is not None and source.needs_llm:
        raise ValueError(
            "--llm oracle:P needs judged questions: use --dataset, or --docs with --qrels "
            "(generated questions need a real --llm)"
        )
    return standin


def index_mismatches(meta: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """``["--chunk-size 60", ...]``: how an index (its ``hyde_plus.json``) was built,
    for each of the ``wanted`` flags (``--chunk-size``, ``--chunk-overlap``, ``--embed``,
    ``--max-length``) whose value differs."""
    chunking = meta.get("chunking") or {}
    built = {
        "--chunk-size": chunking.get("chunk_size"),
        "--chunk-overlap": chunking.get("chunk_overlap"),
        "--embed": meta.get("embed"),
        "--max-length": meta.get("max_length"),
    }
    return [
        f"{flag} {built[flag] if built[flag] is not None else '(none: not chunked)'}"
        for flag, value in wanted.items()
        if built.get(flag) != value
    ]


def differ_flags(differences: list[str]) -> list[str]:
    """The flag names of `index_mismatches`' entries."""
    return [d.split(" ", 1)[0] for d in differences]


#: What ``eval`` and ``tune`` need beyond the base install: the extra and its modules.
EVAL_EXTRA: tuple[str, tuple[str, ...]] = ("eval", ("ir_measures", "matplotlib"))


def find_eval_extra(command: str) -> None:
    """Refuse ``command`` when a module of the ``eval`` extra is not installed, without
    importing any (before the arguments are checked; `require_eval_extra` imports)."""
    with early.refused():
        early.extra(*EVAL_EXTRA, command)


def require_eval_extra(command: str) -> None:
    """Refuse ``command`` when a module of the ``eval`` extra cannot be imported."""
    from ..models import MissingExtraError, require_extra

    try:
        require_extra(*EVAL_EXTRA, command)
    except MissingExtraError as exc:
        raise fail(str(exc)) from exc


def bars(progress: Progress, unit: str) -> Callable[[str, int], Any]:
    """A progress factory for the runner: one bar per transform, with its rate, ETA and
    running count of fallbacks."""

    def factory(description: str, total: int) -> Any:
        return task(progress, description, total, unit)

    return factory


def one_bar(progress: Progress, unit: str) -> Callable[[str, int], Any]:
    """`bars` for a sweep: one bar at a time, each configuration's replacing the last
    one's, so dozens of configurations take one line."""
    shown: list[Any] = []

    def factory(description: str, total: int) -> Any:
        for task_id in shown:
            progress.remove_task(task_id)
        before = {t.id for t in progress.tasks}
        advance = task(progress, description, total, unit)
        shown[:] = [t.id for t in progress.tasks if t.id not in before]
        return advance

    return factory


def command_line(name: str) -> str | None:
    """The command as typed, for the report (None when run from Python), with every
    secret hidden (`redact_argv`: ``--milvus-token``, passwords in a URI), each word
    on the line (`shell_word`)."""
    from .._redact import redact_argv

    if len(sys.argv) <= 2:
        return None
    return f"hyde-plus {name} " + " ".join(map(shell_word, redact_argv(sys.argv[2:])))


def shell_word(arg: str) -> str:
    """``arg`` as a shell reads it back, on one line: quoted (`shlex.quote`), or, when
    it holds a character a name spells (`spelled_name`: a tab, a line feed, an escape,
    a bidirectional mark), in bash's ``$'...'`` with that character spelled."""
    import shlex

    from .._shown import spelled_name

    if spelled_name(arg) == arg:
        return shlex.quote(arg)
    return "$'" + "".join(_in_dollar_quotes(c, spelled_name(c) != c) for c in arg) + "'"


def _in_dollar_quotes(char: str, spelled: bool) -> str:
    """``char`` inside bash's ``$'...'``: as itself unless ``spelled``; a character
    past ASCII as ``\\uHHHH`` (bash writes it in UTF-8), a byte of a name that is
    not UTF-8 (decoded as a lone surrogate, as Python names such a file) as that byte."""
    if char in "\\'":
        return "\\" + char
    code = ord(char)
    if not spelled:
        return char
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x80:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def cache_root(given: Path | None) -> Path:
    from ..local.assets import cache_dir

    return given or cache_dir()
