"""``taskdata eval``: join an inference job's predictions to their targets by stable id, postprocess, score."""

from taskdata.evaluation.predictions import (
    EvaluationError,
    MissingPredictionsError,
    Prediction,
    PredictionFileError,
    expand_prediction_paths,
    read_predictions,
)
from taskdata.evaluation.report import EvalReport, TaskReport, format_report, write_report
from taskdata.evaluation.score import evaluate
from taskdata.evaluation.targets import CacheTargets, SourceTargets, TargetsSource, resolve_version_dir

__all__ = [
    "CacheTargets",
    "EvalReport",
    "EvaluationError",
    "MissingPredictionsError",
    "Prediction",
    "PredictionFileError",
    "SourceTargets",
    "TargetsSource",
    "TaskReport",
    "evaluate",
    "expand_prediction_paths",
    "format_report",
    "read_predictions",
    "resolve_version_dir",
    "write_report",
]
