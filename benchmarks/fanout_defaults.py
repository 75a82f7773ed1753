"""The fan-outs' fusion weight across generator strength.

A fan-out (multi-query, step-back, decompose, rewrite) searches the question and each
generated query and fuses the lists by weighted RRF: ``w / (k + rank)`` for the
question's list, ``1 / (k + rank)`` for each generated one. This scores a grid of
``w`` (``original_weight``) and ``k`` with exact dense search over the index's stored
vectors (FAISS flat inner product = ``D @ v``), so the grid costs one matrix product per
query and configuration:

- the stand-in (``--llm oracle:P``'s draw): its query is a drawn document's title,
  relevant with probability P, else a non-relevant one from the question's top 30;
  drawn documents are masked out of the search and the judgements (``standin.draw``);
- ``decompose``'s stand-in: two drawn titles (claims with 3+ relevant documents),
  each right with probability P, both masked for that claim;
- the bundled model's own queries, read from the eval cache (run ``hyde-plus eval
  --llm local --transforms multi-query ...`` with the same ``--cache-dir`` first).

Prints Δ nDCG@10 against plain search (points), wins/ties/losses; ``--json`` saves
every cell (with per-query deltas) for the report.

    uv run --frozen --all-extras python benchmarks/fanout_defaults.py --split train \
        --cache-dir /work/cache-quality [--seeds 10] [--real multi-query] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from llama_index_hyde_plus.evaluation.beir import BeirDataset, load_beir
from llama_index_hyde_plus.evaluation.metrics import evaluate
from llama_index_hyde_plus.evaluation.standin import answer_text, draw, eligible

SCIFACT = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "scifact"
WEIGHTS = (0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0)
KS = (10, 30, 60, 100)
DEPTH = 100


class Space:
    """The corpus vectors (read once from the eval index, kept as ``.npy``) and a text
    embedding cache, so reruns embed nothing already seen."""

    def __init__(self, ds: BeirDataset, root: Path, split: str) -> None:
        self.root = root
        matrix_file = root / "numpy" / "corpus.npy"
        ids_file = root / "numpy" / "corpus_ids.json"
        self._emb_file = root / "numpy" / "queries.pkl"
        self._session: Any = None
        if matrix_file.exists():
            self.matrix = np.load(matrix_file)
            self.ids: list[str] = json.loads(ids_file.read_text())
        else:
            from llama_index_hyde_plus.evaluation.standin import stored_vectors

            session = self.session(ds)
            self.ids = list(ds.corpus)
            vectors = stored_vectors(session.base_retriever(), self.ids)
            self.matrix = np.asarray([vectors[i] for i in self.ids], dtype=np.float32)
            matrix_file.parent.mkdir(parents=True, exist_ok=True)
            np.save(matrix_file, self.matrix)
            ids_file.write_text(json.dumps(self.ids))
        self.index = {d: i for i, d in enumerate(self.ids)}
        self._emb: dict[str, np.ndarray] = (
            pickle.loads(self._emb_file.read_bytes()) if self._emb_file.exists() else {}
        )

    def session(self, ds: BeirDataset) -> Any:
        if self._session is None:
            from llama_index_hyde_plus.evaluation.runner import EvalSession
            from llama_index_hyde_plus.local import local_embedding

            self._session = EvalSession(
                ds,
                embed_model=local_embedding(max_length=256),
                embed_label="local@256",
                cache_root=self.root,
            )
        return self._session

    def embed(self, texts: Iterable[str]) -> None:
        todo = sorted({t for t in texts if t not in self._emb})
        if not todo:
            return
        from llama_index_hyde_plus.local import local_embedding

        model = local_embedding(max_length=256)
        for t in todo:
            self._emb[t] = np.asarray(model.get_query_embedding(t), dtype=np.float32)
        self._emb_file.write_bytes(pickle.dumps(self._emb))

    def vec(self, text: str) -> np.ndarray:
        return self._emb[text]

    def ranked(self, text: str, masked: Sequence[int] = ()) -> list[int]:
        """The top ``DEPTH`` document rows for ``text``, best first."""
        s = self.matrix @ self.vec(text)
        if masked:
            s[list(masked)] = -np.inf
        top = np.argpartition(-s, DEPTH)[:DEPTH]
        return [int(i) for i in top[np.argsort(-s[top], kind="stable")]]


def fused(lists: Sequence[list[int]], weights: Sequence[float], k: int) -> list[int]:
    """Weighted RRF as `fusion.fuse` does it (ties: first seen), top ``DEPTH``."""
    scores: dict[int, float] = {}
    seen: dict[int, int] = {}
    for nodes, w in zip(lists, weights, strict=True):
        for rank, row in enumerate(nodes, start=1):
            scores[row] = scores.get(row, 0.0) + w / (k + rank)
            seen.setdefault(row, len(seen))
    return sorted(scores, key=lambda r: (-scores[r], seen[r]))[:DEPTH]


def ndcg(
    qrels: dict[str, dict[str, int]], runs: dict[str, list[int]], ids: list[str]
) -> dict[str, float]:
    run = {q: {ids[r]: float(DEPTH - i) for i, r in enumerate(rows)} for q, rows in runs.items()}
    return evaluate(qrels, run, ["nDCG@10"]).per_query["nDCG@10"]


Case = tuple[str, str, list[str], list[int], dict[str, int]]
"""(case id, question, generated queries, masked rows, judgements)."""


def standin_cases(space: Space, ds: BeirDataset, p: float, seeds: Sequence[int]) -> list[Case]:
    qids = eligible(ds)
    space.embed(ds.queries[q] for q in qids)
    rankings = {q: [space.ids[r] for r in space.ranked(ds.queries[q])[:30]] for q in qids}
    cases: list[Case] = []
    for seed in seeds:
        draws = draw(ds, rankings, p, seed)
        masked = sorted(space.index[d.doc_id] for d in draws.values())
        gone = {d.doc_id for d in draws.values()}
        for qid, d in draws.items():
            qrels = {k: g for k, g in ds.qrels[qid].items() if k not in gone}
            if any(g > 0 for g in qrels.values()):
                title = answer_text(ds, d.doc_id, "query")
                cases.append((f"{seed}|{qid}", ds.queries[qid], [title], masked, qrels))
    return cases


def decompose_cases(space: Space, ds: BeirDataset, p: float, seeds: Sequence[int]) -> list[Case]:
    """Two drawn titles per claim with 3+ relevant documents, masked for that claim."""
    qids = [q for q in ds.queries if sum(g > 0 for g in ds.qrels.get(q, {}).values()) >= 3]
    space.embed(ds.queries[q] for q in qids)
    cases: list[Case] = []
    for seed in seeds:
        rng = random.Random(f"decompose|{seed}")
        for qid in qids:
            judged = ds.qrels[qid]
            relevant = sorted(d for d, g in judged.items() if g > 0)
            top = [space.ids[r] for r in space.ranked(ds.queries[qid])[:30]]
            wrong = [d for d in top if judged.get(d, 0) <= 0]
            picks: list[str] = []
            for _ in range(2):
                pool = relevant if rng.random() < p else wrong
                pool = [d for d in pool if d not in picks]
                if pool:
                    picks.append(rng.choice(pool))
            qrels = {d: g for d, g in judged.items() if d not in picks}
            if not picks or not any(g > 0 for g in qrels.values()):
                continue
            queries = [answer_text(ds, d, "query") for d in picks]
            masked = [space.index[d] for d in picks]
            cases.append((f"{seed}|{qid}", ds.queries[qid], queries, masked, qrels))
    return cases


def real_cases(space: Space, ds: BeirDataset, name: str) -> list[Case]:
    """The bundled model's cached queries for transform ``name`` (no generation)."""
    from llama_index_hyde_plus.cli._evaluation import ModelChoice
    from llama_index_hyde_plus.evaluation.runner import TransformSpec, build_transform

    session = space.session(ds)
    llm = ModelChoice("local", "local", 256, 0.7, 160, 0, 4).make_llm()
    transform = build_transform(TransformSpec(name, name, {}), llm, session.cache, "scifact")
    cases: list[Case] = []
    missing = 0
    for qid, text in ds.queries.items():
        if qid not in ds.qrels:
            continue
        if session.cache.get(transform.cache_key_for(text)) is None:
            missing += 1  # not generated yet: left out, never generated here
            continue
        result = transform.transform(text)
        if result.fallback:
            continue
        generated = [q for q in result.queries if q != text]
        cases.append((qid, text, generated, [], ds.qrels[qid]))
    if missing:
        print(f"note: {missing} {name} outputs were not cached: left out")
    return cases


