"""Short training runs on a synthetic teacher task: ``train(plan, TrainSettings(...))``.

Names are imported on first use, so ``te_assembly.train.settings`` imports without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    # Lazy, so that ``te_assembly.train.settings`` imports without torch: ``validate`` checks the section.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CheckpointError", "ExistingRunError", "StepRecord", "TrainResult", "TrainSettings", "train"]
