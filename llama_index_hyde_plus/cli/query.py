"""``hyde-plus query`` and ``hyde-plus transform``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from . import _console as ui
from . import _early as early
from ._console import (
    check_choice,
    literal,
    print_transform,
    reported,
    setup_logging,
    usage_line,
    working,
)
from ._names import METHODS, TRANSFORMS, transform_name
from ._options import (
    Collection,
    Count,
    IndexPath,
    Llm,
    LlmFlags,
    LlmKey,
    LlmModel,
    MilvusToken,
    NumPassages,
    Temperature,
    Timeout,
    Uri,
    Verbose,
)

if TYPE_CHECKING:
    from llama_index.core.schema import NodeWithScore
    from rich.table import Table

    from ..search.retriever import SearchResult

IncludeQuery = Annotated[
    bool | None,
    typer.Option(
        "--include-query/--no-include-query",
        help="Also search the question itself (default: the transform's own).",
    ),
]
Prompt = Annotated[str | None, typer.Option(help="Custom prompt template with {query}.")]


def transform_options(
    name: str,
    *,
    n: int | None = None,
    num_passages: int | None = None,
    temperature: float | None = None,
    timeout: float | None = None,
    include_query: bool | None = None,
    prompt: str | None = None,
) -> dict[str, Any]:
    """The options given on the command line (None: not given) that the transform
    ``name`` takes, by its registry entry (`Entry.option_names`); a flag it does not take is
    named in a warning, not silently dropped."""
    from ..transforms.registry import entry_for

    given = flags(n, num_passages, temperature, timeout, include_query, prompt)
    takes = set(entry_for(name).option_names())
    options = {k: v for k, v in given.items() if v is not None and k in takes}
    ignored = sorted(k for k, v in given.items() if v is not None and k not in takes)
    if ignored:
        named = ", ".join("--" + k.replace("_", "-") for k in ignored)
        ui.err.print(f"[yellow]warning:[/] {name} takes no {named}; ignored", soft_wrap=True)
    if prompt == "":
        raise ValueError("--prompt is empty; give a template with {query} or leave it out")
    return options


def flags(
    n: int | None,
    num_passages: int | None,
    temperature: float | None,
    timeout: float | None,
    include_query: bool | None,
    prompt: str | None,
) -> dict[str, Any]:
    """The transform flags `query` and `transform` share, by option name."""
    return {
        "n": n,
        "num_passages": num_passages,
        "temperature": temperature,
        "timeout": timeout,
        "include_query": include_query,
        "prompt": prompt,
    }


def _search(
    question: str,
    transform: str | None,
    options: dict[str, Any],
    config_file: Path | None,
    llm: LlmFlags,
    open_retriever: Callable[[int], Any],
    top_k: int,
) -> tuple[str, SearchResult, str | None]:
    """Build the transform, open the store at the depth its guards need
    (`retriever.candidate_depth`: a reranking config reorders as many candidates here
    as in ``eval`` and ``from_index``), search, and keep ``top_k``. Returns the
    method, the search, and what its scores are when they are fused
    (`TransformRetriever.explain_scores`)."""
    from ..models import describe_llm
    from ..search.retriever import TransformRetriever, candidate_depth
    from ..transforms.config import load_config
    from ..transforms.factory import build, resolve_name
    from ..transforms.registry import transform_class

    config = load_config(config_file) if config_file is not None else None
    try:
        method = resolve_name(transform, config)
    except ValueError:
        raise ValueError(
            f"--config {config_file} is a {config.transform if config else '?'} config; "
            f"drop -t {transform} or use a config of that transform"
        ) from None
    # flags given on the command line win over the config, which wins over defaults
    given = transform_options(method, **options)
    model = llm.resolve() if transform_class(method).uses_llm else None
    transformer = build(method, model, given, config=config)
    retriever = open_retriever(candidate_depth(transformer.guards, top_k))
    searcher = TransformRetriever(retriever, transformer, top_k=top_k)
    if model is None:
        found = searcher.search(question)
    else:
        with working(f"{method}: {describe_llm(model)} is writing"):
            found = searcher.search(question)
    return method, found, searcher.explain_scores(found)


def _open_store(store: Any, embed: str | None, depth: int) -> Any:
    with working("Loading the index and the embedding model"):
        return store.open(depth, embed=embed)


def source_of(item: NodeWithScore) -> str:
    """Where a result comes from, as ``file#chunk`` (``guide.md#3``; the file alone when
    it is one chunk, ``file:id`` for a line of a ``.jsonl`` file); its id when no file
    is recorded (an index built from BEIR documents)."""
    meta = item.node.metadata
    source = meta.get("source")
    if not source:
        return item.node.node_id
    label = str(source)
    doc_id = meta.get("doc_id")
    if doc_id and str(doc_id) != label:
        label += f":{doc_id}"
    chunks = meta.get("chunks")
    if isinstance(chunks, int) and chunks > 1:
        label += f"#{meta.get('chunk')}"
    return label


def file_of(item: NodeWithScore) -> str:
    """The file a result comes from (its id when no file is recorded)."""
    return str(item.node.metadata.get("source") or item.node.node_id)


@dataclass(frozen=True)
class Row:
    """One line of the results: a chunk, or with ``--group-by-file`` a file's best chunk
    and how many of its chunks were found (``hits``)."""

    item: NodeWithScore
    hits: int = 1


def result_rows(nodes: list[NodeWithScore], group_by_file: bool, top_k: int) -> list[Row]:
    """The first ``top_k`` results, one per chunk or (``group_by_file``) per file: the
    rows keep the rank order, so a file's row is its best-scoring chunk."""
    if not group_by_file:
        return [Row(x) for x in nodes[:top_k]]
    rows: dict[str, Row] = {}
    for x in nodes:
        key = file_of(x)
        found = rows.get(key)
        rows[key] = Row(found.item, found.hits + 1) if found else Row(x)
    return list(rows.values())[:top_k]


