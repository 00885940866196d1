"""OLMo 2 (``Olmo2ForCausalLM``): an RMSNorm after attention and after the MLP, before each residual
(``post_attention_layernorm``, ``post_feedforward_layernorm``; no norm before either), and the queries
and keys RMS-normalised over their whole projection before the rotation (``q_norm``, ``k_norm``:
``Attention``'s ``qk_norm_over: projection``); Llama's ``attention_bias``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from te_assembly.formats.hf.families.attention import PackedAttention, attention_bias_both
from te_assembly.formats.hf.families.base import Layer, dense_mlp_rules, one
from te_assembly.formats.hf.families.mlp import DenseMLP
from te_assembly.formats.hf.names import Rule

if TYPE_CHECKING:
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec


class Olmo2(PackedAttention, DenseMLP):
    architecture = "Olmo2ForCausalLM"
    model_type = "olmo2"
    own_fields = ("attention_bias",)
    block_name = "hf_olmo2_layer"

    def biases(self, r: ConfigReader) -> tuple[bool, bool]:
        return attention_bias_both(r)

    def qk_norm(self, r: ConfigReader) -> bool:
        return True

    def layer_rules(self, spec: HFSpec, te: str, hf: str, dense: bool) -> Iterator[Rule]:
        attn = f"{hf}self_attn."
        q, kv = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
        yield from (r for r in self.attention_rules(spec, te, attn) if "norm_weight" not in r.te)
        yield one(f"{te}attn.q_norm_weight", f"{attn}q_norm.weight", q)
        yield one(f"{te}attn.k_norm_weight", f"{attn}k_norm.weight", kv)
        yield one(f"{te}attn_post_norm.weight", f"{hf}post_attention_layernorm.weight", spec.hidden)
        yield from dense_mlp_rules(te, f"{hf}mlp.", spec.ffn, spec.hidden, bias=False)
        yield one(f"{te}mlp_post_norm.weight", f"{hf}post_feedforward_layernorm.weight", spec.hidden)

    def attention_config(self, spec: HFSpec) -> dict[str, Any]:
        return {"attention_bias": spec.qkv_bias}

    def attention_matches(self, layer: Layer) -> bool:
        return layer.args("Attention").get("qk_norm_over") == "projection"
