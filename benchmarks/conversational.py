"""Does `Condense` help follow-up messages find their answer? Measured on QReCC.

QReCC (github.com/apple/ml-qrecc, CC BY-SA 3.0) holds conversations whose every turn
has the message as the user wrote it, a person's standalone rewrite and an answer
passage. Its 54M-passage collection is too large for a benchmark here, so ``prepare``
builds a small one (`evaluation.conversational.from_qrecc`): each turn's own answer is
the document to find, and the answers of every other turn are the distractors; whole
conversations go to ``train`` or ``test`` (a seeded hash of each conversation's id, so
adding conversations never moves one). The set lives in a cache folder, never in the
repository.

The published numbers (BENCHMARKS.md, "Conversations") come from an excerpt of QReCC's
``qrecc_test.json``: the fields ``prepare`` reads (``Conversation_source``,
``Conversation_no``, ``Turn_no``, ``Question``, ``Rewrite``, ``Answer``), copied
unchanged, for 103 conversations: trec 1-2; QuAC 442, 729, 730, 991-995, 1244,
1499-1501, 1635, 1636; NQ 1898, 1899, 1903, 1905-1907, 1909, 1910, 1912-1916, 1918,
2374, 2376-2378 and every NQ conversation from 2196 to 2299 with an answered follow-up
(2299 up to its turn 4); a conversation may stop before its last turn. The excerpt is
``~/.cache/hyde-plus/qrecc-raw/qrecc_test_excerpt.json`` (one JSON list of QReCC
records); ``prepare`` on the full file or zip with ``--conversations N`` keeps N
conversations spread over it instead.

    # once: QReCC's JSON (the excerpt, qrecc_data.zip from its dataset/ folder, or a
    # qrecc_*.json)
    uv run --frozen --all-extras python benchmarks/conversational.py prepare \\
        --qrecc qrecc_test_excerpt.json [--conversations 80]
    # the drift guard's defaults (original_weight, standalone_words) chosen on train,
    # for the bundled model and for the stand-in that writes the human rewrite
    HYDE_PLUS_LLM_THREADS=1 uv run --frozen --all-extras python \\
        benchmarks/conversational.py choose --split train
    # the table: as written, human rewrite, Condense with the bundled model, the
    # stand-in at P = 1.0 and 0.5; intervals resample conversations
    HYDE_PLUS_LLM_THREADS=1 uv run --frozen --all-extras python \\
        benchmarks/conversational.py table --split test

The bundled model's condensed questions are cached (``--cache-dir``), so ``choose``
generates each once for its whole grid and ``table`` reuses them.
"""

from __future__ import annotations

import argparse
import json
import math
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llama_index_hyde_plus.evaluation.conversational import (
    ConversationalSet,
    from_qrecc,
    load_conversations,
)
from llama_index_hyde_plus.evaluation.conversational_run import (
    HUMAN_REWRITE,
    run_conversations,
)
from llama_index_hyde_plus.evaluation.results import EvalResult, TransformReport
from llama_index_hyde_plus.evaluation.specs import TransformSpec
from llama_index_hyde_plus.evaluation.standin import StandIn
from llama_index_hyde_plus.local.assets import cache_dir

DATA = cache_dir() / "conversational" / "qrecc"
WEIGHTS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 100.0)
STANDALONE = (None, 8)


def read_qrecc(path: Path) -> list[dict[str, Any]]:
    """QReCC's records from its zip (every ``*.json`` member) or one JSON file."""
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if n.endswith(".json")]
            return [r for n in sorted(names) for r in json.loads(z.read(n))]
    records: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return records


