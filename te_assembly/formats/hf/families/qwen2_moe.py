"""Qwen2-MoE (``Qwen2MoeForCausalLM``): Qwen2's attention (its q/k/v biases behind ``qkv_bias``),
routed experts and one gated shared expert."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from te_assembly.formats.hf.families.attention import PackedAttention
from te_assembly.formats.hf.families.mlp import SharedExpert
from te_assembly.formats.hf.families.qwen_common import (
    EVERY_LAYER_MOE,
    EXPERT_FIELDS,
    WINDOW_FIELDS,
    WINDOW_OFF,
)

if TYPE_CHECKING:
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec


class Qwen2Moe(PackedAttention, SharedExpert):
    architecture = "Qwen2MoeForCausalLM"
    model_type = "qwen2_moe"
    own_fields = ("qkv_bias", *WINDOW_FIELDS, *EXPERT_FIELDS, "shared_expert_intermediate_size")
    every_layer_fields = EVERY_LAYER_MOE

    def biases(self, r: ConfigReader) -> tuple[bool, bool]:
        return r.flag("qkv_bias", True), False

    def attention_config(self, spec: HFSpec) -> dict[str, Any]:
        return {"qkv_bias": spec.qkv_bias, **WINDOW_OFF}
