"""The MLP parts a family is made of: a dense SwiGLU MLP, routed experts (with a gated shared expert,
or grouped sigmoid routing with ungated shared experts). GPT-OSS's clamped experts are its own
(``gpt_oss.py``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from te_assembly.formats.hf.families.base import Family, Layer, Shape, dense_mlp_rules, one
from te_assembly.formats.hf.names import Part, Rule
from te_assembly.formats.hf.reader import shown

if TYPE_CHECKING:
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec


class DenseMLP(Family):
    """gate_proj | up_proj -> SwiGLU -> down_proj in every layer (``hf_dense_layer``)."""

    block_name = "hf_dense_layer"
    ffn_field: ClassVar[str] = "intermediate_size"

    def mlp_bias(self, r: ConfigReader) -> bool:
        """Whether its projections have biases (Llama's ``mlp_bias``)."""
        return False

    def read_mlp(self, r: ConfigReader, data: Mapping[str, Any], shape: Shape) -> dict[str, Any]:
        return {"ffn": r.integer(self.ffn_field), "mlp_bias": self.mlp_bias(r)}

    def mlp_dims(self, spec: HFSpec) -> dict[str, Any]:
        return {"mlp_bias": spec.mlp_bias}

    def mlp_rules(self, spec: HFSpec, te: str, hf: str) -> Iterator[Rule]:
        yield from dense_mlp_rules(te, f"{hf}mlp.", spec.ffn, spec.hidden, spec.mlp_bias)

    def has_mlp(self, layer: Layer) -> bool:
        return not layer.routed

    def mlp_from_plan(self, layer: Layer, layers: list[Layer]) -> dict[str, Any]:
        fc1, fc2 = (layer.args("Linear", self.attention_linears + n) for n in (0, 1))
        return {"ffn": fc2["in_features"], "mlp_bias": bool(fc1["bias"])}


class RoutedExperts(Family):
    """A softmax router choosing ``num_experts_per_tok`` of the experts, each a SwiGLU MLP
    (``hf_moe_layer``): Mixtral, Qwen3-MoE."""

    block_name = "hf_moe_layer"
    experts_field: ClassVar[str] = "num_experts"
    experts_aliases: ClassVar[tuple[str, ...]] = ()
    """Other spellings of ``experts_field`` some ``transformers`` versions write."""
    norm_topk_field: ClassVar[str | None] = "norm_topk_prob"
    """The field that says whether the kept probabilities are renormalised (None: always)."""
    ffn_field: ClassVar[str] = "moe_intermediate_size"
    """The field of each expert's width."""
    hub_prefix: ClassVar[str] = "mlp."
    """Where the checkpoint keeps the router and experts (Mixtral: ``block_sparse_moe.``)."""
    hub_projections: ClassVar[tuple[str, str, str]] = ("gate_proj", "up_proj", "down_proj")
    every_layer_fields: ClassVar[dict[str, Any]] = {}
    """Fields its ``config.json`` writes to say every layer is a mixture of experts."""

    def read_mlp(self, r: ConfigReader, data: Mapping[str, Any], shape: Shape) -> dict[str, Any]:
        spelt = [k for k in (self.experts_field, *self.experts_aliases) if data.get(k) is not None]
        counts = [r.integer(k) for k in spelt] or [r.integer(self.experts_field)]
        if len(set(counts)) > 1:
            r.refuse(spelt[1], f"{' and '.join(spelt)} disagree ({', '.join(str(data[k]) for k in spelt)})")
        experts = counts[0]
        top_k = r.integer("num_experts_per_tok")
        if top_k > experts:
            r.refuse("num_experts_per_tok", f"num_experts_per_tok {top_k} is more than the {experts} experts")
        renormalise = True if self.norm_topk_field is None else r.flag(self.norm_topk_field, False)
        return {
            "ffn": r.integer(self.ffn_field),
            "experts": experts,
            "top_k": top_k,
            "pre_softmax": not renormalise,
            "aux_loss_coeff": r.number("router_aux_loss_coef", 0.001, positive=False),
        }

    def mlp_dims(self, spec: HFSpec) -> dict[str, Any]:
        return {
            "experts": spec.experts,
            "top_k": spec.top_k,
            "pre_softmax": spec.pre_softmax,
            "aux_loss_coeff": spec.aux_loss_coeff,
        }

    def mlp_rules(self, spec: HFSpec, te: str, hf: str) -> Iterator[Rule]:
        yield from self.expert_rules(spec, te, hf)

    def expert_rules(self, spec: HFSpec, te: str, hf: str) -> Iterator[Rule]:
        """The router and each expert: the Hub's per-expert tensors, or the stacked ``gate_up_proj`` and
        ``down_proj`` other ``transformers`` versions save."""
        hub, fused = f"{hf}{self.hub_prefix}", f"{hf}mlp."
        gate, up, down = self.hub_projections
        yield Rule(
            f"{te}router.weight",
            ((Part(f"{hub}gate.weight", spec.experts),), (Part(f"{fused}gate.weight", spec.experts),)),
        )
        yield from self.router_rules(spec, te, hub)
        ffn = spec.ffn
        for e in range(spec.experts):
            expert = f"{hub}experts.{e}."
            yield Rule(
                f"{te}fc1.weight{e}",
                (
                    (Part(f"{expert}{gate}.weight", ffn), Part(f"{expert}{up}.weight", ffn)),
                    (Part(f"{fused}experts.gate_up_proj", 2 * ffn, e),),
                ),
            )
            yield Rule(
                f"{te}fc2.weight{e}",
                (
                    (Part(f"{expert}{down}.weight", spec.hidden),),
                    (Part(f"{fused}experts.down_proj", spec.hidden, e),),
                ),
            )

    def router_rules(self, spec: HFSpec, te: str, hub: str) -> Iterator[Rule]:
        """The router's tensors beyond its weight."""
        return iter(())

    def mlp_config(self, spec: HFSpec) -> dict[str, Any]:
        out: dict[str, Any] = {self.experts_field: spec.experts, "num_experts_per_tok": spec.top_k}
        if "router_aux_loss_coef" in self.fields:
            out["router_aux_loss_coef"] = spec.aux_loss_coeff
        if self.norm_topk_field is not None:
            out[self.norm_topk_field] = not spec.pre_softmax
        out[self.ffn_field] = spec.ffn
        return {**out, **self.every_layer_fields}

    def has_mlp(self, layer: Layer) -> bool:
        if not layer.routed or "SigmoidGate" in layer.types or "ScaledClampedQGeGLU" in layer.types:
            return False
        return not _grouped(layer, self.attention_linears)

    def mlp_from_plan(self, layer: Layer, layers: list[Layer]) -> dict[str, Any]:
        router = layer.args("TopKRouter")
        return {
            "ffn": layer.args("GroupedLinear", 1)["in_features"],
            "experts": router["num_experts"],
            "top_k": router["top_k"],
            "pre_softmax": bool(router["pre_softmax"]),
            "aux_loss_coeff": float(router["aux_loss_coeff"]),
        }


def _grouped(layer: Layer, attention_linears: int) -> bool:
    """Sigmoid routing beside ungated shared experts (GLM-4.5's and DeepSeek-V3's MoE)."""
    shared = layer.count("Linear") > attention_linears
    return layer.args("TopKRouter")["score_function"] == "sigmoid" and shared


class SharedExpert(RoutedExperts):
    """Routed experts and one shared expert whose output a sigmoid gate scales (Qwen2-MoE's
    ``shared_expert`` and ``shared_expert_gate``; ``hf_shared_moe_layer``)."""

    block_name = "hf_shared_moe_layer"

    def read_mlp(self, r: ConfigReader, data: Mapping[str, Any], shape: Shape) -> dict[str, Any]:
        return {
            **super().read_mlp(r, data, shape),
            "shared_ffn": r.integer("shared_expert_intermediate_size"),
        }

    def mlp_dims(self, spec: HFSpec) -> dict[str, Any]:
        return {**super().mlp_dims(spec), "shared_ffn": spec.shared_ffn}

    def mlp_rules(self, spec: HFSpec, te: str, hf: str) -> Iterator[Rule]:
        yield from self.expert_rules(spec, te, hf)
        yield from shared_rules(spec, te, f"{hf}mlp.shared_expert.")
        yield one(f"{te}shared_gate.weight", f"{hf}mlp.shared_expert_gate.weight", 1)

    def mlp_config(self, spec: HFSpec) -> dict[str, Any]:
        return {**super().mlp_config(spec), "shared_expert_intermediate_size": spec.shared_ffn}

    def has_mlp(self, layer: Layer) -> bool:
        return "SigmoidGate" in layer.types

    def mlp_from_plan(self, layer: Layer, layers: list[Layer]) -> dict[str, Any]:
        shared = layer.args("Linear", self.attention_linears + 1)["in_features"]
        return {**super().mlp_from_plan(layer, layers), "shared_ffn": shared}


def shared_rules(spec: HFSpec, te: str, shared: str) -> Iterator[Rule]:
    """A shared expert (or several, of their summed width) as one SwiGLU MLP."""
    stacked = (
        Part(f"{shared}gate_proj.weight", spec.shared_ffn),
        Part(f"{shared}up_proj.weight", spec.shared_ffn),
    )
    yield Rule(f"{te}shared_fc1.basic_ops.0.weight", (stacked,))
    yield one(f"{te}shared_fc2.basic_ops.0.weight", f"{shared}down_proj.weight", spec.hidden)


GROUPED_FIELDS = (
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "first_k_dense_replace",
    "n_group",
    "topk_group",
    "norm_topk_prob",
    "routed_scaling_factor",
    "output_router_logits",
    "num_nextn_predict_layers",
)
"""GLM-4.5's and DeepSeek-V3's MoE fields."""
GROUPED_ROUTER = (
    "score_function",
    "enable_expert_bias",
    "num_groups",
    "group_topk",
    "group_score_topk",
    "scaling_factor",
    "sigmoid_renormalise",
)
"""The router arguments a grouped MoE layer sets (``HFSpec.router``)."""


class GroupedExperts(RoutedExperts):
    """GLM-4.5's and DeepSeek-V3's MoE: sigmoid scores with an expert bias (``e_score_correction_bias``)
    that chooses but does not weigh, group-limited choice (``n_group``, ``topk_group``; a group scored by
    its best two), ``norm_topk_prob``, ``routed_scaling_factor``; ``n_shared_experts`` shared experts as
    one MLP of their summed width beside the routed ones, ungated; the first ``first_k_dense_replace``
    layers dense; ``num_nextn_predict_layers`` multi-token prediction layers after the others."""

    experts_field = "n_routed_experts"
    droppable = ("num_nextn_predict_layers",)
    moe_defaults: ClassVar[dict[str, Any]] = {}
    """What transformers assumes for a missing router field (the two families differ)."""

    def read_mlp(self, r: ConfigReader, data: Mapping[str, Any], shape: Shape) -> dict[str, Any]:
        moe = super().read_mlp(r, data, shape)
        experts, default = int(moe["experts"]), self.moe_defaults
        groups, kept = (
            r.integer("n_group", default["n_group"]),
            r.integer("topk_group", default["topk_group"]),
        )
        if experts % groups:
            r.refuse("n_group", f"n_group {groups} does not divide the {experts} experts into equal groups")
        if kept > groups:
            r.refuse("topk_group", f"topk_group {kept} is more than the n_group {groups} groups")
        if groups > 1 and experts // groups < 2:
            r.refuse(
                "n_group", f"n_group {groups} leaves groups of one expert: a group is scored by its best two"
            )
        layers = r.integer("num_hidden_layers")
        first_dense = r.integer("first_k_dense_replace", default["first_k_dense_replace"], minimum=0)
        if first_dense >= layers:
            r.refuse(
                "first_k_dense_replace",
                f"first_k_dense_replace {first_dense} leaves no MoE layer of {layers}",
            )
        mtp = data.get("num_nextn_predict_layers", 0) or 0
        if not isinstance(mtp, int) or isinstance(mtp, bool) or mtp < 0:
            r.refuse(
                "num_nextn_predict_layers", f"num_nextn_predict_layers = {shown(mtp)}", code="hf-bad-value"
            )
            mtp = 0
        # Whether the checkpoint holds those layers is for its tensors to say (``convert.read_spec``):
        # transformers declares one by default and saves none.
        shared = r.integer(
            "n_shared_experts", default["n_shared_experts"], minimum=1
        )  # the block has one MLP
        scaling = r.number(
            "routed_scaling_factor",
            default["routed_scaling_factor"],
            becomes=("TopKRouter", "scaling_factor"),
        )
        return {
            **moe,
            "pre_softmax": False,
            "aux_loss_coeff": 0.0,
            "shared_ffn": shared * moe["ffn"],
            "first_dense": first_dense,
            "dense_ffn": r.integer("intermediate_size"),
            "mtp_layers": mtp,
            "dropped_layers": mtp if "num_nextn_predict_layers" in r.ignore else 0,
            # the checkpoint's tensors may still say there are none (``convert.read_spec``)
            "mtp_modules": 0 if "num_nextn_predict_layers" in r.ignore else mtp,
            "router": {
                "score_function": "sigmoid",
                "enable_expert_bias": True,
                "num_groups": groups,
                "group_topk": kept,
                "group_score_topk": min(2, experts // groups),
                "scaling_factor": scaling,
                "sigmoid_renormalise": r.flag("norm_topk_prob", True),
            },
        }

    def mlp_dims(self, spec: HFSpec) -> dict[str, Any]:
        router = spec.router
        return {
            "experts": spec.experts,
            "top_k": spec.top_k,
            "shared_ffn": spec.shared_ffn,
            "n_group": router["num_groups"],
            "topk_group": router["group_topk"],
            "group_score_topk": router["group_score_topk"],
            "routed_scaling_factor": router["scaling_factor"],
            "norm_topk_prob": router["sigmoid_renormalise"],
        }

    def router_rules(self, spec: HFSpec, te: str, hub: str) -> Iterator[Rule]:
        yield one(f"{te}router.expert_bias", f"{hub}gate.e_score_correction_bias", spec.experts)

    def mlp_rules(self, spec: HFSpec, te: str, hf: str) -> Iterator[Rule]:
        yield from self.expert_rules(spec, te, hf)
        yield from shared_rules(spec, te, f"{hf}mlp.shared_experts.")

    def mlp_config(self, spec: HFSpec) -> dict[str, Any]:
        router = spec.router
        return {
            **super().mlp_config(spec),
            "intermediate_size": spec.dense_ffn,
            "n_shared_experts": spec.shared_ffn // spec.ffn,
            "first_k_dense_replace": spec.first_dense,
            "n_group": router["num_groups"],
            "topk_group": router["group_topk"],
            "norm_topk_prob": router["sigmoid_renormalise"],
            "routed_scaling_factor": router["scaling_factor"],
            "num_nextn_predict_layers": spec.mtp_modules,
        }

    def has_mlp(self, layer: Layer) -> bool:
        return layer.routed and _grouped(layer, self.attention_linears)

    def mlp_from_plan(self, layer: Layer, layers: list[Layer]) -> dict[str, Any]:
        router = layer.args("TopKRouter")
        shared = layer.args("Linear", self.attention_linears + 1)["in_features"]
        return {
            **super().mlp_from_plan(layer, layers),
            "shared_ffn": shared,
            "router": {k: router[k] for k in GROUPED_ROUTER if k in router},
        }


__all__ = ["GROUPED_FIELDS", "DenseMLP", "GroupedExperts", "RoutedExperts", "SharedExpert", "shared_rules"]