def prepare(args: argparse.Namespace) -> None:
    records = read_qrecc(args.qrecc)
    if args.conversations:
        keep = sorted({(r.get("Conversation_source"), r["Conversation_no"]) for r in records})
        keep = keep[:: max(1, len(keep) // args.conversations)][: args.conversations]
        chosen = set(keep)
        records = [
            r for r in records if (r.get("Conversation_source"), r["Conversation_no"]) in chosen
        ]
    counts = from_qrecc(records, args.data, seed=args.seed)
    print(f"wrote {args.data}: {counts}")


def session_options(args: argparse.Namespace) -> dict[str, Any]:
    from llama_index_hyde_plus.local import local_embedding

    return {
        "embed_model": local_embedding(max_length=256),
        "embed_label": "local@256",
        "cache_root": args.cache_dir,
        "concurrency": args.concurrency,
        "top_k": 100,
    }


def local_llm() -> Any:
    """The bundled model, as ``hyde-plus eval --llm local`` makes it."""
    from llama_index_hyde_plus.models import resolve_llm

    return resolve_llm("local", temperature=0.7, max_tokens=160, seed=0, parallel=1)


def condense_spec(weight: float | None = None, standalone: int | None = 0) -> TransformSpec:
    """Condense with ``original_weight`` and ``standalone_words`` (None: condense every
    follow-up); with neither given, as shipped."""
    if weight is None and standalone == 0:
        return TransformSpec("condense", "condense", {})
    words = "always" if standalone is None else f"{standalone}w"
    options = {"original_weight": weight, "standalone_words": standalone}
    return TransformSpec(f"condense w={weight:g} {words}", "condense", options)


def run(
    cset: ConversationalSet,
    specs: Sequence[TransformSpec],
    args: argparse.Namespace,
    standin: StandIn | None = None,
) -> EvalResult:
    llm = None if standin is not None else local_llm
    return run_conversations(cset, specs, llm=llm, standin=standin, **session_options(args))


def row(report: TransformReport, gain: float | None) -> str:
    ndcg = report.scores["nDCG@10"]
    if report.delta_vs_none is None:
        return f"| {report.label} | {ndcg:.3f} | - | - | - |"
    low, high = report.interval_vs_none or (math.nan, math.nan)
    kept = "-" if not gain else f"{report.delta_vs_none / gain:.0%}"
    return (
        f"| {report.label} | {ndcg:.3f} | {report.delta_vs_none * 100:+.1f} "
        f"[{low * 100:+.1f}, {high * 100:+.1f}] | {report.wins}/{report.ties}/{report.losses} "
        f"| {kept} |"
    )


def table(reports: Sequence[TransformReport]) -> str:
    by = {r.label: r for r in reports}
    gain = by[HUMAN_REWRITE].delta_vs_none
    lines = [
        "| search | nDCG@10 | Δ pts [95% CI] | W/T/L | of rewrite's gain |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    return "\n".join([*lines, *(row(r, gain) for r in reports)])


def table_cmd(args: argparse.Namespace) -> None:
    cset = load_conversations(args.data, args.split)
    spec = condense_spec()
    reports = run(cset, [spec], args).reports
    for p in (1.0, 0.5):
        standin = StandIn(p, tuple(range(args.seeds)))
        reports.append(run(cset, [spec], args, standin).reports[-1])
    follow = len(cset.queries)
    print(f"{cset.name} {args.split}: {follow} follow-up turns, {len(cset.corpus)} documents")
    print(table(reports))
    if args.json:
        args.json.write_text(json.dumps([r.to_dict() for r in reports], indent=1))


def choose_cmd(args: argparse.Namespace) -> None:
    cset = load_conversations(args.data, args.split)
    specs = [condense_spec(w, s) for s in STANDALONE for w in WEIGHTS]
    local = run(cset, specs, args).reports
    strong = run(cset, specs, args, StandIn(1.0, tuple(range(args.seeds)))).reports
    print(f"{args.split}: {len(cset.queries)} follow-up turns; bundled model")
    print(table(local))
    print("stand-in at P = 1.0")
    print(table(strong))
    by_local = {r.label: r for r in local[2:]}
    best_small = max(by_local.values(), key=lambda r: r.scores["nDCG@10"])
    best_capable = max(strong[2:], key=lambda r: r.scores["nDCG@10"])
    print(f"small (bundled model): {best_small.label}; capable (P = 1.0): {best_capable.label}")
    if args.json:
        out = {"local": [r.to_dict() for r in local], "standin": [r.to_dict() for r in strong]}
        args.json.write_text(json.dumps(out, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="the conversational set")
    parser.add_argument("--cache-dir", type=Path, default=cache_dir())
    parser.add_argument("--concurrency", type=int, default=1)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="build the set from QReCC's JSON")
    prep.add_argument("--qrecc", type=Path, required=True)
    prep.add_argument("--conversations", type=int, default=0, help="keep N, spread out")
    prep.add_argument("--seed", type=int, default=0)
    for name in ("table", "choose"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--split", default="test" if name == "table" else "train")
        cmd.add_argument("--seeds", type=int, default=3, help="stand-in draws")
        cmd.add_argument("--json", type=Path)
    args = parser.parse_args()
    {"prepare": prepare, "table": table_cmd, "choose": choose_cmd}[args.command](args)


if __name__ == "__main__":
    main()
