"""LoRA adapters (``catalog/adapter_ops.py``): ``y + scaling * B(A(dropout(x)))`` per part of ``y``."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.nn import functional

from te_assembly.catalog.adapter_ops import adapted_parts, parts_of, scaling
from te_assembly.engines.reference.ops.base import ReferenceOp
from te_assembly.engines.reference.ops.linear import init_weight

Out = tuple[torch.Tensor, tuple[torch.Tensor, ...]]

_OFF = contextvars.ContextVar("te_assembly_adapters_off", default=False)


@contextlib.contextmanager
def adapters_disabled() -> Iterator[None]:
    """Inside: every adapter step passes its projection's output through unchanged, so the model is its
    frozen base (DPO's reference, with no second copy of the weights; PEFT's ``disable_adapter``)."""
    token = _OFF.set(True)
    try:
        yield
    finally:
        _OFF.reset(token)


class _Adapter(ReferenceOp):
    """The parameters of adapter sets (A random as PEFT's default, B zero: the branch adds nothing until
    it trains), one per ``suffix`` (a group's), and their update of ``y`` from ``x``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rank: int,
        alpha: float = 16.0,
        dropout: float = 0.0,
        rslora: bool = False,
        parts: list[int] | None = None,
        adapted: list[bool] | None = None,
        suffixes: Sequence[str] = ("",),
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        args: dict[str, Any] = {"out_features": out_features, "parts": parts, "adapted": adapted}
        args.update(rank=rank, alpha=alpha, rslora=rslora)
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.parts, self.adapted = parts, adapted
        self.alpha, self.rslora, self.dropout = alpha, rslora, dropout
        self.widths, self.adapted_indices = parts_of(args), adapted_parts(args)
        self.scaling = scaling(args)
        for suffix in suffixes:
            for i in self.adapted_indices:
                self.register_parameter(f"lora_A{i}{suffix}", init_weight(rank, in_features, device, dtype))
                b = torch.zeros(self.widths[i], rank, device=device, dtype=dtype)
                self.register_parameter(f"lora_B{i}{suffix}", torch.nn.Parameter(b))

    def update(self, x: torch.Tensor, suffix: str = "") -> torch.Tensor:
        """``scaling * B(A(dropout(x)))`` for every part, zeros where a part has no adapter."""
        if self.dropout > 0.0 and self.training:
            x = functional.dropout(x, self.dropout)
        pieces = []
        for i, width in enumerate(self.widths):
            if i in self.adapted_indices:
                a, b = getattr(self, f"lora_A{i}{suffix}"), getattr(self, f"lora_B{i}{suffix}")
                pieces.append(functional.linear(functional.linear(x, a.to(x.dtype)), b.to(x.dtype)))
            else:
                pieces.append(x.new_zeros(*x.shape[:-1], width))
        delta = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)
        return delta * self.scaling


def _check_rows(name: str, x: torch.Tensor, y: torch.Tensor, width: int) -> None:
    if x.shape[:-1] != y.shape[:-1] or x.shape[-1] != width:
        raise ValueError(
            f"{name}'s x must be [..., {width}] with y's rows {tuple(y.shape[:-1])}, got {tuple(x.shape)}"
        )


class LoRA(_Adapter):
    """``y + scaling * B(A(dropout(x)))``: x (extra input 0) is the adapted projection's input."""

    def forward(self, y: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        x = extra_inputs[0]
        _check_rows("LoRA", x, y, self.in_features)
        if _OFF.get():
            return y, ()
        return y + self.update(x).to(y.dtype), ()


class GroupedLoRA(_Adapter):
    """LoRA per group of rows: rows split by ``split_sizes`` (extra input 1) as the adapted
    GroupedLinear splits them; group g's adapters are ``lora_A{i}_{g}``, ``lora_B{i}_{g}``."""

    def __init__(
        self,
        num_groups: int,
        in_features: int,
        out_features: int,
        rank: int,
        alpha: float = 16.0,
        dropout: float = 0.0,
        rslora: bool = False,
        parts: list[int] | None = None,
        adapted: list[bool] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            in_features,
            out_features,
            rank,
            alpha,
            dropout,
            rslora,
            parts,
            adapted,
            suffixes=[f"_{g}" for g in range(num_groups)],
            device=device,
            dtype=dtype,
        )
        self.num_groups = num_groups

    def forward(self, y: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        x, split_sizes = extra_inputs[0], extra_inputs[1]
        _check_rows("GroupedLoRA", x, y, self.in_features)
        if _OFF.get():
            return y, ()
        rows_x = x.reshape(-1, self.in_features)
        sizes = [int(s) for s in split_sizes.reshape(-1).tolist()]
        if len(sizes) != self.num_groups or sum(sizes) != rows_x.shape[0]:
            raise ValueError(f"GroupedLoRA split sizes {sizes} do not fit {rows_x.shape[0]} rows")
        pieces = [self.update(chunk, f"_{g}") for g, chunk in enumerate(torch.split(rows_x, sizes))]
        delta = torch.cat(pieces, dim=0).reshape(*y.shape[:-1], self.out_features)
        return y + delta.to(y.dtype), ()
