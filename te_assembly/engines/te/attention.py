"""The TE engine's ``Attention`` module with TE's kernels: ``transformer_engine.pytorch.DotProductAttention``
(``qkv_format="bshd"``, ``num_gqa_groups``, ``attn_mask_type="causal"``) and TE's fused rotary embedding
(``RotaryPositionEmbedding`` + ``apply_rotary_pos_emb(..., fused=True)``), with the semantics of the
reference module (``te_assembly/engines/reference/attention.py``: packed q | k | v heads in, heads out).

Needs a CUDA GPU (TE's attention backends have no CPU kernels): on CPU, or with ``kernels=reference``,
the TE engine builds the reference module instead. Attention runs in the model's dtype (bfloat16 on a
GPU; float32 takes TE's unfused backend) and never in FP8: te_assembly's recipes leave TE's ``fp8_dpa``
off, so a recipe quantizes the Linear GEMMs around it, not the attention.
"""

from __future__ import annotations

from typing import Any

import torch

from te_assembly.engines.reference.attention import Attention
from te_assembly.errors import EngineUnavailableError

TE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
"""What TE's DotProductAttention computes in (fused and flash backends: bf16/fp16; unfused: also fp32)."""


class TEAttention(torch.nn.Module):
    """Attention through TE's kernels. No parameters and no state-dict entries, like the reference
    module: TE's ``DotProductAttention`` is kept out of the module tree (its ``_extra_state``, FP8
    metadata attention never uses here, would otherwise make state dicts differ between engines)."""

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        num_kv_heads: int | None = None,
        causal: bool = True,
        rotary: bool = False,
        rotary_base: float = 10000.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
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

        # Shapes, checks and the q | k | v split are the reference module's (it has no parameters).
        self.layout = Attention(num_heads, head_dim, num_kv_heads, causal, rotary=False)
        self.rotary = rotary
        self.rotary_base = rotary_base
        with torch.cuda.device(dev):
            attention = te.DotProductAttention(
                num_heads,
                head_dim,
                num_gqa_groups=self.layout.num_kv_heads,
                attention_dropout=0.0,
                qkv_format="bshd",
                attn_mask_type="causal" if causal else "no_mask",
            )
            rope: Any = None
            if rotary:
                from transformer_engine.pytorch.attention.rope import RotaryPositionEmbedding

                rope = RotaryPositionEmbedding(head_dim, rotary_base=rotary_base, interleaved=False)
        # Plain attributes, not submodules (class docstring); RoPE's inv_freq is a buffer too.
        self.__dict__["_te_attention"] = attention
        self.__dict__["_rope"] = rope
        self._freqs: dict[tuple[int, torch.device], torch.Tensor] = {}

    @property
    def te_attention(self) -> Any:
        """TE's ``DotProductAttention``."""
        return self.__dict__["_te_attention"]

    def extra_repr(self) -> str:
        return f"{self.layout.extra_repr()}, kernels=TE DotProductAttention"

    def train(self, mode: bool = True) -> TEAttention:
        self.te_attention.train(mode)
        return super().train(mode)

    def _rotary_freqs(self, seq_len: int, device: torch.device) -> torch.Tensor:
        key = (seq_len, device)
        freqs = self._freqs.get(key)
        if freqs is None:
            freqs = self.__dict__["_rope"](seq_len).to(device)  # [seq, 1, 1, head_dim], float32
            self._freqs[key] = freqs
        return freqs

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb

        q, k, v = self.layout.split_heads(qkv)  # [b, s, heads, head_dim] views
        batch, seq = q.shape[0], q.shape[1]
        if self.rotary:
            freqs = self._rotary_freqs(seq, qkv.device)
            q = apply_rotary_pos_emb(q, freqs, tensor_format="bshd", interleaved=False, fused=True)
            k = apply_rotary_pos_emb(k, freqs, tensor_format="bshd", interleaved=False, fused=True)
        out = self.te_attention(q.contiguous(), k.contiguous(), v.contiguous(), qkv_format="bshd")
        return out.reshape(batch, seq, self.layout.num_heads * self.layout.head_dim)


__all__ = ["TE_DTYPES", "TEAttention"]