TEXT_LINES = 3
"""Lines of text each result may take in the table."""


def _results_table(
    title: str, rows: list[Row], group_by_file: bool, width: int, fused: bool = False
) -> Table:
    """Rank, score (headed ``fused`` when the scores fuse several searches' lists),
    source and as much text as ``width`` columns leave room for (the source takes at
    most a third of them, folding at sensible points: `_folding.label`)."""
    from rich.table import Table

    from .._folding import label

    sources = [file_of(row.item) if group_by_file else source_of(row.item) for row in rows]
    source_width = min(max([len("source"), *map(len, sources)]), max(12, width // 3))
    table = Table(title=literal(title), title_justify="left", expand=True)
    for name in ("#", "fused" if fused else "score"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("source", max_width=source_width)
    if group_by_file:
        table.add_column("chunks", justify="right", no_wrap=True)
    table.add_column("text", overflow="fold", ratio=1)
    room = max(20, width - source_width - (30 if group_by_file else 22)) * TEXT_LINES
    for rank, (row, source) in enumerate(zip(rows, sources), 1):
        item = row.item
        score = f"{item.score:.3f}" if item.score is not None else "-"
        text = " ".join(item.node.get_content().split())
        text = text if len(text) <= room else text[: room - 3] + "..."
        hits = [str(row.hits)] if group_by_file else []
        table.add_row(str(rank), score, label(source), *hits, literal(text))
    return table


def _print_json(result: SearchResult, rows: list[Row], group_by_file: bool) -> None:
    results = []
    for row in rows:
        x = row.item
        entry: dict[str, Any] = {"id": x.node.node_id, "score": x.score}
        entry |= {"text": x.node.get_content()}
        entry |= {"source": source_of(x), "metadata": x.node.metadata}
        results.append(entry | ({"chunks_found": row.hits} if group_by_file else {}))
    payload = {
        "transform": result.transform.to_dict(),
        "results": results,
        "latency_s": result.latency_s,
    }
    ui.console.print_json(json.dumps(payload, default=str))


GROUP_POOL = 4
"""With ``--group-by-file``, the search fetches this many times ``--top-k`` chunks, so
that ``--top-k`` distinct files are usually among them."""


TRANSFORM_HELP = (
    f"One of: {', '.join(TRANSFORMS)} (default: hyde). Its shipped options depend on the "
    "LLM: conservative for the bundled local model, stronger for any other (see the "
    "docs' page The guards)."
)


def query(
    question: Annotated[str, typer.Argument(help="The question to search for.")],
    index_path: IndexPath = None,
    uri: Uri = None,
    collection: Collection = "hyde_plus",
    milvus_token: MilvusToken = None,
    embed: Annotated[
        str | None, typer.Option(help="Embedding model (default: as recorded at indexing).")
    ] = None,
    transform: Annotated[
        str | None,
        typer.Option("--transform", "-t", help=TRANSFORM_HELP),
    ] = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="Results to show.")] = 5,
    n: Count = None,
    num_passages: NumPassages = None,
    include_query: IncludeQuery = None,
    llm: Llm = "auto",
    llm_model: LlmModel = None,
    llm_key: LlmKey = None,
    temperature: Temperature = None,
    prompt: Prompt = None,
    timeout: Timeout = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    group_by_file: Annotated[
        bool,
        typer.Option(help="One row per file: its best chunk and how many of its chunks matched."),
    ] = False,
    config_file: Annotated[
        Path | None,
        typer.Option("--config", help="Transform and options from `hyde-plus tune`."),
    ] = None,
    verbose: Verbose = False,
) -> None:
    """Search a FAISS --index or Milvus --uri with a transformed query; show what was made."""
    setup_logging(verbose)
    if transform is not None:
        try:
            transform = transform_name(transform)  # "HyDE", "multiquery" forgiven
        except ValueError:
            check_choice("--transform", transform, TRANSFORMS)
    with early.refused():
        early.question(question, top_k)
        early.llm_choice(llm, flags=(llm_flags := LlmFlags(llm, llm_model, llm_key)))
        early.store_address(index_path, uri)
        early.config_file(config_file)
    from ..stores import open_store

    options = flags(n, num_passages, temperature, timeout, include_query, prompt)
    with reported():
        store = open_store(
            index=index_path, uri=uri, collection=collection, token=milvus_token or ""
        )
        depth = top_k * GROUP_POOL if group_by_file else top_k
        opener = partial(_open_store, store, embed)
        transform, result, scores = _search(
            question, transform, options, config_file, llm_flags, opener, depth
        )
    _show(Shown(question, transform, top_k, scores), result, group_by_file, as_json)


@dataclass(frozen=True)
class Shown:
    """What `query` shows a search under: the question, the transform's name, how many
    results, and what the scores are when they are fused (None: a store's own)."""

    question: str
    transform: str
    top_k: int
    scores: str | None = None


def _show(shown: Shown, result: SearchResult, group_by_file: bool, as_json: bool) -> None:
    """The results of `query`: JSON, or the transform's output and a table, the line
    saying what a fused score is under it."""
    rows = result_rows(result.nodes, group_by_file, shown.top_k)
    if as_json:
        _print_json(result, rows, group_by_file)
        return
    print_transform(result)
    title = _title(shown, result, len(rows), group_by_file)
    fused = shown.scores is not None
    ui.console.print(_results_table(title, rows, group_by_file, ui.console.width, fused))
    if shown.scores is not None:
        ui.console.print(f"[dim]{shown.scores}[/]")
    cost = f"{usage_line(result.transform.usage)}; " if result.transform.usage.calls else ""
    ui.console.print(f"[dim]{cost}search took {result.latency_s:.2f}s[/]")


def _title(shown: Shown, result: SearchResult, found: int, group_by_file: bool) -> str:
    """``Top 5 for 'question' (hyde)``: as many as are shown (fewer than ``--top-k``
    when the index holds fewer), and whether the transform searched with the question
    alone (it fell back, or a guard skipped it)."""
    what = " files" if group_by_file else ""
    how = shown.transform
    if result.transform.fallback:
        how += ", fell back: the question alone"
    elif result.transform.skipped:
        how += ", skipped: the question alone"
    return f"Top {min(shown.top_k, found)}{what} for {shown.question!r} ({how})"


def transform_cmd(
    question: Annotated[str, typer.Argument(help="The question to transform.")],
    method: Annotated[
        str, typer.Option("--method", "-m", help=f"One of: {', '.join(METHODS)}.")
    ] = "hyde",
    n: Count = None,
    num_passages: NumPassages = None,
    include_query: IncludeQuery = None,
    prompt: Prompt = None,
    llm: Llm = "auto",
    llm_model: LlmModel = None,
    llm_key: LlmKey = None,
    temperature: Temperature = None,
    timeout: Timeout = None,
    verbose: Verbose = False,
) -> None:
    """Print what a transform makes of a question, as JSON."""
    setup_logging(verbose)
    check_choice("--method", method, METHODS)
    llm_flags = LlmFlags(llm, llm_model, llm_key)
    with early.refused():
        early.question(question)
        early.llm_choice(llm, flags=llm_flags)
    from ..models import describe_llm
    from ..transforms.factory import build

    with reported():
        given = flags(n, num_passages, temperature, timeout, include_query, prompt)
        options = transform_options(method, **given)
        model = llm_flags.resolve()
        transformer = build(method, model, options)
        with working(f"{method}: {describe_llm(model)} is writing"):
            result = transformer.transform_safe(question)
    sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
