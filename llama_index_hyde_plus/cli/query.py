"""``hyde-plus query`` and ``hyde-plus transform``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..retriever import SearchResult, TransformRetriever
from ..stores import open_store
from ..transforms.registry import METHODS, TRANSFORMS, make_transform, transform_class
from ._console import (
    check_choice,
    console,
    print_transform,
    reported,
    results_table,
    setup_logging,
    usage_line,
    working,
)
from ._options import (
    Collection,
    Count,
    IndexPath,
    Llm,
    NumPassages,
    Temperature,
    Timeout,
    Token,
    Uri,
    Verbose,
)

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
    n: int,
    num_passages: int,
    temperature: float | None,
    timeout: float,
    include_query: bool | None = None,
    prompt: str | None = None,
) -> dict[str, Any]:
    """The command-line options the transform ``name`` takes, by what the class says
    of itself (its count option, whether it calls an LLM)."""
    cls = transform_class(name)
    if not cls.uses_llm:
        return {}
    options: dict[str, Any] = {"temperature": temperature, "timeout": timeout}
    count = cls.count_option()
    if count is not None:
        options[count] = num_passages if count == "num_passages" else n
    if include_query is not None:
        options["include_query"] = include_query
    if prompt:
        options["prompt"] = prompt
    return options


def _search(
    question: str,
    transform: str | None,
    options: dict[str, Any],
    config_file: Path | None,
    llm: str,
    retriever: Any,
    top_k: int,
) -> tuple[str, SearchResult]:
    from ..evaluation.tune import load_config
    from ..models import describe_llm, resolve_llm

    if config_file is not None:
        tuned = load_config(config_file)
        if transform is not None and transform != tuned.transform:
            raise ValueError(
                f"--config {config_file} is a {tuned.transform} config; drop -t {transform} "
                "or use a config of that transform"
            )
        transform = tuned.transform
        options = {**transform_options(transform, **options), **tuned.options}
    else:
        transform = transform or "hyde"
        options = transform_options(transform, **options)
    model = resolve_llm(llm) if transform_class(transform).uses_llm else None
    transformer = make_transform(transform, model, **options)
    searcher = TransformRetriever(retriever, transformer, top_k=top_k)
    if model is None:
        return transform, searcher.search(question)
    with working(f"{transform}: {describe_llm(model)} is writing"):
        return transform, searcher.search(question)


def _print_json(result: SearchResult) -> None:
    payload = {
        "transform": result.transform.to_dict(),
        "results": [
            {"id": x.node.node_id, "score": x.score, "text": x.node.get_content()}
            for x in result.nodes
        ],
        "latency_s": result.latency_s,
    }
    console.print_json(json.dumps(payload))


def query(
    question: Annotated[str, typer.Argument(help="The question to search for.")],
    index_path: IndexPath = None,
    uri: Uri = None,
    collection: Collection = "hyde_plus",
    token: Token = None,
    embed: Annotated[
        str | None, typer.Option(help="Embedding model (default: as recorded at indexing).")
    ] = None,
    transform: Annotated[
        str | None,
        typer.Option("--transform", "-t", help=f"One of: {', '.join(TRANSFORMS)} (default: hyde)."),
    ] = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="Results to show.")] = 5,
    n: Count = 3,
    num_passages: NumPassages = 1,
    include_query: IncludeQuery = None,
    llm: Llm = "auto",
    temperature: Temperature = None,
    prompt: Prompt = None,
    timeout: Timeout = 120.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    config_file: Annotated[
        Path | None,
        typer.Option("--config", help="Transform and options from `hyde-plus tune`."),
    ] = None,
    verbose: Verbose = False,
) -> None:
    """Search an index (FAISS --index or Milvus --uri) with a transformed query and show
    what was generated."""
    setup_logging(verbose)
    if transform is not None:
        check_choice("--transform", transform, TRANSFORMS)
    options = {
        "n": n,
        "num_passages": num_passages,
        "temperature": temperature,
        "timeout": timeout,
        "include_query": include_query,
        "prompt": prompt,
    }
    with reported():
        store = open_store(index=index_path, uri=uri, collection=collection, token=token or "")
        with working("Loading the index and the embedding model"):
            retriever = store.open(top_k, embed=embed)
        transform, result = _search(
            question, transform, options, config_file, llm, retriever, top_k
        )
    if as_json:
        _print_json(result)
        return
    print_transform(result)
    console.print(results_table(f"Top {top_k} for {question!r} ({transform})", result))
    cost = f"{usage_line(result.transform.usage)}; " if result.transform.usage.calls else ""
    console.print(f"[dim]{cost}search took {result.latency_s:.2f}s[/]")


def transform_cmd(
    question: Annotated[str, typer.Argument(help="The question to transform.")],
    method: Annotated[
        str, typer.Option("--method", "-m", help=f"One of: {', '.join(METHODS)}.")
    ] = "hyde",
    n: Count = 3,
    num_passages: NumPassages = 1,
    include_query: IncludeQuery = None,
    prompt: Prompt = None,
    llm: Llm = "auto",
    temperature: Temperature = None,
    timeout: Timeout = 120.0,
    verbose: Verbose = False,
) -> None:
    """Print what a transform makes of a question, as JSON."""
    from ..models import describe_llm, resolve_llm

    setup_logging(verbose)
    check_choice("--method", method, METHODS)
    with reported():
        options = transform_options(
            method,
            n=n,
            num_passages=num_passages,
            temperature=temperature,
            timeout=timeout,
            include_query=include_query,
            prompt=prompt,
        )
        model = resolve_llm(llm)
        transformer = make_transform(method, model, **options)
        with working(f"{method}: {describe_llm(model)} is writing"):
            result = transformer.transform_safe(question)
    sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
