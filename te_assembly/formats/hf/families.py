"""The Hugging Face families te_assembly imports and exports, and the ``config.json`` fields each one
honours: data, read by ``config.py`` (which honours or refuses every field), the exporter and the docs."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    """One ``architectures`` entry te_assembly imports and exports."""

    architecture: str
    model_type: str
    mlp: str
    """``dense``, ``moe`` (routed experts), ``shared_moe`` (routed experts + a gated shared expert),
    ``glm_moe`` (GLM-4.5: a sigmoid router with an expert bias and groups, shared experts without a gate,
    the first layers dense) or ``gpt_oss`` (a router with a bias, experts with biases and a clamped GLU)."""
    qkv_bias: str = "none"
    """``none``, ``always`` (Qwen2, Qwen2-MoE), ``attention_bias`` (Llama's flag: q, k, v and o),
    ``attention_bias_qkv`` (GLM-4.5's: q, k and v only) or ``qkv_bias`` (a config field that may turn
    Qwen2-MoE's q/k/v biases off)."""
    qk_norm: bool = False
    """Qwen3's per-head RMSNorm on queries and keys."""
    qk_norm_field: str | None = None
    """The field that turns the per-head q/k norms on (GLM-4.5's ``use_qk_norm``); None: ``qk_norm``."""
    sliding: str = "none"
    """``window``: ``sliding_window`` applies to every layer (Mistral, Mixtral); ``qwen``: only with
    ``use_sliding_window`` on some layers (refused); ``layer_types``: on the layers ``layer_types`` marks
    ``sliding_attention`` (GPT-OSS); ``none``."""
    experts_field: str = "num_experts"
    experts_aliases: tuple[str, ...] = ()
    """Other spellings of ``experts_field`` some ``transformers`` versions write (Qwen3-MoE:
    ``num_local_experts`` since transformers 5)."""
    norm_topk_field: str | None = "norm_topk_prob"
    """The field that says whether the kept probabilities are renormalised (None: always, Mixtral)."""
    ffn_field: str = "moe_intermediate_size"
    """The field of the (MoE) layers' MLP width: each expert's (``intermediate_size`` for a dense family,
    Mixtral and GPT-OSS)."""
    attention: str = "gqa"
    """``gqa``: packed q | k | v heads (``Attention``); ``mla``: DeepSeek's multi-head latent attention
    (``LatentAttention``, its queries through a low-rank path)."""
    moe_defaults: tuple[tuple[str, Any], ...] = ()
    """What transformers assumes for a missing router field (``glm_moe``: DeepSeek-V3 and GLM-4.5
    differ)."""


DENSE = "intermediate_size"

FAMILIES: dict[str, Family] = {
    f.architecture: f
    for f in (
        Family("LlamaForCausalLM", "llama", "dense", qkv_bias="attention_bias", ffn_field=DENSE),
        Family("MistralForCausalLM", "mistral", "dense", sliding="window", ffn_field=DENSE),
        Family("Qwen2ForCausalLM", "qwen2", "dense", qkv_bias="always", sliding="qwen", ffn_field=DENSE),
        Family(
            "Qwen3ForCausalLM",
            "qwen3",
            "dense",
            qkv_bias="attention_bias",
            qk_norm=True,
            sliding="qwen",
            ffn_field=DENSE,
        ),
        Family(
            "MixtralForCausalLM",
            "mixtral",
            "moe",
            sliding="window",
            experts_field="num_local_experts",
            norm_topk_field=None,
            ffn_field=DENSE,
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
        Family(
            "Glm4MoeForCausalLM",
            "glm4_moe",
            "glm_moe",
            qkv_bias="attention_bias_qkv",
            qk_norm_field="use_qk_norm",
            experts_field="n_routed_experts",
            moe_defaults=(
                ("n_group", 1),
                ("topk_group", 1),
                ("first_k_dense_replace", 1),
                ("n_shared_experts", 1),
                ("routed_scaling_factor", 1.0),
            ),
        ),
        Family(
            "DeepseekV3ForCausalLM",
            "deepseek_v3",
            "glm_moe",
            experts_field="n_routed_experts",
            attention="mla",
            moe_defaults=(
                ("n_group", 8),
                ("topk_group", 4),
                ("first_k_dense_replace", 3),
                ("n_shared_experts", 1),
                ("routed_scaling_factor", 2.5),
            ),
        ),
        Family(
            "GptOssForCausalLM",
            "gpt_oss",
            "gpt_oss",
            qkv_bias="attention_bias",
            sliding="layer_types",
            experts_field="num_local_experts",
            experts_aliases=("num_experts",),
            norm_topk_field=None,
            ffn_field=DENSE,
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
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "tie_word_embeddings",
    "max_position_embeddings",
    "initializer_range",
)
"""What every family reads (``HONOURED`` adds each family's own; ``CHECKED`` fields are held to a value)."""

QWEN_WINDOW = ("sliding_window", "max_window_layers")
"""Qwen's sliding-window fields, read with the window off (``use_sliding_window`` is ``CHECKED``)."""
QWEN_EXPERTS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "router_aux_loss_coef",
    "output_router_logits",
)

GROUPED_MOE = (
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
"""GLM-4.5's and DeepSeek-V3's MoE fields (``glm_moe``)."""

HONOURED: dict[str, tuple[str, ...]] = {
    "LlamaForCausalLM": (*COMMON_FIELDS, "attention_bias", "mlp_bias"),
    "MistralForCausalLM": (*COMMON_FIELDS, "sliding_window"),
    "Qwen2ForCausalLM": (*COMMON_FIELDS, *QWEN_WINDOW),
    "Qwen3ForCausalLM": (*COMMON_FIELDS, "attention_bias", *QWEN_WINDOW),
    "MixtralForCausalLM": (
        *COMMON_FIELDS,
        "sliding_window",
        "num_local_experts",
        "num_experts_per_tok",
        "router_aux_loss_coef",
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
    "Glm4MoeForCausalLM": (
        *COMMON_FIELDS,
        "attention_bias",
        "use_qk_norm",
        "partial_rotary_factor",
        *GROUPED_MOE,
    ),
    "DeepseekV3ForCausalLM": (
        *COMMON_FIELDS,
        "attention_bias",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "qk_head_dim",
        "v_head_dim",
        "rope_interleave",
        *GROUPED_MOE,
        *("scoring_func", "topk_method", "moe_layer_freq", "ep_size", "aux_loss_alpha", "seq_aux"),
    ),
    "GptOssForCausalLM": (
        *COMMON_FIELDS,
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
    ),
}
"""The fields each family reads (each checked: a value it cannot express is refused)."""

CHECKED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "hidden_act": (lambda v: v == "silu", "silu (SwiGLU MLPs)"),
    "attention_dropout": (lambda v: v in (0, 0.0), "0.0 (te_assembly's Attention has no dropout)"),
    "partial_rotary_factor": (
        lambda v: v in (1, 1.0),
        "1.0 (rotary embeddings on the whole head; GLM-4.5 reads other values)",
    ),
    "pretraining_tp": (lambda v: type(v) is int and v == 1, "1 (the projections unsplit)"),
    "rope_interleaved": (lambda v: v is False, "false (rotate halves, as transformers does)"),
    "router_jitter_noise": (lambda v: v in (0, 0.0), "0.0 (no jitter on the router input)"),
    "decoder_sparse_step": (lambda v: type(v) is int and v == 1, "1 (every layer a mixture of experts)"),
    "mlp_only_layers": (lambda v: v in ([], None), "[] (every layer a mixture of experts)"),
    "layer_types": (
        lambda v: isinstance(v, list) and all(t == "full_attention" for t in v),
        "every layer 'full_attention'",
    ),
    "use_sliding_window": (
        lambda v: v in (False, None),
        "false (sliding windows on some layers only are not expressible)",
    ),
    "add_cross_attention": (lambda v: v in (False, None), "false (a decoder without cross-attention)"),
    "pruned_heads": (lambda v: v in ({}, None), "{} (no pruned attention heads)"),
    "quantization_config": (
        lambda v: v in ({}, None),
        "none (te_assembly reads float weights: dequantize the checkpoint first, e.g. DeepSeek's FP8 "
        "blocks with its fp8_cast_bf16.py, or take a bf16 copy)",
    ),
}
"""Fields that would change the math, held to the one value te_assembly computes (any family may carry
them: ``rope_interleaved`` and ``pretraining_tp`` appear in checkpoints of several families)."""

FAMILY_CHECKED: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "DeepseekV3ForCausalLM": {
        "scoring_func": (lambda v: v == "sigmoid", "sigmoid (transformers' DeepseekV3TopkRouter)"),
        "topk_method": (
            lambda v: v == "noaux_tc",
            "noaux_tc (the expert bias chooses, groups by their best two)",
        ),
        "moe_layer_freq": (lambda v: type(v) is int and v == 1, "1 (every layer after the dense ones a MoE)"),
        "ep_size": (lambda v: type(v) is int and v >= 1, "a positive integer (the remote code's layout)"),
        "aux_loss_alpha": (
            lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0,
            "a number >= 0 (the remote code's training loss, which its noaux_tc gate never computes)",
        ),
        "seq_aux": (lambda v: isinstance(v, bool), "true or false (as aux_loss_alpha)"),
    },
}
"""Fields one family reads, held to what te_assembly computes for it (``CHECKED``'s per-family twin):
DeepSeek's own ``config.json`` fields (the Hub's copies, written for its remote code), held to what
transformers' DeepseekV3 computes, or read as the layout and training-only settings they are."""


METADATA_FIELDS = (
    "architectures",
    "model_type",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "name_or_path",
    "return_dict",
    "output_hidden_states",
    "output_attentions",
    "torchscript",
    "use_return_dict",
    "use_bfloat16",
    "is_encoder_decoder",
    "is_decoder",
    "tie_encoder_decoder",
    "cross_attention_hidden_size",
    "chunk_size_feed_forward",
    "tokenizer_class",
    "id2label",
    "label2id",
    "finetuning_task",
    "problem_type",
    "prefix",
    "task_specific_params",
    "tf_legacy_loss",
    "is_llama_config",
    "auto_map",
    "custom_pipelines",
    "trust_remote_code",
)
"""Fields that describe the checkpoint, not its math: never refused (with ``METADATA_PATTERNS`` and
``GENERATION_DEFAULTS``). ``is_decoder``/``tie_encoder_decoder``/``chunk_size_feed_forward`` are
transformers' generic ``PretrainedConfig`` fields that a decoder-only causal LM does not read;
``is_llama_config`` is a marker nanotron writes."""
METADATA_PATTERNS = (
    re.compile(r"^_"),
    re.compile(r"_token_ids?$"),
    re.compile(r"^transformers\."),
)
"""Metadata by name: ``_``-prefixed keys (``_name_or_path``, ``_model_name_or_path``...), token ids
(``bos_token_id``, ``unk_token_id``, ``decoder_start_token_id``...) and fields of transformers' other
runtimes (``transformers.js_config``)."""
GENERATION_DEFAULTS = (
    "max_length",
    "min_length",
    "do_sample",
    "early_stopping",
    "num_beams",
    "num_beam_groups",
    "diversity_penalty",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "bad_words_ids",
    "num_return_sequences",
    "output_scores",
    "return_dict_in_generate",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
)
"""Sampling defaults older ``transformers`` wrote into ``config.json`` (``generation_config.json``
holds them now): they choose tokens, never the logits."""
REMOTE_CODE_FIELDS = ("auto_map", "custom_pipelines", "trust_remote_code")
"""Pointers to Python code outside transformers (``auto_map``): accepted on import (te_assembly's math is
the family's own), never carried into anything te_assembly writes."""
KEPT_FIELDS = (
    "architectures",
    "model_type",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "tokenizer_class",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "unk_token_id",
    "sep_token_id",
    "max_position_embeddings",
)
"""What an import keeps of its ``config.json`` for export (``HFSpec.metadata``)."""


def is_metadata(key: str) -> bool:
    """Whether ``key`` describes the checkpoint without changing its math (never refused)."""
    return (
        key in METADATA_FIELDS or key in GENERATION_DEFAULTS or any(p.search(key) for p in METADATA_PATTERNS)
    )
