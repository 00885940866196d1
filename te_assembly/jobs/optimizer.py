"""The optimizer ``train`` steps with and ``bench`` times: one spec, one constructor, so a benchmarked
step is a trained step."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class OptimizerSpec:
    """The optimizer of ``train`` and of ``bench``'s full-step phase. ``bench`` names only ``optimizer``
    and ``lr``; the rest are ``train``'s defaults, so a benchmarked step is a trained step."""

    name: str = "adamw"
    lr: float = 3e-3
    weight_decay: float = 0.0
    """Decoupled weight decay (adamw) or L2 (sgd)."""
    momentum: float = 0.9
    """sgd only."""


class NothingToStep:
    """The optimizer of a model without parameters: ``step`` has nothing to update (torch's optimizers
    refuse an empty parameter list)."""

    param_groups: list[dict[str, Any]] = []

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def step(self) -> None:
        pass


def make_optimizer(
    params: Iterable[torch.nn.Parameter], spec: OptimizerSpec
) -> torch.optim.Optimizer | NothingToStep:
    """The optimizer over the trainable ``params``; ``ValueError`` for a name there is none of."""
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        return NothingToStep()
    if spec.name == "adamw":
        return torch.optim.AdamW(trainable, lr=spec.lr, weight_decay=spec.weight_decay)
    if spec.name == "sgd":
        return torch.optim.SGD(trainable, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)
    raise ValueError(f"unknown optimizer {spec.name!r} (adamw | sgd)")


__all__ = ["NothingToStep", "OptimizerSpec", "make_optimizer"]
