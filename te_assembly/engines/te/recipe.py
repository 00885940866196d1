"""A checked recipe (``analysis/recipes.py``) as the TE engine uses it: TE's recipe dataclass, and the
hardware each kind needs, checked before the first forward so a run fails with a clear message.

Imports TE only when a recipe object is made (``to_te_recipe``) and torch only to read the current GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from te_assembly.analysis.recipes import META_KEYS, NO_QUANTIZATION, RECIPE_SCHEMA, checked_recipe
from te_assembly.diagnostics import error
from te_assembly.errors import ConfigError, EngineUnavailableError, UnsupportedRecipeError


def _kind_of(cfg: Mapping[str, Any]) -> str:
    """The recipe's kind; a plain mapping is validated first (raises ``ConfigError``)."""
    return checked_recipe(cfg).kind


def _te_recipe_module() -> Any:
    try:
        # TE's core library loads its CUDA dependencies through torch, so torch goes first.
        import torch  # noqa: F401
        import transformer_engine.common.recipe as te_recipe
    except (ImportError, OSError) as exc:
        raise EngineUnavailableError(f"cannot import transformer_engine: {exc}") from exc
    return te_recipe


def to_te_recipe(cfg: Mapping[str, Any]) -> object | None:
    """The TE recipe dataclass for ``cfg``, or None for ``kind: none`` (plain BF16)."""
    kind = _kind_of(cfg)
    if kind == NO_QUANTIZATION:
        return None
    te_recipe = _te_recipe_module()
    schema = RECIPE_SCHEMA[kind]
    kwargs = {}
    for key, value in cfg.items():
        if key in META_KEYS:
            continue
        enum_name = schema[key].enum
        kwargs[key] = getattr(getattr(te_recipe, enum_name), value) if enum_name else value
    try:
        return getattr(te_recipe, kind)(**kwargs)
    except (AssertionError, ValueError, TypeError) as exc:
        # Our schema should catch these first; if TE still refuses, report it as a config error.
        diag = error("recipe", "te-rejected", f"TE rejected the {kind} recipe: {exc}")
        raise ConfigError([diag], summary="invalid quantization recipe") from exc


# ----------------------------------------------------------------------------------------------------
# Hardware


class _HardwareRule(NamedTuple):
    min_capability: tuple[int, int]
    below_capability: tuple[int, int] | None
    """Exclusive upper bound on the compute capability, or None."""
    needs: str
    min_cuda: tuple[int, int] | None = None
    cuda_applies_below: tuple[int, int] | None = None
    """The CUDA floor only applies to GPUs under this capability (None: to all)."""


# _compute_fp8_support: >= 9.0 always; 8.9 (Ada) also needs CUDA >= 12.1 (and cuBLASLt >= 12.1.3,
# which only TE's extension can query, so TE itself still reports that one).
_FP8_RULE = _HardwareRule((8, 9), None, "compute capability 8.9 or newer (Ada/Hopper)", (12, 1), (9, 0))

_HARDWARE_RULES: dict[str, _HardwareRule] = {
    "DelayedScaling": _FP8_RULE,
    "Float8CurrentScaling": _FP8_RULE,
    # _compute_mxfp8_support: >= 10.0, and refused on >= 12.0 ("not supported on 12.0+ yet").
    "MXFP8BlockScaling": _HardwareRule((10, 0), (12, 0), "compute capability 10.x or 11.x (Blackwell)"),
    # _compute_nvfp4_support: >= 10.0.
    "NVFP4BlockScaling": _HardwareRule((10, 0), None, "compute capability 10.0 or newer (Blackwell)"),
    # _compute_fp8_block_scaling_support: >= 9.0 and float(torch.version.cuda) >= 12.9.
    "Float8BlockScaling": _HardwareRule((9, 0), None, "compute capability 9.0 or newer (Hopper)", (12, 9)),
}
"""Hardware each kind needs, from ``transformer_engine/pytorch/quantization.py`` (TE 2.20, the
``_compute_*_support`` helpers behind ``check_fp8_support``, ``check_mxfp8_support``,
``check_nvfp4_support`` and ``check_fp8_block_scaling_support``). Checking it ourselves lets a run fail
before the forward with a clear message; TE's own ``check_recipe_support`` does not cover NVFP4."""

