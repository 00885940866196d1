"""Engines: ``build(config, engine=...)`` turns a validated plan into an ``nn.Module``."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from te_assembly.analysis.plan import Plan
from te_assembly.analysis.settings import ENGINES, KERNELS
from te_assembly.collector import paused
from te_assembly.diagnostics import did_you_mean, error
from te_assembly.engines.base import AssembledModel, ModelOutput
from te_assembly.errors import ArgumentError, ConfigError, EngineUnavailableError

if TYPE_CHECKING:
    from te_assembly.analysis.analyze import Analysis
    from te_assembly.engines.parallel.context import ParallelContext


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


FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        hint = did_you_mean(value, choices) if isinstance(value, str) else None
        raise ArgumentError(
            f"unknown {name} {value!r}; choose one of {', '.join(choices)}" + (f" ({hint})" if hint else "")
        )
    return value


def check_dtype(dtype: object) -> torch.dtype:
    """``dtype`` if it is a floating-point dtype a model can compute in, else ``ArgumentError``."""
    if not isinstance(dtype, torch.dtype) or dtype not in FLOAT_DTYPES:
        shown = ", ".join(str(d) for d in FLOAT_DTYPES)
        raise ArgumentError(f"dtype must be a floating-point torch.dtype ({shown}); got {dtype!r}")
    return dtype


def check_device(device: object) -> torch.device:
    """``device`` as a ``torch.device`` on which models run here (cpu, or cuda when a GPU is visible)."""
    if device is None:
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device, int)) or isinstance(device, bool):
        raise ArgumentError(f"device must be a str or torch.device such as 'cpu' or 'cuda'; got {device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ArgumentError(f"unknown device {device!r}; use 'cpu' or 'cuda'") from None
    if dev.type not in ("cpu", "cuda"):
        raise ArgumentError(f"device {str(dev)!r} is not supported: te_assembly runs on 'cpu' or 'cuda'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EngineUnavailableError(
            f"device={dev} asked for, but no CUDA GPU is visible (use cpu, or device=auto in a config)"
        )
    return dev


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
    ``parallel``: this rank's part of a parallel layout (``engines/parallel/``): the model holds this
    rank's slices of the weights a single process would draw with the same seed.

    Raises ``ArgumentError`` (a ``TypeError`` and ``ValueError``) for arguments of the wrong type or value,
    ``ConfigError`` for an invalid model, ``EngineUnavailableError`` when the engine cannot run here and
    ``ResourceError`` when the parameters would not fit in memory (estimated before allocating)."""
    if isinstance(config, Plan):
        plan, config_recipe = config, None
    else:
        from te_assembly.analysis.pipeline import CONFIG_KINDS, check_config_argument, load

        if config is None:  # load(None) means the default model; build() wants one named
            raise ArgumentError(f"build() expected {CONFIG_KINDS}; got None")
        check_config_argument(config, "build()")
        analysis = load(config, overrides, config_dirs=config_dirs)
        plan, config_recipe = analysis.checked_plan(), analysis.recipe
    engine = _check_choice("engine", engine, ENGINES)
    kernels = _check_choice("kernels", kernels, KERNELS)
    dtype = check_dtype(dtype)
    if recipe is not None and not isinstance(recipe, Mapping):
        raise ArgumentError(
            f"recipe must be a mapping (a recipe config) or None; got {type(recipe).__name__}"
        )
    chosen, _ = resolve_engine(engine, kernels)
    dev = check_device(device)
    from te_assembly.engines.memory import check_fits, estimate

    # Estimated for the whole model: a rank of a parallel layout holds less (the check errs safe).
    check_fits(
        estimate(plan, dtype), dev, f"building {plan.name}", "make the model smaller (model.dims, widths)"
    )
    # A build allocates many small, acyclic module objects; the cyclic collector's full passes over
    # them made builds of 10k-op models grow quadratically (TE's own construction does the same).
    with paused():
        return _build(plan, chosen, kernels, dev, dtype, recipe, config_recipe, parallel)


def _build(
    plan: Plan,
    chosen: str,
    kernels: str,
    dev: torch.device,
    dtype: torch.dtype,
    recipe: Mapping[str, Any] | None,
    config_recipe: Mapping[str, Any] | None,
    parallel: ParallelContext | None,
) -> AssembledModel:
    split = parallel if parallel is not None and parallel.is_parallel else None
    if chosen == "reference":
        if split is not None:
            return _parallel(plan, split, chosen, kernels, dev, dtype, None)
        from te_assembly.engines.reference.model import build_reference

        return build_reference(plan, device=dev, dtype=dtype)
    if not te_available():
        raise EngineUnavailableError(
            "engine=te needs Transformer Engine: pip install 'te_assembly[te]' "
            "(on a machine without a GPU: scripts/install_te_cpu.sh)"
        )
    from te_assembly.analysis.recipes import checked_recipe
    from te_assembly.engines.te import build_te

    te_recipe = checked_recipe(recipe) if recipe is not None else config_recipe  # validated once, here
    if split is not None:
        return _parallel(plan, split, chosen, kernels, dev, dtype, te_recipe)
    return build_te(plan, kernels=kernels, device=dev, dtype=dtype, recipe=te_recipe)


def _parallel(
    plan: Plan,
    parallel: ParallelContext,
    chosen: str,
    kernels: str,
    dev: torch.device,
    dtype: torch.dtype,
    recipe: Mapping[str, Any] | None,
) -> AssembledModel:
    from te_assembly.engines.parallel.build import build_parallel

    model = build_parallel(plan, parallel, chosen, kernels=kernels, device=dev, dtype=dtype, recipe=recipe)
    model.local_input_checks()  # a rank's inputs hold its own rows and expert groups
    return model


__all__ = [
    "AssembledModel",
    "ModelOutput",
    "build",
    "check_device",
    "check_dtype",
    "resolve_engine",
    "te_available",
]
