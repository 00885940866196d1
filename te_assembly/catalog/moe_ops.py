"""Catalog entries for te_assembly's mixture-of-experts ops. TE ships no router, dispatch or combine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from te_assembly.catalog.costs import linear
from te_assembly.catalog.spec import MultipleOf, OpSpec, Param, Slot, Width

_REF = "te_assembly.engines.reference.ops.moe"
_EXPERTS = ("groups", "num_experts")
_TOP_K = ("top_k", "top_k")


def _group_score_check(args: Mapping[str, Any]) -> list[tuple[str, str, str | None]]:
    """A group's score sums at most the experts it holds."""
    chosen, groups, experts = args.get("group_score_topk"), args.get("num_groups"), args.get("num_experts")
    top_k, kept = args.get("top_k"), args.get("group_topk")
    if chosen is None and isinstance(top_k, int) and isinstance(kept, int) and kept and top_k % kept:
        message = (
            f"top_k={top_k} is not a multiple of group_topk={kept}: each kept group's score sums "
            "top_k / group_topk experts unless group_score_topk says how many"
        )
        return [("top_k", message, f"make top_k a multiple of {kept}, or set group_score_topk")]
    if not (isinstance(chosen, int) and isinstance(groups, int) and isinstance(experts, int) and groups):
        return []
    if chosen > experts // groups:
        held = experts // groups
        message = f"group_score_topk={chosen} but each of the {groups} groups holds {held} experts"
        return [("group_score_topk", message, f"use at most {experts // groups}")]
    return []


MOE_OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="TopKRouter",
        doc="Scores tokens against experts (linear, softmax or sigmoid), keeps the top k, renormalises "
        "their probabilities (unless pre_softmax); x passes through unchanged. TE's fused router's knobs: "
        "pre_softmax, scaling_factor, an expert bias, group-limited top-k (num_groups, group_topk).",
        params=(
            Param("in_features", int),
            Param("num_experts", int),
            Param("top_k", int),
            Param("score_function", str, "softmax", choices=("softmax", "sigmoid")),
            Param("aux_loss_coeff", float, 0.01, doc="Weight of the load-balancing loss."),
            Param(
                "pre_softmax",
                bool,
                False,
                doc="softmax: keep the softmax over all experts (no renormalisation over the top k: "
                "Qwen's norm_topk_prob=false); false renormalises over the k kept (Mixtral).",
            ),
            Param(
                "scaling_factor",
                (float, type(None)),
                None,
                bounds=(0.0, None),
                doc="Multiplies the kept probabilities (DeepSeek's routed_scaling_factor); null: 1.",
            ),
            Param(
                "enable_expert_bias",
                bool,
                False,
                doc="A per-expert bias (buffer expert_bias) added to the scores to choose experts only "
                "(DeepSeek-V3's e_score_correction_bias, adjusted outside the gradient).",
            ),
            Param(
                "num_groups",
                (int, type(None)),
                None,
                doc="Group-limited routing: experts in this many equal groups; null: no groups.",
            ),
            Param(
                "group_topk",
                (int, type(None)),
                None,
                doc="Group-limited routing: only this many best groups compete (with num_groups).",
            ),
            Param(
                "group_score_topk",
                (int, type(None)),
                None,
                doc="Group-limited routing: a group's score is the sum of its best this many experts' "
                "scores; null: top_k / group_topk (TE's and Megatron's); transformers' DeepSeek-V3 and "
                "GLM-4.5 routers: 2.",
            ),
            Param(
                "bias",
                bool,
                False,
                doc="A learned bias on the logits (parameter bias), scoring and choosing alike (GPT-OSS's "
                "router).",
            ),
            Param(
                "sigmoid_renormalise",
                bool,
                True,
                doc="sigmoid with top_k > 1: divide the kept scores by their sum (TE's router; DeepSeek-V3 "
                "and GLM-4.5's norm_topk_prob=true); false keeps them as they are.",
            ),
        ),
        outputs=(
            Slot(
                "probs",
                "float",
                agree=(_EXPERTS, _TOP_K),
                shape="token_topk",
                doc="[tokens, top_k] normalised probabilities.",
            ),
            Slot(
                "routing_map",
                "int",
                agree=(_EXPERTS, _TOP_K),
                shape="token_topk",
                doc="[tokens, top_k] expert ids (int64).",
            ),
            Slot(
                "aux_loss",
                "float",
                shape="scalar",
                is_loss=True,
                doc="Scalar load-balancing loss, already weighted.",
            ),
        ),
        width=Width(in_arg="in_features"),
        arg_rules=(
            ("top_k", "num_experts", "a token cannot pick more experts than exist"),
            ("group_topk", "num_groups", "group-limited routing keeps some of the groups"),
        ),
        multiples=(MultipleOf("num_experts", "num_groups", "the experts are cut into equal groups"),),
        arg_checks=_group_score_check,
        reference=f"{_REF}:TopKRouter",
        param_shapes=lambda a: {
            "weight": (a["num_experts"], a["in_features"]),
            **({"bias": (a["num_experts"],)} if a.get("bias") else {}),
            **({"expert_bias": (a["num_experts"],)} if a.get("enable_expert_bias") else {}),
        },
        buffers=("expert_bias",),
        te_runs_on_cpu=True,
        cost=linear(out_arg="num_experts"),
    ),
    OpSpec(
        name="Dispatch",
        doc="Copies each token top_k times and groups the copies by expert; with align > 1 each group "
        "is padded with zero rows (probability 0, row_map -1) to a multiple of align rows.",
        params=(
            Param("num_experts", int),
            Param("top_k", int),
            Param(
                "align",
                int,
                1,
                doc="Pad each expert's rows to a multiple of this. A quantization recipe needs its "
                "grouped-GEMM alignment here (16 FP8, 32 MXFP8, 128 FP8 block scaling and NVFP4); "
                "validation says which.",
            ),
        ),
        inputs=(
            Slot(
                "probs",
                "float",
                agree=(_EXPERTS, _TOP_K),
                shape="token_topk",
                doc="[tokens, top_k] probabilities.",
            ),
            Slot(
                "routing_map",
                "int",
                agree=(_EXPERTS, _TOP_K),
                shape="token_topk",
                doc="[tokens, top_k] expert ids.",
            ),
        ),
        outputs=(
            Slot(
                "split_sizes",
                "int",
                agree=(_EXPERTS,),
                shape="groups",
                doc="[num_experts] rows per expert (int64), padding included.",
            ),
            Slot("row_probs", "float", shape="rows", doc="Probability of each row (0 on padding rows)."),
            Slot(
                "row_map",
                "int",
                agree=(_TOP_K,),
                shape="rows",
                doc="Source slot (token * top_k + k) of each row; -1 on padding rows.",
            ),
        ),
        arg_rules=(("top_k", "num_experts", "a token cannot pick more experts than exist"),),
        rows_delta=+1,
        needs_layout="tokens",
        reference=f"{_REF}:Dispatch",
        te_runs_on_cpu=True,
    ),
    OpSpec(
        name="Combine",
        doc="Undoes Dispatch's permutation and sums each token's top_k rows.",
        params=(Param("top_k", int),),
        inputs=(
            Slot(
                "row_map", "int", agree=(_TOP_K,), shape="rows", doc="Dispatch's row_map (-1 rows dropped)."
            ),
        ),
        rows_delta=-1,
        needs_layout="tokens",
        reference=f"{_REF}:Combine",
        te_runs_on_cpu=True,
    ),
)
