"""Attention written out the long way, for tests: explicit loops over batch, head and query position,
softmax(q . k / sqrt(d) + causal mask) v in float64, grouped-query attention and rotary embeddings from
their definitions. Nothing here is shared with ``te_assembly/engines/reference/attention.py``: it splits the
packed input itself, rotates pair by pair with ``math.cos``/``math.sin`` of each angle, and picks each
query head's key/value head by index.

Everything is built from differentiable torch ops on slices, so autograd gives its gradients too.
"""

from __future__ import annotations

import math

import torch


def _in_float32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


def rotate_pairs(t: torch.Tensor, position: int, base: float, float32_tables: bool = False) -> torch.Tensor:
    """``t`` (one head at one position, ``[d]``) turned by RoPE: features ``j`` and ``j + d/2`` form a
    pair turned by the angle ``position * base ** (-2j / d)``. ``float32_tables``: each frequency, angle,
    cosine and sine rounded to float32 one scalar at a time, as TE and transformers make their tables."""
    d = t.shape[0]
    half = d // 2
    firsts, seconds = [], []
    for j in range(half):
        if float32_tables:
            one = torch.tensor(1.0, dtype=torch.float32)
            freq = one / (
                torch.tensor(base, dtype=torch.float32) ** torch.tensor(2.0 * j / d, dtype=torch.float32)
            )
            angle32 = torch.tensor(float(position), dtype=torch.float32) * freq
            c, s = float(angle32.cos()), float(angle32.sin())
        else:
            angle = position * base ** (-2.0 * j / d)
            c, s = math.cos(angle), math.sin(angle)
        a, b = t[j], t[j + half]
        firsts.append(a * c - b * s)
        seconds.append(b * c + a * s)
    return torch.stack(firsts + seconds)


def naive_attention(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    *,
    causal: bool = True,
    rotary: bool = False,
    base: float = 10000.0,
    float32_tables: bool = True,
) -> torch.Tensor:
    """``qkv`` ``[batch, seq, (num_heads + 2 num_kv_heads) * head_dim]`` (all q heads, all k heads, all v
    heads) -> ``[batch, seq, num_heads * head_dim]``, in float64."""
    qkv = qkv.double()
    batch, seq, _ = qkv.shape
    d = head_dim
    k_start = num_heads * d
    v_start = k_start + num_kv_heads * d
    per_group = num_heads // num_kv_heads

    def q_of(b: int, h: int, p: int) -> torch.Tensor:
        t = qkv[b, p, h * d : (h + 1) * d]
        return rotate_pairs(t, p, base, float32_tables) if rotary else t

    def k_of(b: int, g: int, p: int) -> torch.Tensor:
        t = qkv[b, p, k_start + g * d : k_start + (g + 1) * d]
        return rotate_pairs(t, p, base, float32_tables) if rotary else t

    def v_of(b: int, g: int, p: int) -> torch.Tensor:
        return qkv[b, p, v_start + g * d : v_start + (g + 1) * d]

    rows = []
    for b in range(batch):
        positions = []
        for p in range(seq):
            heads = []
            for h in range(num_heads):
                g = h // per_group  # the key/value head this query head reads
                q = q_of(b, h, p)
                visible = range(p + 1) if causal else range(seq)
                scores = torch.stack([(q * k_of(b, g, j)).sum() / math.sqrt(d) for j in visible])
                weights = torch.exp(scores - scores.max())
                weights = weights / weights.sum()
                heads.append(sum(w * v_of(b, g, j) for w, j in zip(weights, visible, strict=True)))
            positions.append(torch.cat(heads))
        rows.append(torch.stack(positions))
    return torch.stack(rows)
