"""Gemma 2 (``Gemma2ForCausalLM``): an RMSNorm before and after both attention and the MLP (four per
layer), every norm scaling by (1 + w); the embeddings multiplied by sqrt(hidden_size); a GeGLU MLP with
tanh GELU; the attention logits scaled by ``query_pre_attn_scalar ** -0.5`` and soft-capped
(``attn_logit_softcapping``), a sliding window on the layers ``layer_types`` marks (every other one by
default); the vocabulary logits soft-capped (``final_logit_softcapping``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from te_assembly.formats.hf.families.attention import (
    PackedAttention,
    attention_bias_both,
    layer_types_config,
    layer_windows,
    windows_of,
)
from te_assembly.formats.hf.families.base import Layer, Shape, dense_mlp_rules, one
from te_assembly.formats.hf.families.mlp import DenseMLP
from te_assembly.formats.hf.names import Rule

if TYPE_CHECKING:
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec

TANH_GELU = "gelu_pytorch_tanh"


def _tanh_gelu(v: Any) -> bool:
    return v == TANH_GELU


def pre_attn_scalar(scale: float | None, head_dim: int) -> float | int:
    """``query_pre_attn_scalar`` of a softmax scale: the whole number n with ``n ** -0.5 == scale``
    where there is one (transformers types it int), else ``scale ** -2``."""
    if scale is None:
        return head_dim
    scalar = scale**-2
    whole = round(scalar)
    return whole if whole > 0 and whole**-0.5 == scale else scalar


class Gemma2(PackedAttention, DenseMLP):
    architecture = "Gemma2ForCausalLM"
    model_type = "gemma2"
    own_fields: ClassVar[tuple[str, ...]] = (
        "attention_bias",
        "sliding_window",
        "layer_types",
        "query_pre_attn_scalar",
        "attn_logit_softcapping",
        "final_logit_softcapping",
        "hidden_activation",
        "hidden_act",
        "use_bidirectional_attention",
        "sliding_window_size",
    )
    checked = {
        "hidden_activation": (_tanh_gelu, f"{TANH_GELU} (GeGLU with tanh GELU, TE's GEGLU)"),
        # Gemma 2 reads hidden_activation; the Hub's configs carry hidden_act beside it, the same
        "hidden_act": (_tanh_gelu, f"{TANH_GELU}, as hidden_activation"),
        "use_bidirectional_attention": (lambda v: v in (False, None), "false (causal attention)"),
    }
    block_name = "hf_gemma_layer"
    tied_by_default = True
    norm_islands = ("Gemma2RMSNorm",)

    def biases(self, r: ConfigReader) -> tuple[bool, bool]:
        return attention_bias_both(r)

    def every_full(self, r: ConfigReader) -> int:
        """transformers' default ``layer_types``: every second layer full attention, the others sliding."""
        return 2

    def read(self, r: ConfigReader, data: Mapping[str, Any], shape: Shape) -> dict[str, Any]:
        # The first Gemma 2 configs on the Hub carry this older name beside sliding_window; transformers
        # reads sliding_window alone, so the two must say the same.
        size, window = data.get("sliding_window_size"), data.get("sliding_window")
        if size is not None and size != window:
            r.refuse(
                "sliding_window_size",
                f"sliding_window_size = {size!r} differs from sliding_window = {window!r}, the window "
                "transformers applies",
                code="hf-bad-value",
            )
        scalar = r.number("query_pre_attn_scalar", 256)
        caps = (
            ("attn_softcap", "attn_logit_softcapping", ("Attention", "logit_softcap")),
            ("final_softcap", "final_logit_softcapping", ("Softcap", "cap")),
        )
        softcaps = {
            name: r.number(key, becomes=becomes) if data.get(key) is not None else None
            for name, key, becomes in caps
        }
        return {
            **super().read(r, data, shape),
            "layer_windows": layer_windows(r, data, self.every_full(r)),
            "softmax_scale": scalar**-0.5,
            "embed_scale": shape.hidden**0.5,
            "zero_centered": True,
            **softcaps,
        }

    def attention_dims(self, spec: HFSpec) -> dict[str, Any]:
        return {
            **super().attention_dims(spec),
            "sliding_window": next((w for w in spec.layer_windows if w is not None), None),
            "softmax_scale": spec.softmax_scale,
            "attn_softcap": spec.attn_softcap,
        }

    def layer_rules(self, spec: HFSpec, te: str, hf: str, dense: bool) -> Iterator[Rule]:
        yield one(f"{te}attn_norm.weight", f"{hf}input_layernorm.weight", spec.hidden)
        yield from self.attention_rules(spec, te, f"{hf}self_attn.")
        yield one(f"{te}attn_post_norm.weight", f"{hf}post_attention_layernorm.weight", spec.hidden)
        yield one(f"{te}mlp_norm.weight", f"{hf}pre_feedforward_layernorm.weight", spec.hidden)
        yield from dense_mlp_rules(te, f"{hf}mlp.", spec.ffn, spec.hidden, bias=False)
        yield one(f"{te}mlp_post_norm.weight", f"{hf}post_feedforward_layernorm.weight", spec.hidden)

    def attention_config(self, spec: HFSpec) -> dict[str, Any]:
        return {
            "attention_bias": spec.qkv_bias,
            **layer_types_config(spec),
            "query_pre_attn_scalar": pre_attn_scalar(spec.softmax_scale, spec.head_dim),
            "attn_logit_softcapping": spec.attn_softcap,
            "final_logit_softcapping": spec.final_softcap,
        }

    def mlp_config(self, spec: HFSpec) -> dict[str, Any]:
        return {"hidden_activation": TANH_GELU, "hidden_act": TANH_GELU}

    def has_mlp(self, layer: Layer) -> bool:
        return "GEGLU" in layer.types

    def attention_matches(self, layer: Layer) -> bool:
        qk_norm, _, qkv_bias, o_bias = self.features(layer)
        return not qk_norm and qkv_bias == o_bias

    def attention_from_plan(self, layer: Layer) -> dict[str, Any]:
        attn = layer.args("Attention")
        return {
            **super().attention_from_plan(layer),
            "sliding_window": None,  # per layer: layer_windows
            "softmax_scale": attn["softmax_scale"],
            "attn_softcap": attn["logit_softcap"],
        }

    def mlp_from_plan(self, layer: Layer, layers: list[Layer]) -> dict[str, Any]:
        return {**super().mlp_from_plan(layer, layers), "layer_windows": windows_of(layers)}
