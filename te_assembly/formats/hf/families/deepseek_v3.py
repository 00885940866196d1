"""DeepSeek-V3 (``DeepseekV3ForCausalLM``): multi-head latent attention and GLM-4.5's grouped sigmoid
routing (with DeepSeek's defaults), its first layers dense; the fields the Hub's copies write for
DeepSeek's remote code held to what transformers' DeepseekV3 computes."""

from __future__ import annotations

from te_assembly.formats.hf.families.attention import MLA_FIELDS, LatentAttentionPart
from te_assembly.formats.hf.families.base import Check
from te_assembly.formats.hf.families.mlp import GROUPED_FIELDS, GroupedExperts

REMOTE_CODE_CHECKED: dict[str, Check] = {
    "scoring_func": (lambda v: v == "sigmoid", "sigmoid (transformers' DeepseekV3TopkRouter)"),
    "topk_method": (
        lambda v: v == "noaux_tc",
        "noaux_tc (the expert bias chooses, groups by their best two)",
    ),
    "moe_layer_freq": (lambda v: type(v) is int and v == 1, "1 (every layer after the dense ones a MoE)"),
    "ep_size": (lambda v: type(v) is int and v >= 1, "a positive integer (the remote code's layout)"),
    "aux_loss_alpha": (
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0,
        "a number >= 0 (the remote code's training loss, which its noaux_tc gate never computes)",
    ),
    "seq_aux": (lambda v: isinstance(v, bool), "true or false (as aux_loss_alpha)"),
}
"""DeepSeek's own ``config.json`` fields, held to what transformers' DeepseekV3 computes, or read as the
layout and training-only settings they are."""


class DeepseekV3(LatentAttentionPart, GroupedExperts):
    architecture = "DeepseekV3ForCausalLM"
    model_type = "deepseek_v3"
    own_fields = (*MLA_FIELDS, *GROUPED_FIELDS, *REMOTE_CODE_CHECKED)
    checked = REMOTE_CODE_CHECKED
    block_name = "hf_deepseek_layer"
    dense_block = "hf_deepseek_dense_layer"
    router_islands = ("DeepseekV3TopkRouter",)
    moe_defaults = {
        "n_group": 8,
        "topk_group": 4,
        "first_k_dense_replace": 3,
        "n_shared_experts": 1,
        "routed_scaling_factor": 2.5,
    }
