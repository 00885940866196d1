"""The ``config.json`` fields every family meets alike: those each reads, those held to one value, and
metadata that never changes the math (each family adds its own in its file)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

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
"""What every family reads (each family adds its own ``fields``; ``CHECKED`` fields are held to a value)."""

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
    "cache_implementation",
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
