"""What defines a training run, as a checkpoint records it, and the checks that keep two runs apart.

A checkpoint's ``run`` metadata holds the model, seed, engine, dtype and every run-defining train
setting. Resuming compares it with the new invocation's and refuses on any difference: continuing
with another optimizer, learning rate or teacher would silently splice two runs into one loss curve.
Starting afresh where checkpoints exist is refused unless ``overwrite`` says to delete them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from te_assembly.train.checkpoint import CheckpointError, list_checkpoints
from te_assembly.train.settings import NOT_RECORDED, RESUMABLE, TrainSettings


class ExistingRunError(CheckpointError):
    """``out_dir`` holds checkpoints, and neither ``resume`` nor ``overwrite`` says what to do with them."""


def run_record(
    settings: TrainSettings,
    *,
    plan: str,
    seed: int,
    engine: str,
    kernels: str,
    dtype: torch.dtype,
    recipe: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The settings that define the run, JSON-normalised (as they come back from a checkpoint).

    ``engine`` is the resolved engine (never ``auto``). ``kernels`` and ``recipe`` only shape a TE
    engine's run, so they are recorded as None for the reference engine, which ignores them."""
    skip = set(RESUMABLE) | set(NOT_RECORDED)
    te = engine == "te"
    record: dict[str, Any] = {
        "plan": plan,
        "seed": seed,
        "engine": engine,
        "kernels": kernels if te else None,
        "dtype": str(dtype).removeprefix("torch."),
        # The description is prose; the fields are what the recipe does.
        "recipe": {k: v for k, v in recipe.items() if k != "description"} if te and recipe else None,
    }
    for key, value in dataclasses.asdict(settings).items():
        if key not in skip:
            record[key] = value
    normalised: dict[str, Any] = json.loads(json.dumps(record, default=str))
    return normalised


def run_differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``key: checkpoint X, now Y`` for every run-defining setting that differs, in ``current``'s order."""
    missing = object()
    out = []
    for key in [*current, *(k for k in recorded if k not in current)]:
        old, new = recorded.get(key, missing), current.get(key, missing)
        if old != new:
            shown_old = "(not recorded)" if old is missing else repr(old)
            shown_new = "(not set)" if new is missing else repr(new)
            out.append(f"{key}: checkpoint {shown_old}, now {shown_new}")
    return out


def check_resumable(path: Path, meta: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Raise ``CheckpointError`` listing every difference between the checkpoint's run and ``current``."""
    recorded = meta.get("run")
    if not isinstance(recorded, Mapping):
        raise CheckpointError(
            f"{path} does not record the settings of its run, so resuming cannot check they match: "
            "use another train.out_dir, or train.resume=false train.overwrite=true to start over"
        )
    differences = run_differences(recorded, current)
    if differences:
        listed = "\n".join(f"  {d}" for d in differences)
        raise CheckpointError(
            f"cannot resume from {path}: its run had other settings, and continuing would splice two runs:\n"
            f"{listed}\n"
            f"set them back, use another train.out_dir, or train.resume=false train.overwrite=true to "
            f"start over "
            f"(only {', '.join(f'train.{k}' for k in RESUMABLE)} may change on resume)"
        )


def check_fresh_start(out_dir: Path, settings: TrainSettings) -> None:
    """Refuse to start a new run over an earlier run's checkpoints unless ``overwrite`` is set."""
    if settings.resume or settings.overwrite:
        return
    existing = list_checkpoints(out_dir)
    if existing:
        raise ExistingRunError(
            f"{out_dir} already holds checkpoints up to step {existing[-1][0]}; pass train.resume=true "
            "to continue or train.overwrite=true to start over"
        )
