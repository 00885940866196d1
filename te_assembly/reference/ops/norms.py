"""Normalization reference ops over the last dimension, with TE's zero-centred-gamma option."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from te_assembly.reference.ops.base import ReferenceOp


class _Norm(ReferenceOp):
    def __init__(
        self,
        normalized_shape: int,
        eps: float = 1e-5,
        zero_centered_gamma: bool = False,
        with_bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = normalized_shape
        self.eps = eps
        self.zero_centered_gamma = zero_centered_gamma
        # Zero-centred gamma stores weight - 1, so the identity scale is an all-zero parameter.
        init = torch.zeros if zero_centered_gamma else torch.ones
        self.weight = torch.nn.Parameter(init(normalized_shape, device=device, dtype=dtype))
        if with_bias:
            self.bias = torch.nn.Parameter(torch.zeros(normalized_shape, device=device, dtype=dtype))

    def _gamma(self) -> torch.Tensor:
        return self.weight + 1 if self.zero_centered_gamma else self.weight


class LayerNorm(_Norm):
    """(x - mean) / sqrt(var + eps) * gamma + beta."""

    def __init__(
        self,
        normalized_shape: int,
        eps: float = 1e-5,
        zero_centered_gamma: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(normalized_shape, eps, zero_centered_gamma, True, device, dtype)

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        y = torch.nn.functional.layer_norm(x, (self.normalized_shape,), self._gamma(), self.bias, self.eps)
        return y, ()


class RMSNorm(_Norm):
    """x / sqrt(mean(x^2) + eps) * gamma."""

    def __init__(
        self,
        normalized_shape: int,
        eps: float = 1e-5,
        zero_centered_gamma: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(normalized_shape, eps, zero_centered_gamma, False, device, dtype)

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x * rstd * self._gamma(), ()
