"""Qwen2 (``Qwen2ForCausalLM``): biases on q, k and v (always), none on o; Qwen's window fields read
with the window off."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from te_assembly.formats.hf.families.attention import PackedAttention
from te_assembly.formats.hf.families.base import Layer
from te_assembly.formats.hf.families.mlp import DenseMLP
from te_assembly.formats.hf.families.qwen_common import WINDOW_FIELDS, WINDOW_OFF

if TYPE_CHECKING:
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec


class Qwen2(PackedAttention, DenseMLP):
    architecture = "Qwen2ForCausalLM"
    model_type = "qwen2"
    own_fields = WINDOW_FIELDS

    def biases(self, r: ConfigReader) -> tuple[bool, bool]:
        return True, False

    def attention_config(self, spec: HFSpec) -> dict[str, Any]:
        return dict(WINDOW_OFF)

    def attention_matches(self, layer: Layer) -> bool:
        qk_norm, window, qkv_bias, o_bias = self.features(layer)
        return not qk_norm and not window and qkv_bias and not o_bias
