"""Indexing speed and memory with the local embedding model.

Indexes a BEIR corpus (SciFact's 5,183 abstracts by default) with all-MiniLM-L6-v2
int8 at 256 tokens into a temporary folder, the way ``hyde-plus index`` does
(`read_documents`, then `build_faiss_index`), and prints docs, seconds, docs/s and
peak RSS (and the 1-minute load average at the end, as a sign of other work on the
machine). Each path runs in its own child process, so the peak RSS is that path's.
``--baseline`` also runs the old path in the same invocation (batches in corpus order,
32 texts per ONNX run, onnxruntime's default threads) and prints the ratio.
``--incremental`` instead indexes the corpus as ``hyde-plus index`` does
(chunks of 200 tokens), then rebuilds it unchanged, then after editing 10 documents,
and prints seconds and chunks embedded for each build.

    uv run --frozen --all-extras python benchmarks/indexing.py [--limit N] [--corpus PATH]
        [--baseline | --incremental] [--markdown]

``--corpus`` is a BEIR folder holding ``corpus.jsonl`` (or that file itself); it is
read in place, never copied (``--incremental`` edits a copy in a temporary folder).

``--incremental`` on SciFact (one run, nice 10, load 6 to 7 on 2 cores, 1.10 GB peak):

| build | docs | chunks | embedded | edited docs' chunks | seconds |
| --- | ---: | ---: | ---: | ---: | ---: |
| full build | 5,183 | 11,833 | 11,833 | - | 1114.3 |
| unchanged rebuild | 5,183 | 11,833 | 0 | - | 15.4 |
| 10 docs edited | 5,183 | 11,833 | 23 | 23 | 16.2 |
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_CORPUS = Path("/work/shared/datasets/scifact")
MAX_LENGTH = 256
#: The settings before batching by length: what ``LocalEmbedding`` and ``embed_nodes`` did.
OLD = {"threads": 0, "batch_size": 32, "max_batch_chars": None, "sort_by_length": False}


def _print_rows(header: list[str], lines: list[list[str]], markdown: bool) -> None:
    """``lines`` under ``header``: a Markdown table, else right-aligned columns."""
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("| --- |" + " ---: |" * (len(header) - 1))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(x) for x in col) for col in zip(header, *lines)]
        for line in [header, *lines]:
            print("  ".join(x.rjust(w) for x, w in zip(line, widths)))


def corpus_file(path: Path) -> Path:
    file = path / "corpus.jsonl" if path.is_dir() else path
    if not file.is_file():
        raise SystemExit(f"no corpus.jsonl at {path}")
    return file


def old_embed_nodes(
    nodes: Sequence[Any], embed_model: Any, *, batch_size: int = 64, progress: Any = None
) -> None:
    """`embed_nodes` as it was before batching by length: batches in the documents' order."""
    for start in range(0, len(nodes), batch_size):
        batch = nodes[start : start + batch_size]
        texts = [n.get_content(metadata_mode="embed") for n in batch]
        for node, vector in zip(batch, embed_model.get_text_embedding_batch(texts)):
            node.embedding = vector
        if progress is not None:
            progress(len(batch))


def peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux (bytes on macOS)
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 1e6


def run_child(path: str, corpus: Path, limit: int | None) -> dict[str, Any]:
    """Index the corpus on one path in this process; the result as a dict."""
    from llama_index_hyde_plus.local import local_embedding
    from llama_index_hyde_plus.readers import read_documents
    from llama_index_hyde_plus.stores import faiss, ingestion, nodes

    with tempfile.TemporaryDirectory(prefix="hyde-index-bench-") as tmp:
        folder = Path(tmp) / "docs"
        folder.mkdir()
        (folder / "corpus.jsonl").symlink_to(corpus_file(corpus).resolve())
        documents = read_documents(folder)[:limit]
        if path == "old":
            embed_model = local_embedding(max_length=MAX_LENGTH, **OLD)
            ingestion.embed_nodes = nodes.embed_nodes = old_embed_nodes  # type: ignore[assignment]
        else:
            embed_model = local_embedding(max_length=MAX_LENGTH)
        embed_model.get_text_embedding("warm up")  # load the model outside the timing
        start = time.perf_counter()
        info = faiss.build_faiss_index(
            documents,
            embed_model,
            Path(tmp) / "index",
            embed_spec="local",
            max_length=MAX_LENGTH,
            batch_size=64,  # the CLI's default
        )
        seconds = time.perf_counter() - start
    return {
        "path": path,
        "docs": info.documents,
        "seconds": seconds,
        "docs_per_s": info.documents / seconds,
        "peak_rss_mb": peak_rss_mb(),
        "threads": embed_model.threads,
        "batch_size": embed_model.batch_size,
        "sorted": embed_model.sort_by_length,
        "load": os.getloadavg()[0],  # other work on the machine shows here
    }


