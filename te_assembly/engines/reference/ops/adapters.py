"""LoRA adapters (``catalog/adapter_ops.py``): ``y + scaling * B(A(dropout(x)))`` per part of ``y``."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.nn import functional

from te_assembly.catalog.adapter_ops import BASE_WEIGHT, MAGNITUDE, adapted_parts, parts_of, scaling
from te_assembly.engines.reference.ops.base import ReferenceOp, compute_dtype
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
    """``y + scaling * B(A(dropout(x)))``: x (extra input 0) is the adapted projection's input. With
    ``dora``, PEFT's DoRA: ``base_weight`` is the projection's weight (tied to it by the plan), and each
    adapted part's rows of ``W + scaling * B A`` are rescaled to ``lora_magnitude{i}``:
    ``y + (m / n - 1) * x W^T + (m / n) * scaling * B(A(dropout(x)))``, ``n`` the rows' norms, held
    constant in backward (the DoRA paper's section 4.3, as PEFT does). A magnitude starts unset (NaN)
    and becomes the row norms of the weight the model has when it first runs (the pretrained one, loaded
    after the model was built), unless a checkpoint or adapter gave it a value first."""

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
        dora: bool = False,
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
            device=device,
            dtype=dtype,
        )
        self.dora = dora
        self._magnitude_set = not dora
        if dora:
            for i in self.adapted_indices:
                unset = torch.full((self.widths[i],), float("nan"), device=device, dtype=dtype)
                self.register_parameter(f"{MAGNITUDE}{i}", torch.nn.Parameter(unset))
            # a stand-in until the plan ties it to the projection's weight (``engines.base.tie_weights``)
            shape = (self.out_features, self.in_features)
            self.register_parameter(
                BASE_WEIGHT, torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
            )

    def _rows(self, i: int) -> slice:
        start = sum(self.widths[:i])
        return slice(start, start + self.widths[i])

    def _norms(self, i: int, dtype: torch.dtype) -> torch.Tensor:
        """The row norms of part ``i`` of ``W + scaling * B A`` (PEFT's ``get_weight_norm``)."""
        a, b = getattr(self, f"lora_A{i}"), getattr(self, f"lora_B{i}")
        weight = getattr(self, BASE_WEIGHT)[self._rows(i)].to(dtype) + self.scaling * (
            b.to(dtype) @ a.to(dtype)
        )
        return torch.linalg.norm(weight, dim=1)

    def forward(self, y: torch.Tensor, extra_inputs: Sequence[torch.Tensor] = ()) -> Out:  # type: ignore[override]
        x = extra_inputs[0]
        _check_rows("LoRA", x, y, self.in_features)
        if _OFF.get():
            return y, ()
        if not self.dora:
            return y + self.update(x).to(y.dtype), ()
        if not self._magnitude_set:
            self._set_magnitudes(y.dtype)
        return y + self._dora_update(x, y.dtype), ()

    def _set_magnitudes(self, dtype: torch.dtype) -> None:
        """Each unset magnitude (NaN: none was loaded) as its rows' norms now (PEFT's ``update_layer``)."""
        with torch.no_grad():
            for i in self.adapted_indices:
                magnitude = getattr(self, f"{MAGNITUDE}{i}")
                if bool(torch.isnan(magnitude).all()):
                    magnitude.copy_(self._norms(i, compute_dtype(dtype)))
        self._magnitude_set = True

    def _dora_update(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        dropped = functional.dropout(x, self.dropout) if self.dropout > 0.0 and self.training else x
        weight = getattr(self, BASE_WEIGHT)
        pieces = []
        for i, width in enumerate(self.widths):
            if i not in self.adapted_indices:
                pieces.append(x.new_zeros(*x.shape[:-1], width))
                continue
            a, b = getattr(self, f"lora_A{i}"), getattr(self, f"lora_B{i}")
            scale = getattr(self, f"{MAGNITUDE}{i}").to(x.dtype) / self._norms(i, x.dtype).detach()
            base = functional.linear(dropped, weight[self._rows(i)].to(x.dtype))  # PEFT: x W^T again
            lora = functional.linear(functional.linear(dropped, a.to(x.dtype)), b.to(x.dtype))
            pieces.append((scale - 1) * base + scale * lora * self.scaling)
        return (pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)).to(dtype)


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
