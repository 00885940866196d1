"""Packed rows (``data.packing``): several documents side by side in one row, attention kept inside each.

A packed batch comes with ``documents`` ``[batch, seq]``: each position's document number within its
row (any integers, equal within a document, documents contiguous; -1: padding, which sees only itself).
``with packed(model, documents):`` hands them to every attention step; each then attends causally within
its document only and turns each position by its place in its document (positions restart at 0 where a
document starts), so every document computes what it computes alone. The masks are written out
(block-diagonal causal) for SDPA; TE's ``thd`` format with ``cu_seqlens`` is the GPU kernel for the same
thing, not wired yet: the TE engine runs the reference attention step for packed batches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from te_assembly.engines.reference.written_out import causal_mask
from te_assembly.errors import ArgumentError


def positions_in_documents(documents: torch.Tensor) -> torch.Tensor:
    """``[batch, seq]`` int64: each position's index within its document (0 where one starts)."""
    seq = documents.shape[-1]
    index = torch.arange(seq, device=documents.device).expand_as(documents)
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index))
    return index - torch.cummax(first, dim=-1).values


def document_mask(documents: torch.Tensor, window: int | None) -> torch.Tensor:
    """``[batch, 1, seq, seq]`` bool: query p sees key q when both are in one document, q <= p (and
    p - q < window with a window); a padding position sees itself only."""
    seq = documents.shape[-1]
    causal = causal_mask(seq, window, documents.device)
    same = (documents[:, :, None] == documents[:, None, :]) & (documents[:, :, None] >= 0)
    return ((same & causal) | torch.eye(seq, dtype=torch.bool, device=documents.device))[:, None]


@contextlib.contextmanager
def packed(model: torch.nn.Module, documents: torch.Tensor | None) -> Iterator[None]:
    """Every attention step of ``model`` keeps ``documents`` apart inside (module docstring); None:
    nothing changes."""
    if documents is None:
        yield
        return
    # an attention step (one a key/value cache serves) that cannot keep documents apart would mix them
    unable = sorted(
        {
            type(m).__name__
            for m in model.modules()
            if hasattr(m, "use_cache") and not hasattr(m, "use_documents")
        }
    )
    if unable:
        raise ArgumentError(
            f"data.packing: the model's {', '.join(unable)} steps cannot keep packed documents apart yet; "
            "train without data.packing"
        )
    steps: list[Any] = [m for m in model.modules() if hasattr(m, "use_documents")]
    for step in steps:
        step.use_documents(documents)
    try:
        yield
    finally:
        for step in steps:
            step.use_documents(None)


__all__ = ["document_mask", "packed", "positions_in_documents"]
