"""Linear-family reference ops: BasicLinear, Bias, Linear (fused pair) and GroupedLinear."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from te_assembly.engines.reference.ops.base import ReferenceOp


def init_weight(
    out_features: int, in_features: int, device: torch.device | str | None, dtype: torch.dtype | None
) -> torch.nn.Parameter:
    weight = torch.empty(out_features, in_features, device=device, dtype=dtype)
    # Same init as TE's BasicLinear/GroupedLinear reset_parameters (and torch.nn.Linear's weight).
    torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    return torch.nn.Parameter(weight)


def _new_bias(size: int, device: torch.device | str | None, dtype: torch.dtype | None) -> torch.nn.Parameter:
    # TE zero-initialises biases (unlike torch.nn.Linear), so both engines start identical.
    return torch.nn.Parameter(torch.zeros(size, device=device, dtype=dtype))


class BasicLinear(ReferenceOp):
    """y = x W^T. ``tensor_parallel_mode`` is accepted for the catalog's sake and acts only under a
    tensor-parallel layout, where ``engines/parallel/`` builds the split op instead of this one."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        tensor_parallel_mode: str | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = init_weight(out_features, in_features, device, dtype)

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        return torch.nn.functional.linear(x, self.weight), ()


class Bias(ReferenceOp):
    """y = x + b."""

    def __init__(
        self, size: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.size = size
        self.bias = _new_bias(size, device, dtype)

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        return x + self.bias, ()


class Linear(ReferenceOp):
    """BasicLinear then Bias, held in ``basic_ops`` so parameter names match TE's te.ops.Linear.
    ``tensor_parallel_mode``: see ``BasicLinear``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        tensor_parallel_mode: str | None = None,
    ) -> None:
        super().__init__()
        ops: list[ReferenceOp] = [BasicLinear(in_features, out_features, device=device, dtype=dtype)]
        if bias:
            ops.append(Bias(out_features, device=device, dtype=dtype))
        self.basic_ops = torch.nn.ModuleList(ops)

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        linear: BasicLinear = self.basic_ops[0]  # type: ignore[assignment]
        # One GEMM with the bias in it (as torch.nn.Linear and TE's fused Linear): a separate add
        # would read and write the whole output once more each way.
        bias: Bias | None = self.basic_ops[1] if len(self.basic_ops) > 1 else None  # type: ignore[assignment]
        return torch.nn.functional.linear(x, linear.weight, bias.bias if bias is not None else None), ()


class GroupedLinear(ReferenceOp):
    """Rows of x are split by ``split_sizes``; group g goes through weight{g} (+ bias{g})."""

    def __init__(
        self,
        num_groups: int,
        in_features: int,
        out_features: int,
        bias: bool = True,
        scale_bias: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.num_groups = num_groups
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = bias
        # As in TE, scale_bias is meaningless without a bias and then adds no input slot.
        self.scale_bias = scale_bias and bias
        for g in range(num_groups):
            self.register_parameter(f"weight{g}", init_weight(out_features, in_features, device, dtype))
        if bias:
            for g in range(num_groups):
                self.register_parameter(f"bias{g}", _new_bias(out_features, device, dtype))

    def _split_sizes(self, split_sizes: torch.Tensor, rows: int) -> list[int]:
        sizes = [int(s) for s in split_sizes.reshape(-1).tolist()]
        if len(sizes) != self.num_groups:
            raise ValueError(f"GroupedLinear expects {self.num_groups} split sizes, got {len(sizes)}")
        if any(s < 0 for s in sizes) or sum(sizes) != rows:
            raise ValueError(f"GroupedLinear split sizes {sizes} do not sum to the {rows} input rows")
        return sizes

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        sizes = self._split_sizes(extra_inputs[0], rows.shape[0])
        weights = [getattr(self, f"weight{g}") for g in range(self.num_groups)]
        biases = [getattr(self, f"bias{g}") for g in range(self.num_groups)] if self.use_bias else []
        scales = extra_inputs[1].reshape(-1) if self.scale_bias else None
        y = _GroupedMatmul.apply(rows.contiguous(), scales, sizes, len(biases), *weights, *biases)
        # Rows in, rows out: y itself, not a view of it (FSDP2 warns of views an expert unit returns).
        return (y if len(lead) == 1 else y.reshape(*lead, self.out_features)), ()


class _GroupedMatmul(torch.autograd.Function):
    """Per-group ``x_g W_g^T + b_g`` (or ``+ s_g b_g`` with per-row bias scales ``s``, TE's
    ``scale_bias``) written straight into one output (and one dx in backward).

    Autograd over ``split`` + per-group ``linear`` + ``cat`` gives the same numbers but copies every
    activation once more each way; on big MoE layers that copy was most of the engine's overhead.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        scales: torch.Tensor | None,
        sizes: list[int],
        num_biases: int,
        *params: torch.Tensor,
    ) -> torch.Tensor:
        weights, biases = params[: len(sizes)], params[len(sizes) :]
        scaled = scales.to(x.dtype) if scales is not None and num_biases else None
        out = x.new_empty(x.shape[0], weights[0].shape[0])
        for g, (start, size) in enumerate(zip(_offsets(sizes), sizes, strict=True)):
            rows = slice(start, start + size)
            if num_biases and scaled is None:
                torch.addmm(biases[g], x[rows], weights[g].T, out=out[rows])
                continue
            torch.mm(x[rows], weights[g].T, out=out[rows])
            if scaled is not None:
                out[rows].addr_(scaled[rows], biases[g])  # + s_row * b: the bias scaled per row
        ctx.sizes = sizes
        ctx.scales_dtype = scales.dtype if scales is not None else None
        ctx.save_for_backward(x, scaled, *params)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, scaled, *params = ctx.saved_tensors
        sizes = ctx.sizes
        weights, biases = params[: len(sizes)], params[len(sizes) :]
        if torch.is_grad_enabled():
            # backward(create_graph=True): the ``out=`` kernels below are not differentiable, so build
            # the same gradients from differentiable ops and let autograd take second derivatives.
            grads = _differentiable_grads(sizes, x, scaled, weights, biases, grad_out)
        else:
            grads = _grads(sizes, x, scaled, weights, biases, grad_out.contiguous())
        grad_x, grad_s, grad_w, grad_b = grads
        if grad_s is not None:
            grad_s = grad_s.to(ctx.scales_dtype)
        return (grad_x, grad_s, None, None, *grad_w, *grad_b)


