"""Tensors as a rank holds them: FSDP2's ``DTensor`` pieces, and gradients summed over a group."""

from __future__ import annotations

from typing import Any

import torch

from te_assembly.engines.parallel.collectives import all_reduce
from te_assembly.engines.parallel.mesh import group_size


def is_cut(t: torch.Tensor) -> bool:
    """An FSDP2 piece (a ``DTensor`` sharded over its mesh), not a whole tensor."""
    return hasattr(t, "to_local") and any(p.is_shard() for p in t.placements)  # type: ignore[attr-defined]


def holders(t: Any) -> int:
    """How many ranks hold the same piece of the FSDP2 ``DTensor`` ``t``: its mesh's ranks over the
    pieces its shard dimensions cut (the replicas of HSDP)."""
    mesh = t.device_mesh
    pieces = 1
    for dim, placement in enumerate(t.placements):
        if placement.is_shard():
            pieces *= mesh.size(dim)
    return int(mesh.size()) // pieces


def local_piece(t: torch.Tensor) -> torch.Tensor:
    """This rank's piece of an FSDP2 ``DTensor``; any other tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t  # type: ignore[operator]


def whole(t: torch.Tensor) -> torch.Tensor:
    """A ``DTensor``'s global value (a collective: every rank asks for the same tensors in the same
    order); any other tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t  # type: ignore[operator]


def reduce_grads(params: list[torch.nn.Parameter], group: Any, scale: float) -> None:
    """Sum the gradients over ``group`` (one flat all-reduce), times ``scale``."""
    if not params:
        return
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads if g is not None])
    if group_size(group) > 1:
        flat = all_reduce(flat, group)
    if scale != 1.0:
        flat = flat * scale
    offset = 0
    for g in grads:
        assert g is not None
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


__all__ = ["holders", "is_cut", "local_piece", "reduce_grads", "whole"]
