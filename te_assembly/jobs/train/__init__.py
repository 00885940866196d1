"""The ``train`` job's one home: ``job.py`` (the job: checks, directory, set-up), ``loop.py`` (one
optimizer step, the loop over steps, the run's files), ``resume.py``, ``run_dir.py`` (which
directory, which checkpoint, what an overwrite removes), ``lock.py``, ``run_record.py`` (what a resume
must match), ``metrics.py``, ``schedule.py`` (optimizer and learning rate), ``stopping.py`` (signals),
the tasks (``task.py``: the teacher; ``lm_task.py``: next-token prediction), ``result.py`` (what it
reports) and ``settings.py`` (the ``train:`` section, pure Python).

Names are resolved on first use, so ``settings`` imports without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from te_assembly.lazy import lazy_attributes

if TYPE_CHECKING:
    from te_assembly.jobs.train.job import check_can_train, train
    from te_assembly.jobs.train.result import Started, StepRecord, Stopped, TrainResult
    from te_assembly.jobs.train.run_dir import RunPlace
    from te_assembly.jobs.train.settings import TrainSettings

__getattr__ = lazy_attributes(
    __name__,
    {
        "train": "te_assembly.jobs.train.job",
        "check_can_train": "te_assembly.jobs.train.job",
        "Started": "te_assembly.jobs.train.result",
        "StepRecord": "te_assembly.jobs.train.result",
        "Stopped": "te_assembly.jobs.train.result",
        "TrainResult": "te_assembly.jobs.train.result",
        "RunPlace": "te_assembly.jobs.train.run_dir",
        "TrainSettings": "te_assembly.jobs.train.settings",
    },
)

__all__ = [
    "RunPlace",
    "Started",
    "StepRecord",
    "Stopped",
    "TrainResult",
    "TrainSettings",
    "check_can_train",
    "train",
]
