"""Does a transform help? BEIR loading, retrieval metrics, the runner and its report.

Needs the ``eval`` extra (ir-measures, matplotlib).
"""

from .beir import BeirDataset, BeirFormatError, load_beir
from .metrics import MEASURES, evaluate, paired_t_test, percentile
from .results import EvalResult, TransformReport
from .runner import run_eval
from .specs import parse_transform_spec

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
