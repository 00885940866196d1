"""Tensor-parallel reference ops: the catalog's Linear and BasicLinear split across a process group,
with TE's constructor convention (global sizes given, local shapes computed) and parameter names.

Row-parallel bias. TE's ``te.ops.Linear(tensor_parallel_mode="row")`` adds a full-size bias on every rank
*before* the all-reduce, so the bias it applies is the sum of the ranks' biases, and each rank's
``state_dict`` holds a different share of it. te_assembly instead adds the bias once, after the
reduction (``BasicLinear`` with the row mode, then an unsplit ``Bias``: TE's own ``BasicLinear`` reduces
inside its forward, and its fusions never fold a bias into a row-parallel GEMM). Every rank then holds
the whole, true bias, receives the same gradient for it, and a state dict means the same thing at any
tensor-parallel size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from te_assembly.engines.parallel.collectives import (
    copy_to_group,
    gather_rows,
    reduce_from_group,
    reduce_scatter,
)
from te_assembly.engines.parallel.mesh import Group, group_size
from te_assembly.engines.reference.ops.base import ReferenceOp
from te_assembly.engines.reference.ops.linear import Bias, init_weight

MODES = ("column", "row")


def local_features(in_features: int, out_features: int, mode: str, size: int) -> tuple[int, int]:
    """(local in, local out) as TE's ``BasicLinear`` computes them; raises on an uneven split (the
    config-time check reports it with its key path first)."""
    if mode not in MODES:
        raise ValueError(f"tensor_parallel_mode must be column or row, got {mode!r}")
    split = out_features if mode == "column" else in_features
    if split % size:
        raise ValueError(f"{mode}-parallel Linear: {split} features do not split across {size} ranks")
    if mode == "column":
        return in_features, out_features // size
    return in_features // size, out_features


class TensorParallelBasicLinear(ReferenceOp):
    """y = x W^T on a slice: ``column`` holds rows of W (this rank's output features), ``row`` holds
    columns of W (its input features) and sums the partial outputs over the group. Under sequence
    parallelism the column op gathers the rows of x first and the row op scatters the rows of y."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        mode: str,
        group: Group,
        sequence_parallel: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.mode, self.group, self.sequence_parallel = mode, group, sequence_parallel
        self.local_in, self.local_out = local_features(in_features, out_features, mode, group_size(group))
        self.weight = init_weight(self.local_out, self.local_in, device, dtype)

    def extra_repr(self) -> str:
        shapes = f"global {self.out_features}x{self.in_features}, local {self.local_out}x{self.local_in}"
        return f"{self.mode}, {shapes}"

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        if self.mode == "column":
            x = gather_rows(x, self.group) if self.sequence_parallel else copy_to_group(x, self.group)
            return torch.nn.functional.linear(x, self.weight), ()
        y = torch.nn.functional.linear(x, self.weight)
        return (
            reduce_scatter(y, self.group) if self.sequence_parallel else reduce_from_group(y, self.group)
        ), ()


class TensorParallelLinear(ReferenceOp):
    """The catalog's ``Linear`` split across ``group``: ``basic_ops`` = [split BasicLinear, Bias], so
    parameter names are TE's (``basic_ops.0.weight``, ``basic_ops.1.bias``). Column: the bias is this
    rank's slice of the output features. Row: the whole bias, added after the reduction (module doc)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        mode: str,
        group: Group,
        sequence_parallel: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        linear = TensorParallelBasicLinear(
            in_features,
            out_features,
            mode=mode,
            group=group,
            sequence_parallel=sequence_parallel,
            device=device,
            dtype=dtype,
        )
        ops: list[ReferenceOp] = [linear]
        if bias:
            ops.append(Bias(linear.local_out, device=device, dtype=dtype))
        self.basic_ops = torch.nn.ModuleList(ops)

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        for op in self.basic_ops:
            x, _ = op(x)
        return x, ()


__all__ = ["MODES", "TensorParallelBasicLinear", "TensorParallelLinear", "local_features"]
