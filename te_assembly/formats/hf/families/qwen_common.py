"""What the Qwen families share: their sliding-window fields, read with the window off, and the
experts' fields of the Qwen MoE families."""

from __future__ import annotations

from typing import Any

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
