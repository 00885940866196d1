"""Qwen3-MoE (``Qwen3MoeForCausalLM``): Qwen3's attention (q/k norms), routed experts (its count spelt
``num_local_experts`` too since transformers 5)."""

from __future__ import annotations

from te_assembly.formats.hf.families.mlp import RoutedExperts
from te_assembly.formats.hf.families.qwen_common import (
    EVERY_LAYER_MOE,
    EXPERT_FIELDS,
    WINDOW_FIELDS,
    Qwen3Attention,
)


class Qwen3Moe(Qwen3Attention, RoutedExperts):
    architecture = "Qwen3MoeForCausalLM"
    model_type = "qwen3_moe"
    own_fields = ("attention_bias", *WINDOW_FIELDS, *EXPERT_FIELDS, "num_local_experts")
    experts_aliases = ("num_local_experts",)
    every_layer_fields = EVERY_LAYER_MOE
