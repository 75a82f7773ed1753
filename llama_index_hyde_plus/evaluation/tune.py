"""Choose a transform's search options on a training split: `run_tune` sweeps the
options its registry entry lists (`registry.Entry.grid`), reusing one generation per query from the
transform cache, and picks the simplest configuration within ``tolerance`` of the best.
`write_config` / `load_config` keep the winner as a file that ``query``, ``serve`` and
``eval`` accept with ``--config``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llama_index.core.llms import LLM

from .._owned import check_file, say_replacing, write_all_atomic
from .._suggest import did_you_mean
from ..transforms.config import CONFIG_FORMAT, label_for
from ..transforms.registry import TRANSFORMS, check_options, entry_for
from .beir import BeirDataset
from .results import TransformReport, compare
from .session import EvalSession, SessionOptions, build_transform, fresh_llm, needs_llm
from .specs import TransformSpec, parse_value
from .standin import StandIn
from .standin_run import run_standin

if TYPE_CHECKING:
    from typing_extensions import Unpack

MAX_GRID = 500
"""The most configurations one sweep may hold."""
DEFAULT_TOLERANCE = 0.002
"""nDCG@10 (0-1 scale) within which a simpler configuration is preferred to the best."""


def parse_grid(text: str) -> list[dict[str, Any]]:
    """``"query_weight=0.7,1.0; keyword_weight=0.5,0.9"`` -> the product of the listed
    values, in order (``none`` is None, ``true``/``false`` booleans, numbers as
    numbers). A `ValueError` names what cannot be read."""
    import itertools

    axes: list[tuple[str, list[Any]]] = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, sep, values = part.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise ValueError(f"--grid part {part!r} must be key=value[,value...]")
        if any(key == k for k, _ in axes):
            raise ValueError(f"--grid names {key!r} twice")
        parsed = [
            None if v.strip().lower() == "none" else parse_value(v.strip())
            for v in values.split(",")
        ]
        axes.append((key, parsed))
    if not axes:
        raise ValueError("--grid is empty; write key=value[,value...]; key=...")
    count = math.prod(len(v) for _, v in axes)  # counted before the product is built
    if count > MAX_GRID:
        sizes = " x ".join(str(len(v)) for _, v in axes)
        raise ValueError(f"--grid has {sizes} = {count} configurations; at most {MAX_GRID}")
    keys = [k for k, _ in axes]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in axes))]


def check_grid(name: str, grid: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``grid`` if every configuration builds the transform ``name``; else a `ValueError`
    naming the first that does not. At most `MAX_GRID` configurations."""
    configs = [dict(c) for c in grid]
    if not configs:
        raise ValueError("the grid must hold at least one configuration")
    if len(configs) > MAX_GRID:
        raise ValueError(f"the grid has {len(configs)} configurations; at most {MAX_GRID}")
    for options in configs:
        try:
            check_options(name, options)
        except ValueError as exc:
            raise ValueError(f"grid configuration {label_for(name, options)!r}: {exc}") from exc
    return configs


def complexity(name: str, options: dict[str, Any]) -> int:
    """How much machinery a configuration of the transform ``name`` switches on (lower
    is simpler), as its registry entry says (`registry.Entry.complexity`)."""
    return entry_for(name).complexity(options)


@dataclass
class TuneResult:
    """A sweep's reports (grid order), the baseline, the best and the chosen one."""

    transform: str
    dataset: str
    split: str
    queries: int
    baseline: TransformReport
    reports: list[TransformReport]
    best: TransformReport
    winner: TransformReport
    tolerance: float
    extra: dict[str, Any] = field(default_factory=dict)

    def ranked(self) -> list[TransformReport]:
        """The configurations' reports, best nDCG@10 first; those not measured (more
        than a tenth of their queries fell back, `TransformReport.measured`) last."""
        return sorted(self.reports, key=lambda r: (not r.measured, -r.scores["nDCG@10"]))

    @property
    def unmeasured(self) -> int:
        """How many configurations fell back on more than a tenth of their queries."""
        return sum(not r.measured for r in self.reports)


def pick_winner(
    reports: Sequence[TransformReport], tolerance: float, transform: str
) -> TransformReport:
    """The simplest report within ``tolerance`` nDCG@10 of the best (the best among
    equally simple ones). Where a knob makes no measurable difference, the simpler
    value wins. A report that is not measured (more than a tenth of its queries fell
    back: its score is mostly plain search's) is chosen only when none is."""
    if not reports:
        raise ValueError("no configurations to choose from")
    reports = [r for r in reports if r.measured] or list(reports)
    best = max(r.scores["nDCG@10"] for r in reports)
    close = [r for r in reports if r.scores["nDCG@10"] >= best - tolerance - 1e-12]
    return min(close, key=lambda r: (complexity(transform, r.options), -r.scores["nDCG@10"]))


