"""What defines a training run, as a checkpoint records it, and the checks that keep two runs apart.

A checkpoint's ``run`` metadata holds the fully resolved model (every step with its arguments, catalog
defaults filled in, and its channel bindings; the dims), the fully resolved recipe, the seed, engine,
dtype and every run-defining train setting, plus a SHA-256 of all of it. Resuming compares it with the
new invocation's and refuses on any difference, listing each one by key path
(``model.dims.top_k``, ``model.ops[2].args.aux_loss_coeff``, ``lr``...): continuing with another model,
optimizer, learning rate or teacher would silently splice two runs into one. Starting afresh where
checkpoints exist is refused unless ``overwrite`` says to replace them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from te_assembly.analysis.plan import Plan
from te_assembly.errors import ExistingRunError
from te_assembly.formats.checkpoint import CheckpointError, scan
from te_assembly.formats.model_record import model_record
from te_assembly.jobs.train.settings import ADDED_LATER, NOT_RECORDED, RESUMABLE, TrainSettings


def run_record(
    settings: TrainSettings,
    *,
    plan: Plan | str,
    seed: int,
    engine: str,
    kernels: str,
    dtype: torch.dtype,
    recipe: Mapping[str, Any] | None,
    data: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The settings that define the run, JSON-normalised (as they come back from a checkpoint).

    ``engine`` is the resolved engine (never ``auto``); ``kernels`` only shapes a TE engine's run and is
    recorded as None for the reference engine. ``recipe`` is the recipe config of the invocation,
    recorded whole (its prose ``description`` aside) whatever the engine: a resume that asks for another
    recipe is another run. ``data``: a language model's data (its settings, the hash of its sources and
    the tokenizer's fingerprint): a resume on other text or another tokenizer is another run."""
    skip = set(RESUMABLE) | set(NOT_RECORDED)
    te = engine == "te"
    record: dict[str, Any] = {
        "plan": plan.name if isinstance(plan, Plan) else plan,
        "seed": seed,
        "engine": engine,
        "kernels": kernels if te else None,
        "dtype": str(dtype).removeprefix("torch."),
        "recipe": {k: v for k, v in recipe.items() if k != "description"} if recipe else None,
    }
    if isinstance(plan, Plan):
        record["model"] = model_record(plan)
    for key, value in dataclasses.asdict(settings).items():
        if key in ADDED_LATER and value == ADDED_LATER[key]:
            continue  # as every run before the setting existed ran
        if key not in skip:
            record[key] = value
    if data is not None:
        record["data"] = dict(data)
    normalised: dict[str, Any] = json.loads(json.dumps(record, default=str))
    return normalised


NO_RECIPE_RECORD = {"kind": "none", "name": "none"}
"""What a run without a recipe records (``engines.target.NO_RECIPE``)."""


def record_sha256(record: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a run record: equal records, equal hashes."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


_MISSING = object()


def _flatten(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(key path, leaf) pairs: ``model.dims.top_k``, ``model.ops[2].args.top_k``; an empty mapping or
    list is a leaf of its own."""
    if isinstance(value, Mapping) and value:
        for key, child in value.items():
            yield from _flatten(child, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list) and value:
        for i, child in enumerate(value):
            yield from _flatten(child, f"{path}[{i}]")
    else:
        yield path, value


def run_differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``key: checkpoint X, now Y`` for every run-defining value that differs, in ``current``'s order;
    nested records (model, recipe) are compared leaf by leaf."""
    old, new = dict(_flatten(recorded, "")), dict(_flatten(current, ""))
    out = []
    for key in [*new, *(k for k in old if k not in new)]:
        before, after = old.get(key, _MISSING), new.get(key, _MISSING)
        if before != after or type(before) is not type(after):
            shown_old = "(not recorded)" if before is _MISSING else repr(before)
            shown_new = "(not set)" if after is _MISSING else repr(after)
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
    if meta.get("run_sha256") != record_sha256(recorded):
        raise CheckpointError(f"{path} is corrupt: its run record does not match the hash stored with it")
    if recorded.get("recipe") is None and current.get("recipe") == NO_RECIPE_RECORD:
        # Runs started from Python without a target recorded no recipe as null: the same run.
        current = {**current, "recipe": None}
    differences = run_differences(recorded, current)
    if not differences and record_sha256(recorded) != record_sha256(current):
        differences = ["(the run records differ in a way no key shows; their hashes differ)"]
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
    found = scan(out_dir)
    if not found:
        return
    readable = [f.step for f in found if f.step is not None]
    unreadable = [f for f in found if f.step is None]
    if readable:
        what = f"checkpoints up to step {max(readable)}"
        if unreadable:
            what += f" and {len(unreadable)} file(s) that cannot be read as checkpoints"
    else:
        problem = unreadable[0].problem
        what = f"{len(unreadable)} file(s) named like checkpoints that cannot be read ({problem})"
    raise ExistingRunError(
        f"{out_dir} already holds {what}; pass train.resume=true to continue or train.overwrite=true to "
        "start over"
    )
