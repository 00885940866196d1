"""Activation reference ops, with TE's conventions: tanh GELU, gate on the first half of a GLU input.

Each computes in at least float32 and rounds its output once, as TE's activation kernels do."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from te_assembly.engines.reference.ops.base import ReferenceOp, compute_dtype

Fn = Callable[[torch.Tensor], torch.Tensor]


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _qgelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


def _srelu(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


def glu(act: Fn, x: torch.Tensor) -> torch.Tensor:
    """act(a) * b with x = [a, b] split in halves on the last dim (TE activates the first half)."""
    a, b = x.chunk(2, dim=-1)
    return act(a) * b


class _Activation(ReferenceOp):
    gated: bool = False

    def __init__(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()

    @staticmethod
    def fn(x: torch.Tensor, /) -> torch.Tensor:
        raise NotImplementedError

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        x_c = x.to(compute_dtype(x.dtype))
        return (glu(self.fn, x_c) if self.gated else self.fn(x_c)).to(x.dtype), ()


class _Gated(_Activation):
    gated = True


class GELU(_Activation):
    fn = staticmethod(_gelu)


class QGELU(_Activation):
    fn = staticmethod(_qgelu)


class ReLU(_Activation):
    fn = staticmethod(F.relu)


class SReLU(_Activation):
    fn = staticmethod(_srelu)


class SiLU(_Activation):
    fn = staticmethod(F.silu)


class SwiGLU(_Gated):
    fn = staticmethod(F.silu)


class GEGLU(_Gated):
    fn = staticmethod(_gelu)


class QGEGLU(_Gated):
    fn = staticmethod(_qgelu)


class ReGLU(_Gated):
    fn = staticmethod(F.relu)


class SReGLU(_Gated):
    fn = staticmethod(_srelu)


class ScaledSwiGLU(ReferenceOp):
    """SwiGLU(x) * scales[..., None]; scales has shape x.shape[:-1] (e.g. router probs per row)."""

    def __init__(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        # TE rounds the scales to x's dtype first, then computes in float32 and rounds once.
        dtype = compute_dtype(x.dtype)
        scales = extra_inputs[0].reshape(x.shape[:-1]).to(x.dtype).to(dtype)
        return (glu(F.silu, x.to(dtype)) * scales[..., None]).to(x.dtype), ()


def clamped_glu(x: torch.Tensor, limit: float, alpha: float, offset: float) -> torch.Tensor:
    """GPT-OSS's activation on halves [a, b]: a <= limit, |b| <= limit, (b + offset) * a * sigmoid(alpha a)
    (transformers' order of operations)."""
    a, b = x.chunk(2, dim=-1)
    a = a.clamp(max=limit)
    b = b.clamp(min=-limit, max=limit)
    return (b + offset) * (a * torch.sigmoid(a * alpha))


class ClampedSwiGLU(ReferenceOp):
    """``clamped_glu`` of x, computed in at least float32 and rounded once."""

    def __init__(
        self,
        limit: float = 7.0,
        alpha: float = 1.702,
        glu_linear_offset: float = 1.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.limit, self.alpha, self.glu_linear_offset = limit, alpha, glu_linear_offset

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        out = clamped_glu(x.to(compute_dtype(x.dtype)), self.limit, self.alpha, self.glu_linear_offset)
        return out.to(x.dtype), ()


class ScaledClampedQGeGLU(ClampedSwiGLU):
    """``clamped_glu`` of x times ``scales[..., None]`` (the router probability of each row)."""

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        dtype = compute_dtype(x.dtype)
        scales = extra_inputs[0].reshape(x.shape[:-1]).to(x.dtype).to(dtype)
        out = clamped_glu(x.to(dtype), self.limit, self.alpha, self.glu_linear_offset)
        return (out * scales[..., None]).to(x.dtype), ()


class Softcap(ReferenceOp):
    """y = cap * tanh(x / cap): every value squashed into (-cap, cap), nearly unchanged near zero
    (Gemma 2's final_logit_softcapping)."""

    def __init__(
        self, cap: float, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        if cap <= 0:
            raise ValueError(f"Softcap's cap must be positive, got {cap}")
        self.cap = cap

    def extra_repr(self) -> str:
        return f"cap={self.cap:g}"

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        x_c = x.to(compute_dtype(x.dtype))
        return (torch.tanh(x_c / self.cap) * self.cap).to(x.dtype), ()
