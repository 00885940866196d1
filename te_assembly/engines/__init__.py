"""Engines: ``build(config, engine=...)`` turns a validated plan into an ``nn.Module``."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from te_assembly.diagnostics import did_you_mean, error
from te_assembly.engines.base import AssembledModel, ModelOutput
from te_assembly.errors import ConfigError, EngineUnavailableError
from te_assembly.plan import Plan
from te_assembly.settings import ENGINES, KERNELS

if TYPE_CHECKING:
    from te_assembly.parallel.context import ParallelContext
    from te_assembly.validate.analysis import Analysis


def te_available() -> bool:
    """TE's PyTorch extension imports (it needs ``import torch`` first for libnccl)."""
    if importlib.util.find_spec("transformer_engine") is None:
        return False
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:
        return False
    return True


def resolve_engine(engine: str, kernels: str = "te") -> tuple[str, str]:
    """The engine to use and a one-line reason, for ``engine=auto``."""
    problems = [
        error(
            key,
            f"bad-{key}",
            f"unknown {key} {value!r}; choose one of {', '.join(choices)}",
            did_you_mean(value, choices),
        )
        for key, value, choices in (("engine", engine, ENGINES), ("kernels", kernels, KERNELS))
        if value not in choices
    ]
    if problems:
        raise ConfigError(problems)
    if engine != "auto":
        return engine, f"engine={engine} (asked for)"
    has_te, has_gpu = te_available(), torch.cuda.is_available()
    if has_te and has_gpu:
        return "te", "engine=te: Transformer Engine and a CUDA GPU are present"
    absent = [m for m, ok in (("Transformer Engine", has_te), ("CUDA GPU", has_gpu)) if not ok]
    missing = " and no ".join(absent)
    return "reference", f"engine=reference: no {missing} here, using the pure-PyTorch reference engine"


def build(
    config: Plan | Analysis | Mapping[str, Any] | str | os.PathLike[str],
    engine: str = "auto",
    *,
    overrides: Sequence[str] = (),
    config_dirs: Sequence[str | os.PathLike[str]] = (),
    kernels: str = "te",
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    recipe: Mapping[str, Any] | None = None,
    parallel: ParallelContext | None = None,
) -> AssembledModel:
    """Build a model. ``config``: a plan, an analysis (``te_assembly.load``), a model mapping, a model
    name (shipped or in ``config_dirs``) or a model file; names, files and mappings go through
    ``te_assembly.load`` with ``overrides`` (``ConfigError`` with every diagnostic if anything is wrong).
    ``engine``: ``reference`` (pure PyTorch, any machine), ``te`` (Transformer Engine fusers, locked at
    build time) or ``auto``. ``kernels=reference`` with ``engine=te`` runs our reference math inside TE's
    real ``OperationFuser``. ``recipe``: the TE engine's quantization recipe (a recipe config, see
    recipes.py; default: the config's own ``recipe``); the reference engine computes in ``dtype``.
    ``parallel``: this rank's part of a parallel layout (``te_assembly.parallel``): the model holds this
    rank's slices of the weights a single process would draw with the same seed."""
    if isinstance(config, Plan):
        plan, config_recipe = config, None
    elif config is None:
        raise TypeError("build() needs a config: a model name, a path, a mapping, an analysis or a plan")
    else:
        from te_assembly.pipeline import load

        analysis = load(config, overrides, config_dirs=config_dirs)
        plan, config_recipe = analysis.checked_plan(), analysis.recipe
    chosen, _ = resolve_engine(engine, kernels)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    split = parallel if parallel is not None and parallel.is_parallel else None
    if chosen == "reference":
        if split is not None:
            from te_assembly.parallel.build import build_parallel

            return build_parallel(plan, split, chosen, kernels=kernels, device=dev, dtype=dtype)
        from te_assembly.engines.reference import build_reference

        return build_reference(plan, device=dev, dtype=dtype)
    if not te_available():
        raise EngineUnavailableError(
            "engine=te needs Transformer Engine: pip install 'te_assembly[te]' "
            "(on a machine without a GPU: scripts/install_te_cpu.sh)"
        )
    from te_assembly.engines.te import build_te
    from te_assembly.recipes import checked_recipe

    te_recipe = checked_recipe(recipe) if recipe is not None else config_recipe  # validated once, here
    if split is not None:
        from te_assembly.parallel.build import build_parallel

        return build_parallel(plan, split, chosen, kernels=kernels, device=dev, dtype=dtype, recipe=te_recipe)
    return build_te(plan, kernels=kernels, device=dev, dtype=dtype, recipe=te_recipe)


__all__ = ["AssembledModel", "ModelOutput", "build", "resolve_engine", "te_available"]
