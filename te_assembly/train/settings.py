"""The ``train:`` config block as a checked dataclass. Bad values become diagnostics, not tracebacks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from te_assembly.diagnostics import error
from te_assembly.errors import ConfigError
from te_assembly.sections import read_section

OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("constant", "cosine")
NAN_TARGETS = ("loss", "grad")


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 200
    batch_tokens: int = 256
    optimizer: str = "adamw"
    lr: float = 3e-3
    weight_decay: float = 0.0
    momentum: float = 0.9
    schedule: str = "cosine"
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    teacher_seed_offset: int = 1
    out_dir: str = "train_out"
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    resume: bool = False
    """Continue from the last checkpoint in ``out_dir``; refused if the run's settings differ
    (``run_record``)."""
    overwrite: bool = False
    """Start over when ``out_dir`` holds checkpoints of an earlier run (deleted once the new run has
    written its first checkpoint); without it such a directory is refused, so forgetting ``resume``
    never loses a run."""
    resume_from: str | None = None
    """With ``resume``: this checkpoint of ``out_dir`` instead of the newest (e.g. the newest good one
    when the newest is corrupt; ``train`` names it)."""
    plot: bool = True
    stop_after: int | None = None
    """Stop (with a checkpoint) after this step, as if interrupted; the schedule still spans ``steps``."""
    inject_nan_at_step: int | None = None
    inject_nan_into: str = "loss"

    def __post_init__(self) -> None:
        if self.resume_from and not self.resume:
            raise ConfigError(
                [
                    error(
                        "train.resume_from",
                        "bad-train-value",
                        "train.resume_from names a checkpoint to resume from: set train.resume=true too",
                    )
                ]
            )
        if self.resume and self.overwrite:
            raise ConfigError(
                [
                    error(
                        "train.overwrite",
                        "bad-train-value",
                        "train.resume and train.overwrite are both true: resume continues the run in "
                        "out_dir, overwrite deletes it; set only one",
                    )
                ]
            )

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], prefix: str = "train") -> TrainSettings:
        """Check every key at once; raise ``ConfigError`` listing all problems."""
        return read_section(cls, raw, prefix, lambda key, value: _check(key, value, getattr(cls, key, None)))


RESUMABLE = ("steps", "stop_after", "checkpoint_every", "keep_checkpoints", "plot")
"""Settings a resumed run may change (a changed ``steps`` reshapes the cosine schedule: noted)."""
NOT_RECORDED = ("out_dir", "resume", "overwrite", "resume_from", "inject_nan_at_step", "inject_nan_into")
"""Where and how this invocation runs, not what the run is. Every other setting defines the run: a
checkpoint records them and a resume must match (a new setting is run-defining unless listed)."""

_CHOICES = {"optimizer": OPTIMIZERS, "schedule": SCHEDULES, "inject_nan_into": NAN_TARGETS}
_POSITIVE = ("steps", "batch_tokens", "keep_checkpoints")
_OPTIONAL_STEP = ("stop_after", "inject_nan_at_step")
# The teacher is seeded with seed + offset; seeds are < 2**63 and torch takes seeds below 2**64.
_MAX = {"teacher_seed_offset": 2**63}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(key: str, value: Any, default: Any) -> str | None:
    if key == "resume_from":
        ok = value is None or (isinstance(value, str) and value.strip())
        return None if ok else f"resume_from must be null or a checkpoint path, got {value!r}"
    if key in _CHOICES:
        return (
            None
            if value in _CHOICES[key]
            else f"{key} must be one of {', '.join(_CHOICES[key])}, got {value!r}"
        )
    if key in _OPTIONAL_STEP:
        return (
            None if value is None or (_is_int(value) and value >= 1) else f"{key} must be null or a step >= 1"
        )
    if key in _POSITIVE:
        return None if _is_int(value) and value >= 1 else f"{key} must be a positive integer, got {value!r}"
    if isinstance(default, bool):
        return None if isinstance(value, bool) else f"{key} must be true or false, got {value!r}"
    if _is_int(default):
        top = _MAX.get(key)
        if _is_int(value) and value >= 0 and (top is None or value <= top):
            return None
        bound = f" at most {top}" if top is not None else ""
        return f"{key} must be a non-negative integer{bound}, got {value!r}"
    if isinstance(default, float):
        ok = (_is_int(value) or isinstance(value, float)) and value >= 0
        return None if ok else f"{key} must be a non-negative number, got {value!r}"
    if isinstance(default, str):
        return (
            None if isinstance(value, str) and value else f"{key} must be a non-empty string, got {value!r}"
        )
    return None
