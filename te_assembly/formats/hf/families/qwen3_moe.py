"""Qwen3-MoE (``Qwen3MoeForCausalLM``): Qwen3's attention (q/k norms), routed experts (its count spelt
``num_local_experts`` too since transformers 5)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from te_assembly.formats.hf.families.attention import PackedAttention, attention_bias_both
from te_assembly.formats.hf.families.base import Layer
from te_assembly.formats.hf.families.mlp import RoutedExperts
from te_assembly.formats.hf.families.qwen_common import (
    EVERY_LAYER_MOE,
    EXPERT_FIELDS,
    WINDOW_FIELDS,
    WINDOW_OFF,
)

if TYPE_CHECKING:
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec


class Qwen3Moe(PackedAttention, RoutedExperts):
    architecture = "Qwen3MoeForCausalLM"
    model_type = "qwen3_moe"
    own_fields = ("attention_bias", *WINDOW_FIELDS, *EXPERT_FIELDS, "num_local_experts")
    experts_aliases = ("num_local_experts",)
    every_layer_fields = EVERY_LAYER_MOE

    def biases(self, r: ConfigReader) -> tuple[bool, bool]:
        return attention_bias_both(r)

    def qk_norm(self, r: ConfigReader) -> bool:
        return True

    def attention_config(self, spec: HFSpec) -> dict[str, Any]:
        return {"attention_bias": spec.qkv_bias, **WINDOW_OFF}

    def attention_matches(self, layer: Layer) -> bool:
        return self.features(layer)[0]