def run_tune(
    ds: BeirDataset,
    transform: str,
    *,
    llm: LLM | Callable[[], LLM] | None,
    split: str = "train",
    grid: Sequence[dict[str, Any]] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    hyde_prompt: str | None = None,
    on_report: Callable[[TransformReport], None] | None = None,
    standin: StandIn | None = None,
    **options: Unpack[SessionOptions],
) -> TuneResult:
    """Score ``none`` and every configuration of ``transform`` in ``grid`` (default:
    its registry entry's `registry.Entry.grid`) on ``ds``; generations are cached, so the sweep
    calls the LLM once per query and generation setting. ``options`` are the
    `EvalSession` options (`SessionOptions`: models, cache, store, depth...).
    ``standin`` sweeps with the strong-generator stand-in instead of ``llm``
    (`standin_run.run_standin`: seeds averaged per question)."""
    name = transform.strip().lower()
    if name not in TRANSFORMS or name == "none":
        raise ValueError(
            f"transform must be one of {', '.join(TRANSFORMS[1:])}, not {transform!r}"
            f"{did_you_mean(transform, TRANSFORMS[1:])}"
        )
    if not 0 <= tolerance < 1:
        raise ValueError("tolerance must be between 0 and 1 (nDCG@10 is 0-1)")
    configs = check_grid(name, grid if grid is not None else entry_for(name).grid)
    if needs_llm(name) and llm is None and standin is None:
        raise ValueError(f"{name} needs an llm")
    session = EvalSession(ds, **options)
    try:
        if standin is None:
            baseline, reports = _sweep(session, name, configs, llm, hyde_prompt, on_report)
            stand_in: dict[str, Any] = {}
        else:
            baseline, reports, stand_in = _sweep_standin(
                session, standin, name, configs, hyde_prompt, on_report
            )
    finally:
        session.close()
    best = max([r for r in reports if r.measured] or reports, key=lambda r: r.scores["nDCG@10"])
    return TuneResult(
        transform=name,
        dataset=ds.name,
        split=split,
        queries=len(ds.queries),
        baseline=baseline,
        reports=reports,
        best=best,
        winner=pick_winner(reports, tolerance, name),
        tolerance=tolerance,
        extra={
            "store": options.get("store", "faiss"),
            "hyde_prompt": hyde_prompt,
            "top_k": options.get("top_k", 100),
            **stand_in,
        },
    )


def _sweep_standin(
    session: EvalSession,
    standin: StandIn,
    name: str,
    configs: Sequence[dict[str, Any]],
    hyde_prompt: str | None,
    on_report: Callable[[TransformReport], None] | None,
) -> tuple[TransformReport, list[TransformReport], dict[str, Any]]:
    """`_sweep` on every draw of the stand-in, averaged per question (`run_standin`):
    ``(none's report, each configuration's, what to record about the stand-in)``."""

    def score_all(child: EvalSession, llm_for: Callable[[str], Any]) -> list[Any]:
        head, rest = _sweep(child, name, configs, partial(llm_for, name), hyde_prompt)
        return [head, *rest]

    merged, stand_in = run_standin(session, standin, score_all)
    for report in merged[1:]:
        if on_report is not None:
            on_report(report)
    return merged[0], merged[1:], stand_in


def _sweep(
    session: EvalSession,
    name: str,
    configs: Sequence[dict[str, Any]],
    llm: LLM | Callable[[], LLM] | None,
    hyde_prompt: str | None,
    on_report: Callable[[TransformReport], None] | None = None,
) -> tuple[TransformReport, list[TransformReport]]:
    """``none``'s report, then each configuration's, compared with it."""
    model = fresh_llm(llm) if needs_llm(name) else None
    warm_up = getattr(model, "warm_up", None)
    if callable(warm_up):
        warm_up()
    baseline = session.score(
        "none", build_transform(TransformSpec("none", "none"), None, None, None)
    )
    reports: list[TransformReport] = []
    for options in configs:
        spec = TransformSpec(label_for(name, options), name, dict(options))
        transformer = build_transform(spec, model, session.cache, hyde_prompt)
        report = session.score(spec.label, transformer, options=dict(options))
        reports.append(report)
        compare([baseline, report])
        if on_report is not None:
            on_report(report)
    return baseline, reports


def config_payload(result: TuneResult) -> dict[str, Any]:
    """What `write_config` writes: the winner's options and how they were chosen."""
    w = result.winner
    return {
        "hyde_plus_config": CONFIG_FORMAT,
        "transform": result.transform,
        "options": w.options,
        "tuned_on": {
            "dataset": result.dataset,
            "split": result.split,
            "queries": result.queries,
            "ndcg@10": round(w.scores["nDCG@10"], 5),
            "none_ndcg@10": round(result.baseline.scores["nDCG@10"], 5),
            "p_value_vs_none": None if w.p_value_vs_none is None else round(w.p_value_vs_none, 5),
            "wins_ties_losses": [w.wins, w.ties, w.losses],
            "best_label": result.best.label,
            "best_ndcg@10": round(result.best.scores["nDCG@10"], 5),
            "tolerance_points": round(result.tolerance * 100, 4),
            "fallbacks": w.fallbacks,
            "measured": w.measured,
            "configurations": len(result.reports),
            "configurations_not_measured": result.unmeasured,
            **result.extra,
        },
    }


def write_config(result: TuneResult, path: Path) -> Path:
    """Write the winner as JSON to ``path`` (atomically: a temporary file renamed; the
    permissions the umask gives)."""
    path = check_writable(path, "--out")
    write_output(path, json.dumps(config_payload(result), indent=2) + "\n")
    return path


def is_our_config(head: bytes) -> bool:
    """Whether a file starting with ``head`` is a config `write_config` wrote (a JSON
    object carrying ``hyde_plus_config``, the key that names what it is)."""
    try:
        data = json.loads(head.decode("utf-8"))
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and "hyde_plus_config" in data


def check_writable(
    path: Path, what: str, kind: str = "a config", ours: Callable[[bytes], bool] = is_our_config
) -> Path:
    """``path`` (expanded) if a file can be written there: absent or a file this tool
    wrote (``ours``: a tune config by default), its folder creatable; else a
    `ValueError` naming ``what`` (`check_file`)."""
    return check_file(path, what, kind, ours)


def write_output(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, making its missing folders first and
    saying so when it replaces the file of an earlier run."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create the folder {path.parent} ({exc.strerror})") from exc
    say_replacing([path] if path.exists() else [])
    write_all_atomic([(path, text)])
