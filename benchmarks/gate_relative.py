"""The relative gate and a learned per-query choice for HyDE.

With the bundled model's own passages (read from the eval cache: run ``hyde-plus eval
--llm local --transforms hyde --hyde-prompt scifact`` on both splits with the same
``--cache-dir`` first), for every judged question: plain search, HyDE at the
small-model question weight (0.8), and label-free signals of the passage. A gate keeps
HyDE's ranking for a question or falls back to plain search; its Δ nDCG@10 against
plain search is scored exactly (dense search over the stored vectors, ``D @ v``).

- the absolute gate (shipped: cosine(question, passage) >= 0.7);
- the relative gate: cosine(question, passage) >= top-hit cosine - d, d chosen on train;
- both together;
- a logistic regression over the signals fit on train (helped vs not), its threshold
  chosen on train; weights printed as the JSON to ship.

    uv run --frozen --all-extras python benchmarks/gate_relative.py \
        --cache-dir /work/cache-quality [--limit 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fanout_defaults import DEPTH, SCIFACT, Space, ndcg
from gate_signals import auc, unit

from llama_index_hyde_plus.evaluation.beir import BeirDataset, load_beir
from llama_index_hyde_plus.evaluation.metrics import (
    paired_interval,
    paired_t_test,
)

WEIGHT = 0.8
ABSOLUTE = 0.7
DS = tuple(round(0.02 * i, 2) for i in range(0, 26))
FEATURES = (
    "cos(q,h)",
    "cos(q,h) - top",
    "top-10 overlap",
    "cos(h, centroid q top10)",
    "q top score",
    "q gap s1-s2",
    "h top score",
)


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def rows(space: Space, ds: BeirDataset, name: str = "hyde") -> list[dict[str, Any]]:
    """Per judged question: signals and the nDCG@10 of plain and HyDE search."""
    from llama_index_hyde_plus.cli._evaluation import ModelChoice
    from llama_index_hyde_plus.evaluation.runner import TransformSpec, build_transform
    from llama_index_hyde_plus.local import local_embedding

    session = space.session(ds)
    llm = ModelChoice("local", "local", 256, 0.7, 160, 0, 4).make_llm()
    hyde = build_transform(TransformSpec(name, name, {}), llm, session.cache, "scifact")
    results = {}
    for qid, text in ds.queries.items():
        if qid in ds.qrels and session.cache.get(hyde.cache_key_for(text)) is not None:
            r = hyde.transform(text)
            if not r.fallback and r.hypothetical:
                results[qid] = r
    space.embed(ds.queries[q] for q in results)
    cache = space.root / "numpy" / "passages.npz"
    known: dict[str, np.ndarray] = {}
    if cache.exists():
        with np.load(cache) as z:
            known = {k: z[k] for k in z.files}
    model = None
    for r in results.values():
        key = _key(r.hypothetical[0])
        if key not in known:
            model = model or local_embedding(max_length=256)
            known[key] = np.asarray(model.get_text_embedding(r.hypothetical[0]), np.float32)
    np.savez(cache, **known)
    out: list[dict[str, Any]] = []
    plain_runs, hyde_runs = {}, {}
    feats = {}
    for qid, r in results.items():
        q = unit(space.vec(ds.queries[qid]))
        h = known[_key(r.hypothetical[0])]
        h = unit(h)
        qs, hs = space.matrix @ q, space.matrix @ h
        v = unit(WEIGHT * q + (1 - WEIGHT) * h)
        vs = space.matrix @ v
        qtop, htop = np.argsort(-qs)[:DEPTH], np.argsort(-hs)[:10]
        plain_runs[qid] = [int(i) for i in qtop]
        hyde_runs[qid] = [int(i) for i in np.argsort(-vs)[:DEPTH]]
        sq = np.sort(qs)[::-1]
        sim = float(q @ h)
        feats[qid] = {
            "cos(q,h)": sim,
            "cos(q,h) - top": sim - float(sq[0]),
            "top-10 overlap": len(set(qtop[:10].tolist()) & set(htop.tolist())) / 10,
            "cos(h, centroid q top10)": float(h @ unit(space.matrix[qtop[:10]].mean(axis=0))),
            "q top score": float(sq[0]),
            "q gap s1-s2": float(sq[0] - sq[1]),
            "h top score": float(hs.max()),
        }
    qrels = {q: ds.qrels[q] for q in results}
    plain = ndcg(qrels, plain_runs, space.ids)
    expanded = ndcg(qrels, hyde_runs, space.ids)
    for qid in results:
        out.append(
            {"qid": qid, "plain": plain.get(qid, 0.0), "hyde": expanded.get(qid, 0.0), **feats[qid]}
        )
    return out


def score(rows: list[dict[str, Any]], keep: list[bool]) -> dict[str, Any]:
    """Δ nDCG@10 (points) of keeping HyDE where ``keep``, plain search elsewhere."""
    plain = {r["qid"]: r["plain"] for r in rows}
    gated = {r["qid"]: (r["hyde"] if k else r["plain"]) for r, k in zip(rows, keep, strict=True)}
    d = np.asarray([100 * (gated[q] - plain[q]) for q in plain])
    lo, hi = paired_interval(gated, plain)
    return {
        "delta": float(d.mean()),
        "ci": [100 * lo, 100 * hi],
        "wtl": [int((d > 1e-9).sum()), int((abs(d) <= 1e-9).sum()), int((d < -1e-9).sum())],
        "p": paired_t_test(gated, plain),
        "kept": float(np.mean(keep)),
    }


def auc_ci(pos: list[float], neg: list[float], rounds: int = 1000) -> tuple[float, float]:
    """The AUC's 95% bootstrap interval as BENCHMARKS.md reports it (numpy's resampling:
    not gate_signals' `auc_interval`, so the published intervals repeat)."""
    rng = np.random.default_rng(0)
    a, b = np.asarray(pos), np.asarray(neg)
    vals = sorted(
        auc(list(rng.choice(a, a.size)), list(rng.choice(b, b.size))) for _ in range(rounds)
    )
    return vals[int(0.025 * rounds)], vals[int(0.975 * rounds) - 1]


