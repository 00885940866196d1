"""Llama (``LlamaForCausalLM``): packed attention, a dense SwiGLU MLP; ``attention_bias`` on q, k, v and
o together, ``mlp_bias`` on the MLP's projections."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from te_assembly.formats.hf.families.attention import PackedAttention, attention_bias_both
from te_assembly.formats.hf.families.base import Layer
from te_assembly.formats.hf.families.mlp import DenseMLP

if TYPE_CHECKING:
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec


class Llama(PackedAttention, DenseMLP):
    architecture = "LlamaForCausalLM"
    model_type = "llama"
    own_fields = ("attention_bias", "mlp_bias")

    def biases(self, r: ConfigReader) -> tuple[bool, bool]:
        return attention_bias_both(r)

    def mlp_bias(self, r: ConfigReader) -> bool:
        return r.flag("mlp_bias", False)

    def attention_config(self, spec: HFSpec) -> dict[str, Any]:
        return {"attention_bias": spec.qkv_bias}

    def mlp_config(self, spec: HFSpec) -> dict[str, Any]:
        return {"mlp_bias": spec.mlp_bias}

    def attention_matches(self, layer: Layer) -> bool:
        qk_norm, window, qkv_bias, o_bias = self.features(layer)
        return not qk_norm and not window and not (qkv_bias and not o_bias)  # that one is Qwen2's
