"""Side-branch reference ops: SigmoidGate and SwapExtraInput (``catalog/branch_ops.py``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from te_assembly.engines.reference.ops.base import ReferenceOp
from te_assembly.engines.reference.ops.linear import init_weight

Out = tuple[torch.Tensor, tuple[torch.Tensor, ...]]


class SigmoidGate(ReferenceOp):
    """y = x * sigmoid(gate_input @ weight^T), weight ``[1, in_features]``."""

    def __init__(
        self,
        in_features: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.weight = init_weight(1, in_features, device, dtype)

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        gate_input = extra_inputs[0]
        if gate_input.shape != x.shape:
            raise ValueError(
                f"SigmoidGate's gate_input must be shaped like x {tuple(x.shape)}, "
                f"got {tuple(gate_input.shape)}"
            )
        gate = torch.sigmoid(torch.nn.functional.linear(gate_input, self.weight.to(gate_input.dtype)))
        return x * gate.to(x.dtype), ()


class SwapExtraInput(ReferenceOp):
    """y = value; x leaves on extra output slot 0."""

    def __init__(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        value = extra_inputs[0]
        if value.shape != x.shape:
            raise ValueError(
                f"SwapExtraInput's value must be shaped like x {tuple(x.shape)}, got {tuple(value.shape)}"
            )
        return value, (x,)
