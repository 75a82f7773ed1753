"""What a run scored: `TransformReport` (one transform), `EvalResult` (one `eval`
run), the comparison with `none` and its verdict, as ``results.json`` records them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._plural import counted
from ..usage import Usage
from .metrics import paired_interval, paired_t_test


@dataclass
class TransformReport:
    """Scores and costs of one transform over the dataset."""

    label: str
    scores: dict[str, float]
    per_query_ndcg: dict[str, float]
    latency_p50_s: float
    latency_p95_s: float
    latency_n: int
    usage: Usage
    fallbacks: int
    cached: int
    queries: int
    p_value_vs_none: float | None = None
    examples: list[dict[str, Any]] = field(default_factory=list)
    wins: int = 0
    ties: int = 0
    losses: int = 0
    """Queries whose nDCG@10 is above, equal to, below `none`'s."""
    delta_vs_none: float | None = None
    """Mean nDCG@10 minus `none`'s."""
    skipped: int = 0
    """Queries whose expansion a gate skipped."""
    timeouts: int = 0
    """Of the ``fallbacks``, those whose generation ran out of time (the LLM's, waiting
    for a worker, or for a slot of the local model)."""
    unusable: int = 0
    """Of the ``fallbacks``, those whose model answered with nothing that could be used
    (an ``UnusableReplyError``: no query parsed from the reply, an empty passage). The
    rest (``fallbacks`` minus these and ``timeouts``) are errors: a call that raised."""
    fallback_reasons: dict[str, str] = field(default_factory=dict)
    """Each query that fell back, by id: why (its transform's ``error``)."""
    interval_vs_none: tuple[float, float] | None = None
    """95% interval of the mean per-query nDCG@10 difference with `none` (paired t)."""
    options: dict[str, Any] = field(default_factory=dict)
    rankings: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)
    """Each query's ranked document ids (to tell a configuration that changes nothing)."""
    identical_to_none: bool = False
    """Every query's ranking equals `none`'s: the configuration is a no-op here."""
    changed: int = 0
    """How many queries' rankings differ from `none`'s (of those both ranked)."""

    @property
    def measured(self) -> bool:
        """Whether the score is this transform's own: at most a tenth of its queries
        (`MAX_FALLBACK_SHARE`) fell back to plain search. Otherwise the score is mostly
        plain search's, and no comparison with `none` is drawn from it."""
        return self.fallbacks <= MAX_FALLBACK_SHARE * max(self.queries, 1)

    @property
    def errors(self) -> int:
        """Of the ``fallbacks``, those neither timed out nor unusable: a call raised."""
        return max(self.fallbacks - self.timeouts - self.unusable, 0)

    @property
    def fell_back(self) -> str:
        """``"fell back on 11 of 15: timeouts"``: the fallback count and why, by kind
        (`FALLBACK_KINDS`: timeouts, unusable replies, errors), each kind counted when
        there are several (``3 timeouts, 1 unusable reply``; ``a timeout`` for one),
        the one wording every output uses; empty when none fell back."""
        if not self.fallbacks:
            return ""
        counts = [self.timeouts, self.unusable, self.errors]
        kinds = [(n, kind) for n, kind in zip(counts, FALLBACK_KINDS) if n]
        if len(kinds) > 1:
            why = ", ".join(counted(n, one, many) for n, (one, many, _) in kinds)
        else:
            [(n, (one, many, article))] = kinds
            why = f"{article} {one}" if n == 1 else many
        return f"fell back on {self.fallbacks} of {self.queries}: {why}"

    @property
    def verdict(self) -> str:
        """The comparison with `none` in words: helps / hurts / no clear difference, or
        "not measured" when too many of its queries fell back (`measured`)."""
        if self.delta_vs_none is not None and not self.measured:
            return f"not measured: {self.fell_back}"
        return verdict(self.delta_vs_none, self.p_value_vs_none)

    def gains(self, alpha: float = 0.05) -> bool:
        """Whether this beats `none` as a recommendation requires: a positive difference,
        significant (p < ``alpha``), on a score that is not mostly plain search's (at
        most a tenth of its queries fell back). `eval` and `tune` decide by this."""
        return (
            (self.delta_vs_none or 0.0) > 0
            and self.p_value_vs_none is not None
            and self.p_value_vs_none < alpha
            and self.measured
        )

    def compare_with(self, baseline: TransformReport) -> None:
        """Fill the paired comparison with ``baseline`` (the `none` run)."""
        mine, base = self.per_query_ndcg, baseline.per_query_ndcg
        keys = set(mine) & set(base)
        self.wins = sum(1 for k in keys if mine[k] > base[k] + 1e-9)
        self.losses = sum(1 for k in keys if mine[k] < base[k] - 1e-9)
        self.ties = len(keys) - self.wins - self.losses
        self.delta_vs_none = self.scores["nDCG@10"] - baseline.scores["nDCG@10"]
        self.p_value_vs_none = paired_t_test(mine, base)
        self.interval_vs_none = paired_interval(mine, base)
        ranked = set(self.rankings) & set(baseline.rankings)
        self.changed = sum(1 for k in ranked if self.rankings[k] != baseline.rankings[k])
        self.identical_to_none = bool(ranked) and self.changed == 0

    def to_dict(self) -> dict[str, Any]:
        """This transform's record in ``results.json``'s ``results``: the scores
        (4 decimals), latency, usage and cost, and the comparison with `none`."""
        return {
            "transform": self.label,
            **{k: round(v, 4) for k, v in self.scores.items()},
            "latency_p50_s": _round(self.latency_p50_s),
            "latency_p95_s": _round(self.latency_p95_s),
            "latency_measured_queries": self.latency_n,
            "llm_calls": self.usage.calls,
            "input_tokens": self.usage.input_tokens,
            "output_tokens": self.usage.output_tokens,
            "cost_usd": round(self.usage.cost, 6),
            "usage_source": self.usage.usage_source,
            "cost_source": self.usage.cost_source,
            "fallbacks": self.fallbacks,
            "fallback_timeouts": self.timeouts,
            "fallback_unusable_replies": self.unusable,
            "fallback_errors": self.errors,
            "fallback_reasons": dict(sorted(self.fallback_reasons.items())),
            "measured": self.measured,
            "cached_transforms": self.cached,
            "queries": self.queries,
            "p_value_vs_none": None
            if self.p_value_vs_none is None
            else round(self.p_value_vs_none, 5),
            "delta_ndcg@10_vs_none": None
            if self.delta_vs_none is None
            else round(self.delta_vs_none, 5),
            "delta_ndcg@10_ci95_vs_none": None
            if self.interval_vs_none is None
            else [_round(x) for x in self.interval_vs_none],
            "wins": self.wins,
            "ties": self.ties,
            "losses": self.losses,
            "verdict": self.verdict if self.delta_vs_none is not None else None,
            "skipped_by_gate": self.skipped,
            "changed_rankings": self.changed,
            "identical_to_none": self.identical_to_none,
            "per_query_ndcg@10": {k: round(v, 4) for k, v in sorted(self.per_query_ndcg.items())},
            "options": self.options,
            "examples": self.examples,
        }


