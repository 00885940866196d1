"""The reference ``LatentAttention`` module: DeepSeek-V2/V3's multi-head latent attention (MLA), causal,
in plain PyTorch; both engines run it (``catalog/modules.py`` holds its arguments and formula).

The input packs, per position, every query head (``qk_nope_dim`` features that ignore position, then
``qk_rope_dim`` that turn with it) and the compressed key/value: a latent of ``kv_lora_rank`` features
and one rotary key of ``qk_rope_dim`` features that every head shares. The latent is RMS-normalised
(``kv_norm_weight``) and expanded by ``kv_b_weight`` into each head's ``qk_nope_dim`` key features and
``v_head_dim`` value features; each head's key is its expanded part followed by the shared rotary key.

Why the norm and the expansion live here rather than as fusible ops before it: the key/value cache
keeps what enters the module, ``kv_lora_rank + qk_rope_dim`` numbers per position (DeepSeek-V3: 576
instead of 128 heads x 320), and expands the whole past again at each step, as ``transformers`` does.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from te_assembly.engines.reference.attention import _TWICE, Rope, rms_norm, rotary_tables, yarn_mscale
from te_assembly.engines.reference.kv_cache import KVCache
from te_assembly.engines.reference.ops.base import compute_dtype
from te_assembly.engines.reference.ops.linear import init_weight
from te_assembly.engines.reference.rotary import apply_rotary


class LatentAttention(torch.nn.Module):
    """See the module docstring. Parameters: ``kv_norm_weight`` ``[kv_lora_rank]`` and ``kv_b_weight``
    ``[num_heads * (qk_nope_dim + v_head_dim), kv_lora_rank]``; computes in at least float32 and rounds
    the output once."""

    sliding_window: int | None = None
    has_sinks: bool = False

    def __init__(
        self,
        num_heads: int,
        qk_nope_dim: int,
        qk_rope_dim: int,
        v_head_dim: int,
        kv_lora_rank: int,
        kv_norm_eps: float = 1e-6,
        causal: bool = True,
        rope_interleaved: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **rope: Any,
    ) -> None:
        """``rope``: the rotary arguments (``rotary_base``, ``rope_type`` and its knobs), one ``Rope``."""
        super().__init__()
        sizes = (num_heads, qk_nope_dim, qk_rope_dim, v_head_dim, kv_lora_rank)
        if min(sizes) <= 0 or qk_rope_dim % 2:
            raise ValueError(
                "LatentAttention needs positive sizes and an even qk_rope_dim, got num_heads, qk_nope_dim, "
                f"qk_rope_dim, v_head_dim, kv_lora_rank = {sizes}"
            )
        self.num_heads, self.qk_nope_dim, self.qk_rope_dim = num_heads, qk_nope_dim, qk_rope_dim
        self.v_head_dim, self.kv_lora_rank, self.kv_norm_eps = v_head_dim, kv_lora_rank, kv_norm_eps
        self.rotary_dim = qk_rope_dim
        self.causal = causal
        self.rope_interleaved = rope_interleaved
        self.rope = Rope.from_args(**rope)
        self.kv_norm_weight = torch.nn.Parameter(torch.ones(kv_lora_rank, device=device, dtype=dtype))
        self.kv_b_weight = init_weight(num_heads * (qk_nope_dim + v_head_dim), kv_lora_rank, device, dtype)

    @property
    def in_features(self) -> int:
        return self.num_heads * (self.qk_nope_dim + self.qk_rope_dim) + self.kv_lora_rank + self.qk_rope_dim

    @property
    def softmax_scale(self) -> float:
        """``1 / sqrt(qk_nope_dim + qk_rope_dim)``, times YaRN's ``mscale(factor, mscale_all_dim)``
        squared (DeepSeek-V3's correction for the longer context)."""
        scale = (self.qk_nope_dim + self.qk_rope_dim) ** -0.5
        rope = self.rope
        if rope.type == "yarn" and rope.mscale_all_dim:
            m = yarn_mscale(rope.factor, rope.mscale_all_dim)
            scale = scale * m * m
        return scale

    @property
    def cached(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """What a key/value cache keeps per position: the normalised latent and the rotated shared key."""
        return (1, self.kv_lora_rank), (1, self.qk_rope_dim)

    @property
    def cache_layout(self) -> LatentAttention:
        return self

    def use_cache(self, cache: KVCache | None) -> None:
        """Attend through ``cache`` (generation: only new positions come in), or not (None)."""
        self.__dict__["_kv_cache"] = cache

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, qk_nope_dim={self.qk_nope_dim}, qk_rope_dim={self.qk_rope_dim}, "
            f"v_head_dim={self.v_head_dim}, kv_lora_rank={self.kv_lora_rank}"
            + (f", rope_type={self.rope.type}" if self.rope.type != "default" else "")
            + (", rope_interleaved=True" if self.rope_interleaved else "")
        )

    def _halves(self, t: torch.Tensor) -> torch.Tensor:
        """Rotary features as rotate-half expects them: neighbouring pairs regrouped as evens | odds."""
        return torch.cat((t[..., 0::2], t[..., 1::2]), dim=-1) if self.rope_interleaved else t

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """q without position ``[b, s, h, n]``, q to rotate ``[b, s, h, r]``, the normalised latent
        ``[b, 1, s, L]`` and the shared key to rotate ``[b, s, 1, r]``."""
        if x.dim() != 3 or x.shape[-1] != self.in_features:
            raise ValueError(
                f"LatentAttention takes [batch, seq, {self.in_features}] ({self.num_heads} query heads of "
                f"{self.qk_nope_dim} + {self.qk_rope_dim}, a latent of {self.kv_lora_rank} and a shared "
                f"key of {self.qk_rope_dim}); got shape {tuple(x.shape)}"
            )
        batch, seq, _ = x.shape
        h, n, r = self.num_heads, self.qk_nope_dim, self.qk_rope_dim
        q, latent, k_rot = x.split((h * (n + r), self.kv_lora_rank, r), dim=-1)
        q_pass, q_rot = q.view(batch, seq, h, n + r).split((n, r), dim=-1)
        latent = rms_norm(latent, self.kv_norm_weight, self.kv_norm_eps)
        return q_pass, self._halves(q_rot), latent[:, None], self._halves(k_rot.view(batch, seq, 1, r))

    def _expand(self, latent: torch.Tensor, k_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys ``[b, h, t, n + r]`` and values ``[b, h, t, v]`` from the latent ``[b, 1, t, L]`` and the
        rotated shared key ``[b, 1, t, r]``."""
        batch, _, length, _ = latent.shape
        h, n = self.num_heads, self.qk_nope_dim
        kv = torch.nn.functional.linear(latent[:, 0], self.kv_b_weight.to(latent.dtype))
        k_pass, v = (
            kv.view(batch, length, h, n + self.v_head_dim).transpose(1, 2).split((n, self.v_head_dim), dim=-1)
        )
        keys = torch.cat((k_pass, k_rot.expand(batch, h, length, self.qk_rope_dim)), dim=-1)
        return keys, v

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: Any) -> torch.Tensor:
        with sdpa_kernel(SDPBackend.MATH) if _TWICE.get() else contextlib.nullcontext():
            if mask is None:
                return torch.nn.functional.scaled_dot_product_attention(
                    q, keys, values, is_causal=self.causal and q.shape[2] > 1, scale=self.softmax_scale
                )
            return torch.nn.functional.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, scale=self.softmax_scale
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_dtype = x.dtype
        cache: KVCache | None = self.__dict__.get("_kv_cache")
        if cache is not None and not self.causal:
            raise ValueError("a key/value cache needs causal attention")
        q_pass, q_rot, latent, k_rot = self._split(x.to(cache.dtype if cache else compute_dtype(x.dtype)))
        batch, seq = q_pass.shape[0], q_pass.shape[1]
        mask = None
        if cache is None:
            cos, sin = rotary_tables(seq, self.qk_rope_dim, self.rope, x.device, q_rot.dtype)
            q_rot, k_rot = apply_rotary(q_rot, cos, sin), apply_rotary(k_rot, cos, sin)
        else:
            q_rot, k_rot = cache.rotated(self, q_rot, k_rot)
            latent, k_rot_all = cache.append(self, latent, k_rot.transpose(1, 2))
            mask = cache.mask(seq, None)
            k_rot = k_rot_all.transpose(1, 2)
        keys, values = self._expand(latent, k_rot.transpose(1, 2))
        q = torch.cat((q_pass, q_rot), dim=-1).transpose(1, 2)
        out = self._attend(q, keys, values, mask)
        return out.transpose(1, 2).reshape(batch, seq, self.num_heads * self.v_head_dim).to(out_dtype)


__all__ = ["LatentAttention"]
