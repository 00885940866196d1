"""Phi-3 (``Phi3ForCausalLM``, Phi-3 and Phi-4-mini): Llama's layer with q | k | v and gate | up each
stored as one fused tensor (``qkv_proj``, ``gate_up_proj``: te_assembly's own packed layout, so each is
read whole), partial rotary (``partial_rotary_factor``), an optional window on every layer; its
dropouts held to 0.0. LongRoPE (``rope_scaling.rope_type: longrope``: Phi-3.5, Phi-4-mini and the 128k
Phi-3 models) is the RoPE reader's (``rope.py``), its ``original_max_position_embeddings`` read from the
top of ``config.json`` where ``rope_scaling`` has none, as transformers reads it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from te_assembly.formats.hf.families.attention import PackedAttention, partial_rotary, rotary_factor
from te_assembly.formats.hf.families.base import Layer, one
from te_assembly.formats.hf.families.mistral import window_of
from te_assembly.formats.hf.families.mlp import DenseMLP
from te_assembly.formats.hf.names import Rule

if TYPE_CHECKING:
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec


def _zero(v: Any) -> bool:
    return v in (0, 0.0)


class Phi3(PackedAttention, DenseMLP):
    architecture = "Phi3ForCausalLM"
    model_type = "phi3"
    own_fields = (
        "sliding_window",
        "partial_rotary_factor",
        "original_max_position_embeddings",
        "resid_pdrop",
        "embd_pdrop",
        "attention_bias",
        # Phi-4-mini's own remote-code fields, which transformers' Phi3 does not read: held to the
        # values it builds, as Phi-4-mini-instruct publishes them
        "mlp_bias",
        "lm_head_bias",
        "full_attn_mod",
        "interpolate_factor",
    )
    # Phi3Config reads these older names as longrope: the first Phi-3 128k and Phi-3-vision configs
    # on the Hub say "su"
    rope_aliases: ClassVar[dict[str, str]] = {"su": "longrope", "yarn": "longrope"}
    checked = {
        "resid_pdrop": (_zero, "0.0 (te_assembly's layers have no residual dropout)"),
        "embd_pdrop": (_zero, "0.0 (no dropout on the embeddings)"),
        "attention_bias": (lambda v: v is False, "false (Phi-3's qkv_proj and o_proj have no bias)"),
        "mlp_bias": (lambda v: v is False, "false (Phi-3's gate_up_proj and down_proj have no bias)"),
        "lm_head_bias": (lambda v: v is False, "false (Phi-3's lm_head has no bias)"),
        "full_attn_mod": (lambda v: v == 1, "1 (every layer attends alike, as transformers' Phi3 builds it)"),
        "interpolate_factor": (lambda v: v == 1, "1 (positions as LongRoPE scales them, nothing more)"),
    }

    def window(self, r: ConfigReader, data: Mapping[str, Any]) -> int | None:
        return window_of(r, data)

    def rotary_dim(self, r: ConfigReader, data: Mapping[str, Any], head_dim: int) -> int | None:
        return partial_rotary(r, data, head_dim)

    def attention_rules(self, spec: HFSpec, te: str, attn: str) -> Iterator[Rule]:
        rows = (spec.heads + 2 * spec.kv_heads) * spec.head_dim
        yield one(f"{te}qkv.basic_ops.0.weight", f"{attn}qkv_proj.weight", rows)
        yield one(f"{te}proj.basic_ops.0.weight", f"{attn}o_proj.weight", spec.hidden)

    def mlp_rules(self, spec: HFSpec, te: str, hf: str) -> Iterator[Rule]:
        yield one(f"{te}fc1.basic_ops.0.weight", f"{hf}mlp.gate_up_proj.weight", 2 * spec.ffn)
        yield one(f"{te}fc2.basic_ops.0.weight", f"{hf}mlp.down_proj.weight", spec.hidden)

    def attention_config(self, spec: HFSpec) -> dict[str, Any]:
        return {"sliding_window": spec.sliding_window, "partial_rotary_factor": rotary_factor(spec)}

    def attention_matches(self, layer: Layer) -> bool:
        qk_norm, _, qkv_bias, o_bias = self.features(layer)
        return not qk_norm and not qkv_bias and not o_bias
