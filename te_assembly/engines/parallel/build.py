"""Build this rank's part of a model: the weights a single process would draw, then this rank's slices.

Every rank first builds the whole model with the reference engine on the CPU, drawing from torch's global
RNG exactly as a single-process build does, and keeps its state dict; then it builds its split model
(reference or TE engine) and copies its slices in. So every layout, the single process included, starts
from the same weights, and the RNG is left where a single-process build leaves it. The cost is one
whole copy of the weights per process during the build.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from te_assembly.analysis.plan import Plan
from te_assembly.engines.base import AssembledModel
from te_assembly.engines.parallel.context import ParallelContext


def build_parallel(
    plan: Plan,
    parallel: ParallelContext,
    engine: str,
    *,
    kernels: str = "te",
    device: torch.device,
    dtype: torch.dtype,
    recipe: Mapping[str, Any] | None = None,
) -> AssembledModel:
    from te_assembly.engines.reference.model import build_reference

    state = build_reference(plan, device="cpu", dtype=dtype).state_dict()
    after = torch.get_rng_state()
    model: AssembledModel
    if engine == "reference":
        model = build_reference(plan, device=device, dtype=dtype, parallel=parallel)
    else:
        from te_assembly.engines.te import build_te

        model = build_te(plan, kernels=kernels, device=device, dtype=dtype, recipe=recipe, parallel=parallel)
    torch.set_rng_state(after)
    parallel.load_global(model, state)
    return model


__all__ = ["build_parallel"]
