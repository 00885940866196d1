"""What the Qwen families share: their sliding-window fields, read with the window off, the experts'
fields of the Qwen MoE families, and Qwen3's attention."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from te_assembly.formats.hf.families.attention import PackedAttention, attention_bias_both
from te_assembly.formats.hf.families.base import Layer

if TYPE_CHECKING:
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec

WINDOW_FIELDS = ("sliding_window", "max_window_layers")
"""Qwen's sliding-window fields, read with the window off (``use_sliding_window`` is held to false)."""
EXPERT_FIELDS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "router_aux_loss_coef",
    "output_router_logits",
)
WINDOW_OFF: dict[str, Any] = {"use_sliding_window": False}
"""What an export writes of the window: off."""
EVERY_LAYER_MOE: dict[str, Any] = {"decoder_sparse_step": 1, "mlp_only_layers": []}
"""Qwen2/3-MoE's export: every layer a mixture of experts, said explicitly."""


class Qwen3Attention(PackedAttention):
    """Qwen3's attention (dense and MoE alike): Llama's ``attention_bias`` and a per-head RMSNorm of the
    queries and keys before the rotation, the window off."""

    def biases(self, r: ConfigReader) -> tuple[bool, bool]:
        return attention_bias_both(r)

    def qk_norm(self, r: ConfigReader) -> bool:
        return True

    def attention_config(self, spec: HFSpec) -> dict[str, Any]:
        return {"attention_bias": spec.qkv_bias, **WINDOW_OFF}

    def attention_matches(self, layer: Layer) -> bool:
        return self.features(layer)[0]
