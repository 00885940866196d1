"""Normalization reference ops over the last dimension, with TE's zero-centred-gamma option.

Both compute in at least float32 and round once to the input's dtype, as TE's kernels do."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from te_assembly.engines.reference.ops.base import ReferenceOp, compute_dtype


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

    def _gamma(self, dtype: torch.dtype) -> torch.Tensor:
        weight = self.weight.to(dtype)
        return weight + 1 if self.zero_centered_gamma else weight


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
        dtype = compute_dtype(x.dtype)
        y = torch.nn.functional.layer_norm(
            x.to(dtype), (self.normalized_shape,), self._gamma(dtype), self.bias.to(dtype), self.eps
        )
        return y.to(x.dtype), ()


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
        dtype = compute_dtype(x.dtype)
        x_c = x.to(dtype)
        rstd = torch.rsqrt(x_c.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x_c * rstd * self._gamma(dtype)).to(x.dtype), ()
