"""Does any label-free signal tell a good HyDE passage from a bad one?

A gate skips the expansion for a query when a signal says the passage is bad. It earns
its place only if the signal separates good from bad on the training split. For each
candidate this prints the AUC (0.5 = a coin; far from 0.5 either way = a signal; the
"direction" column says which side is good) between:

- **stand-in right vs wrong**: ``--llm oracle:P`` passages (a judged-relevant document
  vs a plausible non-relevant one from the question's top 30; the drawn documents are
  masked out of the search, exactly as removing them from a flat index);
- **helped vs hurt** (stand-in, and the bundled model's real passages with ``--real``):
  queries whose nDCG@10 rose vs fell against plain search when the passage was mixed
  in at question weight ``--weight``.

Candidates (query performance prediction): the question-passage cosine (today's gate);
that cosine relative to the question's own top hit; the overlap of the question's and
the passage's top 10; the passage's top score, its NQC and WIG; the question's top-score
gap, NQC and WIG; the passage's cosine to the centroid of the question's top 10.

The dense search is exact (FAISS flat inner product = ``D @ v``), so this reads the
index's stored vectors once and scores with numpy.

    uv run --frozen --all-extras python benchmarks/gate_signals.py --split train \
        [--p 0.5 --seeds 3] [--real] [--markdown]
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from llama_index_hyde_plus.evaluation.beir import BeirDataset, load_beir
from llama_index_hyde_plus.evaluation.metrics import evaluate
from llama_index_hyde_plus.evaluation.runner import EvalSession
from llama_index_hyde_plus.evaluation.standin import (
    answer_text,
    draw,
    eligible,
    stored_vectors,
)

SCIFACT = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "scifact"
Vec = np.ndarray


def unit(v: Vec) -> Vec:
    n = float(np.linalg.norm(v))
    return v / n if n else v


def nqc(scores: Vec, k: int = 100) -> float:
    top = np.sort(scores)[::-1][:k]
    return float(np.std(top) / (abs(float(np.mean(top))) + 1e-9))


def wig(scores: Vec, k: int = 10) -> float:
    top = np.sort(scores)[::-1][:k]
    return float(np.mean(top) - np.mean(scores))


SIGNALS: dict[str, Callable[[dict[str, Any]], float]] = {
    "cos(question, passage)  [today's gate]": lambda c: float(c["q"] @ c["h"]),
    "cos(q, passage) - question's top score": lambda c: float(c["q"] @ c["h"] - c["qs"].max()),
    "top-10 overlap, question vs passage": lambda c: len(c["qtop"] & c["htop"]) / 10,
    "passage's top score": lambda c: float(c["hs"].max()),
    "passage NQC (top 100)": lambda c: nqc(c["hs"]),
    "passage WIG (top 10)": lambda c: wig(c["hs"]),
    "question top-score gap (s1 - s2)": lambda c: float(
        np.diff(np.sort(c["qs"])[::-1][:2])[0] * -1
    ),
    "question NQC (top 100)": lambda c: nqc(c["qs"]),
    "question WIG (top 10)": lambda c: wig(c["qs"]),
    "cos(passage, centroid of question top 10)": lambda c: float(c["h"] @ unit(c["qcent"])),
}


def auc(pos: Sequence[float], neg: Sequence[float]) -> float:
    """Mann-Whitney AUC: the chance a positive scores above a negative (ties half)."""
    if not pos or not neg:
        return float("nan")
    p, n = np.asarray(pos)[:, None], np.asarray(neg)[None, :]
    return float(((p > n).sum() + 0.5 * (p == n).sum()) / (p.size * n.size))


def auc_interval(pos: list[float], neg: list[float], rounds: int = 1000) -> tuple[float, float]:
    rng = random.Random(0)
    values = sorted(
        auc(rng.choices(pos, k=len(pos)), rng.choices(neg, k=len(neg))) for _ in range(rounds)
    )
    return values[int(0.025 * rounds)], values[int(0.975 * rounds) - 1]


class Space:
    """The index's stored vectors as a matrix, and exact dense search over it."""

    def __init__(self, session: EvalSession) -> None:
        ds = session.ds
        self.ids = list(ds.corpus)
        vectors = stored_vectors(session.base_retriever(), self.ids)
        self.matrix = np.asarray([vectors[i] for i in self.ids], dtype=np.float32)
        self.embedder = session.embedder

    def scores(self, v: Vec, masked: set[int]) -> Vec:
        s = self.matrix @ v
        if masked:
            s[list(masked)] = -np.inf
        return s

    def top(self, s: Vec, k: int) -> list[int]:
        return [int(i) for i in np.argsort(-s)[:k]]


def context(space: Space, q: Vec, h: Vec, masked: set[int]) -> dict[str, Any]:
    qs, hs = space.scores(q, masked), space.scores(h, masked)
    live = np.isfinite(qs)
    qtop = space.top(qs, 10)
    return {
        "q": q,
        "h": h,
        "qs": qs[live],
        "hs": hs[live],
        "qtop": set(qtop),
        "htop": set(space.top(hs, 10)),
        "qcent": space.matrix[qtop].mean(axis=0),
    }


def ndcg_delta(
    space: Space,
    ds: BeirDataset,
    qid: str,
    q: Vec,
    h: Vec,
    weight: float,
    masked: set[int],
    qrels: dict[str, int],
) -> float:
    runs = {}
    for name, v in (("plain", q), ("hyde", unit(weight * q + (1 - weight) * h))):
        s = space.scores(v, masked)
        runs[name] = {qid: {space.ids[i]: float(s[i]) for i in space.top(s, 100)}}
    plain = evaluate({qid: qrels}, runs["plain"], ["nDCG@10"]).mean["nDCG@10"]
    hyde = evaluate({qid: qrels}, runs["hyde"], ["nDCG@10"]).mean["nDCG@10"]
    return hyde - plain


