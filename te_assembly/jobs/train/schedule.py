"""Optimizer and learning-rate schedule from the ``train:`` settings.

The learning rate is a pure function of the step (set on every param group before each update), so
a resumed run needs no scheduler state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from te_assembly.errors import ArgumentError
from te_assembly.jobs import optimizer as shared
from te_assembly.jobs.optimizer import NothingToStep, OptimizerSpec
from te_assembly.jobs.train.settings import TrainSettings


def optimizer_spec(s: TrainSettings) -> OptimizerSpec:
    return OptimizerSpec(s.optimizer, s.lr, s.weight_decay, s.momentum)


def make_optimizer(params: Iterable[torch.nn.Parameter], s: TrainSettings) -> torch.optim.Optimizer:
    """``train``'s optimizer (``jobs/optimizer.py``, the one ``bench`` steps with too); a model
    with nothing to train is refused before this (``check_can_train``)."""
    optimizer = shared.make_optimizer(params, optimizer_spec(s))
    if isinstance(optimizer, NothingToStep):
        raise ArgumentError("train has no trainable parameters to optimize")
    return optimizer


def lr_at(step: int, s: TrainSettings) -> float:
    """Learning rate of 1-based ``step``: linear warm-up to ``lr``, then constant or cosine decay to
    ``lr * min_lr_ratio`` at ``s.steps``."""
    if s.warmup_steps and step <= s.warmup_steps:
        return s.lr * step / s.warmup_steps
    if s.schedule == "constant":
        return s.lr
    span = max(1, s.steps - s.warmup_steps)
    progress = min(1.0, (step - s.warmup_steps) / span)
    floor = s.lr * s.min_lr_ratio
    return floor + (s.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
