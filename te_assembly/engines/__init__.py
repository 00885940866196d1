"""Engines: ``build(config, target)`` turns a validated plan into an ``nn.Module`` on a ``Target``."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from te_assembly.analysis.plan import Plan
from te_assembly.engines.base import AssembledModel, ModelOutput
from te_assembly.engines.choice import check_device, check_dtype, resolve_engine, te_available
from te_assembly.engines.target import NO_RECIPE, Target, as_target
from te_assembly.errors import ArgumentError

if TYPE_CHECKING:
    from te_assembly.analysis.analyze import Analysis


def build(
    config: Plan | Analysis | Mapping[str, Any] | str | os.PathLike[str],
    target: Target | str = "auto",
    *,
    overrides: Sequence[str] = (),
    config_dirs: Sequence[str | os.PathLike[str]] = (),
) -> AssembledModel:
    """Build a model. ``config``: a plan, an analysis (``te_assembly.load``), a model mapping, a model
    name (shipped or in ``config_dirs``) or a model file; names, files and mappings go through
    ``te_assembly.load`` with ``overrides`` (``ConfigError`` with every diagnostic if anything is wrong).
    ``target``: where and how (``Target.of(engine, kernels=..., device=..., dtype=..., recipe=...)``), or
    just an engine name: ``reference`` (pure PyTorch, any machine), ``te`` (Transformer Engine fusers,
    locked at build time) or ``auto``. ``kernels=reference`` with ``engine=te`` runs our reference math
    inside TE's real ``OperationFuser``. A target without a recipe builds a config's own ``recipe``.
    ``target.parallel``: this rank's part of a parallel layout (``engines/parallel/``): the model holds
    this rank's slices of the weights a single process would draw. The weights come from torch's global
    generator as it stands (``target.seed`` is for jobs).

    Raises ``ArgumentError`` (a ``TypeError`` and ``ValueError``) for arguments of the wrong type or value,
    ``ConfigError`` for an invalid model, ``EngineUnavailableError`` when the engine cannot run here and
    ``ResourceError`` when the parameters would not fit in memory (estimated before allocating)."""
    target = as_target(target)
    if isinstance(config, Plan):
        plan, config_recipe = config, None
    else:
        from te_assembly.analysis.pipeline import CONFIG_KINDS, check_config_argument, load

        if config is None:  # load(None) means the default model; build() wants one named
            raise ArgumentError(f"build() expected {CONFIG_KINDS}; got None")
        check_config_argument(config, "build()")
        analysis = load(config, overrides, config_dirs=config_dirs)
        plan, config_recipe = analysis.checked_plan(), analysis.recipe
    if target.recipe is NO_RECIPE and config_recipe is not None:
        from te_assembly.analysis.recipes import checked_recipe

        target = dataclasses.replace(target, recipe=checked_recipe(config_recipe))  # validated once, here
    # The weights alone (a job checks everything it holds itself, then calls target.build).
    target.check_fits(plan, f"building {plan.name}", "make the model smaller (model.dims, widths)")
    return target.build(plan)


__all__ = [
    "AssembledModel",
    "ModelOutput",
    "Target",
    "build",
    "check_device",
    "check_dtype",
    "resolve_engine",
    "te_available",
]
