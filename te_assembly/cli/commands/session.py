"""What the commands that build a model share: config sections, device, dtype, engine choice.

Kept apart from ``common`` because it imports torch, which ``validate`` must never do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig
from rich.console import Console

from te_assembly.cli.commands.common import require_plan, section
from te_assembly.config import LoadedConfig
from te_assembly.diagnostics import error
from te_assembly.engines import resolve_engine
from te_assembly.errors import ConfigError, EngineUnavailableError
from te_assembly.plan import Plan

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
}


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when a GPU is visible, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(
            [error("device", "bad-device", f"unknown device {name!r}", "use auto, cpu or cuda")]
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise EngineUnavailableError(f"device={name} but no CUDA GPU is visible (use device=auto or cpu)")
    return device


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ConfigError(
            [error("dtype", "bad-dtype", f"unknown dtype {name!r}", f"use one of {', '.join(DTYPES)}")]
        )
    return DTYPES[name]


@dataclass(frozen=True)
class Session:
    """A validated plan plus the resolved run settings every model-building command needs."""

    loaded: LoadedConfig
    plan: Plan
    engine: str
    kernels: str
    device: torch.device
    dtype: torch.dtype
    seed: int

    @property
    def cfg(self) -> DictConfig:
        return self.loaded.cfg

    @property
    def recipe(self) -> dict[str, Any]:
        return section(self.cfg, "recipe") or {"kind": "none", "name": "bf16"}

    @property
    def engine_recipe(self) -> dict[str, Any] | None:
        """The recipe to hand to ``build``: the TE engine runs its forwards under its ``te.autocast``;
        the reference engine has none."""
        return self.recipe if self.engine == "te" else None


def start(overrides: Sequence[str], console: Console) -> Session:
    """Compose, validate (exit 2 on errors), pick the engine and say which in one line."""
    loaded, plan = require_plan(overrides, console)
    cfg = loaded.cfg
    kernels = str(cfg.kernels)
    engine, reason = resolve_engine(str(cfg.engine), kernels)
    session = Session(
        loaded,
        plan,
        engine,
        kernels,
        resolve_device(str(cfg.device)),
        resolve_dtype(str(cfg.dtype)),
        int(cfg.seed),
    )
    console.print(reason, markup=False)
    return session
