"""``hyde-plus tune``: sweep a transform's search options and write the winner."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from . import _console as ui
from . import _early as early
from . import _options as opt
from . import _questions as q
from ._console import check_choice, fail, progress_bar, reported, setup_logging
from ._evaluation import (
    ModelChoice,
    SearchChoice,
    command_line,
    find_eval_extra,
    one_bar,
    require_eval_extra,
    standin_for,
)
from ._names import DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_SIZE, TRANSFORMS
from ._options import LlmFlags
from .eval import check_timeout, show_plan, show_timeout_hint, with_timeout


def _check_flags(
    name: str, tolerance: float, dataset: Path | None, timeout: float | None, llm: LlmFlags
) -> None:
    """The checks that need no library (before `require_eval_extra` imports)."""
    check_choice("--transform", name, TRANSFORMS[1:])
    check_timeout(timeout)
    if not 0 <= tolerance < 100:
        raise fail(f"--tolerance must be between 0 and 100 nDCG@10 points, not {tolerance:g}")
    with early.refused():
        early.llm_choice(llm.spec, oracle=True, flags=llm)
        early.dataset_folder(dataset)


def _check(name: str, split: str, out: Path, report: Path | None) -> None:
    from ..evaluation.report import is_tune_report
    from ..evaluation.tune import check_writable

    if split.strip().lower() == "test":  # (--docs: "generated" or "labelled", no split)
        ui.err.print("[bold yellow]warning:[/] tuning on the test split; report on another split")
    with reported():
        if report is not None and report.expanduser().resolve() == out.expanduser().resolve():
            raise ValueError(f"--report {report} is the --out file; give each its own path")
        check_writable(out, "--out")
        if report is not None:
            check_writable(report, "--report", "a tune report", is_tune_report)


TuneTransform = Annotated[
    str, typer.Option("--transform", "-t", help=f"One of: {', '.join(TRANSFORMS[1:])}.")
]
TuneSplit = Annotated[str, typer.Option(help="qrels split to tune on (never test).")]
ConfigOut = Annotated[Path, typer.Option(help="Config file to write (JSON), for --config.")]
SweepReport = Annotated[
    Path | None, typer.Option(help="Also write the whole sweep as a Markdown table.")
]
Tolerance = Annotated[
    float, typer.Option(help="nDCG@10 points within which the simpler configuration wins.")
]
Grid = Annotated[
    str | None,
    typer.Option(
        help="Your own sweep instead of the transform's: "
        "'query_weight=0.7,1.0; keyword_weight=0.5,0.9' (the product)."
    ),
]
Depth = Annotated[int, typer.Option(help="Results kept per query (rerank depth).")]


WriteAnyway = Annotated[
    bool,
    typer.Option(
        "--write-anyway", help="Write the chosen config even when it does not beat plain search."
    ),
]


def tune(
    dataset: opt.TuneDataset = None,
    docs: q.Docs = None,
    questions: q.Questions = 100,
    qrels: q.Qrels = None,
    questions_dir: q.QuestionsDir = Path("hyde-plus-questions"),
    chunk_size: q.ChunkSize = DEFAULT_CHUNK_SIZE,
    chunk_overlap: q.ChunkOverlap = DEFAULT_CHUNK_OVERLAP,
    index: q.ReuseIndex = None,
    transform: TuneTransform = "hyde",
    split: TuneSplit = "train",
    limit: opt.Limit = 300,
    out: ConfigOut = Path("hyde-plus-tuned.json"),
    report: SweepReport = None,
    tolerance: Tolerance = 0.2,
    grid: Grid = None,
    llm: opt.EvalLlm = "auto",
    llm_model: opt.LlmModel = None,
    llm_key: opt.LlmKey = None,
    embed: opt.Embed = "auto",
    hyde_prompt: opt.HydePrompt = None,
    concurrency: opt.Concurrency = 4,
    top_k: Depth = 100,
    temperature: opt.EvalTemperature = 0.7,
    max_tokens: opt.MaxTokens = 160,
    seed: opt.Seed = 0,
    max_length: opt.MaxLength = 256,
    cache_dir: opt.CacheDir = None,
    store: opt.StoreKind = None,
    uri: opt.Uri = None,
    milvus_token: opt.MilvusToken = None,
    timeout: opt.Timeout = None,
    write_anyway: WriteAnyway = False,
    verbose: opt.Verbose = False,
) -> None:
    """Sweep a transform's search options on a training split (or on questions written
    from your --docs) and write the winner, the simplest configuration within
    --tolerance points of the best, when it beats plain search (significantly, p < 0.05).
    Each query is generated once and reused."""
    setup_logging(verbose)
    find_eval_extra("hyde-plus tune")
    name, split = transform.strip().lower(), q.split_of(docs, qrels, split)
    _check_flags(name, tolerance, dataset, timeout, LlmFlags(llm, llm_model, llm_key))
    require_eval_extra("hyde-plus tune")
    _check(name, split, out, report)
    choices = (temperature, max_tokens, seed, concurrency, llm_model, llm_key)
    models = ModelChoice(llm, embed, max_length, *choices)
    where = SearchChoice(store, uri, milvus_token, cache_dir, top_k, hyde_prompt, index)
    docs_set = q.docs_choice(docs, questions, qrels, questions_dir, chunk_size, chunk_overlap, seed)
    source = q.DataChoice(dataset, docs_set)
    outputs = (("--out", out), ("--report", report), ("--cache-dir", cache_dir))
    loaded = _load(source, where, models, name, grid, split, limit, outputs)
    configs, ds, embed_model, model = loaded
    configs = _timed_grid(configs, name, timeout)
    options = {"llm": model, "split": split, "grid": configs, "tolerance": tolerance / 100}
    result = _sweep(ds, name, options, where.runner_kwargs(models, embed_model))
    path = _write(result, out, source) if result.winner.gains() or write_anyway else None
    show_timeout_hint([result.winner], concurrency)  # every configuration shares its generations
    _show(result, (path, out), report)


def _write(result: Any, out: Path, source: q.DataChoice) -> Path:
    """Write the chosen configuration to ``out`` (`evaluation.tune.write_config`),
    with the question set it was tuned on (`DataChoice.scored_set`), if any, in its
    ``tuned_on``: `eval` scoring that set with it warns that its scores are
    optimistic."""
    from ..evaluation.tune import write_config

    if (scored := source.scored_set()) is not None:
        result.extra["question_set"] = scored
    with reported():
        return write_config(result, out)


def _timed_grid(configs: Any, name: str, timeout: float | None) -> Any:
    """The sweep's configurations (None: the transform's own grid) with ``--timeout``
    in each: every configuration's calls, not a swept option."""
    if timeout is None:
        return configs
    from ..transforms.registry import entry_for

    grid = configs if configs is not None else entry_for(name).grid
    return [with_timeout(dict(c), name, timeout) for c in grid]