EDITED = 10
"""Documents edited before the last rebuild of ``--incremental``."""


def run_incremental(corpus: Path, limit: int | None) -> dict[str, Any]:
    """Build, rebuild unchanged, edit `EDITED` documents and rebuild, in this process,
    with the CLI's chunking; a row per build."""
    from llama_index_hyde_plus.chunking import Chunking, split_documents, tokenizer_for
    from llama_index_hyde_plus.local import local_embedding
    from llama_index_hyde_plus.readers import read_documents
    from llama_index_hyde_plus.stores.faiss import build_faiss_index

    lines = corpus_file(corpus).read_text(encoding="utf-8").splitlines()[:limit]
    embed_model = local_embedding(max_length=MAX_LENGTH)
    embed_model.get_text_embedding("warm up")
    tokenizer = tokenizer_for(embed_model)[1]
    steps = []
    with tempfile.TemporaryDirectory(prefix="hyde-index-bench-") as tmp:
        folder, out = Path(tmp) / "docs", Path(tmp) / "index"
        folder.mkdir()
        for step in ("full build", "unchanged rebuild", f"{EDITED} docs edited"):
            edited: set[str] = set()
            if step.endswith("edited"):
                for i in range(0, len(lines), len(lines) // EDITED)[:EDITED]:
                    row = json.loads(lines[i])
                    lines[i] = json.dumps({**row, "text": row["text"] + " (edited)"})
                    edited.add(str(row.get("_id")))
            (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
            start = time.perf_counter()
            documents = read_documents(folder)
            info = build_faiss_index(
                documents, embed_model, out, embed_spec="local", max_length=MAX_LENGTH,
                chunking=Chunking(),
            )  # fmt: skip
            seconds = time.perf_counter() - start
            theirs = [d for d in documents if d.doc_id in edited]
            their_chunks = len(split_documents(theirs, Chunking(), tokenizer)) if theirs else None
            steps.append(
                {"step": step, "docs": info.documents, "chunks": info.chunks}
                | {"embedded": info.embedded, "seconds": seconds, "theirs": their_chunks}
            )
            print(f"{step}: {seconds:.1f} s", file=sys.stderr)
    return {"steps": steps, "peak_rss_mb": peak_rss_mb(), "load": os.getloadavg()[0]}


def print_incremental(result: dict[str, Any], *, markdown: bool) -> None:
    header = ["build", "docs", "chunks", "embedded", "edited docs' chunks", "seconds"]
    lines = [
        [
            r["step"],
            f"{r['docs']:,}",
            f"{r['chunks']:,}",
            f"{r['embedded']:,}",
            "-" if r["theirs"] is None else f"{r['theirs']:,}",
            f"{r['seconds']:.1f}",
        ]
        for r in result["steps"]
    ]
    _print_rows(header, lines, markdown)
    peak = result["peak_rss_mb"] / 1000
    print(f"\npeak RSS {peak:.2f} GB, load {result['load']:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--limit", type=int, default=None, help="index only the first N")
    parser.add_argument("--baseline", action="store_true", help="also run the old path")
    parser.add_argument(
        "--incremental", action="store_true", help="build, rebuild, edit 10 docs, rebuild"
    )
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--child", choices=("old", "new"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(args.child, args.corpus, args.limit)))
        return
    corpus_file(args.corpus)
    if args.incremental:
        print_incremental(run_incremental(args.corpus, args.limit), markdown=args.markdown)
        return
    rows = []
    for path in (["old"] if args.baseline else []) + ["new"]:
        cmd = [sys.executable, __file__, "--child", path, "--corpus", str(args.corpus)]
        if args.limit is not None:
            cmd += ["--limit", str(args.limit)]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"{path}: {rows[-1]['seconds']:.1f} s", file=sys.stderr)
    print_table(rows, markdown=args.markdown)


def print_table(rows: list[dict[str, Any]], *, markdown: bool) -> None:
    header = ["path", "docs", "seconds", "docs/s", "peak RSS", "batching", "threads", "load"]
    lines = [
        [
            "old (document order)" if r["path"] == "old" else "new",
            f"{r['docs']:,}",
            f"{r['seconds']:.1f}",
            f"{r['docs_per_s']:.1f}",
            f"{r['peak_rss_mb'] / 1000:.2f} GB",
            "sorted, char budget" if r["sorted"] else f"{r['batch_size']} in corpus order",
            "ort default" if not r["threads"] else str(r["threads"]),
            f"{r['load']:.1f}",
        ]
        for r in rows
    ]
    _print_rows(header, lines, markdown)
    if len(rows) == 2:
        old, new = rows
        print(
            f"\nnew / old: {new['docs_per_s'] / old['docs_per_s']:.2f}x docs/s, "
            f"{new['peak_rss_mb'] / old['peak_rss_mb']:.2f}x peak RSS"
        )


if __name__ == "__main__":
    main()