def helped_hurt(rows: list[dict[str, Any]], values: list[float]) -> dict[str, Any]:
    pos = [v for r, v in zip(rows, values, strict=True) if r["hyde"] - r["plain"] > 1e-9]
    neg = [v for r, v in zip(rows, values, strict=True) if r["hyde"] - r["plain"] < -1e-9]
    lo, hi = auc_ci(pos, neg)
    return {"auc": auc(pos, neg), "ci": [lo, hi], "helped": len(pos), "hurt": len(neg)}


def matrix(rows: list[dict[str, Any]]) -> np.ndarray:
    return np.asarray([[r[f] for f in FEATURES] for r in rows], dtype=np.float64)


def fit_logistic(
    x: np.ndarray, y: np.ndarray, l2: float = 1.0, steps: int = 3000
) -> dict[str, Any]:
    """Standardised logistic regression by gradient descent (numpy only)."""
    mean, sd = x.mean(axis=0), x.std(axis=0) + 1e-9
    z = (x - mean) / sd
    w, b = np.zeros(z.shape[1]), 0.0
    for _ in range(steps):
        p = 1 / (1 + np.exp(-(z @ w + b)))
        gw = z.T @ (p - y) / len(y) + l2 * w / len(y)
        gb = float(np.mean(p - y))
        w -= 0.5 * gw
        b -= 0.5 * gb
    return {
        "features": list(FEATURES),
        "mean": mean.tolist(),
        "sd": sd.tolist(),
        "w": w.tolist(),
        "b": b,
    }


def predict(model: dict[str, Any], x: np.ndarray) -> np.ndarray:
    z = (x - np.asarray(model["mean"])) / np.asarray(model["sd"])
    return 1 / (1 + np.exp(-(z @ np.asarray(model["w"]) + model["b"])))


