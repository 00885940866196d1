"""Tiny Hugging Face checkpoints made by ``transformers`` itself (random weights, nothing downloaded):
one per family and the variants each family's config can take."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip(
    "transformers", reason="the Hugging Face tests need transformers (dev extra)"
)
import torch  # noqa: E402

COMMON: dict[str, Any] = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}

QWEN3_MOE: dict[str, Any] = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 24,
    "head_dim": 8,
    "norm_topk_prob": True,
}

PHI3_TOKENS: dict[str, Any] = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None}
"""Phi3Config's default ids (32000...) are past the tiny vocabulary; without a pad id its embedding has
no padding row (a published Phi-3's row 32000 gets no gradient in transformers' training)."""

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    "llama-tied-mqa": ("LlamaConfig", {"tie_word_embeddings": True, "num_key_value_heads": 1}),
    "llama-biases": ("LlamaConfig", {"attention_bias": True, "mlp_bias": True}),
    "llama-rope-linear": ("LlamaConfig", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    "llama-rope-llama3": (
        "LlamaConfig",
        {
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
    ),
    "llama-head-dim": ("LlamaConfig", {"head_dim": 12}),
    # A pad id inside the vocabulary (Phi-3's and OLMo 2's published configs have one): transformers'
    # embedding gives its row no gradient, and the test ids hold it.
    "llama-pad": ("LlamaConfig", {"pad_token_id": 12}),
    # YaRN as Qwen2.5's long-context recipe and DeepSeek-V3 write it: the factor over a short original
    # context, so the ramp and the attention factor both matter at 11 positions.
    "qwen2-rope-yarn": (
        "Qwen2Config",
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}},
    ),
    "qwen3_moe-rope-yarn-mscale": (
        "Qwen3MoeConfig",
        {
            **QWEN3_MOE,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 4,
                "beta_fast": 16.0,
                "beta_slow": 2.0,
                "mscale": 0.9,
                "mscale_all_dim": 0.6,
                "truncate": False,
            },
        },
    ),
    "mistral": ("MistralConfig", {"sliding_window": 5}),
    "mistral-no-window": ("MistralConfig", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", {}),
    "qwen2-tied": ("Qwen2Config", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 24,
            "shared_expert_intermediate_size": 40,
        },
    ),
    "qwen2_moe-norm-topk": (
        "Qwen2MoeConfig",
        {
            "num_experts": 6,
            "num_experts_per_tok": 3,
            "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 24,
            "norm_topk_prob": True,
        },
    ),
    "qwen3_moe": ("Qwen3MoeConfig", QWEN3_MOE),
    "qwen3_moe-no-norm": (
        "Qwen3MoeConfig",
        {
            "num_experts": 4,
            "num_experts_per_tok": 1,
            "moe_intermediate_size": 24,
            "head_dim": 8,
            "norm_topk_prob": False,
        },
    ),
    # GLM-4.5-MoE: a dense first layer, sigmoid routing over 2 of 4 groups (each scored by its best two),
    # an expert bias, a scaling factor, two shared experts, partial rotary, q/k norms and q/k/v biases.
    "glm4_moe": (
        "Glm4MoeConfig",
        {
            "num_hidden_layers": 3,
            "head_dim": 16,
            "n_routed_experts": 8,
            "num_experts_per_tok": 3,
            "moe_intermediate_size": 12,
            "n_shared_experts": 2,
            "first_k_dense_replace": 1,
            "n_group": 4,
            "topk_group": 2,
            "norm_topk_prob": True,
            "routed_scaling_factor": 1.8,
            "partial_rotary_factor": 0.5,
            "use_qk_norm": True,
            "attention_bias": True,
            "num_nextn_predict_layers": 0,
        },
    ),
    # DeepSeek-V3: a dense first layer, latent attention (low-rank queries, a 16-wide latent, a shared
    # 4-wide rotary key in DeepSeek's interleaved layout, YaRN with mscale_all_dim scaling the softmax),
    # sigmoid routing over 2 of 4 groups, an expert bias, a scaling factor, one shared expert.
    "deepseek_v3": (
        "DeepseekV3Config",
        {
            "num_hidden_layers": 3,
            "num_key_value_heads": 4,
            "q_lora_rank": 24,
            "kv_lora_rank": 16,
            "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 4,
            "v_head_dim": 6,
            "n_routed_experts": 8,
            "num_experts_per_tok": 3,
            "moe_intermediate_size": 12,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "n_group": 4,
            "topk_group": 2,
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
            "num_nextn_predict_layers": 0,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 8,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 0.8,
            },
        },
    ),
    # GPT-OSS: alternating sliding (window 5, shorter than the test sequences) and full attention with
    # sinks, q/k/v/o biases, a router with a bias, clamped-GLU experts with biases (a limit low enough to
    # clamp), YaRN with truncate false (GPT-OSS's own setting).
    "gpt_oss": (
        "GptOssConfig",
        {
            "head_dim": 8,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "intermediate_size": 24,
            "sliding_window": 5,
            "swiglu_limit": 0.5,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 8.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 16,
            },
        },
    ),
    # Phi-3: q | k | v and gate | up each one stored tensor, partial rotary (Phi-4-mini's 0.75 is 0.5
    # here), a window shorter than the test sequences, as transformers writes the config.
    "phi3": ("Phi3Config", {**PHI3_TOKENS, "partial_rotary_factor": 0.5, "sliding_window": 6}),
    "phi3-plain": ("Phi3Config", PHI3_TOKENS),
    # Phi-3.5 / Phi-4-mini's LongRoPE: a divisor per rotated pair, the long ones past an original
    # context of 8 (the test sequences are 11 long), an attention factor from max_position_embeddings.
    "phi3-longrope": (
        "Phi3Config",
        {
            **PHI3_TOKENS,
            "partial_rotary_factor": 0.5,
            "original_max_position_embeddings": 8,
            "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0, 1.5], "long_factor": [2.0, 3.5]},
        },
    ),
    # OLMo 2: norms after attention and the MLP, q/k norms over the whole projection (grouped heads).
    "olmo2": ("Olmo2Config", {"pad_token_id": None, "eos_token_id": 2}),
    # Gemma 2: sliding (window 5, shorter than the test sequences) and full layers alternating, caps as
    # low as the random model's small logits need for the tanh to bend them (its attention logits are
    # about 0.03, its vocabulary logits 0.4), a query_pre_attn_scalar that is not head_dim.
    "gemma2": (
        "Gemma2Config",
        {
            "num_hidden_layers": 3,
            "head_dim": 8,
            "query_pre_attn_scalar": 10,
            "sliding_window": 5,
            "attn_logit_softcapping": 0.1,
            "final_logit_softcapping": 0.5,
        },
    ),
    # Gemma 3: per-head q/k norms, sliding and full layers each turned by its own RoPE (the full ones
    # with linear scaling, as the 4B's), written by transformers 5 in rope_parameters by layer type.
    "gemma3": (
        "Gemma3TextConfig",
        {
            "num_hidden_layers": 3,
            "head_dim": 8,
            "query_pre_attn_scalar": 8,
            "sliding_window": 5,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
            },
        },
    ),
}
FAMILIES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "glm4_moe",
    "deepseek_v3",
    "gpt_oss",
    "phi3",
    "olmo2",
    "gemma2",
    "gemma3",
)
"""One variant per family, the architectures of the issue."""


def config_of(variant: str, **changes: Any) -> Any:
    cls, extra = VARIANTS[variant]
    return getattr(transformers, cls)(**{**COMMON, **extra, **changes})


def make(
    variant: str, directory: Path, seed: int = 0, changes: dict[str, Any] | None = None, **save: Any
) -> Path:
    """Save a random-weight ``transformers`` model of ``variant`` in ``directory``. Norm scales,
    biases and expert biases start away from their 1 and 0, so a mapping that dropped or swapped one
    would show."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config_of(variant, **(changes or {})))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias") or "layernorm" in name:
                param.add_(torch.randn_like(param) * 0.2)
            elif name.endswith(("_bias", "sinks")):  # GPT-OSS's expert biases and attention sinks
                param.add_(torch.randn_like(param) * 0.2)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # GLM-4.5's and DeepSeek-V3's expert bias
                buffer.add_(torch.randn_like(buffer) * 0.1)
    model.save_pretrained(directory, **save)
    return directory


def token_ids(vocab: int = 96, batch: int = 2, seq: int = 11, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))
