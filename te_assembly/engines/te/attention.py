"""The TE engine's ``Attention`` module with TE's kernels: ``transformer_engine.pytorch.DotProductAttention``
(``qkv_format="bshd"``, ``num_gqa_groups``, ``attn_mask_type="causal"``) and TE's fused rotary embedding
(``apply_rotary_pos_emb(..., fused=True)`` on the reference module's float32 angles, so every
``rope_type`` scaling is the reference's), with the semantics of the reference module
(``te_assembly/engines/reference/attention.py``: packed q | k | v heads in, heads out).

Needs a CUDA GPU (TE's attention backends have no CPU kernels): on CPU, or with ``kernels=reference``,
the TE engine builds the reference module instead. Attention runs in the model's dtype (bfloat16 on a
GPU; float32 takes TE's unfused backend) and never in FP8: te_assembly's recipes leave TE's ``fp8_dpa``
off, so a recipe quantizes the Linear GEMMs around it, not the attention.
"""

from __future__ import annotations

from typing import Any

import torch

from te_assembly.engines.reference.attention import Attention
from te_assembly.engines.reference.kv_cache import KVCache, attend
from te_assembly.errors import EngineUnavailableError

TE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
"""What TE's DotProductAttention computes in (fused and flash backends: bf16/fp16; unfused: also fp32)."""


class TEAttention(torch.nn.Module):
    """Attention through TE's kernels. The reference module's parameters (``qk_norm``'s scales) and no
    other state-dict entries: TE's ``DotProductAttention`` is kept out of the module tree (its
    ``_extra_state``, FP8 metadata attention never uses here, would otherwise make state dicts differ
    between engines)."""

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        num_kv_heads: int | None = None,
        causal: bool = True,
        rotary: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **options: Any,
    ) -> None:
        """``options``: the reference module's other arguments (``rotary_base``, ``rope_type`` and its
        knobs, ``qk_norm``, ``qk_norm_eps``, ``sliding_window``, ``softmax_scale``), read by it alone; the
        catalog builds the reference module for what TE has no kernel for (``logit_softcap``)."""
        super().__init__()
        dev = torch.device(device) if device is not None else torch.device("cuda")
        if dev.type != "cuda" or not torch.cuda.is_available():
            raise EngineUnavailableError(
                "TE's DotProductAttention needs a CUDA GPU; use kernels=reference to run the reference "
                "attention inside the TE engine"
            )
        if dtype is not None and dtype not in TE_DTYPES:
            shown = ", ".join(str(d).removeprefix("torch.") for d in TE_DTYPES)
            raise EngineUnavailableError(
                f"TE's DotProductAttention computes in {shown}, not {str(dtype).removeprefix('torch.')}; "
                "use kernels=reference"
            )
        import transformer_engine.pytorch as te

        # Shapes, checks, the q | k | v split, qk_norm and the rotary angles are the reference module's;
        # its parameters are registered here under the same names, so state dicts match across engines.
        layout = Attention(
            num_heads, head_dim, num_kv_heads, causal, rotary=False, device=dev, dtype=dtype, **options
        )
        self.__dict__["_layout"] = layout
        for name, param in layout.named_parameters():
            self.register_parameter(name, param)
        self.rotary = rotary
        with torch.cuda.device(dev):
            attention = te.DotProductAttention(
                num_heads,
                head_dim,
                num_gqa_groups=self.layout.num_kv_heads,
                attention_dropout=0.0,
                qkv_format="bshd",
                attn_mask_type="causal" if causal else "no_mask",
                # TE's window counts the positions before the query: w - 1 of them, and none after.
                window_size=None if layout.sliding_window is None else (layout.sliding_window - 1, 0),
                softmax_type="learnable" if layout.has_sinks else "vanilla",
                softmax_scale=layout.softmax_scale,  # None: TE's 1 / sqrt(head_dim), the reference's too
            )
        # A plain attribute, not a submodule (class docstring).
        self.__dict__["_te_attention"] = attention
        self._freqs: dict[tuple[int, torch.device], torch.Tensor] = {}

    @property
    def layout(self) -> Attention:
        """The reference module whose shapes, split, qk_norm and rotary angles this one uses."""
        layout: Attention = self.__dict__["_layout"]
        return layout

    @property
    def te_attention(self) -> Any:
        """TE's ``DotProductAttention``."""
        return self.__dict__["_te_attention"]

    def extra_repr(self) -> str:
        return f"{self.layout.extra_repr()}, kernels=TE DotProductAttention"

    def _apply(self, fn: Any, recurse: bool = True) -> TEAttention:
        # .to() may give the parameters new tensors: the layout module reads the ones registered here.
        super()._apply(fn, recurse)
        for name, param in self.named_parameters(recurse=False):
            setattr(self.layout, name, param)
        return self

    def train(self, mode: bool = True) -> TEAttention:
        self.te_attention.train(mode)
        return super().train(mode)

    def _rotary_freqs(self, seq_len: int, device: torch.device) -> torch.Tensor:
        key = (seq_len, device)
        freqs = self._freqs.get(key)
        if freqs is None:
            # TE's layout for the angles: [seq, 1, 1, head_dim], float32.
            # Only rotary_dim of them: TE's fused RoPE turns those features and passes the rest.
            freqs = self.layout.rope.angles(seq_len, self.layout.rotary_dim, device)[:, None, None, :]
            self._freqs[key] = freqs
        return freqs

    @property
    def cache_layout(self) -> Attention:
        """What a ``KVCache`` keeps for this step: the reference layout's shapes."""
        return self.layout

    def use_documents(self, documents: torch.Tensor | None) -> None:
        """Packed rows: each document attended alone, with the reference module's math (TE's ``thd``
        format with ``cu_seqlens`` is not wired yet)."""
        self.__dict__["_documents"] = documents

    def use_cache(self, cache: KVCache | None) -> None:
        """Generation: attend the new positions over ``cache`` (torch's SDPA on the cached keys and
        values, the reference module's math; TE's fusers run every other step as before)."""
        self.__dict__["_kv_cache"] = cache

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb

        cache = self.__dict__.get("_kv_cache")
        if cache is not None:
            return attend(self.layout, qkv, cache, self.rotary)
        documents = self.__dict__.get("_documents")
        if documents is not None:
            return self.layout.attend_packed(qkv, documents, rotary=self.rotary)

        q, k, v = self.layout.split_heads(qkv)  # [b, s, heads, head_dim] views
        batch, seq = q.shape[0], q.shape[1]
        if self.rotary:
            freqs = self._rotary_freqs(seq, qkv.device)
            q = apply_rotary_pos_emb(q, freqs, tensor_format="bshd", interleaved=False, fused=True)
            k = apply_rotary_pos_emb(k, freqs, tensor_format="bshd", interleaved=False, fused=True)
            scale = self.layout.rope.scale
            if scale != 1.0:  # YaRN's attention factor scales cos and sin: the turned features, linearly
                turned = self.layout.rotary_dim
                q = torch.cat((q[..., :turned] * scale, q[..., turned:]), dim=-1)
                k = torch.cat((k[..., :turned] * scale, k[..., turned:]), dim=-1)
        if self.layout.has_sinks:  # TE's learnable softmax offset is this step's sinks parameter
            self.te_attention._parameters["softmax_offset"] = self.layout.sinks
        out = self.te_attention(q.contiguous(), k.contiguous(), v.contiguous(), qkv_format="bshd")
        return out.reshape(batch, seq, self.layout.num_heads * self.layout.head_dim)


__all__ = ["TE_DTYPES", "TEAttention"]
