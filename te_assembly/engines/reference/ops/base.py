"""The contract every reference op follows. The reference engine and the TE adapter rely on it."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class ReferenceOp(torch.nn.Module):
    """A pure-PyTorch fusible op with TE's extra-tensor slots.

    ``forward(x, extra_inputs)`` returns ``(y, extra_outputs)``: ``extra_inputs`` in the catalog's
    (enabled) input-slot order, ``extra_outputs`` a tuple in output-slot order. Gradients come from
    autograd, so every float extra input must be used differentiably. Parameter names and shapes
    equal the catalog's ``param_shapes`` (which mirror TE's), so state dicts map across engines.
    Constructors take the catalog's params as keyword arguments plus ``device`` and ``dtype``.
    """

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        raise NotImplementedError


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least float32: TE's norm and activation kernels compute in float32 and round their output
    to the tensor's dtype once; rounding each bfloat16 intermediate instead made the reference
    engine's RMSNorm flip MoE routing choices against TE's on correct code."""
    return torch.promote_types(dtype, torch.float32)