_SHORT_NAMES = {
    "DelayedScaling": "FP8 delayed scaling",
    "Float8CurrentScaling": "FP8 current scaling",
    "MXFP8BlockScaling": "MXFP8",
    "NVFP4BlockScaling": "NVFP4",
    "Float8BlockScaling": "FP8 block scaling",
}


def required_capability(cfg: Mapping[str, Any]) -> tuple[tuple[int, int], str] | None:
    """Minimum compute capability (major, minor) and a description, or None when anything will do."""
    kind = _kind_of(cfg)
    rule = _HARDWARE_RULES.get(kind)
    if rule is None:
        return None
    needs = rule.needs
    if rule.min_cuda is not None:
        cuda = f"CUDA >= {rule.min_cuda[0]}.{rule.min_cuda[1]}"
        below = rule.cuda_applies_below
        needs += f" ({cuda} below {below[0]}.{below[1]})" if below else f" with {cuda}"
    return rule.min_capability, f"{_SHORT_NAMES[kind]} needs {needs}"


def _parse_cuda_version(text: str) -> tuple[int, int] | None:
    # Compare as integers: TE's float("12.10") would read as 12.1.
    match = re.match(r"\s*(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2) or 0)


def _label(cfg: Mapping[str, Any], kind: str) -> str:
    return f"recipe {str(cfg.get('name') or kind)!r} ({kind})"


def _cuda_problem(rule: _HardwareRule, capability: tuple[int, int], cuda_version: str | None) -> str | None:
    if rule.min_cuda is None:
        return None
    if rule.cuda_applies_below is not None and capability >= rule.cuda_applies_below:
        return None
    floor = f"{rule.min_cuda[0]}.{rule.min_cuda[1]}"
    if cuda_version is None:
        return f"CUDA >= {floor}; the CUDA version is unknown (torch.version.cuda is None)"
    parsed = _parse_cuda_version(cuda_version)
    if parsed is None or parsed < rule.min_cuda:
        present = f"{capability[0]}.{capability[1]}"
        return f"CUDA >= {floor} on compute capability {present}; torch has CUDA {cuda_version}"
    return None


def check_recipe_supported(
    cfg: Mapping[str, Any], capability: tuple[int, int], cuda_version: str | None
) -> None:
    """Raise ``UnsupportedRecipeError`` if a GPU of ``capability`` with ``cuda_version`` cannot run it."""
    kind = _kind_of(cfg)
    rule = _HARDWARE_RULES.get(kind)
    if rule is None:
        return
    capability = (int(capability[0]), int(capability[1]))
    present = f"{capability[0]}.{capability[1]}"
    too_old = capability < rule.min_capability
    too_new = rule.below_capability is not None and capability >= rule.below_capability
    if too_old or too_new:
        raise UnsupportedRecipeError(f"{_label(cfg, kind)} needs {rule.needs}; this GPU is {present}")
    cuda_problem = _cuda_problem(rule, capability, cuda_version)
    if cuda_problem is not None:
        raise UnsupportedRecipeError(f"{_label(cfg, kind)} needs {cuda_problem}")


def check_recipe_on_current_device(cfg: Mapping[str, Any]) -> None:
    """``check_recipe_supported`` against the current CUDA device; call it before the first forward."""
    kind = _kind_of(cfg)
    if kind not in _HARDWARE_RULES:
        return
    import torch

    if not torch.cuda.is_available():
        raise EngineUnavailableError(f"{_label(cfg, kind)} needs a CUDA GPU; none is visible")
    capability = torch.cuda.get_device_capability(torch.cuda.current_device())
    check_recipe_supported(cfg, capability, torch.version.cuda)
