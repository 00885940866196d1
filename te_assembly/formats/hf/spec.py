"""A checkpoint's architecture in te_assembly's terms: what its ``config.json`` says (``config.py``
reads it, its family's file says what each field means), written as a te_assembly model (``layout.py``)
and back (``mapping.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class HFSpec:
    """A checkpoint's architecture in te_assembly's terms (``layout.py`` writes it as YAML)."""

    architecture: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    tied: bool
    rope: dict[str, Any]
    """``rope_theta``, ``rope_type`` and, for the scaled types, ``factor`` etc. (hf_*_layer's dims)."""
    sliding_window: int | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    experts: int = 0
    top_k: int = 0
    pre_softmax: bool = False
    aux_loss_coeff: float = 0.0
    shared_ffn: int = 0
    rotary_dim: int | None = None
    """Partial rotary (GLM-4.5's ``partial_rotary_factor * head_dim``); None: the whole head."""
    first_dense: int = 0
    """The first layers with a dense MLP of ``dense_ffn`` (GLM-4.5's ``first_k_dense_replace``)."""
    dense_ffn: int = 0
    mtp_layers: int = 0
    """The multi-token prediction layers ``config.json`` declares after ``layers``
    (``num_nextn_predict_layers``; transformers' default is 1, and it saves none of their tensors)."""
    dropped_layers: int = 0
    """Of those, the ones the import leaves out by request when the checkpoint holds them
    (``import_hf.ignore_fields=[num_nextn_predict_layers]``)."""
    mtp_modules: int = 0
    """Of those, the ones the model has: multi-token prediction modules after the final layer, read from
    the checkpoint's ``model.layers.{layers + k}.*`` tensors and written back; 0 where the checkpoint
    holds none (as transformers saves it) or they are left out."""
    mla: dict[str, Any] = field(default_factory=dict)
    """DeepSeek-V3's latent attention (``LatentAttention``): ``q_lora_rank``, ``kv_lora_rank``,
    ``qk_nope_dim``, ``qk_rope_dim``, ``v_head_dim``, ``rope_interleaved``, ``attention_bias``; empty for
    the families with packed q | k | v heads."""
    layer_windows: tuple[int | None, ...] = ()
    """Each layer's sliding window when they differ (GPT-OSS's ``layer_types``); empty: every layer has
    ``sliding_window``."""
    local_rope: dict[str, Any] = field(default_factory=dict)
    """The RoPE of the sliding-window layers when it is not ``rope`` (Gemma 3's ``rope_local_base_freq``);
    empty: every layer turns by ``rope``."""
    softmax_scale: float | None = None
    """What attention multiplies q k^T by (Gemma's ``query_pre_attn_scalar ** -0.5``); None: 1 /
    sqrt(head_dim)."""
    attn_softcap: float | None = None
    """Soft-capping of the attention logits (Gemma 2's ``attn_logit_softcapping``)."""
    final_softcap: float | None = None
    """Soft-capping of the vocabulary logits (Gemma 2's ``final_logit_softcapping``)."""
    embed_scale: float | None = None
    """What the embeddings are multiplied by before the first layer (Gemma's sqrt(hidden_size))."""
    zero_centered: bool = False
    """Every RMSNorm scales by (1 + w), its stored weight w starting at zero (Gemma's norms)."""
    clamp: dict[str, float] = field(default_factory=dict)
    """GPT-OSS's experts: ``swiglu_limit`` and ``swiglu_alpha``."""
    router: dict[str, Any] = field(default_factory=dict)
    """The family's own TopKRouter arguments beyond experts and top_k (GLM-4.5's sigmoid scores, expert
    bias, groups and scaling), as the router step takes them."""
    init_std: float = 0.02
    dtype: str = "float32"
    metadata: dict[str, Any] = field(default_factory=dict)
    """The checkpoint's own metadata fields (token ids, max_position_embeddings...), kept for export."""

    def notes(self) -> list[str]:
        """What the import leaves out of ``config.json``'s model, or adds to what transformers loads,
        one line each (the CLI says them)."""
        if not self.mtp_layers:
            return []
        if self.dropped_layers:
            return [
                f"left out the {self.dropped_layers} multi-token prediction layer(s) the checkpoint holds "
                "(import_hf.ignore_fields=[num_nextn_predict_layers])"
            ]
        if self.mtp_modules:
            return [
                f"imported the {self.mtp_modules} multi-token prediction module(s) the checkpoint holds "
                f"(model.layers.{self.layers}...): trained with weight train.mtp_weight; transformers "
                "loads the model without them"
            ]
        return [
            f"config.json declares {self.mtp_layers} multi-token prediction layer(s) "
            "(num_nextn_predict_layers) and the checkpoint holds none of their tensors, as transformers "
            "saves it: the model is the one transformers loads, without them"
        ]


__all__ = ["HFSpec"]
