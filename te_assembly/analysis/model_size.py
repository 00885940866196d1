"""Whether any machine could hold the model at all: its parameters counted from the plan (no tensor
made), at two bytes each (bfloat16, the narrowest dtype a model trains in), against the largest memory
there is. A width typed with three digits too many (a 1e11-wide Linear) is found by ``validate``, with
the number and the step that holds most of it, not by the first command that allocates."""

from __future__ import annotations

from collections.abc import Sequence

from te_assembly.analysis.plan import PlannedStep
from te_assembly.catalog.devices import ACCELERATORS
from te_assembly.diagnostics import Diagnostic, error, warning

BYTES_PER_PARAM = 2
LARGEST_RACK = 72 * ACCELERATORS["gb200"].memory_bytes
"""An NVIDIA GB200 NVL72 rack's memory (72 GPUs, about 13.4 TB): past it a model needs a cluster."""
LARGEST_ONE = max(ACCELERATORS.values(), key=lambda a: a.memory_bytes)
"""The accelerator with the most memory: past it, the weights alone need several."""
LARGEST_ANYWHERE = 10**15
"""1 PB: more than the largest training clusters hold across all their GPUs, so no model beyond it can
be trained or run anywhere."""


def _words(nbytes: float) -> str:
    for unit, size in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9)):
        if nbytes >= size:
            return f"{nbytes / size:,.3g} {unit}"
    return f"{nbytes:,.0f} bytes"


def check_model_size(steps: Sequence[PlannedStep | None]) -> list[Diagnostic]:
    """An error for a model no machine or cluster could hold; a warning, with the number, for one no
    single accelerator holds (its weights alone)."""
    counted = []
    for step in steps:
        if step is None or not step.args_valid:
            continue
        try:
            counted.append((step.num_params, step))
        except (TypeError, ValueError, KeyError):  # arguments another pass reports
            continue
    total = sum(n for n, _ in counted)
    nbytes = total * BYTES_PER_PARAM
    if nbytes <= LARGEST_ONE.memory_bytes:
        return []
    biggest, step = max(counted, key=lambda c: c[0])
    what = (
        f"the model has {total:.3g} parameters, {_words(nbytes)} in bfloat16 ({step.name}, a {step.type}, "
        f"holds {biggest / total:.0%} of them)"
    )
    if nbytes > LARGEST_ANYWHERE:
        return [
            error(
                "model",
                "model-too-large",
                f"{what}: more than any machine or cluster holds ({_words(LARGEST_ANYWHERE)})",
                f"check {step.name}'s widths: a dimension with digits too many?",
            )
        ]
    if nbytes > LARGEST_RACK:
        needs = f"more than one GB200 NVL72 rack holds ({_words(LARGEST_RACK)}); it needs a cluster"
    else:
        needs = (
            f"more than one accelerator holds (the largest, {LARGEST_ONE.name}, "
            f"{_words(LARGEST_ONE.memory_bytes)}); it needs several"
        )
    return [warning("model", "model-too-large", f"{what}: {needs} and parallel.shard")]


__all__ = ["BYTES_PER_PARAM", "LARGEST_ANYWHERE", "LARGEST_ONE", "LARGEST_RACK", "check_model_size"]
