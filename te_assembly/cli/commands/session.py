"""What the commands that build a model share: config sections, device, dtype, engine choice.

Kept apart from ``common`` because it imports torch, which ``validate`` must never do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from omegaconf import DictConfig
from rich.console import Console

from te_assembly.cli.commands.common import require_plan, section, setting
from te_assembly.config import LoadedConfig
from te_assembly.diagnostics import Diagnostic, error
from te_assembly.engines import resolve_engine
from te_assembly.errors import ConfigError, EngineUnavailableError
from te_assembly.plan import Plan

SEED_MAX = 2**63 - 1
"""Seeds feed ``torch.manual_seed`` and generators, which take a 64-bit integer."""

T = TypeVar("T")

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


def positive_int(cfg: DictConfig, key: str) -> int:
    value = setting(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError([error(key, "bad-run-value", f"{key} must be a positive integer, got {value!r}")])
    return value


def resolve_seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise ConfigError(
            [error("seed", "bad-seed", f"seed must be an integer in 0..2**63-1, got {value!r}")]
        )
    return value


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


class Checks:
    """Run each check, keep every config error, raise them together at the end."""

    def __init__(self) -> None:
        self.diagnostics: list[Diagnostic] = []

    def __call__(self, check: Callable[[], T]) -> T | None:
        try:
            return check()
        except ConfigError as exc:
            self.diagnostics.extend(exc.diagnostics)
            return None

    def raise_errors(self) -> None:
        if self.diagnostics:
            raise ConfigError(self.diagnostics)


def start(overrides: Sequence[str], console: Console) -> Session:
    """Compose, validate (exit 2 on errors), pick the engine and say which in one line."""
    loaded, plan = require_plan(overrides, console)
    cfg = loaded.cfg
    check = Checks()
    kernels = check(lambda: str(setting(cfg, "kernels")))
    engine_name = check(lambda: str(setting(cfg, "engine")))
    chosen = None
    if kernels is not None and engine_name is not None:
        chosen = check(lambda: resolve_engine(engine_name, kernels))
    device = check(lambda: resolve_device(str(setting(cfg, "device"))))
    dtype = check(lambda: resolve_dtype(str(setting(cfg, "dtype"))))
    seed = check(lambda: resolve_seed(setting(cfg, "seed")))
    check.raise_errors()
    assert chosen is not None and kernels is not None and device is not None
    assert dtype is not None and seed is not None
    engine, reason = chosen
    session = Session(loaded, plan, engine, kernels, device, dtype, seed)
    console.print(reason, markup=False)
    return session
