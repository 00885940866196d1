"""Recipe-aware shape rules: the GEMM dimension rules TE enforces only on the GPU for the chosen
quantization recipe (FP8 and MXFP8 divisibility, block scaling, NVFP4), checked at config time.

The analysis calls ``recipe_shape_diagnostics`` once, when both the model's steps and a valid recipe are
known (``validate/analysis.py``). The rules land here, each citing the TE check it mirrors; until they
do, this finds nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from te_assembly.diagnostics import Diagnostic
from te_assembly.plan import PlannedStep


def recipe_shape_diagnostics(
    steps: Sequence[PlannedStep], recipe: Mapping[str, Any] | None
) -> list[Diagnostic]:
    """Every step whose shapes the recipe's kernels cannot run (``steps``: the plan's steps, widths
    known; ``recipe``: the validated recipe config, ``kind`` and fields)."""
    return []


__all__ = ["recipe_shape_diagnostics"]
