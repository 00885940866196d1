"""Global <-> local tensors by the layout's ``ParamShard`` rules: loading a global state dict (the one a
single process would have) into a rank, and assembling one on rank 0 from every rank's pieces.

The global state dict is the only form te_assembly writes: a checkpoint of a parallel run has the keys,
shapes and meaning of a single-process one.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from te_assembly.analysis.parallel.layout import ParamShard, local_name, slice_rows


def take_slice(full: torch.Tensor, rule: ParamShard, tensor_rank: int, tensor_size: int) -> torch.Tensor:
    """This tensor rank's part of a ``tensor``-split parameter (any other rule: the tensor itself)."""
    if rule.kind != "tensor" or tensor_size == 1:
        return full
    ranges = slice_rows(full.shape[rule.dim], rule, tensor_rank, tensor_size)
    return torch.cat([full.narrow(rule.dim, start, stop - start) for start, stop in ranges], dim=rule.dim)


def join_slices(pieces: list[torch.Tensor], rule: ParamShard) -> torch.Tensor:
    """Inverse of ``take_slice``: the whole tensor from every tensor rank's slice, in rank order."""
    if rule.kind != "tensor" or len(pieces) == 1:
        return pieces[0]
    blocks = [piece.chunk(rule.blocks, dim=rule.dim) for piece in pieces]
    return torch.cat([blocks[t][b] for b in range(rule.blocks) for t in range(len(pieces))], dim=rule.dim)


def local_state(
    global_state: Mapping[str, torch.Tensor],
    rules: Mapping[str, tuple[str, str, ParamShard, int]],
    tensor_rank: int,
    tensor_size: int,
    expert_rank: int,
) -> dict[str, torch.Tensor]:
    """This rank's state from a global one. ``rules``: global key -> (step prefix, parameter name in the
    step, rule, local groups); keys not in ``rules`` are taken whole."""
    out: dict[str, torch.Tensor] = {}
    for key, value in global_state.items():
        if key not in rules:
            out[key] = value
            continue
        prefix, name, rule, groups = rules[key]
        mine = local_name(name, rule, expert_rank, groups)
        if mine is not None:
            out[f"{prefix}{mine}"] = take_slice(value, rule, tensor_rank, tensor_size)
    return out


__all__ = ["join_slices", "local_state", "take_slice"]
