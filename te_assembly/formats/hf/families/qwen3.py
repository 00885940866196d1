"""Qwen3 (``Qwen3ForCausalLM``): Llama's ``attention_bias``, and a per-head RMSNorm of queries and keys
(``q_norm``, ``k_norm``) before the rotation."""

from __future__ import annotations

from te_assembly.formats.hf.families.mlp import DenseMLP
from te_assembly.formats.hf.families.qwen_common import WINDOW_FIELDS, Qwen3Attention


class Qwen3(Qwen3Attention, DenseMLP):
    architecture = "Qwen3ForCausalLM"
    model_type = "qwen3"
    own_fields = ("attention_bias", *WINDOW_FIELDS)
