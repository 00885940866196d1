"""Multi-token prediction's reference ops: ShiftTokens and AheadLogits (``catalog/prediction_ops.py``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from te_assembly.engines.reference.ops.base import ReferenceOp

Out = tuple[torch.Tensor, tuple[torch.Tensor, ...]]


class ShiftTokens(ReferenceOp):
    """y[:, i] = x[:, i + by]; the last ``by`` positions zero."""

    def __init__(
        self, by: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.by = by

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        if x.dim() != 3:
            raise ValueError(f"ShiftTokens takes [batch, seq, features], got {tuple(x.shape)}")
        kept = x[:, self.by :]
        tail = x.new_zeros(x.shape[0], min(self.by, x.shape[1]), x.shape[2])
        return torch.cat([kept, tail], dim=1), ()


class AheadLogits(ReferenceOp):
    """y = value; the logits arriving leave on extra output slot 0."""

    def __init__(
        self,
        depth: int,
        value_features: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.depth, self.value_features = depth, value_features

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        value = extra_inputs[0]
        if value.shape[:-1] != x.shape[:-1] or value.shape[-1] != self.value_features:
            raise ValueError(
                f"AheadLogits' value must be [{', '.join(map(str, x.shape[:-1]))}, {self.value_features}] "
                f"beside the logits {tuple(x.shape)}, got {tuple(value.shape)}"
            )
        return value, (x,)
