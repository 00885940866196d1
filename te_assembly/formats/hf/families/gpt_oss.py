"""GPT-OSS (``GptOssForCausalLM``): packed attention with Llama's ``attention_bias``, learned attention
sinks and a sliding window on the layers ``layer_types`` marks; a router with a bias and experts with
biases and a clamped GLU, stored stacked and transposed with gate and up columns interleaved."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from te_assembly.formats.hf.families.attention import (
    PackedAttention,
    attention_bias_both,
    layer_types_config,
    layer_windows,
    windows_of,
)
from te_assembly.formats.hf.families.base import Layer, Shape, one
from te_assembly.formats.hf.families.mlp import RoutedExperts
from te_assembly.formats.hf.names import Part, Rule
from te_assembly.formats.hf.reader import shown

if TYPE_CHECKING:
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec


class GptOss(PackedAttention, RoutedExperts):
    architecture = "GptOssForCausalLM"
    model_type = "gpt_oss"
    own_fields = (
        "attention_bias",
        "sliding_window",
        "layer_types",
        "num_local_experts",
        "num_experts",
        "num_experts_per_tok",
        "router_aux_loss_coef",
        "output_router_logits",
        "swiglu_alpha",
        "swiglu_limit",
        "experts_per_token",
        "initial_context_length",
    )
    block_name = "hf_gpt_oss_layer"
    experts_field = "num_local_experts"
    experts_aliases = ("num_experts",)
    norm_topk_field = None
    ffn_field = "intermediate_size"

    def biases(self, r: ConfigReader) -> tuple[bool, bool]:
        return attention_bias_both(r)

    def read(self, r: ConfigReader, data: Mapping[str, Any], shape: Shape) -> dict[str, Any]:
        return {**super().read(r, data, shape), **self._layers(r, data), "pre_softmax": False}

    def _layers(self, r: ConfigReader, data: Mapping[str, Any]) -> dict[str, Any]:
        """Each layer's window from ``layer_types`` (transformers' default: sliding, full, sliding...),
        the experts' clamp (``swiglu_limit``, ``swiglu_alpha``)."""
        windows = layer_windows(r, data, every=2)
        # OpenAI's own names, kept in the Hub's config.json beside transformers' (the same numbers)
        given = data.get("rope_parameters") or data.get("rope_scaling")
        rope: Mapping[str, Any] = given if isinstance(given, Mapping) else {}  # _rope refuses any other
        twins = (
            ("experts_per_token", data.get("num_experts_per_tok"), "num_experts_per_tok"),
            ("initial_context_length", rope.get("original_max_position_embeddings"), "YaRN's context"),
        )
        for key, twin, name in twins:
            if key in data and data[key] != twin:
                r.refuse(key, f"{key} = {shown(data[key])} disagrees with {name} ({shown(twin)})")
        clamp = {
            "swiglu_limit": r.number("swiglu_limit", 7.0, becomes=("ScaledClampedQGeGLU", "limit")),
            "swiglu_alpha": r.number("swiglu_alpha", 1.702, becomes=("ScaledClampedQGeGLU", "alpha")),
        }
        return {"layer_windows": windows, "clamp": clamp}

    def mlp_dims(self, spec: HFSpec) -> dict[str, Any]:
        return {
            "sliding_window": next((w for w in spec.layer_windows if w is not None), None),
            "experts": spec.experts,
            "top_k": spec.top_k,
            "aux_loss_coeff": spec.aux_loss_coeff,
            "swiglu_limit": spec.clamp["swiglu_limit"],
            "swiglu_alpha": spec.clamp["swiglu_alpha"],
        }

    def attention_rules(self, spec: HFSpec, te: str, attn: str) -> Iterator[Rule]:
        yield from super().attention_rules(spec, te, attn)
        yield one(f"{te}attn.sinks", f"{attn}sinks", spec.heads)

    def mlp_rules(self, spec: HFSpec, te: str, hf: str) -> Iterator[Rule]:
        """The router (with a bias) and experts, stored stacked and transposed (``gate_up_proj``
        ``[experts, hidden, 2 * ffn]``, gate and up columns interleaved; ``down_proj`` ``[experts, ffn,
        hidden]``): each expert's fc1 rows are [gate | up], as ScaledClampedQGeGLU reads them."""
        mlp = f"{hf}mlp."
        yield one(f"{te}router.weight", f"{mlp}router.weight", spec.experts)
        yield one(f"{te}router.bias", f"{mlp}router.bias", spec.experts)
        ffn, experts = spec.ffn, f"{mlp}experts."
        for e in range(spec.experts):
            for kind, stored, transposed in (
                ("weight", "gate_up_proj", True),
                ("bias", "gate_up_proj_bias", False),
            ):
                halves = tuple(
                    Part(f"{experts}{stored}", ffn, e, transposed=transposed, stride=2, offset=o)
                    for o in (0, 1)
                )
                yield Rule(f"{te}fc1.{kind}{e}", (halves,))
            yield Rule(
                f"{te}fc2.weight{e}", ((Part(f"{experts}down_proj", spec.hidden, e, transposed=True),),)
            )
            yield Rule(f"{te}fc2.bias{e}", ((Part(f"{experts}down_proj_bias", spec.hidden, e),),))

    def attention_config(self, spec: HFSpec) -> dict[str, Any]:
        return {"attention_bias": spec.qkv_bias, **layer_types_config(spec)}

    def mlp_config(self, spec: HFSpec) -> dict[str, Any]:
        clamp = spec.clamp
        return {
            **super().mlp_config(spec),
            "swiglu_limit": clamp["swiglu_limit"],
            "swiglu_alpha": clamp["swiglu_alpha"],
        }

    def has_mlp(self, layer: Layer) -> bool:
        return "ScaledClampedQGeGLU" in layer.types

    def attention_from_plan(self, layer: Layer) -> dict[str, Any]:
        return {**super().attention_from_plan(layer), "sliding_window": None}  # per layer: layer_windows

    def mlp_from_plan(self, layer: Layer, layers: list[Layer]) -> dict[str, Any]:
        act = layer.args("ScaledClampedQGeGLU")
        return {
            **super().mlp_from_plan(layer, layers),
            "layer_windows": windows_of(layers),
            "clamp": {"swiglu_limit": act["limit"], "swiglu_alpha": act["alpha"]},
        }