FALLBACK_KINDS = (
    ("timeout", "timeouts", "a"),
    ("unusable reply", "unusable replies", "an"),
    ("error", "errors", "an"),
)
"""Why a query fell back, as `TransformReport.fell_back` words it: its generation ran
out of time, the model's reply held nothing usable, or a call raised."""

MAX_FALLBACK_SHARE = 0.1
"""The share of a transform's queries that may fall back to plain search before its
score stops being its own (`TransformReport.measured`)."""


def verdict(delta: float | None, p_value: float | None, alpha: float = 0.05) -> str:
    """``delta`` (nDCG@10 against `none`, 0-1 scale) and its p-value in words, in
    nDCG points: "helps: +1.2 nDCG@10, p = 0.010" / "hurts: ..." / "no clear
    difference: ..."."""
    if delta is None:
        return "baseline"
    points = f"{delta * 100:+.1f} nDCG@10"
    p_text = "p = 1" if p_value is None else f"p = {p_value:.3f}"
    if p_value is not None and p_value < alpha and abs(delta) > 1e-9:
        return f"{'helps' if delta > 0 else 'hurts'}: {points}, {p_text}"
    return f"no clear difference: {points}, {p_text}"


def _round(x: float) -> float | None:
    return None if x != x else round(x, 4)  # NaN -> None


@dataclass
class EvalResult:
    """One `eval` run: the dataset, its size, the configuration and one
    `TransformReport` per transform, with the time per phase."""

    dataset: str
    queries: int
    documents: int
    config: dict[str, Any]
    reports: list[TransformReport]
    index_seconds: float
    index_cached: bool
    wall_seconds: float = 0.0
    unit: str = "documents"
    """What ``documents`` counts: ``documents``, or ``chunks`` (`BeirDataset.unit`)."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds per phase, in the order they ran: ``index`` (build or load) and one per
    transform label, after what a command did first (`include_earlier`: loading the
    models, reading the dataset or writing questions). ``wall_seconds`` is the whole."""

    def include_earlier(self, earlier: dict[str, float], total: float) -> None:
        """Count the phases that ran before `run_eval` (``earlier``, in order) and make
        ``total``, the whole command's time, the wall time.

        Args:
            earlier: seconds per phase that ran first, in order.
            total: the whole command's seconds.
        """
        self.phases = {**earlier, **self.phases}
        self.wall_seconds = total

    def to_dict(self) -> dict[str, Any]:
        """The ``results.json`` record (`write_outputs` adds the command)."""
        return {
            "dataset": self.dataset,
            "queries": self.queries,
            "documents": self.documents,
            "unit": self.unit,
            "config": self.config,
            "index_seconds": round(self.index_seconds, 2),
            "index_cached": self.index_cached,
            "wall_seconds": round(self.wall_seconds, 1),
            "phase_seconds": {k: round(v, 1) for k, v in self.phases.items()},
            "results": [r.to_dict() for r in self.reports],
        }


def compare(reports: Sequence[TransformReport]) -> None:
    """Fill every report's paired comparison with the `none` report among them."""
    baseline = next((r for r in reports if r.label == "none"), None)
    if baseline is None:
        return
    for report in reports:
        if report is not baseline:
            report.compare_with(baseline)
