"""Mistral (``MistralForCausalLM``): Llama's layer without biases, with a ``sliding_window`` on every
layer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from te_assembly.formats.hf.families.attention import PackedAttention
from te_assembly.formats.hf.families.base import Layer
from te_assembly.formats.hf.families.mlp import DenseMLP

if TYPE_CHECKING:
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec


def window_of(r: ConfigReader, data: Mapping[str, Any]) -> int | None:
    """``sliding_window`` on every layer (null: none)."""
    return r.integer("sliding_window") if data.get("sliding_window") is not None else None


class Mistral(PackedAttention, DenseMLP):
    architecture = "MistralForCausalLM"
    model_type = "mistral"
    own_fields = ("sliding_window",)

    def window(self, r: ConfigReader, data: Mapping[str, Any]) -> int | None:
        return window_of(r, data)

    def attention_config(self, spec: HFSpec) -> dict[str, Any]:
        return {"sliding_window": spec.sliding_window}

    def attention_matches(self, layer: Layer) -> bool:
        # a window is Mistral's (any biases: the comparison names the step it cannot say)
        qk_norm, window, qkv_bias, o_bias = self.features(layer)
        return not qk_norm and (window or not (qkv_bias and not o_bias))