def fmt(s: dict[str, Any]) -> str:
    w, t, l_ = s["wtl"]
    return (
        f"{s['delta']:+.2f} [{s['ci'][0]:+.2f}, {s['ci'][1]:+.2f}] | {w}/{t}/{l_} | "
        f"{s['p']:.3f} | {100 * s['kept']:.0f}%"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=SCIFACT)
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    space = Space(load_beir(args.dataset, "test"), args.cache_dir, "train")
    data = {
        split: rows(space, load_beir(args.dataset, split, limit=args.limit))
        for split in ("train", "test")
    }
    train, test = data["train"], data["test"]
    report: dict[str, Any] = {"n": {k: len(v) for k, v in data.items()}}
    # d on train: the best mean Δ with the relative gate alone and with the absolute one
    grid = {}
    for d in DS:
        alone = score(train, [r["cos(q,h) - top"] >= -d for r in train])
        both = score(
            train, [r["cos(q,h) - top"] >= -d and r["cos(q,h)"] >= ABSOLUTE for r in train]
        )
        grid[d] = (alone, both)
    report["train_grid"] = {
        f"{d:g}": [a["delta"], b["delta"], a["kept"]] for d, (a, b) in grid.items()
    }
    best = max(DS, key=lambda d: (round(grid[d][0]["delta"], 6), -d))
    report["d"] = best
    configs = {
        "HyDE, weight 0.8, no gate": lambda r: True,
        f"absolute gate {ABSOLUTE} (shipped)": lambda r: r["cos(q,h)"] >= ABSOLUTE,
        f"relative gate d = {best:g}": lambda r: r["cos(q,h) - top"] >= -best,
        f"both (absolute {ABSOLUTE} and relative {best:g})": lambda r: (
            r["cos(q,h) - top"] >= -best and r["cos(q,h)"] >= ABSOLUTE
        ),
    }
    # the learned choice: helped (1) vs not (0), threshold chosen on train
    model = fit_logistic(
        matrix(train), np.asarray([r["hyde"] > r["plain"] + 1e-9 for r in train], float)
    )
    p_train = predict(model, matrix(train))
    thresholds = sorted(set(np.round(p_train, 4).tolist()))
    best_t = max(thresholds, key=lambda t: score(train, list(p_train >= t))["delta"])
    model["threshold"] = best_t
    report["model"] = model
    p_test = predict(model, matrix(test))
    lines = [
        "| configuration | split | Δ nDCG@10 [95% CI] | W/T/L | p | HyDE kept |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for label, keep in configs.items():
        for split, rs in (("train", train), ("test", test)):
            s = score(rs, [bool(keep(r)) for r in rs])
            report[f"{label}|{split}"] = s
            lines.append(f"| {label} | {split} | {fmt(s)} |")
    for split, rs, ps in (("train", train, p_train), ("test", test, p_test)):
        s = score(rs, list(ps >= best_t))
        report[f"learned|{split}"] = s
        lines.append(f"| learned choice (threshold {best_t:.3f}) | {split} | {fmt(s)} |")
    print("\n".join(lines))
    print()
    print("| signal (helped vs hurt at weight 0.8) | AUC train [95%] | AUC test [95%] |")
    print("| --- | ---: | ---: |")
    for name in (*FEATURES, "learned"):
        cells = []
        for rs, ps in ((train, p_train), (test, p_test)):
            values = list(ps) if name == "learned" else [r[name] for r in rs]
            a = helped_hurt(rs, values)
            report[f"auc|{name}|{len(cells)}"] = a
            cells.append(
                f"{a['auc']:.3f} [{a['ci'][0]:.2f}-{a['ci'][1]:.2f}] ({a['helped']}/{a['hurt']})"
            )
        print(f"| {name} | {cells[0]} | {cells[1]} |")
    print()
    print("| d | Δ relative alone (train) | Δ with absolute 0.7 (train) | kept |")
    print("| ---: | ---: | ---: | ---: |")
    for d, (a, b) in grid.items():
        print(f"| {d:g} | {a['delta']:+.2f} | {b['delta']:+.2f} | {100 * a['kept']:.0f}% |")
    print()
    print("model:", json.dumps({k: v for k, v in model.items()}))
    if args.json:
        args.json.write_text(json.dumps(report, default=float))


if __name__ == "__main__":
    main()
