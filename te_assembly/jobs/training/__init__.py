"""Short training runs on a synthetic teacher task: ``train(plan, TrainSettings(...))``.

Names are imported on first use, so ``te_assembly.jobs.training.settings`` imports without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from te_assembly.lazy import lazy_attributes

if TYPE_CHECKING:
    from te_assembly.jobs.train import StepRecord, TrainResult, train
    from te_assembly.jobs.training.checkpoint import CheckpointError
    from te_assembly.jobs.training.run_record import ExistingRunError
    from te_assembly.jobs.training.settings import TrainSettings

_LAZY = {
    "CheckpointError": "te_assembly.jobs.training.checkpoint",
    "StepRecord": "te_assembly.jobs.train",
    "TrainResult": "te_assembly.jobs.train",
    "train": "te_assembly.jobs.train",
    "ExistingRunError": "te_assembly.jobs.training.run_record",
    "TrainSettings": "te_assembly.jobs.training.settings",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = ["CheckpointError", "ExistingRunError", "StepRecord", "TrainResult", "TrainSettings", "train"]
