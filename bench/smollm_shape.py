"""The model both Hugging Face side-by-sides run (``train_vs_transformers.py``,
``generate_vs_transformers.py``): a random Llama at SmolLM2-135M's shape (576 wide, 9 query / 3
key-value heads, a 1536-wide SwiGLU, a 49,152-token vocabulary, tied embeddings), made by
``transformers`` and loaded by both sides from the same directory."""

from __future__ import annotations

import tempfile
from typing import Any

import torch

import te_assembly


def both(layers: int) -> tuple[Any, Any, Any]:
    """``(transformers' model, te_assembly's model, its config)``: one random checkpoint of ``layers``
    layers, float32, loaded by transformers (SDPA, its default) and by ``te_assembly.from_hf`` (the
    reference engine)."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    )
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp)
        theirs = transformers.AutoModelForCausalLM.from_pretrained(
            tmp, attn_implementation="sdpa", dtype=torch.float32
        )
        ours = te_assembly.from_hf(tmp, "reference")
    return theirs, ours, config