def grid(
    space: Space, cases: list[Case], weights: Sequence[float], ks: Sequence[int]
) -> dict[str, Any]:
    """Δ nDCG@10 (points) per (w, k) over ``cases``; per case deltas kept."""
    space.embed(q for case in cases for q in [case[1], *case[2]])
    qrels = {c[0]: c[4] for c in cases}
    plain_lists = {c[0]: space.ranked(c[1], c[3]) for c in cases}
    gen_lists = {c[0]: [space.ranked(g, c[3]) for g in c[2]] for c in cases}
    plain = ndcg(qrels, plain_lists, space.ids)
    out: dict[str, Any] = {"plain": float(np.mean(list(plain.values()))), "cells": {}}
    for k in ks:
        for w in weights:
            runs = {
                cid: fused(
                    [plain_lists[cid], *gen_lists[cid]], [w, *[1.0] * len(gen_lists[cid])], k
                )
                if gen_lists[cid]
                else plain_lists[cid]
                for cid in qrels
            }
            scored = ndcg(qrels, runs, space.ids)
            deltas = {cid: 100 * (scored.get(cid, 0.0) - plain.get(cid, 0.0)) for cid in qrels}
            out["cells"][f"{w:g}|{k}"] = summarise(deltas)
    return out


def by_question(deltas: dict[str, float]) -> dict[str, float]:
    """Seeds averaged per question (``seed|qid`` ids), as `merge_seeds` reports."""
    groups: dict[str, list[float]] = {}
    for cid, d in deltas.items():
        groups.setdefault(cid.split("|")[-1], []).append(d)
    return {q: sum(v) / len(v) for q, v in groups.items()}


