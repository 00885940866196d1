"""Qwen3 (``Qwen3ForCausalLM``): Llama's ``attention_bias``, and a per-head RMSNorm of queries and keys
(``q_norm``, ``k_norm``) before the rotation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from te_assembly.formats.hf.families.attention import PackedAttention, attention_bias_both
from te_assembly.formats.hf.families.base import Layer
from te_assembly.formats.hf.families.mlp import DenseMLP
from te_assembly.formats.hf.families.qwen_common import WINDOW_FIELDS, WINDOW_OFF

if TYPE_CHECKING:
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec


class Qwen3(PackedAttention, DenseMLP):
    architecture = "Qwen3ForCausalLM"
    model_type = "qwen3"
    own_fields = ("attention_bias", *WINDOW_FIELDS)

    def biases(self, r: ConfigReader) -> tuple[bool, bool]:
        return attention_bias_both(r)

    def qk_norm(self, r: ConfigReader) -> bool:
        return True

    def attention_config(self, spec: HFSpec) -> dict[str, Any]:
        return {"attention_bias": spec.qkv_bias, **WINDOW_OFF}

    def attention_matches(self, layer: Layer) -> bool:
        return self.features(layer)[0]
