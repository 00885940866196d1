"""Which engine, device and dtype: ``engine=auto`` resolved, and the device and dtype a model can run
in here, checked before anything is built."""

from __future__ import annotations

import importlib.util

import torch

from te_assembly.analysis.settings import ENGINES, KERNELS
from te_assembly.diagnostics import did_you_mean, error
from te_assembly.errors import ArgumentError, ChoiceError, EngineUnavailableError


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
    asked = (("engine", "bad-engine", engine, ENGINES), ("kernels", "bad-kernels", kernels, KERNELS))
    problems = [
        error(
            key,
            code,
            f"unknown {key} {value!r}; choose one of {', '.join(choices)}",
            did_you_mean(value, choices),
        )
        for key, code, value, choices in asked
        if value not in choices
    ]
    if problems:
        raise ChoiceError(problems)
    if engine != "auto":
        return engine, f"engine={engine} (asked for)"
    has_te, has_gpu = te_available(), torch.cuda.is_available()
    if has_te and has_gpu:
        return "te", "engine=te: Transformer Engine and a CUDA GPU are present"
    absent = [m for m, ok in (("Transformer Engine", has_te), ("CUDA GPU", has_gpu)) if not ok]
    missing = " and no ".join(absent)
    return "reference", f"engine=reference: no {missing} here, using the pure-PyTorch reference engine"


FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


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


__all__ = ["FLOAT_DTYPES", "check_device", "check_dtype", "resolve_engine", "te_available"]
