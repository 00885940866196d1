"""The Transformer Engine engine: TE ``OperationFuser``s built, bound and locked at build time.

``binding_calls`` and ``gpu_only_steps`` are pure data about a plan and import neither torch nor TE;
``build_te`` imports TE lazily.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from te_assembly.engines.te.bindings import SET_INPUT, SET_OUTPUT, BindingCall, binding_calls, gpu_only_steps

if TYPE_CHECKING:
    import torch

    from te_assembly.analysis.plan import Plan
    from te_assembly.engines.parallel.context import ParallelContext
    from te_assembly.engines.te.model import TEModel


def build_te(
    plan: Plan,
    kernels: str = "te",
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    recipe: Mapping[str, Any] | None = None,
    parallel: ParallelContext | None = None,
) -> TEModel:
    """See ``te_assembly.engines.te.builder.build_te``."""
    import torch

    from te_assembly.engines.te.builder import build_te as build

    return build(
        plan, kernels=kernels, device=device, dtype=dtype or torch.float32, recipe=recipe, parallel=parallel
    )


__all__ = ["SET_INPUT", "SET_OUTPUT", "BindingCall", "binding_calls", "build_te", "gpu_only_steps"]
