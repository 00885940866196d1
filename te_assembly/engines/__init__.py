"""Engines: ``build(config, engine=...)`` turns a validated plan into an ``nn.Module``."""

from __future__ import annotations

import gc
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from te_assembly.diagnostics import did_you_mean, error
from te_assembly.engines.base import AssembledModel, ModelOutput
from te_assembly.errors import ArgumentError, ConfigError, EngineUnavailableError
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
    if not isinstance(config, (str, Path)) or (isinstance(config, str) and not config.strip()):
        raise ArgumentError(
            "expected a Plan, a model mapping, a shipped model name or a .yaml path; got "
            f"{config!r} ({type(config).__name__})"
        )
    if isinstance(config, Path) or config.endswith((".yaml", ".yml")):
        path = Path(config)
        if not path.is_file():
            what = "a directory" if path.is_dir() else "no such file"
            raise ArgumentError(f"cannot load model {path}: {what}")
        loaded = load_model_file(config)
    else:
        loaded = compose([f"model={config}"])
    diags, plan = analyze(loaded.model)
    diags = dedupe(sort_diagnostics([*loaded.diagnostics, *locate(diags, loaded.file, loaded.lines)]))
    if plan is None or has_errors(diags):
        raise ConfigError(diags)
    return plan


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
        raise EngineUnavailableError(f"device={dev} asked for, but no CUDA GPU is visible")
    return dev


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
    rank's slices of the weights a single process would draw with the same seed.

    Raises ``ArgumentError`` (a ``TypeError`` and ``ValueError``) for arguments of the wrong type or value,
    ``ConfigError`` for an invalid model, ``EngineUnavailableError`` when the engine cannot run here and
    ``ResourceError`` when the parameters would not fit in memory (estimated before allocating)."""
    plan = to_plan(config)
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
    enabled = gc.isenabled()
    gc.disable()
    try:
        if parallel is not None and parallel.is_parallel:
            from te_assembly.parallel.build import build_parallel

            model = build_parallel(
                plan, parallel, chosen, kernels=kernels, device=dev, dtype=dtype, recipe=recipe
            )
            model.local_input_checks()  # a rank's inputs hold its own rows and expert groups
            return model
        return _build(plan, chosen, kernels, dev, dtype, recipe)
    finally:
        if enabled:
            gc.enable()


def _build(
    plan: Plan,
    chosen: str,
    kernels: str,
    dev: torch.device,
    dtype: torch.dtype,
    recipe: Mapping[str, Any] | None,
) -> AssembledModel:
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
