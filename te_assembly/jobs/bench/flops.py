"""FLOPs of one forward and one backward: counted by ``torch.utils.flop_counter.FlopCounterMode``, or
from the catalog where the counter cannot see the work.

``FlopCounterMode`` counts the matrix multiplies torch dispatches (``mm``, ``addmm``, ``bmm``...; other
ops count nothing). That covers the reference engine and ``engine=te kernels=reference`` (our reference
math inside TE's fusers), and it counts what really runs: the zero rows a ``Dispatch`` with ``align``
pads expert groups with, a backward without the data gradient of an input that needs none. It cannot see
TE's own GEMM kernels (custom CUDA extension calls, not torch ops): with ``engine=te kernels=te`` the
count comes from the catalog (``forward_flops``; backward twice the forward), and ``bench`` says which
was used.

The catalog's count is each step's own declaration (``catalog/costs.py``): GEMMs only, a grouped linear
by the rows it receives, attention over the (query, key) pairs it computes (causal and windowed pairs
only, as FlashAttention's benchmarks count), latent attention with its expansion of the latent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from te_assembly.analysis.plan import Plan
from te_assembly.catalog.costs import Work
from te_assembly.engines.data import rows_per_step

COUNTER = "torch.utils.flop_counter.FlopCounterMode"
CATALOG = "the catalog's GEMM count"


def attention_flops(args: Mapping[str, Any], rows: int, seq_len: int) -> int:
    """Forward FLOPs of an ``Attention`` step on ``rows`` rows in sequences of ``seq_len``."""
    from te_assembly.catalog import MODULE_ALLOWLIST

    return MODULE_ALLOWLIST["Attention"].cost.flops(args, Work(rows, seq_len))


def step_flops(plan: Plan, tokens: int, seq_len: int | None = None, every_pair: bool = False) -> list[int]:
    """Each step's forward FLOPs as its catalog entry declares them, on ``tokens`` rows (in sequences of
    ``seq_len``; default: one sequence); ``every_pair``: attention's masked pairs too."""
    rows = rows_per_step(plan, tokens)
    out = []
    for step in plan.steps:
        n = rows[step.index]
        work = Work(n, min(seq_len or n, n), every_pair=every_pair)
        out.append(step.spec.cost.flops(step.args, work) if n else 0)
    return out


def forward_flops(plan: Plan, tokens: int, seq_len: int | None = None, every_pair: bool = False) -> int:
    """Forward GEMM FLOPs of one call on ``tokens`` rows (``step_flops`` summed)."""
    return sum(step_flops(plan, tokens, seq_len, every_pair))


@dataclass(frozen=True)
class FlopCount:
    forward: int
    backward: int
    source: str
    """``COUNTER`` or ``CATALOG``."""
    note: str = ""

    @property
    def step(self) -> int:
        """Forward + backward (the optimizer's element-wise update is not counted)."""
        return self.forward + self.backward

    def of(self, phase: str) -> int:
        return {"forward": self.forward, "backward": self.backward, "step": self.step}[phase]


def catalog_count(plan: Plan, tokens: int, note: str = "", seq_len: int | None = None) -> FlopCount:
    forward = forward_flops(plan, tokens, seq_len)
    return FlopCount(forward, 2 * forward, CATALOG, note)


def count_flops(
    forward: Callable[[], torch.Tensor],
    plan: Plan,
    tokens: int,
    *,
    te_kernels: bool,
    seq_len: int | None = None,
) -> FlopCount:
    """Count one forward (``forward()`` returns the loss) and its backward with ``FlopCounterMode``;
    the catalog's count where the counter is blind: TE's kernels (``te_kernels``), or a count of zero
    where the plan has GEMMs. The caller clears the gradients this leaves."""
    if te_kernels:
        return catalog_count(
            plan, tokens, "TE's GEMM kernels are CUDA extension calls FlopCounterMode cannot see", seq_len
        )
    from torch.utils.flop_counter import FlopCounterMode

    from te_assembly.engines.reference.attention import twice_differentiable

    # Attention counted on SDPA's math backend, whose batched GEMMs the counter sees (the fast CPU
    # kernel is one opaque call it would count as nothing).
    with twice_differentiable(), FlopCounterMode(display=False) as fwd:
        loss = forward()
    with twice_differentiable(), FlopCounterMode(display=False) as bwd:
        loss.backward()
    counted = FlopCount(int(fwd.get_total_flops()), int(bwd.get_total_flops()), COUNTER)
    if counted.forward == 0 and forward_flops(plan, tokens, seq_len) > 0:
        return catalog_count(
            plan, tokens, "FlopCounterMode saw no matrix multiply where the plan has some", seq_len
        )
    return counted


__all__ = [
    "CATALOG",
    "COUNTER",
    "FlopCount",
    "attention_flops",
    "catalog_count",
    "count_flops",
    "forward_flops",
    "step_flops",
]
