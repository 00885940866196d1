"""Mixtral (``MixtralForCausalLM``): Mistral's attention, routed experts (``num_local_experts``, always
renormalised), stored as the Hub has them (``block_sparse_moe.experts.N.w1/w3/w2``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from te_assembly.formats.hf.families.attention import PackedAttention
from te_assembly.formats.hf.families.base import Layer
from te_assembly.formats.hf.families.mistral import window_of
from te_assembly.formats.hf.families.mlp import RoutedExperts

if TYPE_CHECKING:
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec


class Mixtral(PackedAttention, RoutedExperts):
    architecture = "MixtralForCausalLM"
    model_type = "mixtral"
    own_fields = (
        "sliding_window",
        "num_local_experts",
        "num_experts_per_tok",
        "router_aux_loss_coef",
        "output_router_logits",
    )
    experts_field = "num_local_experts"
    norm_topk_field = None
    ffn_field = "intermediate_size"
    hub_prefix = "block_sparse_moe."
    hub_projections = ("w1", "w3", "w2")

    def window(self, r: ConfigReader, data: Mapping[str, Any]) -> int | None:
        return window_of(r, data)

    def attention_config(self, spec: HFSpec) -> dict[str, Any]:
        return {"sliding_window": spec.sliding_window}

    def attention_matches(self, layer: Layer) -> bool:
        return not self.features(layer)[0]
