"""Reference ops that pass the main tensor through: channel taps, scaling, identity, dropout."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from te_assembly.engines.reference.ops.base import ReferenceOp

Out = tuple[torch.Tensor, tuple[torch.Tensor, ...]]


class MakeExtraOutput(ReferenceOp):
    """Returns x and also emits it on extra output slot 0."""

    def __init__(
        self,
        in_place: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_place = in_place

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        return x, (x,)


class AddExtraInput(ReferenceOp):
    """y = x + addend."""

    def __init__(
        self,
        in_place: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        # Kept for the plan and explain output only: in_place is a TE memory optimisation that does not
        # change the sum, and an in-place add here would corrupt tensors autograd saved for backward.
        self.in_place = in_place

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        return x + extra_inputs[0], ()


class ConstantScale(ReferenceOp):
    """y = scale * x."""

    def __init__(
        self, scale: float, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        return x * self.scale, ()


class Identity(ReferenceOp):
    """y = x."""

    def __init__(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        return x, ()


class Dropout(ReferenceOp):
    """Inverted dropout with probability p; identity in eval mode."""

    def __init__(
        self, p: float, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        return torch.nn.functional.dropout(x, self.p, training=self.training), ()
