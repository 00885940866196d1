"""Short training runs on a synthetic teacher task: ``train(plan, TrainSettings(...))``.

Names are imported on first use, so ``te_assembly.train.settings`` imports without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from te_assembly.lazy import lazy_attributes

if TYPE_CHECKING:
    from te_assembly.train.checkpoint import CheckpointError
    from te_assembly.train.loop import StepRecord, TrainResult, train
    from te_assembly.train.run_record import ExistingRunError
    from te_assembly.train.settings import TrainSettings

_LAZY = {
    "CheckpointError": "te_assembly.train.checkpoint",
    "StepRecord": "te_assembly.train.loop",
    "TrainResult": "te_assembly.train.loop",
    "train": "te_assembly.train.loop",
    "ExistingRunError": "te_assembly.train.run_record",
    "TrainSettings": "te_assembly.train.settings",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = ["CheckpointError", "ExistingRunError", "StepRecord", "TrainResult", "TrainSettings", "train"]