Grads = tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor], list[torch.Tensor]]


def _grads(
    sizes: list[int],
    x: torch.Tensor,
    scaled: torch.Tensor | None,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor],
    grad_out: torch.Tensor,
) -> Grads:
    grad_x = torch.empty_like(x)
    grad_s = torch.empty_like(scaled) if scaled is not None else None
    grad_w, grad_b = [], []
    for g, (start, size) in enumerate(zip(_offsets(sizes), sizes, strict=True)):
        rows = slice(start, start + size)
        dy = grad_out[rows]
        torch.mm(dy, weights[g], out=grad_x[rows])
        grad_w.append(dy.T @ x[rows])
        if not biases:
            continue
        if scaled is None:
            grad_b.append(dy.sum(0))
        else:
            assert grad_s is not None
            grad_b.append(dy.T.mv(scaled[rows]))
            torch.mv(dy, biases[g], out=grad_s[rows])
    return grad_x, grad_s, grad_w, grad_b


def _differentiable_grads(
    sizes: list[int],
    x: torch.Tensor,
    scaled: torch.Tensor | None,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor],
    grad_out: torch.Tensor,
) -> Grads:
    grad_x, grad_s, grad_w, grad_b = [], [], [], []
    s_parts = scaled.split(sizes) if scaled is not None else [None] * len(sizes)
    for g, (x_g, dy_g, s_g) in enumerate(zip(x.split(sizes), grad_out.split(sizes), s_parts, strict=True)):
        grad_x.append(dy_g @ weights[g])
        grad_w.append(dy_g.T @ x_g)
        if not biases:
            continue
        if s_g is None:
            grad_b.append(dy_g.sum(0))
        else:
            grad_b.append(dy_g.T @ s_g)
            grad_s.append(dy_g @ biases[g])
    return torch.cat(grad_x), (torch.cat(grad_s) if scaled is not None else None), grad_w, grad_b


def _offsets(sizes: list[int]) -> list[int]:
    starts, total = [], 0
    for size in sizes:
        starts.append(total)
        total += size
    return starts
