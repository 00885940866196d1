"""Short training runs on a synthetic teacher task: ``train(plan, TrainSettings(...))``."""

from __future__ import annotations

from te_assembly.train.checkpoint import CheckpointError
from te_assembly.train.loop import StepRecord, TrainResult, train
from te_assembly.train.run_record import ExistingRunError
from te_assembly.train.settings import TrainSettings

__all__ = ["CheckpointError", "ExistingRunError", "StepRecord", "TrainResult", "TrainSettings", "train"]
