"""Present an `EvalResult`: a terminal table, ``results.json``, ``results.md`` and a
PNG bar chart."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.table import Table

from .metrics import LABELS, MEASURES
from .runner import EvalResult, TransformReport


def _ms(seconds: float) -> str:
    return "cached" if math.isnan(seconds) else f"{seconds * 1000:.0f} ms"


def _p(report: TransformReport) -> str:
    if report.p_value_vs_none is None:
        return "-"
    return f"{report.p_value_vs_none:.3f}" + (" *" if report.p_value_vs_none < 0.05 else "")


def _tokens(report: TransformReport) -> str:
    if not report.usage.calls:
        return "0"
    per_query = report.usage.total_tokens / max(report.queries, 1)
    return f"{per_query:.0f}"


def _cost(report: TransformReport) -> str:
    if report.usage.cost_source in ("local", "none"):
        return "$0 (local)" if report.usage.cost_source == "local" else "$0"
    return f"${report.usage.cost:.4f}" + (
        " (partly unknown)" if report.usage.cost_source == "unknown" else ""
    )


def _row(report: TransformReport, best: dict[str, float]) -> list[str]:
    cells = []
    for m in MEASURES:
        value = report.scores[m]
        text = f"{value:.4f}"
        cells.append(f"**{text}**" if abs(value - best[m]) < 1e-12 else text)
    return [
        report.label,
        *cells,
        _p(report),
        _ms(report.latency_p50_s),
        _ms(report.latency_p95_s),
        _tokens(report),
        _cost(report),
        str(report.fallbacks),
    ]


HEADERS = [
    "transform",
    *(LABELS[m] for m in MEASURES),
    "p vs none",
    "latency p50",
    "latency p95",
    "LLM tokens/query",
    "cost",
    "fallbacks",
]


def _best(result: EvalResult) -> dict[str, float]:
    return {m: max(r.scores[m] for r in result.reports) for m in MEASURES}


def rich_table(result: EvalResult) -> Table:
    table = Table(
        title=f"{result.dataset}: {result.queries} queries, {result.documents} documents",
        title_justify="left",
    )
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i == 0 else "right")
    best = _best(result)
    for report in result.reports:
        row = _row(report, best)
        table.add_row(
            *[
                c.replace("**", "") if not c.startswith("**") else f"[bold green]{c.strip('*')}[/]"
                for c in row
            ]
        )
    return table


def markdown(result: EvalResult, command: str | None = None) -> str:
    lines = []
    if command:
        lines += ["```bash", command, "```", ""]
    lines += [
        f"{result.dataset}: {result.queries} queries, {result.documents} documents. "
        "Best value per column in bold; p is a paired t-test of per-query nDCG@10 "
        "against `none` (* below 0.05). Latency is per query (transform + search, "
        f"{result.config.get('concurrency', '?')} queries in flight), measured on "
        "freshly generated transforms.",
        "",
    ]
    lines.append("| " + " | ".join(HEADERS) + " |")
    lines.append("| --- | " + " | ".join("---:" for _ in HEADERS[1:]) + " |")
    best = _best(result)
    for report in result.reports:
        lines.append("| " + " | ".join(_row(report, best)) + " |")
    lines.append("")
    config = ", ".join(f"{k}={v}" for k, v in result.config.items())
    lines.append(
        f"Config: {config}. Wall time {result.wall_seconds:.0f} s "
        f"(index {'cached' if result.index_cached else f'{result.index_seconds:.0f} s'})."
    )
    return "\n".join(lines) + "\n"


def bar_chart(result: EvalResult, path: Path) -> None:
    """nDCG@10 and Recall@100 per transform, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r.label for r in result.reports]
    ndcg = [r.scores["nDCG@10"] for r in result.reports]
    recall = [r.scores["R@100"] for r in result.reports]
    width = 0.38
    xs = range(len(labels))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(labels)), 4.2), dpi=120)
    bars1 = ax.bar([x - width / 2 for x in xs], ndcg, width, label="nDCG@10", color="#3b6ea8")
    bars2 = ax.bar([x + width / 2 for x in xs], recall, width, label="Recall@100", color="#9cc3e6")
    for bars in (bars1, bars2):
        ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=2)
    ax.set_xticks(list(xs), labels, rotation=20, ha="right")
    ax.set_ylim(0, 1.18)
    ax.set_ylabel("score")
    ax.set_title(f"{result.dataset}: retrieval quality per transform ({result.queries} queries)")
    ax.legend(loc="upper center", ncol=2, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_outputs(result: EvalResult, out: Path, command: str | None = None) -> list[Path]:
    """Write ``results.json``, ``results.md`` and ``results.png`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    payload = result.to_dict()
    if command:
        payload["command"] = command
    paths = [out / "results.json", out / "results.md", out / "results.png"]
    paths[0].write_text(json.dumps(payload, indent=2))
    paths[1].write_text(markdown(result, command))
    bar_chart(result, paths[2])
    return paths
