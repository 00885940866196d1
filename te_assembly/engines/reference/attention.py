"""The reference ``Attention`` module: causal multi-head self-attention on a packed QKV tensor, with
grouped-query attention and rotary position embeddings, in plain PyTorch.

Semantics shared with the TE engine's ``TEAttention`` (``engines/te/attention.py``), which runs TE's
``DotProductAttention`` and fused RoPE instead:

- input ``[batch, seq, (num_heads + 2 * num_kv_heads) * head_dim]``: all query heads, then all key heads,
  then all value heads, each head ``head_dim`` features; output ``[batch, seq, num_heads * head_dim]``;
- query head ``i`` reads key/value head ``i // (num_heads // num_kv_heads)`` (TE's and flash-attention's
  grouping);
- rotary embeddings as TE's ``RotaryPositionEmbedding(head_dim, rotary_base=...)`` with
  ``interleaved=False`` (rotate-half): position ``p`` turns features ``j`` and ``j + head_dim / 2`` of q
  and k by ``p * rotary_base ** (-2j / head_dim)``;
- softmax scale ``1 / sqrt(head_dim)``; causal: position ``p`` attends to positions ``<= p``.

``scaled_dot_product_attention`` runs with its math backend: the textbook computation, twice
differentiable like every other reference op (the flash kernels' backward is not), and what the memory
estimate counts (it keeps the attention probabilities for backward). On CPU that costs about twice the
flash kernel's time for the attention itself.
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from te_assembly.engines.reference.ops.base import compute_dtype


def rotary_tables(
    seq_len: int, head_dim: int, base: float, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, ``[seq_len, head_dim]``, for the rotate-half convention (frequencies in float32 as
    TE computes them, or float64 when ``dtype`` is float64)."""
    freq_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device, dtype=freq_dtype) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=freq_dtype), inv_freq)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``t`` ``[batch, seq, heads, head_dim]`` rotated by position (rotate-half)."""
    first, second = t.chunk(2, dim=-1)
    rotated = torch.cat((-second, first), dim=-1)
    return t * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(torch.nn.Module):
    """See the module docstring. No parameters; computes in at least float32 and rounds the output once
    (TE's fused kernels accumulate in float32)."""

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        num_kv_heads: int | None = None,
        causal: bool = True,
        rotary: bool = False,
        rotary_base: float = 10000.0,
    ) -> None:
        super().__init__()
        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads <= 0 or kv_heads <= 0 or head_dim <= 0 or num_heads % kv_heads:
            raise ValueError(
                f"Attention needs positive sizes and num_heads a multiple of num_kv_heads, got num_heads="
                f"{num_heads}, num_kv_heads={kv_heads}, head_dim={head_dim}"
            )
        if rotary and head_dim % 2:
            raise ValueError(f"rotary embeddings rotate pairs of features: head_dim={head_dim} must be even")
        self.num_heads = num_heads
        self.num_kv_heads = kv_heads
        self.head_dim = head_dim
        self.causal = causal
        self.rotary = rotary
        self.rotary_base = rotary_base

    @property
    def in_features(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"causal={self.causal}, rotary={self.rotary}"
        )

    def split_heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q ``[b, s, num_heads, d]``, k and v ``[b, s, num_kv_heads, d]``: views of the packed input,
        rotated when ``rotary``."""
        if qkv.dim() != 3 or qkv.shape[-1] != self.in_features:
            raise ValueError(
                f"Attention takes [batch, seq, {self.in_features}] (packed q, k, v of {self.num_heads} + "
                f"2 x {self.num_kv_heads} heads of {self.head_dim}); got shape {tuple(qkv.shape)}"
            )
        batch, seq, _ = qkv.shape
        h, g, d = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = qkv.split((h * d, g * d, g * d), dim=-1)
        q, k, v = q.view(batch, seq, h, d), k.view(batch, seq, g, d), v.view(batch, seq, g, d)
        if self.rotary:
            cos, sin = rotary_tables(seq, d, self.rotary_base, qkv.device, qkv.dtype)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return q, k, v

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        out_dtype = qkv.dtype
        q, k, v = self.split_heads(qkv.to(compute_dtype(qkv.dtype)))
        batch, seq = q.shape[0], q.shape[1]
        group = self.num_heads // self.num_kv_heads
        # [b, heads, s, d]; each key/value head repeated for the query heads it serves
        q = q.transpose(1, 2)
        k = k.transpose(1, 2).repeat_interleave(group, dim=1)
        v = v.transpose(1, 2).repeat_interleave(group, dim=1)
        with sdpa_kernel(SDPBackend.MATH):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return out.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim).to(out_dtype)


__all__ = ["Attention", "apply_rotary", "rotary_tables"]