def standin_rows(
    space: Space, ds: BeirDataset, p: float, seeds: Sequence[int], weight: float
) -> list[dict[str, Any]]:
    """One row per (seed, question): signals, right/wrong, and the nDCG change."""
    index = {d: i for i, d in enumerate(space.ids)}
    qids = eligible(ds)
    qvec = {q: np.asarray(space.embedder.query(ds.queries[q]), dtype=np.float32) for q in qids}
    rankings = {
        q: [space.ids[i] for i in space.top(space.scores(qvec[q], set()), 30)] for q in qids
    }
    rows = []
    for seed in seeds:
        draws = draw(ds, rankings, p, seed)
        masked = {index[d.doc_id] for d in draws.values()}
        passages = {q: answer_text(ds, d.doc_id, "passage") for q, d in draws.items()}
        hvec = dict(zip(passages, space.embedder.texts(list(passages.values())), strict=True))
        for qid, d in draws.items():
            qrels = {k: g for k, g in ds.qrels[qid].items() if index.get(k) not in masked}
            if not any(g > 0 for g in qrels.values()):
                continue
            q, h = qvec[qid], np.asarray(hvec[qid], dtype=np.float32)
            c = context(space, q, h, masked)
            rows.append(
                {
                    "good": d.right,
                    "delta": ndcg_delta(space, ds, qid, q, h, weight, masked, qrels),
                    **{name: f(c) for name, f in SIGNALS.items()},
                }
            )
    return rows


def real_rows(
    space: Space, ds: BeirDataset, session: EvalSession, weight: float
) -> list[dict[str, Any]]:
    """Rows for the bundled model's own passages, read from the eval cache (run
    ``hyde-plus tune -t hyde --llm local --hyde-prompt scifact`` on the same split first)."""
    from llama_index_hyde_plus.cli._evaluation import ModelChoice
    from llama_index_hyde_plus.evaluation.runner import TransformSpec, build_transform

    llm = ModelChoice("local", "local", 256, 0.7, 160, 0, 4).make_llm()
    hyde = build_transform(TransformSpec("hyde", "hyde", {}), llm, session.cache, "scifact")
    rows = []
    for qid, text in ds.queries.items():
        result = hyde.transform(text)
        if result.fallback or not result.hypothetical:
            continue
        if not result.cached:
            print(f"note: {qid} was not in the cache and was generated now")
        q = np.asarray(space.embedder.query(text), dtype=np.float32)
        h = np.asarray(space.embedder.texts([result.hypothetical[0]])[0], dtype=np.float32)
        c = context(space, q, h, set())
        rows.append(
            {
                "good": None,
                "delta": ndcg_delta(space, ds, qid, q, h, weight, set(), ds.qrels[qid]),
                **{name: f(c) for name, f in SIGNALS.items()},
            }
        )
    return rows


def table(
    title: str, rows: list[dict[str, Any]], label: Callable[[dict[str, Any]], bool | None]
) -> Table:
    t = Table(title=title)
    for col in ("signal", "AUC", "95% interval", "direction", "good / bad"):
        t.add_column(col, justify="left" if col == "signal" else "right")
    for name in SIGNALS:
        pos = [r[name] for r in rows if label(r) is True]
        neg = [r[name] for r in rows if label(r) is False]
        a = auc(pos, neg)
        lo, hi = auc_interval(pos, neg)
        direction = "higher is good" if a >= 0.5 else "lower is good"
        t.add_row(name, f"{a:.3f}", f"{lo:.2f}-{hi:.2f}", direction, f"{len(pos)} / {len(neg)}")
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=SCIFACT)
    parser.add_argument("--split", default="train")
    parser.add_argument("--p", type=float, default=0.5)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--weight", type=float, default=0.5, help="question weight for helped/hurt")
    parser.add_argument("--real", action="store_true", help="also the bundled model's passages")
    parser.add_argument("--limit", type=int, default=300, help="questions for --real")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()

    from llama_index_hyde_plus.local import local_embedding
    from llama_index_hyde_plus.local.assets import cache_dir

    ds = load_beir(args.dataset, args.split)
    session = EvalSession(
        ds,
        embed_model=local_embedding(max_length=256),
        embed_label="local@256",
        cache_root=cache_dir(),
    )
    space = Space(session)
    console = Console(width=140, record=True)
    rows = standin_rows(space, ds, args.p, range(args.seeds), args.weight)
    console.print(
        table(f"stand-in oracle:{args.p}: right vs wrong passages", rows, lambda r: r["good"])
    )
    console.print(
        table(
            f"stand-in oracle:{args.p}: helped vs hurt at question weight {args.weight}",
            rows,
            lambda r: None if abs(r["delta"]) < 1e-9 else r["delta"] > 0,
        )
    )
    if args.real:
        small = load_beir(args.dataset, args.split, limit=args.limit)
        real = real_rows(space, small, session, args.weight)
        console.print(
            table(
                f"bundled model ({len(real)} questions): helped vs hurt at weight {args.weight}",
                real,
                lambda r: None if abs(r["delta"]) < 1e-9 else r["delta"] > 0,
            )
        )
    session.close()


if __name__ == "__main__":
    main()
