"""``hyde-plus eval``: score transforms on a BEIR dataset."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from . import _console as ui
from . import _early as early
from . import _options as opt
from . import _questions as q
from ._console import progress_bar, reported, setup_logging
from ._evaluation import (
    ModelChoice,
    SearchChoice,
    bars,
    command_line,
    find_eval_extra,
    require_eval_extra,
    standin_for,
)
from ._names import DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_SIZE
from ._options import LlmFlags


def _specs(transforms: str, config_files: list[Path] | None) -> list[Any]:
    from ..evaluation.specs import TransformSpec, parse_transform_spec, split_transforms
    from ..transforms.config import load_config

    specs = [parse_transform_spec(name) for name in split_transforms(transforms)]
    for path in config_files or []:
        tuned = load_config(path)
        specs.append(TransformSpec(f"{path.stem}: {tuned.label}", tuned.transform, tuned.options))
    seen: dict[str, str] = {}
    for s in specs:
        key = f"{s.name}:{sorted(s.options.items())}"
        if key in seen or s.label in seen.values():
            raise ValueError(f"transform {s.label!r} is listed twice; list each once")
        seen[key] = s.label
    return specs


def _config(
    models: ModelChoice,
    model: Any,
    store: str,
    top_k: int,
    split: str,
    note: str | None,
    hyde_prompt: str | None,
) -> dict[str, Any]:
    from ..models import describe_llm

    standin = models.standin()
    llm = standin.label if standin else "none" if model is None else describe_llm(model)
    return {
        "store": store,
        "llm": llm,
        "embed": models.embed_label,
        "top_k": top_k,
        "concurrency": models.concurrency,
        "temperature": models.temperature,
        "max_tokens": models.max_tokens,
        "seed": models.seed,
        "hyde_prompt": hyde_prompt or "default",
        "split": split,
        "questions": note,
    }


Transforms = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated: none, hyde, hyde-n4, hyde+q, multi-query, step-back, "
        "decompose, rewrite, rocchio, condense, or NAME:key=value. Default: none,hyde; "
        "on a conversational set, condense (beside the message as written and the "
        "human rewrite)."
    ),
]
DEFAULT_TRANSFORMS = "none,hyde"
CONVERSATION_TRANSFORMS = "condense"
Split = Annotated[str, typer.Option(help="qrels split.")]
ResultsOut = Annotated[Path, typer.Option(help="Folder for results.json/.md/.png.")]
Keep = Annotated[int, typer.Option(help="Results kept per query.")]
UseCache = Annotated[
    bool, typer.Option("--cache/--no-cache", help="Reuse cached transform outputs.")
]
Configs = Annotated[
    list[Path] | None,
    typer.Option(
        "--config", metavar="<path>", help="A config written by `hyde-plus tune` (repeatable)."
    ),
]


def check_timeout(timeout: float | None) -> None:
    """``--timeout``, checked before anything loads."""
    if timeout is not None and not 0 < timeout < 1e6:
        raise typer.BadParameter("must be > 0 seconds", param_hint="--timeout")


def with_timeout(options: dict[str, Any], name: str, timeout: float | None) -> dict[str, Any]:
    """``options`` with ``timeout`` for a transform that calls the LLM (``--timeout``)."""
    from ..evaluation.session import needs_llm

    return options if timeout is None or not needs_llm(name) else {**options, "timeout": timeout}


def timed(specs: list[Any], timeout: float | None) -> list[Any]:
    """The transform specs with ``--timeout`` in the options of those calling the LLM."""
    from dataclasses import replace

    return [replace(s, options=with_timeout(s.options, s.name, timeout)) for s in specs]


def show_plan(models: Any, source: Any, llm_transforms: int, queries: int | None = None) -> bool:
    """Print `ModelChoice.speed_line` before the generating starts: before this run
    writes questions from ``--docs`` (``queries`` None, `DataChoice.writes_questions`),
    else once the set is loaded (``queries``: its size; a ``--dataset``, ``--qrels``
    or a set reused from ``--questions-dir``). Whether it was planned: False before
    a set that is loaded first, to plan once it is."""
    if queries is None and not source.writes_questions:
        return False
    line = models.speed_line(*source.planned_work(llm_transforms, queries))
    if line is not None:
        ui.err.print(f"[yellow]{line}[/]" if "shortens it" in line else line)
    return True


def show_timeout_hint(reports: list[Any], concurrency: int) -> None:
    """Print `timeout_hint` and `fallback_hints`, what to do about each kind of
    fallback that happened."""
    hint = timeout_hint(reports, concurrency)
    for line in ([hint] if hint is not None else []) + fallback_hints(reports):
        ui.err.print(f"[yellow]{ui.literal(line)}[/]")


def fallback_hints(reports: list[Any]) -> list[str]:
    """What to do when queries fell back for another reason than time, one line per
    kind (`TransformReport.unusable`, `TransformReport.errors`): replies that held
    nothing usable call for a model that follows the prompt; errors, for a model that
    answers. Empty when none did."""
    hints = []
    unusable = [r.label for r in reports if r.unusable]
    if unusable:
        hints.append(
            f"{', '.join(unusable)}: the model's replies held nothing usable (the warnings "
            "say what was left out of each): a model that follows the prompt better (a "
            "larger --llm) helps; more time or fewer in flight does not"
        )
    failed = [r.label for r in reports if r.errors]
    if failed:
        hints.append(
            f"{', '.join(failed)}: calls raised errors (the warnings say which): check "
            "that --llm answers"
        )
    return hints


def timeout_hint(reports: list[Any], concurrency: int) -> str | None:
    """What to do when generations ran out of time: each transform's fallbacks in the
    words of its report (`TransformReport.fell_back`, the count the table and
    ``results.json`` show), then fewer in flight, so that each gets the model (or the
    provider's rate) sooner; None when none ran out of time."""
    timed = [r for r in reports if r.timeouts]
    if not timed:
        return None
    fewer = max(1, concurrency // 2)
    said = "; ".join(f"{r.label} {r.fell_back}" for r in timed)
    return (
        f"{said} (searched with the question alone). Fewer in flight (--concurrency "
        f"{fewer}, now {concurrency}) gives each generation the model sooner; a longer "
        "--timeout waits longer for it"
    )


def _check_inputs(
    dataset: Path | None, config_files: list[Path] | None, timeout: float | None, llm: LlmFlags
) -> None:
    """The eval extra, the input paths, ``--llm`` (and its server's model and key) and
    ``--timeout``, checked with no library imported; then the extra's modules imported."""
    check_timeout(timeout)
    find_eval_extra("hyde-plus eval")
    with early.refused():
        early.llm_choice(llm.spec, oracle=True, flags=llm)
        early.dataset_folder(dataset)
        for path in config_files or []:
            early.config_file(path)
    require_eval_extra("hyde-plus eval")


def eval_cmd(
    dataset: opt.OptDataset = None,
    docs: q.Docs = None,
    questions: q.Questions = 100,
    qrels: q.Qrels = None,
    questions_dir: q.QuestionsDir = Path("hyde-plus-questions"),
    chunk_size: q.ChunkSize = DEFAULT_CHUNK_SIZE,
    chunk_overlap: q.ChunkOverlap = DEFAULT_CHUNK_OVERLAP,
    index: q.ReuseIndex = None,
    transforms: Transforms = None,
    split: Split = "test",
    limit: opt.Limit = None,
    out: ResultsOut = Path("eval-results"),
    llm: opt.EvalLlm = "auto",
    llm_model: opt.LlmModel = None,
    llm_key: opt.LlmKey = None,
    embed: opt.Embed = "auto",
    hyde_prompt: opt.HydePrompt = None,
    concurrency: opt.Concurrency = 4,
    top_k: Keep = 100,
    temperature: opt.EvalTemperature = 0.7,
    max_tokens: opt.MaxTokens = 160,
    seed: opt.Seed = 0,
    max_length: opt.MaxLength = 256,
    cache: UseCache = True,
    cache_dir: opt.CacheDir = None,
    store: opt.StoreKind = None,
    uri: opt.Uri = None,
    milvus_token: opt.MilvusToken = None,
    config_files: Configs = None,
    timeout: opt.Timeout = None,
    verbose: opt.Verbose = False,
) -> None:
    """Score transforms on a BEIR dataset, or on your own documents (--docs, with
    generated questions or your --qrels): nDCG@10, recall, MRR, wins/ties/losses and a
    verdict against `none`, latency, tokens, cost. A conversational set (turns/):
    follow-ups as written, their human rewrite, and condense given the chat."""
    setup_logging(verbose)
    _check_inputs(dataset, config_files, timeout, LlmFlags(llm, llm_model, llm_key))
    choices = (temperature, max_tokens, seed, concurrency, llm_model, llm_key)
    models = ModelChoice(llm, embed, max_length, *choices)
    where = SearchChoice(store, uri, milvus_token, cache_dir, top_k, hyde_prompt, index)
    docs_set = q.docs_choice(docs, questions, qrels, questions_dir, chunk_size, chunk_overlap, seed)
    source = q.DataChoice(dataset, docs_set)
    started, phases = time.perf_counter(), dict[str, float]()
    specs, ds, note, embed_model, model = _prepare(
        source, where, models, transforms, config_files, split, limit, out, phases
    )
    scored = q.split_of(docs, qrels, split)
    config = _config(models, model, where.kind, top_k, scored, note, hyde_prompt)
    runner = {"use_cache": cache, **where.runner_kwargs(models, embed_model)}
    run = _runner(source)
    result = _run(run, ds, timed(specs, timeout), models, model is not None, config, runner)
    result.include_earlier(phases, time.perf_counter() - started)
    _show(result, out, note, concurrency)


def _run(
    run: Any,
    ds: Any,
    specs: list[Any],
    models: ModelChoice,
    uses_llm: bool,
    config: dict[str, Any],
    runner: dict[str, Any],
) -> Any:
    """``run`` (`run_eval` or `run_conversations`) with progress bars (rate, ETA,
    fallbacks so far)."""
    with progress_bar() as progress, reported():
        return run(
            ds,
            specs,
            llm=models.make_llm if uses_llm else None,
            max_length=models.max_length,
            progress=bars(progress, "/s"),
            config={k: v for k, v in config.items() if v is not None},
            **runner,
        )


def _runner(source: q.DataChoice) -> Any:
    """`run_conversations` for a conversational set, else `run_eval`."""
    from ..evaluation import run_eval
    from ..evaluation.conversational_run import run_conversations

    return run_conversations if source.conversational else run_eval


def _prepare(
    source: q.DataChoice,
    where: SearchChoice,
    models: ModelChoice,
    transforms: str | None,
    config_files: list[Path] | None,
    split: str,
    limit: int | None,
    out: Path,
    phases: dict[str, float],
) -> tuple[list[Any], Any, str | None, Any, Any]:
    """Check every flag, then load the models and the dataset (writing questions for
    ``--docs``), timing both into ``phases``: ``(specs, dataset, caveat, embedding
    model, LLM or None)``."""
    from ..evaluation.report import check_results_folder
    from ..evaluation.session import needs_llm

    with reported():  # BeirFormatError is a ValueError
        where.kind  # noqa: B018 - flags are checked before anything loads
        if transforms is None:
            transforms = CONVERSATION_TRANSFORMS if source.conversational else DEFAULT_TRANSFORMS
        specs = _specs(transforms, config_files)
        standin_for(models, source)
        outputs = (("--out", out), ("--cache-dir", where.cache_dir))
        source.check(models.max_length, outputs, conversations=True)
        check_results_folder(out)
        where.check_index(source.docs, models)
        needs = any(needs_llm(s.name) for s in specs) or source.needs_llm
        start = time.perf_counter()
        embed_model, model = models.load(source, where, needs)
        planned = show_plan(models, source, llm_specs := sum(needs_llm(s.name) for s in specs))
        loaded = time.perf_counter()
        ds, note = source.load(split, limit, embed_model, model, models.max_length)
        source.warn_tuned_here(config_files or [])
        if not planned:
            show_plan(models, source, llm_specs, len(ds.queries))
        phases["models"] = loaded - start
        phases["dataset" if note is None else "questions"] = time.perf_counter() - loaded
    ui.err.print(
        f"[bold]{ui.named(ds.name)}[/]: {len(ds.queries)} queries, {len(ds.corpus)} "
        f"{ds.unit}; transforms: {', '.join(ui.named(s.label) for s in specs)}"
    )
    return specs, ds, note, embed_model, model


def _show(result: Any, out: Path, note: str | None = None, concurrency: int = 1) -> None:
    from ..evaluation.report import recommendation, rich_table, verdicts, write_outputs

    if result.config.get("stand_in"):
        ui.err.print(f"[bold yellow]Not a real model.[/] {result.config['stand_in']}.")
    ui.console.print(rich_table(result))
    for line in verdicts(result):
        ui.console.print(f"  {ui.literal(line)}")
    if note is not None:
        ui.err.print(f"[yellow]About these questions:[/] {ui.literal(note)}")
    with reported():
        paths = write_outputs(result, out, command_line("eval"))
    wrote = ", ".join(ui.named(str(p)) for p in paths)
    ui.console.print(f"[dim]Wrote {wrote} ({result.wall_seconds:.0f} s)[/]")
    show_timeout_hint(result.reports, concurrency)
    if result.config.get("set") == "conversational":  # a person's rewrite is no option
        from dataclasses import replace

        from ..evaluation.conversational_run import HUMAN_REWRITE

        ui.err.print(f"{HUMAN_REWRITE}: a person's standalone rewrite, the ceiling to aim at")
        result = replace(result, reports=[r for r in result.reports if r.label != HUMAN_REWRITE])
    ui.console.print(f"[bold]{ui.literal(recommendation(result))}[/]")
