"""Does a transform help? BEIR loading, retrieval metrics, the runner and its report.

Needs the ``eval`` extra (ir-measures, matplotlib).
"""

from .beir import BeirDataset, BeirFormatError, load_beir
from .metrics import MEASURES, evaluate, paired_t_test, percentile
from .runner import EvalResult, TransformReport, parse_transform_spec, run_eval

__all__ = [
    "MEASURES",
    "BeirDataset",
    "BeirFormatError",
    "EvalResult",
    "TransformReport",
    "evaluate",
    "load_beir",
    "paired_t_test",
    "parse_transform_spec",
    "percentile",
    "run_eval",
]
