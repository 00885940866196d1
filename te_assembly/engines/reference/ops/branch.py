"""Side-branch reference ops: SigmoidGate, SwapExtraInput and ConcatExtraInput (``catalog/branch_ops.py``)."""

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

    def __init__(
        self,
        value_features: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.value_features = value_features

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        value = extra_inputs[0]
        width = x.shape[-1] if self.value_features is None else self.value_features
        if value.shape[:-1] != x.shape[:-1] or value.shape[-1] != width:
            raise ValueError(
                f"SwapExtraInput's value must be [{', '.join(map(str, x.shape[:-1]))}, {width}] beside x "
                f"{tuple(x.shape)}, got {tuple(value.shape)}"
            )
        return value, (x,)


class ConcatExtraInput(ReferenceOp):
    """y = cat([x, tail], -1): ``tail_features`` appended after x's ``in_features``."""

    def __init__(
        self,
        in_features: int,
        tail_features: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features, self.tail_features = in_features, tail_features

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        tail = extra_inputs[0]
        if tail.shape[:-1] != x.shape[:-1] or tail.shape[-1] != self.tail_features:
            rows = ", ".join(map(str, x.shape[:-1]))
            raise ValueError(
                f"ConcatExtraInput's tail must be [{rows}, {self.tail_features}] beside x {tuple(x.shape)}, "
                f"got {tuple(tail.shape)}"
            )
        return torch.cat((x, tail.to(x.dtype)), dim=-1), ()
