"""A te_assembly plan as a Hugging Face family: the ``config.json`` of its spec, and the rules that say
where each of its tensors lives in a checkpoint (``names.py``), under the plan's own step names. What
import, export and the PEFT adapter format (``formats/adapters.py``) all map through."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_assembly.formats.hf.config import KEPT_FIELDS, YARN_FIELDS, HFSpec, parse_config
from te_assembly.formats.hf.families import HONOURED
from te_assembly.formats.hf.layout import check_same_steps, model_config, spec_of_plan
from te_assembly.formats.hf.names import Rule, renamed, rules

if TYPE_CHECKING:
    from te_assembly.analysis.plan import Plan


def hf_config(spec: HFSpec, dtype: str) -> dict[str, Any]:
    """The ``config.json`` of ``spec``: the family's own fields, each one ``config.py`` reads back."""
    family = spec.family
    # The family and the dtype are the model's own now; the rest of the import's metadata is kept.
    written = {"architectures", "model_type", "dtype", "torch_dtype"}
    keep = {k: v for k, v in spec.metadata.items() if k in KEPT_FIELDS and k not in written}
    out: dict[str, Any] = {
        "architectures": [family.architecture],
        "model_type": family.model_type,
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": spec.eps,
        "tie_word_embeddings": spec.tied,
        "attention_dropout": 0.0,
        "initializer_range": spec.init_std,
        "max_position_embeddings": keep.pop("max_position_embeddings", 4096),
        "rope_theta": spec.rope["rope_theta"],
        "rope_scaling": _rope_scaling(spec),
        "dtype": dtype,
        **keep,
    }
    if family.qkv_bias == "attention_bias":
        out["attention_bias"] = spec.qkv_bias
    if family.qkv_bias == "qkv_bias":
        out["qkv_bias"] = spec.qkv_bias
    if family.architecture == "LlamaForCausalLM":
        out["mlp_bias"] = spec.mlp_bias
    if family.sliding == "window":
        out["sliding_window"] = spec.sliding_window
    if family.sliding == "qwen":
        out["use_sliding_window"] = False
    if family.sliding == "layer_types":
        windows = spec.layer_windows or (None,) * spec.layers
        out["layer_types"] = ["full_attention" if w is None else "sliding_attention" for w in windows]
        out["sliding_window"] = next((w for w in windows if w is not None), None)
    if family.mlp != "dense":
        out[family.experts_field] = spec.experts
        out["num_experts_per_tok"] = spec.top_k
        if "router_aux_loss_coef" in HONOURED[family.architecture]:
            out["router_aux_loss_coef"] = spec.aux_loss_coeff
        if family.norm_topk_field is not None:
            out[family.norm_topk_field] = not spec.pre_softmax
        out[family.ffn_field] = spec.ffn
        if family.sliding == "qwen":  # Qwen2/3-MoE: every layer a mixture of experts, said explicitly
            out["decoder_sparse_step"] = 1
            out["mlp_only_layers"] = []
    if family.mlp == "shared_moe":
        out["shared_expert_intermediate_size"] = spec.shared_ffn
    if family.mlp == "gpt_oss":
        out.update(swiglu_limit=spec.clamp["swiglu_limit"], swiglu_alpha=spec.clamp["swiglu_alpha"])
    if family.mlp == "glm_moe":
        router = spec.router
        out.update(
            intermediate_size=spec.dense_ffn,
            n_shared_experts=spec.shared_ffn // spec.ffn,
            first_k_dense_replace=spec.first_dense,
            n_group=router["num_groups"],
            topk_group=router["group_topk"],
            norm_topk_prob=router["sigmoid_renormalise"],
            routed_scaling_factor=router["scaling_factor"],
            num_nextn_predict_layers=0,  # what is written has no multi-token prediction layers
        )
    if family.attention == "mla":
        mla = spec.mla
        out.update(
            attention_bias=mla["attention_bias"],
            q_lora_rank=mla["q_lora_rank"],
            kv_lora_rank=mla["kv_lora_rank"],
            qk_nope_head_dim=mla["qk_nope_dim"],
            qk_rope_head_dim=mla["qk_rope_dim"],
            v_head_dim=mla["v_head_dim"],
            rope_interleave=mla["rope_interleaved"],
        )
    elif family.mlp == "glm_moe":
        out.update(
            attention_bias=spec.qkv_bias,
            use_qk_norm=spec.qk_norm,
            partial_rotary_factor=(spec.rotary_dim or spec.head_dim) / spec.head_dim,
        )
    return out


def _rope_scaling(spec: HFSpec) -> dict[str, Any] | None:
    rope = spec.rope
    if rope["rope_type"] == "default":
        return None
    out: dict[str, Any] = {"rope_type": rope["rope_type"], "factor": rope["rope_factor"]}
    if rope["rope_type"] == "llama3":
        out.update(
            low_freq_factor=rope["rope_low_freq_factor"],
            high_freq_factor=rope["rope_high_freq_factor"],
            original_max_position_embeddings=rope["rope_original_max_positions"],
        )
    if rope["rope_type"] == "yarn":
        out["original_max_position_embeddings"] = rope["rope_original_max_positions"]
        for name, dim in YARN_FIELDS.items():
            if rope.get(dim) is not None:
                out[name] = rope[dim]
        if not rope["rope_truncate"]:  # transformers' default is true: written only when it is not
            out["truncate"] = False
    return out


def mapping_of_plan(plan: Plan, metadata: Mapping[str, Any] | None = None) -> tuple[HFSpec, list[Rule]]:
    """The spec ``plan`` expresses and its rules under its own step names (``UnexportableError`` for a
    plan no family expresses: one with adapters among them; ``formats/adapters.py`` maps those)."""
    from te_assembly.analysis.pipeline import load

    read = spec_of_plan(plan, metadata)
    # Through config.json and back: what the family cannot say (a Mistral's q/k/v biases) is dropped
    # here, so the comparison below names the step instead of an export that silently loses it.
    spec = parse_config(hf_config(read, "float32"), Path("config.json"))
    rebuilt = load(model_config(spec, plan.name)).checked_plan()
    names = check_same_steps(plan, rebuilt, spec.architecture)
    return spec, renamed(rules(spec), names)


def rules_of_plan(plan: Plan) -> list[Rule]:
    """Every tensor of ``plan`` (a model no adapters are part of) with where a Hugging Face checkpoint
    keeps it."""
    return mapping_of_plan(plan)[1]


__all__ = ["hf_config", "mapping_of_plan", "rules_of_plan"]
