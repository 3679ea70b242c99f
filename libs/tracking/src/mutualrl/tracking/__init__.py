"""Experiment tracking: the learner's metrics records sent to TensorBoard, MLflow and Weights & Biases
beside ``metrics.jsonl``, without ever slowing or stopping training (docs/tracking.md)."""

from mutualrl.tracking.backend import Backend, RunInfo
from mutualrl.tracking.tracker import DropCounter, Tracker, WarnOnce, missing, open_tracker

__all__ = ["Backend", "DropCounter", "RunInfo", "Tracker", "WarnOnce", "missing", "open_tracker"]