def summarise(deltas: dict[str, float]) -> dict[str, Any]:
    per_q = by_question(deltas)
    values = np.asarray(list(per_q.values()))
    n = len(values)
    mean = float(values.mean()) if n else 0.0
    sd = float(values.std(ddof=1)) if n > 1 else 0.0
    half = 1.96 * sd / math.sqrt(n) if n > 1 else 0.0
    return {
        "delta": mean,
        "ci": [mean - half, mean + half],
        "wtl": [
            int((values > 1e-9).sum()),
            int((abs(values) <= 1e-9).sum()),
            int((values < -1e-9).sum()),
        ],
        "n": n,
        "per_query": per_q,
    }


def markdown(
    title: str, result: dict[str, Any], weights: Sequence[float], ks: Sequence[int]
) -> str:
    lines = [f"**{title}** (plain nDCG@10 {result['plain']:.3f})", ""]
    lines.append("| k \\ w | " + " | ".join(f"{w:g}" for w in weights) + " |")
    lines.append("| --- |" + " ---: |" * len(weights))
    for k in ks:
        cells = [result["cells"][f"{w:g}|{k}"] for w in weights]
        lines.append(f"| {k} | " + " | ".join(f"{c['delta']:+.2f}" for c in cells) + " |")
    c60 = [result["cells"][f"{w:g}|60"] for w in weights if f"{w:g}|60" in result["cells"]]
    if c60:
        lines.append(
            "| W/T/L (k 60) | " + " | ".join("/".join(map(str, c["wtl"])) for c in c60) + " |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=SCIFACT)
    parser.add_argument("--split", default="train")
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--real", default="", help="comma-separated transforms (cached)")
    parser.add_argument("--limit", type=int, default=None, help="judged queries for --real")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    ds = load_beir(args.dataset, args.split)
    space = Space(load_beir(args.dataset, "test"), args.cache_dir, args.split)
    report: dict[str, Any] = {}
    seeds = range(args.seeds)
    for p in (1.0, 0.5):
        report[f"title, P={p:g}"] = grid(space, standin_cases(space, ds, p, seeds), WEIGHTS, KS)
        report[f"two titles (decompose), P={p:g}"] = grid(
            space, decompose_cases(space, ds, p, seeds), WEIGHTS, KS
        )
    for name in filter(None, args.real.split(",")):
        small = load_beir(args.dataset, args.split, limit=args.limit)
        report[f"bundled model, {name}"] = grid(space, real_cases(space, small, name), WEIGHTS, KS)
    for title, result in report.items():
        print(markdown(title, result, WEIGHTS, KS))
        print()
    if args.json:
        args.json.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