def _sweep(ds: Any, name: str, options: dict[str, Any], runner: dict[str, Any]) -> Any:
    """`run_tune` with progress bars: the configurations done of the grid's (so the bar
    has an ETA) and how many were not measured, and the current one's queries (rate,
    ETA, fallbacks so far)."""
    from ..evaluation.tune import run_tune
    from ..transforms.registry import entry_for

    grid = options["grid"] if options["grid"] is not None else entry_for(name).grid
    unmeasured = 0

    def done(report: Any) -> None:
        nonlocal unmeasured
        unmeasured += not report.measured
        said = f"[yellow]{unmeasured} not measured[/]" if unmeasured else ""
        progress.update(sweep, advance=1, rate=said)

    with progress_bar() as progress, reported():
        sweep = progress.add_task("configurations", total=len(grid), rate="")
        return run_tune(
            ds, name, progress=one_bar(progress, "q/s"), on_report=done, **options, **runner
        )


def _load(
    source: q.DataChoice,
    where: SearchChoice,
    models: ModelChoice,
    name: str,
    grid: str | None,
    split: str,
    limit: int | None,
    outputs: q.Outputs = (),
) -> tuple[Any, Any, Any, Any]:
    """Check the flags, then load the models and the data: ``(grid, dataset,
    embedding model, LLM or None)``."""
    from ..evaluation.session import needs_llm
    from ..evaluation.tune import check_grid, parse_grid

    with reported():  # BeirFormatError is a ValueError
        where.kind  # noqa: B018 - flags are checked before anything loads
        standin_for(models, source)
        configs = check_grid(name, parse_grid(grid)) if grid is not None else None
        source.check(models.max_length, outputs)
        where.check_index(source.docs, models)
        embed_model, model = models.load(source, where, needs_llm(name) or source.needs_llm)
        planned = show_plan(models, source, int(needs_llm(name)))
        ds, _ = source.load(split, limit, embed_model, model, models.max_length)
        if not planned:
            show_plan(models, source, int(needs_llm(name)), len(ds.queries))
    what = split if source.docs is None else f"{split} questions"
    ui.err.print(f"[bold]{ui.named(ds.name)}[/] {what}: {len(ds.queries)} queries; tuning {name}")
    return configs, ds, embed_model, model if needs_llm(name) else None


TABLE_ROWS = 15
"""Configurations the terminal table shows, best first; the report has them all."""


def _whole_table(result: Any, out: Path) -> Path | None:
    """Where the whole sweep goes when the terminal shows only `TABLE_ROWS` and no
    ``--report`` was given: beside ``--out``, with ``.md`` (``hyde.json`` ->
    ``hyde.md``), unless a file there is not a tune report hyde-plus wrote (None)."""
    from ..evaluation.report import is_tune_report
    from ..evaluation.tune import check_writable

    if len(result.reports) <= TABLE_ROWS:
        return None
    path = out.with_suffix(".md") if out.suffix.lower() != ".md" else out.with_suffix(".md.md")
    try:
        return check_writable(path, "--report", "a tune report", is_tune_report)
    except ValueError:
        return None


def _show(result: Any, paths: tuple[Path | None, Path], report: Path | None) -> None:
    """The sweep, the choice and where it was written (``paths``: the config written
    or None, and ``--out``)."""
    path, out = paths
    from ..evaluation.report import (
        is_tune_report,
        tune_choice,
        tune_markdown,
        tune_recommendation,
        tune_table,
    )
    from ..evaluation.tune import check_writable, write_output

    if result.extra.get("stand_in"):
        ui.err.print(f"[bold yellow]Not a real model.[/] {result.extra['stand_in']}.")
    ui.console.print(tune_table(result, TABLE_ROWS))
    report = report if report is not None else _whole_table(result, out)
    if len(result.reports) > TABLE_ROWS:
        where = f"all in {report}" if report is not None else "--report FILE writes them all"
        said = f"{TABLE_ROWS} of {len(result.reports)} shown; {where}"
        ui.console.print(said, markup=False, soft_wrap=True)  # a path is never folded
    ui.console.print(ui.literal(tune_choice(result)))
    if report is not None:
        with reported():
            report = check_writable(report, "--report", "a tune report", is_tune_report)
        write_output(report, tune_markdown(result, command_line("tune"), config=path))
    if path is not None:
        ui.console.print(f"[dim]Wrote {ui.named(str(path))}[/]")
    ui.console.print(f"[bold]{ui.literal(tune_recommendation(result, path))}[/]")
