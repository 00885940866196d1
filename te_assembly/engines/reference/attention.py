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
  and k by ``p * f_j``, ``f_j = rotary_base ** (-2j / head_dim)``, computed in float32 as TE and
  ``transformers`` compute them (so a float64 model's tables equal theirs bit for bit); ``rope_type``
  rescales the frequencies as Hugging Face's ``rope_scaling`` types do: ``linear`` divides every
  ``f_j`` by ``rope_factor``, ``llama3`` divides the low frequencies by it and blends the middle band
  (Llama 3.1's published formula);
- ``qk_norm``: each query and key head RMS-normalised over its ``head_dim`` features with its own
  learned scale (``q_norm_weight``, ``k_norm_weight``) before the rotation (Qwen3's ``q_norm``/``k_norm``);
- softmax scale ``1 / sqrt(head_dim)``; causal: position ``p`` attends to positions ``<= p``, and with a
  ``sliding_window`` ``w`` only to the last ``w`` of them (``p - w < q <= p``: Mistral's window, TE's
  ``window_size=(w - 1, 0)``).

``scaled_dot_product_attention`` chooses its fastest kernel (flash attention on CPU, as
``transformers`` runs it), which keeps one log-sum-exp per row and head for backward instead of the
probabilities. Its backward cannot be differentiated again: inside ``twice_differentiable()``
(gradient checks, gradient penalties) the math backend runs instead, the textbook computation, twice
differentiable like every other reference op, at about twice the time.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from te_assembly.catalog.modules import ROPE_TYPES
from te_assembly.engines.reference.kv_cache import KVCache, attend
from te_assembly.engines.reference.ops.base import compute_dtype
from te_assembly.engines.reference.packing import document_mask, positions_in_documents
from te_assembly.engines.reference.rotary import apply_rotary, cos_sin
from te_assembly.engines.reference.written_out import attend_written_out, causal_mask

_TWICE = contextvars.ContextVar("te_assembly_twice_differentiable", default=False)


@contextlib.contextmanager
def twice_differentiable() -> Iterator[None]:
    """Inside: every reference ``Attention`` computes with SDPA's math backend, so gradients of its
    gradients exist (``torch.autograd.gradgradcheck``, ``grad(..., create_graph=True)`` then backward).
    Outside, a second backward through attention fails in torch ("derivative for
    aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented")."""
    token = _TWICE.set(True)
    try:
        yield
    finally:
        _TWICE.reset(token)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context ``factor`` times the original: ``0.1 mscale ln(factor)
    + 1`` (1 without scaling), as the YaRN paper and DeepSeek-V3 compute it."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class Rope:
    """How the rotary frequencies are made: the base and a ``ROPE_TYPES`` scaling with its knobs."""

    base: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.type not in ROPE_TYPES:
            raise ValueError(f"rope_type must be one of {', '.join(ROPE_TYPES)}, got {self.type!r}")
        if self.type == "longrope" and (not self.short_factor or not self.long_factor):
            raise ValueError("rope_type longrope needs rope_short_factor and rope_long_factor")

    @classmethod
    def from_args(
        cls,
        rotary_base: float = 10000.0,
        rope_type: str = "default",
        rope_factor: float = 1.0,
        rope_low_freq_factor: float = 1.0,
        rope_high_freq_factor: float = 4.0,
        rope_original_max_positions: int = 8192,
        rope_beta_fast: float = 32.0,
        rope_beta_slow: float = 1.0,
        rope_mscale: float | None = None,
        rope_mscale_all_dim: float | None = None,
        rope_attention_factor: float | None = None,
        rope_truncate: bool = True,
        rope_short_factor: list[float] | None = None,
        rope_long_factor: list[float] | None = None,
    ) -> Rope:
        """The rotary arguments as the catalog names them (``rotary_base``, ``rope_*``: the attention
        modules' keyword arguments, flat in a model's YAML), as one object."""
        return cls(
            rotary_base,
            rope_type,
            rope_factor,
            rope_low_freq_factor,
            rope_high_freq_factor,
            rope_original_max_positions,
            rope_beta_fast,
            rope_beta_slow,
            rope_mscale,
            rope_mscale_all_dim,
            rope_attention_factor,
            rope_truncate,
            tuple(rope_short_factor) if rope_short_factor else None,
            tuple(rope_long_factor) if rope_long_factor else None,
        )

    @property
    def scale(self) -> float:
        """What cos and sin are multiplied by: 1, or YaRN's attention factor (given, or from ``factor``,
        ``mscale`` and ``mscale_all_dim`` as the YaRN paper and DeepSeek-V3 compute it)."""
        if self.type == "longrope":
            if self.attention_factor is not None:
                return self.attention_factor
            if self.factor <= 1.0:
                return 1.0
            return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_positions))
        if self.type != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)
        return yarn_mscale(self.factor)

    def inv_freq(
        self, head_dim: int, device: torch.device | None = None, seq_len: int | None = None
    ) -> torch.Tensor:
        """``[head_dim / 2]`` float32 frequencies, each operation in the order the published formulas
        give it, so every float32 rounding is the one TE and ``transformers`` make. ``head_dim``: the
        rotated features (all of a head's, or its first ``rotary_dim``)."""
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).to(torch.float32)
        if self.type == "yarn":
            return self._yarn(exponents, head_dim)
        if self.type == "longrope":  # the long factors past the original context (transformers' choice)
            long = seq_len is not None and seq_len > self.original_max_positions
            factors = self.long_factor if long else self.short_factor
            ext = torch.tensor(factors, dtype=torch.float32, device=device)
            if ext.numel() != exponents.numel():
                raise ValueError(f"longrope has {ext.numel()} factors for {exponents.numel()} rotated pairs")
            return 1.0 / (ext * self.base ** (exponents / head_dim))
        inv_freq = 1.0 / (self.base ** (exponents / head_dim))
        if self.type == "linear":
            return inv_freq / self.factor
        if self.type != "llama3":
            return inv_freq
        low_wavelen = self.original_max_positions / self.low_freq_factor
        high_wavelen = self.original_max_positions / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (self.original_max_positions / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)

    def _yarn(self, exponents: torch.Tensor, dim: int) -> torch.Tensor:
        """YaRN: the low frequencies interpolated (divided by ``factor``), the high ones kept, a linear
        ramp between the dimensions that turn ``beta_slow`` and ``beta_fast`` times over the original
        context (rounded outwards unless ``truncate`` is false)."""
        pos_freqs = self.base ** (exponents / dim)
        extrapolation = 1.0 / pos_freqs
        interpolation = 1.0 / (self.factor * pos_freqs)

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(self.original_max_positions / (rotations * 2 * math.pi))) / (
                2 * math.log(self.base)
            )

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # the published formula's guard against a zero-width ramp
        ramp = (torch.arange(dim // 2, dtype=torch.float32, device=exponents.device) - low) / (high - low)
        extrapolation_factor = 1 - torch.clamp(ramp, 0, 1)
        return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor

    def angles(self, seq_len: int, head_dim: int, device: torch.device | None = None) -> torch.Tensor:
        """``[seq_len, head_dim]`` float32 rotation angles, rotate-half layout (each frequency twice)."""
        positions = torch.arange(seq_len, device=device, dtype=torch.int64).to(torch.float32)
        angles = positions[:, None] * self.inv_freq(head_dim, device, seq_len)[None, :]
        return torch.cat((angles, angles), dim=-1)


def _check_window_and_cap(causal: bool, window: int | None, cap: float | None) -> None:
    if window is not None and (not causal or window <= 0):
        raise ValueError(f"Attention sliding_window needs causal attention and a positive size, got {window}")
    if cap is not None and cap <= 0:
        raise ValueError(f"Attention logit_softcap must be positive, got {cap}")


def _checked_rope(args: dict[str, Any], rotary: bool, rotated: int) -> Rope:
    """The ``Rope`` of an attention step's rotary arguments, LongRoPE's factors one per rotated pair."""
    rope = Rope.from_args(**args)
    factors = rope.short_factor if rope.type == "longrope" else None
    if rotary and factors is not None and len(factors) != rotated // 2:
        raise ValueError(f"longrope needs one factor per rotated pair: {rotated // 2}, got {len(factors)}")
    return rope


def rotary_tables(
    seq_len: int, head_dim: int, rope: Rope, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, ``[seq_len, head_dim]`` (``head_dim``: the rotated features), computed in float32
    (times YaRN's attention factor) and rounded once to ``dtype``."""
    return cos_sin(rope.angles(seq_len, head_dim, device), rope.scale, dtype)


def rms_norm(t: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``t / sqrt(mean(t^2) + eps) * weight`` over the last dimension (the RMSNorm op's formula)."""
    return t * torch.rsqrt(t.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.to(t.dtype)


class Attention(torch.nn.Module):
    """See the module docstring. No parameters but the per-head norm scales of ``qk_norm``; computes in
    at least float32 and rounds the output once (TE's fused kernels accumulate in float32)."""

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        num_kv_heads: int | None = None,
        causal: bool = True,
        rotary: bool = False,
        rotary_dim: int | None = None,
        qk_norm: bool = False,
        qk_norm_eps: float = 1e-6,
        qk_norm_over: str = "head",
        qk_norm_zero_centered: bool = False,
        softmax_scale: float | None = None,
        logit_softcap: float | None = None,
        sliding_window: int | None = None,
        sinks: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **rope: Any,
    ) -> None:
        """``rope``: the rotary arguments (``rotary_base``, ``rope_type`` and its knobs), one ``Rope``."""
        super().__init__()
        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads <= 0 or kv_heads <= 0 or head_dim <= 0 or num_heads % kv_heads:
            raise ValueError(
                f"Attention needs positive sizes and num_heads a multiple of num_kv_heads, got num_heads="
                f"{num_heads}, num_kv_heads={kv_heads}, head_dim={head_dim}"
            )
        rotated = head_dim if rotary_dim is None else rotary_dim
        if rotary and (rotated % 2 or not 0 < rotated <= head_dim):
            raise ValueError(
                f"rotary embeddings rotate pairs of a head's features: rotary_dim={rotated} must be even and "
                f"at most head_dim={head_dim}"
            )
        self.rotary_dim = rotated
        self.num_heads = num_heads
        self.num_kv_heads = kv_heads
        self.head_dim = head_dim
        self.causal = causal
        _check_window_and_cap(causal, sliding_window, logit_softcap)
        self.sliding_window = sliding_window
        self.rotary = rotary
        self.rope = _checked_rope(rope, rotary, rotated)
        self.rotary_base = self.rope.base
        self.qk_norm = qk_norm
        self.qk_norm_eps = qk_norm_eps
        if qk_norm_over not in ("head", "projection"):
            raise ValueError(f"qk_norm_over is head or projection, got {qk_norm_over!r}")
        self.qk_norm_over = qk_norm_over
        self.qk_norm_zero_centered = qk_norm_zero_centered
        if qk_norm:
            self._add_norm_scales(device, dtype)
        self.softmax_scale = softmax_scale
        self.logit_softcap = logit_softcap
        self.has_sinks = sinks
        if sinks:
            self.sinks = torch.nn.Parameter(torch.zeros(num_heads, device=device, dtype=dtype))

    @property
    def in_features(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"causal={self.causal}, rotary={self.rotary}"
            + (f", rope_type={self.rope.type}" if self.rotary and self.rope.type != "default" else "")
            + (f", qk_norm={self.qk_norm_over}" if self.qk_norm else "")
            + (f", sliding_window={self.sliding_window}" if self.sliding_window is not None else "")
            + (f", softmax_scale={self.softmax_scale:g}" if self.softmax_scale is not None else "")
            + (f", logit_softcap={self.logit_softcap:g}" if self.logit_softcap is not None else "")
            + (", sinks=True" if self.has_sinks else "")
        )

    def split_heads(
        self, qkv: torch.Tensor, rotate: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q ``[b, s, num_heads, d]``, k and v ``[b, s, num_kv_heads, d]``: views of the packed input,
        q and k normalised when ``qk_norm`` and rotated from position 0 when ``rotary`` and ``rotate``."""
        if qkv.dim() != 3 or qkv.shape[-1] != self.in_features:
            raise ValueError(
                f"Attention takes [batch, seq, {self.in_features}] (packed q, k, v of {self.num_heads} + "
                f"2 x {self.num_kv_heads} heads of {self.head_dim}); got shape {tuple(qkv.shape)}"
            )
        batch, seq, _ = qkv.shape
        h, g, d = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = qkv.split((h * d, g * d, g * d), dim=-1)
        if self.qk_norm and self.qk_norm_over == "projection":  # over all heads' features at once
            q, k = self._norms(q, k)
        q, k, v = q.view(batch, seq, h, d), k.view(batch, seq, g, d), v.view(batch, seq, g, d)
        if self.qk_norm and self.qk_norm_over == "head":
            q, k = self._norms(q, k)
        if self.rotary and rotate:
            cos, sin = rotary_tables(seq, self.rotary_dim, self.rope, qkv.device, qkv.dtype)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return q, k, v

    def _add_norm_scales(self, device: torch.device | str | None, dtype: torch.dtype | None) -> None:
        """``qk_norm``'s learned scales: per head's features, or over the whole projection."""
        whole = self.qk_norm_over == "projection"
        h, g, d = self.num_heads, self.num_kv_heads, self.head_dim
        q_width, k_width = (h * d, g * d) if whole else (d, d)
        start = torch.zeros if self.qk_norm_zero_centered else torch.ones  # the scale starts at one
        self.q_norm_weight = torch.nn.Parameter(start(q_width, device=device, dtype=dtype))
        self.k_norm_weight = torch.nn.Parameter(start(k_width, device=device, dtype=dtype))

    def _norms(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q_scale: torch.Tensor = self.q_norm_weight
        k_scale: torch.Tensor = self.k_norm_weight
        if self.qk_norm_zero_centered:
            q_scale, k_scale = 1 + q_scale, 1 + k_scale
        return rms_norm(q, q_scale, self.qk_norm_eps), rms_norm(k, k_scale, self.qk_norm_eps)

    @property
    def written_out(self) -> bool:
        """Whether it needs the written-out formula (``written_out.py``): sinks or soft-capped logits,
        which SDPA has no argument for."""
        return self.has_sinks or self.logit_softcap is not None

    def attend_written_out(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``attend_written_out`` with this step's scale, cap and sinks."""
        sinks = self.sinks if self.has_sinks else None
        return attend_written_out(q, k, v, mask, self.softmax_scale, self.logit_softcap, sinks)

    @property
    def cached(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """What a key/value cache keeps per position: keys and values of every key/value head."""
        return (self.num_kv_heads, self.head_dim), (self.num_kv_heads, self.head_dim)

    @property
    def cache_layout(self) -> Attention:
        """The module whose shapes a ``KVCache`` keeps (``kv_cache.cache_layouts``): this one."""
        return self

    def use_cache(self, cache: KVCache | None) -> None:
        """Attend through ``cache`` (generation: only new positions come in), or not (None)."""
        self.__dict__["_kv_cache"] = cache

    def use_documents(self, documents: torch.Tensor | None) -> None:
        """Attend within each packed document (``packing.py``), or across the row (None)."""
        self.__dict__["_documents"] = documents

    def attend_packed(
        self, qkv: torch.Tensor, documents: torch.Tensor, rotary: bool | None = None
    ) -> torch.Tensor:
        """Each document of a packed row alone: a block-diagonal causal mask, rotary positions that
        restart at each document's start (``packing.py``). ``rotary``: whether to turn q and k (None:
        this step's ``rotary``; the TE engine's step holds it beside its layout)."""
        out_dtype = qkv.dtype
        q, k, v = self.split_heads(qkv.to(compute_dtype(qkv.dtype)), rotate=False)
        batch, seq = q.shape[0], q.shape[1]
        if documents.shape != (batch, seq):
            raise ValueError(
                f"packed documents {tuple(documents.shape)} do not fit a batch of {batch} x {seq}"
            )
        if self.rotary if rotary is None else rotary:
            table = self.rope.angles(seq, self.rotary_dim, q.device)
            cos, sin = cos_sin(table[positions_in_documents(documents)], self.rope.scale, q.dtype)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        mask = document_mask(documents, self.sliding_window)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.written_out:
            out = self.attend_written_out(q, k, v, mask)
        else:
            with sdpa_kernel(SDPBackend.MATH) if _TWICE.get() else contextlib.nullcontext():
                gqa = self.num_heads != self.num_kv_heads
                out = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, enable_gqa=gqa, scale=self.softmax_scale
                )
        return out.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim).to(out_dtype)

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        cache = self.__dict__.get("_kv_cache")
        if cache is not None:
            return attend(self, qkv, cache, self.rotary)
        documents = self.__dict__.get("_documents")
        if documents is not None:
            return self.attend_packed(qkv, documents)
        out_dtype = qkv.dtype
        q, k, v = self.split_heads(qkv.to(compute_dtype(qkv.dtype)))
        batch, seq = q.shape[0], q.shape[1]
        # [b, heads, s, d]; query head i reads key/value head i // group (enable_gqa: SDPA's grouping,
        # without a copy of the keys and values per query head)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        gqa = self.num_heads != self.num_kv_heads
        if self.written_out:
            mask = causal_mask(seq, self.sliding_window, q.device) if self.causal else None
            out = self.attend_written_out(q, k, v, mask)
            return out.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim).to(out_dtype)
        with sdpa_kernel(SDPBackend.MATH) if _TWICE.get() else contextlib.nullcontext():
            if self.sliding_window is not None and self.sliding_window < seq:
                mask = causal_mask(seq, self.sliding_window, q.device)
                out = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, enable_gqa=gqa, scale=self.softmax_scale
                )
            else:
                out = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=self.causal, enable_gqa=gqa, scale=self.softmax_scale
                )
        return out.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim).to(out_dtype)


__all__ = [
    "ROPE_TYPES",
    "Attention",
    "Rope",
    "apply_rotary",
    "rms_norm",
    "rotary_tables",
    "twice_differentiable",
    "yarn_mscale",
]
