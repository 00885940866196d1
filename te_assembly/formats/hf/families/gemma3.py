"""Gemma 3 text (``Gemma3ForCausalLM``, ``model_type: gemma3_text``): Gemma 2's layer with a per-head
RMSNorm of queries and keys (``q_norm``, ``k_norm``, scaling by (1 + w) as every Gemma norm) before the
rotation, no soft-capping by default, five sliding layers to one full (``sliding_window_pattern``), and
two RoPEs: the full layers' (``rope_theta``, with ``rope_scaling``: the 4B's linear 8) and the sliding
layers' (``rope_local_base_freq``); transformers 5 writes both in ``rope_parameters``, keyed by layer
type."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from te_assembly.formats.hf.families.attention import rope_of
from te_assembly.formats.hf.families.base import Layer, Shape
from te_assembly.formats.hf.families.gemma2 import Gemma2
from te_assembly.formats.hf.rope import read_rope, read_section, scaling_of

if TYPE_CHECKING:
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec

GLOBAL_THETA, LOCAL_THETA = 1_000_000.0, 10_000.0
"""transformers' defaults for the full and the sliding layers' bases."""
SECTIONS = ("full_attention", "sliding_attention")


def _nested(data: Mapping[str, Any]) -> bool:
    """``rope_parameters`` keyed by layer type (transformers 5), not one RoPE."""
    params = data.get("rope_parameters")
    return isinstance(params, Mapping) and any(k in params for k in SECTIONS)


class Gemma3(Gemma2):
    architecture = "Gemma3ForCausalLM"
    model_type = "gemma3_text"
    own_fields = (*Gemma2.own_fields, "rope_local_base_freq", "sliding_window_pattern")
    norm_islands = ("Gemma3RMSNorm",)

    def qk_norm(self, r: ConfigReader) -> bool:
        return True

    def read_rope(self, r: ConfigReader, data: Mapping[str, Any]) -> dict[str, Any]:
        if _nested(data):
            return self._section(r, data, "full_attention", GLOBAL_THETA)
        return read_rope(r, {**data, "rope_theta": data.get("rope_theta", GLOBAL_THETA)}, partial=False)

    def _section(self, r: ConfigReader, data: Mapping[str, Any], name: str, theta: float) -> dict[str, Any]:
        params = data["rope_parameters"]
        extra = sorted(set(params) - set(SECTIONS))
        if extra and name == "full_attention":  # said once
            r.refuse("rope_parameters", f"rope_parameters.{extra[0]}: expected only {', '.join(SECTIONS)}")
        section = params.get(name) or {"rope_type": "default"}
        if isinstance(section, Mapping):
            section = {"rope_theta": theta, **section}
        return read_section(r, f"rope_parameters.{name}", section, data)

    def read(self, r: ConfigReader, data: Mapping[str, Any], shape: Shape) -> dict[str, Any]:
        if _nested(data):
            local = self._section(r, data, "sliding_attention", LOCAL_THETA)
        else:
            theta = r.number("rope_local_base_freq", LOCAL_THETA, becomes=("Attention", "rotary_base"))
            local = {"rope_theta": theta, "rope_type": "default"}
        return {**super().read(r, data, shape), "local_rope": local}

    def every_full(self, r: ConfigReader) -> int:
        return r.integer("sliding_window_pattern", 6)

    def attention_config(self, spec: HFSpec) -> dict[str, Any]:
        """Both RoPEs in ``rope_parameters`` by layer type, as transformers 5 writes them."""
        sections = {"full_attention": spec.rope, "sliding_attention": spec.local_rope or spec.rope}
        nested = {
            name: {"rope_type": "default", **(scaling_of(rope) or {}), "rope_theta": rope["rope_theta"]}
            for name, rope in sections.items()
        }
        return {**super().attention_config(spec), "rope_parameters": nested, "rope_scaling": None}

    def attention_matches(self, layer: Layer) -> bool:
        qk_norm, _, qkv_bias, o_bias = self.features(layer)
        attn = layer.args("Attention")
        return qk_norm and attn["qk_norm_over"] == "head" and qkv_bias == o_bias

    def from_plan(self, layer: Layer, layers: list[Layer]) -> dict[str, Any]:
        """The full layers' RoPE is ``rope``, the sliding layers' ``local_rope``."""
        out = super().from_plan(layer, layers)
        attns = [group.args("Attention") for group in layers]
        full = [a for a in attns if a["sliding_window"] is None]
        sliding = [a for a in attns if a["sliding_window"] is not None]
        out["rope"] = rope_of(full[0]) if full else rope_of(attns[0])
        out["local_rope"] = rope_of(sliding[0]) if sliding else dict(out["rope"])
        return out
