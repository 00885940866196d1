"""Rotate-half rotary embeddings applied to heads (the formula ``attention.py``'s module docstring
gives), for the whole-sequence forward and the key/value cache's new positions alike."""

from __future__ import annotations

import torch


def apply_rotary(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``t`` ``[batch, seq, heads, head_dim]`` rotated by position (rotate-half): ``cos`` and ``sin``
    ``[seq, d]`` (one table for every sequence) or ``[batch, seq, d]`` (each its own). With ``d`` below
    ``head_dim`` (partial rotary), the first ``d`` features turn and the rest pass unchanged."""
    rotated_dim = cos.shape[-1]
    if rotated_dim < t.shape[-1]:
        turned, kept = t[..., :rotated_dim], t[..., rotated_dim:]
        return torch.cat((apply_rotary(turned, cos, sin), kept), dim=-1)
    first, second = t.chunk(2, dim=-1)
    rotated = torch.cat((-second, first), dim=-1)
    return t * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2)


def cos_sin(angles: torch.Tensor, scale: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of float32 ``angles``, times ``scale`` (YaRN's attention factor; 1 otherwise) in
    float32, rounded once to ``dtype``: the order ``transformers`` computes them in."""
    cos, sin = angles.cos(), angles.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), sin.to(dtype)


__all__ = ["apply_rotary", "cos_sin"]
