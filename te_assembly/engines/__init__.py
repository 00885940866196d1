"""Engines: ``build(config, engine=...)`` turns a validated plan into an ``nn.Module``."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from te_assembly.diagnostics import did_you_mean, error
from te_assembly.engines.base import AssembledModel, ModelOutput
from te_assembly.errors import ConfigError, EngineUnavailableError
from te_assembly.plan import Plan

if TYPE_CHECKING:
    from te_assembly.parallel.context import ParallelContext

ENGINES = ("auto", "reference", "te")
KERNELS = ("te", "reference")


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


def to_plan(config: Plan | Mapping[str, Any] | str | Path) -> Plan:
    """Accept a plan, a model mapping (the ``model`` node, or a whole config holding one; interpolations
    resolved or not), a shipped model name, or a YAML file path."""
    from te_assembly.config import compose, load_model_file, locate
    from te_assembly.diagnostics import dedupe, has_errors, sort_diagnostics
    from te_assembly.validate import analyze, plan_or_raise

    if isinstance(config, Plan):
        return config
    if isinstance(config, Mapping):
        model = config["model"] if isinstance(config.get("model"), Mapping) else config
        return plan_or_raise(model)
    if isinstance(config, Path) or config.endswith((".yaml", ".yml")):
        loaded = load_model_file(config)
    else:
        loaded = compose([f"model={config}"])
    diags, plan = analyze(loaded.model)
    diags = dedupe(sort_diagnostics([*loaded.diagnostics, *locate(diags, loaded.file, loaded.lines)]))
    if plan is None or has_errors(diags):
        raise ConfigError(diags)
    return plan


def build(
    config: Plan | Mapping[str, Any] | str | Path,
    engine: str = "auto",
    *,
    kernels: str = "te",
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    recipe: Mapping[str, Any] | None = None,
    parallel: ParallelContext | None = None,
) -> AssembledModel:
    """Build a model. ``engine``: ``reference`` (pure PyTorch, any machine), ``te`` (Transformer
    Engine fusers, locked at build time) or ``auto``. ``kernels=reference`` with ``engine=te`` runs our
    reference math inside TE's real ``OperationFuser``. ``recipe`` (a recipe config, see recipes.py) is
    the TE engine's quantization recipe; the reference engine computes in ``dtype`` and ignores it.
    ``parallel``: this rank's part of a parallel layout (``te_assembly.parallel``): the model holds this
    rank's slices of the weights a single process would draw with the same seed."""
    plan = to_plan(config)
    chosen, _ = resolve_engine(engine, kernels)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if parallel is not None and parallel.is_parallel:
        from te_assembly.parallel.build import build_parallel

        return build_parallel(plan, parallel, chosen, kernels=kernels, device=dev, dtype=dtype, recipe=recipe)
    if chosen == "reference":
        from te_assembly.engines.reference import build_reference

        return build_reference(plan, device=dev, dtype=dtype)
    if not te_available():
        raise EngineUnavailableError(
            "engine=te needs Transformer Engine: pip install 'te_assembly[te]' "
            "(on a machine without a GPU: scripts/install_te_cpu.sh)"
        )
    from te_assembly.engines.te import build_te

    return build_te(plan, kernels=kernels, device=dev, dtype=dtype, recipe=recipe)


__all__ = ["AssembledModel", "ModelOutput", "build", "resolve_engine", "te_available", "to_plan"]
