"""Token views: ``FlattenTokens`` turns ``[..., features]`` into token rows and says what the leading
dimensions were; ``RestoreTokens`` gives them back. Both are views when the tensor allows it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from te_assembly.engines.reference.ops.base import ReferenceOp

Out = tuple[torch.Tensor, tuple[torch.Tensor, ...]]


class FlattenTokens(ReferenceOp):
    """y = x.reshape(-1, features); extra output ``token_shape``: int64 ``x.shape[:-1]``."""

    def __init__(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        shape = torch.tensor(tuple(x.shape[:-1]), dtype=torch.int64, device=x.device)
        return x.reshape(-1, x.shape[-1]), (shape,)


class RestoreTokens(ReferenceOp):
    """y = x.reshape(*token_shape, features) for a 2-D ``x`` of ``prod(token_shape)`` rows."""

    def __init__(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        token_shape = extra_inputs[0]
        if token_shape.dim() != 1 or token_shape.is_floating_point():
            raise ValueError(
                f"RestoreTokens takes token_shape as a 1-D integer tensor, got {token_shape.dtype} of "
                f"shape {tuple(token_shape.shape)}"
            )
        lead = [int(n) for n in token_shape.tolist()]
        if x.dim() != 2 or math.prod(lead) != x.shape[0]:
            raise ValueError(
                f"RestoreTokens cannot give {tuple(x.shape)} the leading dimensions {lead}: it takes "
                f"[tokens, features] with tokens = {math.prod(lead)}"
            )
        return x.reshape(*lead, x.shape[-1]), ()
