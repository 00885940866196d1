"""The Hugging Face families te_assembly imports and exports, and the ``config.json`` fields each one
honours: data, read by ``config.py`` (which honours or refuses every field), the exporter and the docs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One ``architectures`` entry te_assembly imports and exports."""

    architecture: str
    model_type: str
    mlp: str
    """``dense``, ``moe`` (routed experts) or ``shared_moe`` (routed experts + a gated shared expert)."""
    qkv_bias: str = "none"
    """``none``, ``always`` (Qwen2, Qwen2-MoE), ``attention_bias`` (Llama's flag: q, k, v and o) or
    ``qkv_bias`` (a config field that may turn Qwen2-MoE's q/k/v biases off)."""
    qk_norm: bool = False
    """Qwen3's per-head RMSNorm on queries and keys."""
    sliding: str = "none"
    """``window``: ``sliding_window`` applies to every layer (Mistral, Mixtral); ``qwen``: only with
    ``use_sliding_window`` on some layers (refused); ``none``."""
    experts_field: str = "num_experts"
    experts_aliases: tuple[str, ...] = ()
    """Other spellings of ``experts_field`` some ``transformers`` versions write (Qwen3-MoE:
    ``num_local_experts`` since transformers 5)."""
    norm_topk_field: str | None = "norm_topk_prob"
    """The field that says whether the kept probabilities are renormalised (None: always, Mixtral)."""


FAMILIES: dict[str, Family] = {
    f.architecture: f
    for f in (
        Family("LlamaForCausalLM", "llama", "dense", qkv_bias="attention_bias"),
        Family("MistralForCausalLM", "mistral", "dense", sliding="window"),
        Family("Qwen2ForCausalLM", "qwen2", "dense", qkv_bias="always", sliding="qwen"),
        Family("Qwen3ForCausalLM", "qwen3", "dense", qkv_bias="attention_bias", qk_norm=True, sliding="qwen"),
        Family(
            "MixtralForCausalLM",
            "mixtral",
            "moe",
            sliding="window",
            experts_field="num_local_experts",
            norm_topk_field=None,
        ),
        Family("Qwen2MoeForCausalLM", "qwen2_moe", "shared_moe", qkv_bias="qkv_bias", sliding="qwen"),
        Family(
            "Qwen3MoeForCausalLM",
            "qwen3_moe",
            "moe",
            qkv_bias="attention_bias",
            qk_norm=True,
            sliding="qwen",
            experts_aliases=("num_local_experts",),
        ),
    )
}

COMMON_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "rms_norm_eps",
    "hidden_act",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "tie_word_embeddings",
    "attention_dropout",
    "max_position_embeddings",
    "initializer_range",
)
"""What every family reads (``HONOURED`` adds each family's own)."""

QWEN_WINDOW = ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types")
"""Qwen's sliding-window fields: honoured with the window off (on some layers only is refused)."""
QWEN_EXPERTS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
    "router_aux_loss_coef",
    "output_router_logits",
)

HONOURED: dict[str, tuple[str, ...]] = {
    "LlamaForCausalLM": (*COMMON_FIELDS, "attention_bias", "mlp_bias", "pretraining_tp"),
    "MistralForCausalLM": (*COMMON_FIELDS, "sliding_window"),
    "Qwen2ForCausalLM": (*COMMON_FIELDS, *QWEN_WINDOW),
    "Qwen3ForCausalLM": (*COMMON_FIELDS, "attention_bias", *QWEN_WINDOW),
    "MixtralForCausalLM": (
        *COMMON_FIELDS,
        "sliding_window",
        "num_local_experts",
        "num_experts_per_tok",
        "router_aux_loss_coef",
        "router_jitter_noise",
        "output_router_logits",
    ),
    "Qwen2MoeForCausalLM": (
        *COMMON_FIELDS,
        "qkv_bias",
        *QWEN_WINDOW,
        *QWEN_EXPERTS,
        "shared_expert_intermediate_size",
    ),
    "Qwen3MoeForCausalLM": (
        *COMMON_FIELDS,
        "attention_bias",
        *QWEN_WINDOW,
        *QWEN_EXPERTS,
        "num_local_experts",
    ),
}
"""The fields each family reads (each checked: a value it cannot express is refused)."""

METADATA_FIELDS = (
    "architectures",
    "model_type",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "use_cache",
    "_name_or_path",
    "name_or_path",
    "return_dict",
    "output_hidden_states",
    "output_attentions",
    "torchscript",
    "use_return_dict",
    "is_encoder_decoder",
    "tokenizer_class",
    "id2label",
    "label2id",
    "auto_map",
)
"""Fields that describe the checkpoint, not its math: never refused."""
REMOTE_CODE_FIELDS = ("auto_map", "custom_pipelines", "trust_remote_code")
"""Pointers to Python code outside transformers (``auto_map``): accepted on import (te_assembly's math is
the family's own), never carried into anything te_assembly writes."""
KEPT_FIELDS = (*(f for f in METADATA_FIELDS if f not in REMOTE_CODE_FIELDS), "max_position_embeddings")
"""What an import keeps of its ``config.json`` for export (``HFSpec.metadata``)."""

ROPE_TYPES = ("default", "linear", "llama3")
