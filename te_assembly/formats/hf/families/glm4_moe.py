"""GLM-4.5 (``Glm4MoeForCausalLM``): packed attention with q/k/v biases (``attention_bias``, none on o),
optional per-head q/k norms (``use_qk_norm``) and partial rotary (``partial_rotary_factor``); grouped
sigmoid routing with ungated shared experts, its first layers dense."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from te_assembly.formats.hf.families.attention import PackedAttention, partial_rotary, rotary_factor
from te_assembly.formats.hf.families.mlp import GROUPED_FIELDS, GroupedExperts

if TYPE_CHECKING:
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec


class Glm4Moe(PackedAttention, GroupedExperts):
    architecture = "Glm4MoeForCausalLM"
    model_type = "glm4_moe"
    own_fields = ("attention_bias", "use_qk_norm", "partial_rotary_factor", *GROUPED_FIELDS)
    block_name = "hf_glm_moe_layer"
    router_islands = ("Glm4MoeTopkRouter",)
    moe_defaults = {
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "n_shared_experts": 1,
        "routed_scaling_factor": 1.0,
    }

    def biases(self, r: ConfigReader) -> tuple[bool, bool]:
        return r.flag("attention_bias", False), False

    def qk_norm(self, r: ConfigReader) -> bool:
        return r.flag("use_qk_norm", False)

    def rotary_dim(self, r: ConfigReader, data: Mapping[str, Any], head_dim: int) -> int | None:
        return partial_rotary(r, data, head_dim)

    def attention_config(self, spec: HFSpec) -> dict[str, Any]:
        return {
            "attention_bias": spec.qkv_bias,
            "use_qk_norm": spec.qk_norm,
            "partial_rotary_factor": rotary_factor(spec),
        }
