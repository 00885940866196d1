"""Rotate-half rotary embeddings applied to heads (the formula ``attention.py``'s module docstring
gives), for the whole-sequence forward and the key/value cache's new positions alike."""

from __future__ import annotations

import torch


def apply_rotary(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``t`` ``[batch, seq, heads, head_dim]`` rotated by position (rotate-half): ``cos`` and ``sin``
    ``[seq, head_dim]`` (one table for every sequence) or ``[batch, seq, head_dim]`` (each its own)."""
    first, second = t.chunk(2, dim=-1)
    rotated = torch.cat((-second, first), dim=-1)
    return t * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2)


__all__ = ["apply_rotary"]
